//! Host-side client: one method per request, each opening a fresh stream through the
//! connector it was built with (one request per connection, see the crate doc). The
//! client is `Sync`, so threads sharing one client make concurrent requests.

use std::fmt;
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::frame::{read_frame, write_frame, write_json, FrameError, FrameKind, DATA_CHUNK};
use crate::msg::{
    AgentError, EvalResponse, ExecRequest, ExitStatus, FileInfo, IdentityApplied, IdentityRequest, MkdirRequest,
    MountVolumeRequest, Pong, ProtocolError, Request, Response, SignalRequest, Started, UntarRequest, WatchMessage,
    WatchRequest, WriteFileRequest,
};
use crate::vsock::{connect_vsock_uds, VsockConnectError};

/// A failed request, by step.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Opening the per-request stream failed.
    #[error("connecting to the agent: {0}")]
    Connect(#[source] io::Error),
    /// The vsock `CONNECT` handshake failed.
    #[error(transparent)]
    VsockConnect(#[from] VsockConnectError),
    /// Sending the request or its stdin/data frames failed.
    #[error("sending {step}: {source}")]
    Send { step: &'static str, source: FrameError },
    /// Reading the agent's reply frames failed.
    #[error("receiving {step}: {source}")]
    Receive { step: &'static str, source: FrameError },
    /// Reading the caller's stdin / file source failed.
    #[error("reading the local source for {step}: {source}")]
    ReadSource { step: &'static str, source: io::Error },
    /// Writing into the caller's sink failed.
    #[error("writing the local sink for {step}: {source}")]
    WriteSink { step: &'static str, source: io::Error },
    /// The agent rejected a frame with an `Error` frame.
    #[error(transparent)]
    Rejected(#[from] ProtocolError),
    /// The operation failed in the guest.
    #[error("agent: {0}")]
    Agent(#[from] AgentError),
    /// The agent replied with a frame or response that does not fit the conversation.
    #[error("unexpected reply to {step}: {got}")]
    Unexpected { step: &'static str, got: String },
    /// The agent sent nothing for the call's idle limit (a hung, paused or reset guest).
    #[error("{step}: the agent sent nothing for {} s (its idle limit); the guest may be hung or paused", limit.as_secs())]
    Silent { step: &'static str, limit: Duration },
}

impl ClientError {
    /// True when the agent went silent past the call's idle limit.
    pub fn is_silent(&self) -> bool {
        matches!(self, ClientError::Silent { .. })
    }
}

/// How long a call may wait for the agent without a byte moving, by kind of call. These
/// are idle limits, not total ones: a long file transfer or a chatty process is never
/// cut while bytes flow. They are generous because a guest's kernel runs emulated on
/// some hosts (PLATFORM.md) and a busy host shares two cores among many guests.
pub mod idle_limit {
    use std::time::Duration;
    /// Ping, files, identity, shutdown: requests the agent answers without running
    /// the caller's code.
    pub const CALL: Duration = Duration::from_secs(300);
    /// Added to an exec's own timeout (after which the agent kills the process).
    pub const EXEC_GRACE: Duration = Duration::from_secs(120);
    /// An exec with no timeout of its own: a day, the longest the API accepts.
    pub const EXEC_UNTIMED: Duration = Duration::from_secs(86_400);
    /// Eval runs the caller's code in the warm interpreter, which has no timeout of its
    /// own yet: an hour of silence ends the call.
    pub const EVAL: Duration = Duration::from_secs(3600);
    /// A watch: the agent sends a keepalive every few seconds while nothing changes.
    pub const WATCH: Duration = Duration::from_secs(60);
    /// An attachment to a background process: the agent sends a keepalive every few
    /// seconds while the process is quiet.
    pub const ATTACH: Duration = Duration::from_secs(60);

    /// An exec's idle limit: its own timeout plus [`EXEC_GRACE`], else a day plus it.
    pub fn exec(timeout_ms: Option<u64>) -> Duration {
        timeout_ms.map_or(EXEC_UNTIMED, Duration::from_millis).saturating_add(EXEC_GRACE)
    }
}

/// A stream whose reads and writes can be made to give up after a time without progress.
pub trait IdleLimit {
    /// Every read and write on the stream fails after `limit` without progress.
    fn set_idle_limit(&self, limit: Duration) -> io::Result<()>;
}

impl IdleLimit for UnixStream {
    fn set_idle_limit(&self, limit: Duration) -> io::Result<()> {
        self.set_read_timeout(Some(limit))?;
        self.set_write_timeout(Some(limit))
    }
}

fn timed_out(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut)
}

/// A frame error on a stream with `limit`: a timeout is [`ClientError::Silent`].
pub(crate) fn frame_failed(step: &'static str, limit: Duration, send: bool) -> impl Fn(FrameError) -> ClientError {
    move |source| {
        let silent = match &source {
            FrameError::ReadHeader(e) | FrameError::ReadPayload(e) => timed_out(e),
            FrameError::Write { source, .. } => timed_out(source),
            _ => false,
        };
        match (silent, send) {
            (true, _) => ClientError::Silent { step, limit },
            (false, true) => ClientError::Send { step, source },
            (false, false) => ClientError::Receive { step, source },
        }
    }
}

/// Collected result of [`AgentClient::exec_collect`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
    /// Everything written to stdout.
    pub stdout: Vec<u8>,
    /// Everything written to stderr.
    pub stderr: Vec<u8>,
    /// How the process ended.
    pub status: ExitStatus,
}

type Connector<S> = Box<dyn Fn() -> Result<S, ClientError> + Send + Sync>;

/// A client for one agent. Every method opens its own stream, with an idle limit for
/// its kind of call ([`idle_limit`]).
pub struct AgentClient<S: Read + Write> {
    connect: Connector<S>,
    /// A lower idle limit for every call (probes).
    cap: Option<Duration>,
}

impl<S: Read + Write> fmt::Debug for AgentClient<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AgentClient").finish_non_exhaustive()
    }
}

impl AgentClient<UnixStream> {
    /// Connects through a VMM's hybrid vsock Unix socket (`CONNECT <port>` per request).
    pub fn vsock_uds(path: impl Into<PathBuf>, port: u32) -> Self {
        let path = path.into();
        Self::new(move || Ok(connect_vsock_uds(&path, port)?))
    }

    /// [`AgentClient::vsock_uds`] whose requests fail when the agent is silent for
    /// `limit` (see [`crate::vsock::connect_vsock_uds_within`]); for probes.
    pub fn vsock_uds_within(path: impl Into<PathBuf>, port: u32, limit: Duration) -> Self {
        let path = path.into();
        Self::new(move || Ok(crate::vsock::connect_vsock_uds_within(&path, port, Some(limit))?)).with_idle_cap(limit)
    }

    /// Connects straight to an agent listening on a Unix socket (`--listen-unix`).
    pub fn unix(path: impl AsRef<Path>) -> Self {
        let path = path.as_ref().to_path_buf();
        Self::new(move || UnixStream::connect(&path).map_err(ClientError::Connect))
    }
}

impl<S: Read + Write + IdleLimit> AgentClient<S> {
    /// A client that calls `connect` for every request.
    pub fn new(connect: impl Fn() -> Result<S, ClientError> + Send + Sync + 'static) -> Self {
        Self { connect: Box::new(connect), cap: None }
    }

    /// The same client with every call's idle limit at most `cap`.
    pub fn with_idle_cap(mut self, cap: Duration) -> Self {
        self.cap = Some(cap);
        self
    }

    /// Opens a stream for `req`, limited to `limit` of silence (or the client's cap).
    pub(crate) fn start(
        &self,
        step: &'static str,
        req: &Request,
        limit: Duration,
    ) -> Result<(S, Duration), ClientError> {
        let limit = self.cap.map_or(limit, |cap| cap.min(limit));
        let mut stream = (self.connect)()?;
        stream.set_idle_limit(limit).map_err(ClientError::Connect)?;
        write_json(&mut stream, FrameKind::Request, req).map_err(frame_failed(step, limit, true))?;
        Ok((stream, limit))
    }

    /// Sends one request with no trailing frames and returns its response.
    pub(crate) fn call(&self, step: &'static str, req: &Request, limit: Duration) -> Result<Response, ClientError> {
        let (mut stream, limit) = self.start(step, req, limit)?;
        final_response(&mut stream, step, limit)
    }

    /// Liveness, versions, uptime, sandbox id and identity generation.
    pub fn ping(&self) -> Result<Pong, ClientError> {
        match self.call("ping", &Request::Ping, idle_limit::CALL)? {
            Response::Pong(p) => Ok(p),
            other => Err(unexpected("ping", &other)),
        }
    }

    /// Runs a process, calling `on_stdout` / `on_stderr` with each chunk as it arrives.
    /// `stdin` is streamed in full before output is read; `req.stdin` is set accordingly.
    pub fn exec(
        &self,
        req: &ExecRequest,
        stdin: Option<&mut dyn Read>,
        on_stdout: &mut dyn FnMut(&[u8]),
        on_stderr: &mut dyn FnMut(&[u8]),
    ) -> Result<ExitStatus, ClientError> {
        self.exec_reporting_start(req, stdin, None, on_stdout, on_stderr)
    }

    /// [`exec`](Self::exec), and with `on_start` the agent reports the process's pid
    /// first (`report_start`), so a caller can [`signal`](Self::signal) it while it
    /// runs. An agent too old to report it calls `on_start` never.
    pub fn exec_reporting_start(
        &self,
        req: &ExecRequest,
        stdin: Option<&mut dyn Read>,
        mut on_start: Option<&mut dyn FnMut(u32)>,
        on_stdout: &mut dyn FnMut(&[u8]),
        on_stderr: &mut dyn FnMut(&[u8]),
    ) -> Result<ExitStatus, ClientError> {
        let step = "exec";
        let mut req = req.clone();
        req.stdin = stdin.is_some();
        req.report_start = on_start.is_some();
        let limit = idle_limit::exec(req.timeout_ms);
        let (mut stream, limit) = self.start(step, &Request::Exec(req), limit)?;
        if let Some(src) = stdin {
            send_stream(&mut stream, src, FrameKind::Stdin, step, limit)?;
        }
        loop {
            let frame = read_frame(&mut stream).map_err(frame_failed(step, limit, false))?;
            match frame.kind {
                FrameKind::Stdout => on_stdout(&frame.payload),
                FrameKind::Stderr => on_stderr(&frame.payload),
                FrameKind::Started => {
                    let started: Started = serde_json::from_slice(&frame.payload).map_err(|e| {
                        ClientError::Unexpected { step, got: format!("a malformed started frame: {e}") }
                    })?;
                    if let Some(f) = on_start.as_mut() {
                        f(started.pid);
                    }
                }
                _ => {
                    return match decode_final(&frame, step)? {
                        Response::Exit(status) => Ok(status),
                        other => Err(unexpected(step, &other)),
                    }
                }
            }
        }
    }

    /// Runs a process with `stdin` bytes and collects its output.
    pub fn exec_collect(&self, req: &ExecRequest, stdin: &[u8]) -> Result<ExecOutput, ClientError> {
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        let mut src = stdin;
        let src: Option<&mut dyn Read> = if stdin.is_empty() { None } else { Some(&mut src) };
        let status = self.exec(req, src, &mut |c| stdout.extend_from_slice(c), &mut |c| stderr.extend_from_slice(c))?;
        Ok(ExecOutput { stdout, stderr, status })
    }

    /// Streams a guest file into `sink`; returns the byte count.
    pub fn read_file(&self, path: &str, sink: &mut dyn Write) -> Result<u64, ClientError> {
        self.read_stream("read_file", &Request::ReadFile { path: path.into() }, sink)
    }

    /// Streams a tar archive of guest directory `path` into `sink`; returns its size.
    pub fn tar(&self, path: &str, sink: &mut dyn Write) -> Result<u64, ClientError> {
        self.read_stream("tar", &Request::Tar { path: path.into() }, sink)
    }

    /// A guest file's size and SHA-256 (lowercase hex), computed by the agent.
    pub fn hash_file(&self, path: &str) -> Result<(u64, String), ClientError> {
        match self.call("hash_file", &Request::HashFile { path: path.into() }, idle_limit::CALL)? {
            Response::FileHash { size, sha256 } => Ok((size, sha256)),
            other => Err(unexpected("hash_file", &other)),
        }
    }

    /// `Data` frames into `sink` until `ReadDone` (which must count what came).
    fn read_stream(&self, step: &'static str, req: &Request, sink: &mut dyn Write) -> Result<u64, ClientError> {
        let (mut stream, limit) = self.start(step, req, idle_limit::CALL)?;
        let mut total = 0u64;
        loop {
            let frame = read_frame(&mut stream).map_err(frame_failed(step, limit, false))?;
            if frame.kind == FrameKind::Data {
                sink.write_all(&frame.payload).map_err(|source| ClientError::WriteSink { step, source })?;
                total += frame.payload.len() as u64;
                continue;
            }
            return match decode_final(&frame, step)? {
                Response::ReadDone { bytes } if bytes == total => Ok(total),
                other => Err(unexpected(step, &other)),
            };
        }
    }

    /// Reads a whole guest file into memory.
    pub fn read_file_to_vec(&self, path: &str) -> Result<Vec<u8>, ClientError> {
        let mut out = Vec::new();
        self.read_file(path, &mut out)?;
        Ok(out)
    }

    /// Streams `src` into a guest file (atomically replaced); returns the byte count.
    pub fn write_file(&self, req: &WriteFileRequest, src: &mut dyn Read) -> Result<u64, ClientError> {
        self.send_data("write_file", &Request::WriteFile(req.clone()), src)
    }

    /// Streams the tar archive `src` into guest directory `req.dir`; returns the bytes
    /// sent.
    pub fn untar(&self, req: &UntarRequest, src: &mut dyn Read) -> Result<u64, ClientError> {
        self.send_data("untar", &Request::Untar(req.clone()), src)
    }

    /// Sends `req`, then `src` as `Data` frames and `End`; the agent answers `Written`.
    fn send_data(&self, step: &'static str, req: &Request, src: &mut dyn Read) -> Result<u64, ClientError> {
        let (mut stream, limit) = self.start(step, req, idle_limit::CALL)?;
        send_stream(&mut stream, src, FrameKind::Data, step, limit)?;
        match final_response(&mut stream, step, limit)? {
            Response::Written { bytes } => Ok(bytes),
            other => Err(unexpected(step, &other)),
        }
    }

    /// Lists a guest directory.
    pub fn list(&self, path: &str) -> Result<Vec<FileInfo>, ClientError> {
        match self.call("list", &Request::List { path: path.into() }, idle_limit::CALL)? {
            Response::Entries { entries } => Ok(entries),
            other => Err(unexpected("list", &other)),
        }
    }

    /// Describes one guest path.
    pub fn stat(&self, path: &str) -> Result<FileInfo, ClientError> {
        match self.call("stat", &Request::Stat { path: path.into() }, idle_limit::CALL)? {
            Response::Stat(info) => Ok(info),
            other => Err(unexpected("stat", &other)),
        }
    }

    /// Creates a guest directory.
    pub fn mkdir(&self, req: &MkdirRequest) -> Result<(), ClientError> {
        self.expect_done("mkdir", &Request::Mkdir(req.clone()))
    }

    /// Removes a guest path (`recursive` for non-empty directories).
    pub fn remove(&self, path: &str, recursive: bool) -> Result<(), ClientError> {
        self.expect_done("remove", &Request::Remove { path: path.into(), recursive })
    }

    /// Renames a guest path.
    pub fn rename(&self, from: &str, to: &str) -> Result<(), ClientError> {
        self.expect_done("rename", &Request::Rename { from: from.into(), to: to.into() })
    }

    pub(crate) fn expect_done(&self, step: &'static str, req: &Request) -> Result<(), ClientError> {
        match self.call(step, req, idle_limit::CALL)? {
            Response::Done => Ok(()),
            other => Err(unexpected(step, &other)),
        }
    }

    /// Mounts the volume in slot `req.serial` at `req.path` (waiting, bounded, for the
    /// guest to see the disk's size).
    pub fn mount_volume(&self, req: &MountVolumeRequest) -> Result<(), ClientError> {
        self.expect_done("mount_volume", &Request::MountVolume(req.clone()))
    }

    /// Flushes the guest's dirty pages to its disks.
    pub fn sync(&self) -> Result<(), ClientError> {
        self.expect_done("sync", &Request::Sync)
    }

    /// Sends `signal` to the process group of the exec that reported `pid`.
    pub fn signal(&self, pid: u32, signal: i32) -> Result<(), ClientError> {
        self.expect_done("signal", &Request::Signal(SignalRequest { pid, signal }))
    }

    /// Runs `code` in the warm interpreter.
    pub fn eval(&self, code: &str) -> Result<EvalResponse, ClientError> {
        match self.call("eval", &Request::Eval { code: code.into() }, idle_limit::EVAL)? {
            Response::Eval(r) => Ok(r),
            other => Err(unexpected("eval", &other)),
        }
    }

    /// Applies a fresh identity (send first after a restore).
    pub fn identity(&self, req: &IdentityRequest) -> Result<IdentityApplied, ClientError> {
        match self.call("identity", &Request::Identity(req.clone()), idle_limit::CALL)? {
            Response::Identity(r) => Ok(r),
            other => Err(unexpected("identity", &other)),
        }
    }

    /// Starts watching a guest directory. Returns once the watch is in place (every
    /// change after that is reported), with the number of directories it covers.
    pub fn watch(&self, req: &WatchRequest) -> Result<(WatchStream<S>, u32), ClientError> {
        let step = "watch";
        let (stream, limit) = self.start(step, &Request::Watch(req.clone()), idle_limit::WATCH)?;
        let mut watch = WatchStream { stream, limit, ended: false };
        match watch.recv()? {
            Some(WatchMessage::Armed { directories }) => Ok((watch, directories)),
            Some(other) => Err(ClientError::Unexpected { step, got: format!("{other:?} before the watch was armed") }),
            None => Err(ClientError::Unexpected { step, got: "the end of the watch before it was armed".into() }),
        }
    }

    /// Asks the guest to sync and reset (or the agent to exit, when not PID 1).
    pub fn shutdown(&self) -> Result<(), ClientError> {
        match self.call("shutdown", &Request::Shutdown, idle_limit::CALL)? {
            Response::ShuttingDown => Ok(()),
            other => Err(unexpected("shutdown", &other)),
        }
    }
}

/// A running watch ([`AgentClient::watch`]): its messages, in the order the guest saw the
/// changes. Dropping it closes the connection, which also ends the watch in the guest.
pub struct WatchStream<S: Read + Write> {
    stream: S,
    limit: Duration,
    ended: bool,
}

impl<S: Read + Write> fmt::Debug for WatchStream<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WatchStream").field("ended", &self.ended).finish_non_exhaustive()
    }
}

impl<S: Read + Write> WatchStream<S> {
    /// The next message, waiting for it; `None` once the watch ended in the guest (the
    /// directory went away). Keepalives arrive every few seconds while nothing changes,
    /// so a caller that loops here regains control at least that often.
    pub fn recv(&mut self) -> Result<Option<WatchMessage>, ClientError> {
        let step = "watch";
        if self.ended {
            return Ok(None);
        }
        let frame = read_frame(&mut self.stream).map_err(frame_failed(step, self.limit, false))?;
        if frame.kind == FrameKind::Watch {
            return frame.json::<WatchMessage>().map(Some).map_err(|source| ClientError::Receive { step, source });
        }
        self.ended = true;
        match decode_final(&frame, step)? {
            Response::Done => Ok(None),
            other => Err(unexpected(step, &other)),
        }
    }

    /// Ends the watch: the guest stops watching and answers; messages still in flight
    /// are dropped.
    pub fn stop(mut self) -> Result<(), ClientError> {
        let step = "watch stop";
        if self.ended {
            return Ok(());
        }
        write_frame(&mut self.stream, FrameKind::End, &[]).map_err(frame_failed(step, self.limit, true))?;
        while self.recv()?.is_some() {}
        Ok(())
    }
}

/// Sends `src` as chunks of `kind`, then `End`.
pub(crate) fn send_stream<S: Write>(
    stream: &mut S,
    src: &mut dyn Read,
    kind: FrameKind,
    step: &'static str,
    limit: Duration,
) -> Result<(), ClientError> {
    let mut buf = vec![0u8; DATA_CHUNK];
    loop {
        let n = match src.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(source) => return Err(ClientError::ReadSource { step, source }),
        };
        write_frame(stream, kind, &buf[..n]).map_err(frame_failed(step, limit, true))?;
    }
    write_frame(stream, FrameKind::End, &[]).map_err(frame_failed(step, limit, true))
}

/// Reads the one frame that ends a conversation and decodes it.
pub(crate) fn final_response<S: Read>(
    stream: &mut S,
    step: &'static str,
    limit: Duration,
) -> Result<Response, ClientError> {
    let frame = read_frame(stream).map_err(frame_failed(step, limit, false))?;
    decode_final(&frame, step)
}

/// Turns a terminal frame into a `Response`, mapping `Error` frames and
/// `Response::Error` to errors.
pub(crate) fn decode_final(frame: &crate::Frame, step: &'static str) -> Result<Response, ClientError> {
    match frame.kind {
        FrameKind::Response => match frame.json::<Response>() {
            Ok(Response::Error(e)) => Err(ClientError::Agent(e)),
            Ok(r) => Ok(r),
            Err(source) => Err(ClientError::Receive { step, source }),
        },
        FrameKind::Error => match frame.json::<ProtocolError>() {
            Ok(e) => Err(ClientError::Rejected(e)),
            Err(source) => Err(ClientError::Receive { step, source }),
        },
        kind => Err(ClientError::Unexpected { step, got: format!("{kind:?} frame") }),
    }
}

pub(crate) fn unexpected(step: &'static str, got: &Response) -> ClientError {
    ClientError::Unexpected { step, got: format!("{got:?}") }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    /// An agent that takes the connection and the request, then says nothing: every kind
    /// of call ends with `Silent` at the client's cap instead of waiting forever.
    #[test]
    fn a_silent_agent_ends_each_call_at_its_idle_limit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let held = std::thread::spawn(move || {
            let mut open = Vec::new();
            for stream in listener.incoming().take(3) {
                open.push(stream.unwrap());
            }
            std::thread::sleep(Duration::from_secs(2));
        });
        let cap = Duration::from_millis(200);
        let client = AgentClient::unix(&path).with_idle_cap(cap);
        let started = std::time::Instant::now();
        let e = client.ping().unwrap_err();
        assert!(matches!(e, ClientError::Silent { step: "ping", limit } if limit == cap), "{e:?}");
        assert!(e.to_string().contains("sent nothing"), "{e}");
        let e = client.exec_collect(&ExecRequest::argv(["true"]), b"").unwrap_err();
        assert!(e.is_silent(), "{e:?}");
        let e = client.eval("1").unwrap_err();
        assert!(e.is_silent(), "{e:?}");
        assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
        held.join().unwrap();
    }

    #[test]
    fn exec_waits_its_own_timeout_plus_grace() {
        assert_eq!(idle_limit::exec(Some(5_000)), Duration::from_secs(125));
        assert_eq!(idle_limit::exec(None), Duration::from_secs(86_400 + 120));
        assert!(idle_limit::exec(Some(u64::MAX)) > idle_limit::EXEC_UNTIMED, "no overflow");
    }
}
