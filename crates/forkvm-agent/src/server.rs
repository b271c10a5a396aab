//! Connection handling: accept loop (connections served by waiting threads, `workers`), reading the single
//! request of a connection, dispatching it, and answering rejected frames with an
//! `Error` frame before closing that connection (the agent keeps serving others).

use std::io::{self, Read};
use std::net::Shutdown;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use forkvm_proto::{
    read_frame, write_json, AgentError, ErrorKind, FrameError, FrameKind, IdentityTimings, Pong, ProtocolError,
    ProtocolErrorCode, Request, Response, PROTOCOL_VERSION,
};

use crate::identity::{self, IdentitySys};

/// Python that reseeds the generators a warm interpreter may hold (see
/// `reseed_interpreter`): `random` from the first half of `seed` and numpy's global
/// generator from the second (both are Mersenne Twisters seeded the same way, so one key
/// for both would give them the same stream). Without a seed (an older host), both are
/// reseeded from the guest kernel, which is slow where the kernel is emulated.
fn reseed_python(seed: &[u8]) -> String {
    let (for_random, for_numpy) = seed.split_at(seed.len() / 2);
    if for_random.is_empty() || for_numpy.is_empty() {
        return "import sys as _forkvm_sys\n\
if 'random' in _forkvm_sys.modules: _forkvm_sys.modules['random'].seed()\n\
if 'numpy' in _forkvm_sys.modules: _forkvm_sys.modules['numpy'].random.seed()\n\
del _forkvm_sys"
            .to_string();
    }
    let random_key: String = for_random.iter().map(|b| format!("{b:02x}")).collect();
    let numpy_key: Vec<String> = for_numpy
        .chunks(4)
        .map(|w| w.iter().rev().fold(0u32, |acc, b| (acc << 8) | u32::from(*b)).to_string())
        .collect();
    format!(
        "import sys as _forkvm_sys\n\
if 'random' in _forkvm_sys.modules: _forkvm_sys.modules['random'].seed(0x{random_key})\n\
if 'numpy' in _forkvm_sys.modules: _forkvm_sys.modules['numpy'].random.seed([{}])\n\
del _forkvm_sys",
        numpy_key.join(", ")
    )
}
use crate::interp::Interp;
use crate::reaper::Reaper;
use crate::vsock::VsockListener;
use crate::workers::Workers;
use crate::{exec, files, init, watch};

/// How long, and how much, to drain from a connection after rejecting a frame, so
/// closing it does not reset the peer before it reads the `Error` frame.
const DRAIN_TIME: Duration = Duration::from_millis(200);
const DRAIN_BYTES: u64 = 16 << 20;

/// Why a connection ended without a normal response.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The request frame could not be read or was rejected.
    #[error("receiving the request: {0}")]
    ReceiveRequest(#[source] FrameError),
    /// The request frame's JSON did not decode.
    #[error("decoding the request: {0}")]
    DecodeRequest(#[source] FrameError),
    /// A `Stdin`/`Data` frame could not be read or was rejected.
    #[error("receiving input frames: {0}")]
    ReceiveInput(#[source] FrameError),
    /// A frame of the wrong kind arrived.
    #[error("unexpected {kind:?} frame during {step}")]
    UnexpectedFrame { step: &'static str, kind: FrameKind },
    /// Sending output or data frames failed (the host went away).
    #[error("sending output frames: {0}")]
    SendOutput(#[source] FrameError),
    /// Sending the final response failed.
    #[error("sending the response: {0}")]
    SendResponse(#[source] FrameError),
    /// The host hung up on a conversation that it may end that way (a watch).
    #[error("the host hung up")]
    HostLeft,
    /// Duplicating the connection for the stdin pump failed.
    #[error("cloning the connection for stdin: {0}")]
    CloneConnection(#[source] io::Error),
}

impl ServeError {
    /// The `Error` frame to send, if the host sent something we rejected.
    fn protocol_error(&self) -> Option<ProtocolError> {
        match self {
            Self::ReceiveRequest(e) | Self::DecodeRequest(e) | Self::ReceiveInput(e) => match e {
                FrameError::Closed | FrameError::ReadHeader(_) | FrameError::ReadPayload(_) => None,
                e => Some(ProtocolError::from_frame_error(e)),
            },
            Self::UnexpectedFrame { .. } => Some(ProtocolError {
                code: ProtocolErrorCode::UnexpectedFrame,
                message: self.to_string(),
                agent_protocol_version: PROTOCOL_VERSION,
            }),
            _ => None,
        }
    }
}

/// Shared agent state.
pub struct Agent {
    started: Instant,
    reaper: Arc<Reaper>,
    running: Arc<crate::exec::Running>,
    procs: crate::procs::Procs,
    interp: Option<Interp>,
    identity_sys: Box<dyn IdentitySys>,
    sandbox_id: Mutex<Option<String>>,
    generation: AtomicU64,
    pid1: bool,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent").field("pid1", &self.pid1).finish_non_exhaustive()
    }
}

/// Where connections come from.
#[derive(Debug)]
pub enum Listener {
    /// A Unix socket (host tests, `--listen-unix`).
    Unix(UnixListener),
    /// AF_VSOCK (in a guest).
    Vsock(VsockListener),
}

impl Listener {
    fn accept(&self) -> io::Result<UnixStream> {
        match self {
            Self::Unix(l) => l.accept().map(|(s, _)| s),
            Self::Vsock(l) => l.accept(),
        }
    }
}

impl Agent {
    /// Builds the shared state.
    pub fn new(reaper: Arc<Reaper>, interp: Option<Interp>, identity_sys: Box<dyn IdentitySys>, pid1: bool) -> Self {
        Self {
            started: Instant::now(),
            reaper,
            running: Arc::default(),
            procs: crate::procs::Procs::default(),
            interp,
            identity_sys,
            sandbox_id: Mutex::new(None),
            generation: AtomicU64::new(0),
            pid1,
        }
    }

    /// Accepts connections forever, each served by a waiting thread (`workers`).
    pub fn serve(self: Arc<Self>, listener: Listener) {
        let agent = self.clone();
        let workers = Workers::start(move |conn| agent.handle(conn));
        loop {
            match listener.accept() {
                Ok(conn) => workers.dispatch(conn),
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a connection");
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
    }

    /// Serves the one request of `conn`, answering rejected frames with an `Error` frame.
    pub fn handle(&self, mut conn: UnixStream) {
        match self.serve_one(&mut conn) {
            Ok(true) => {
                tracing::info!("shutdown requested");
                let _ = conn.shutdown(Shutdown::Both);
                init::shutdown(self.pid1);
            }
            Ok(false) => {}
            Err(ServeError::ReceiveRequest(FrameError::Closed) | ServeError::HostLeft) => {}
            Err(e) => {
                tracing::warn!(error = %e, "connection failed");
                if let Some(pe) = e.protocol_error() {
                    let _ = write_json(&mut conn, FrameKind::Error, &pe);
                    let _ = conn.shutdown(Shutdown::Write);
                    let _ = conn.set_read_timeout(Some(DRAIN_TIME));
                    let _ = io::copy(&mut (&mut conn).take(DRAIN_BYTES), &mut io::sink());
                }
            }
        }
    }

    /// Returns whether the agent should shut down after this request.
    fn serve_one(&self, conn: &mut UnixStream) -> Result<bool, ServeError> {
        let frame = read_frame(conn).map_err(ServeError::ReceiveRequest)?;
        if frame.kind != FrameKind::Request {
            return Err(ServeError::UnexpectedFrame { step: "request", kind: frame.kind });
        }
        let req: Request = frame.json().map_err(ServeError::DecodeRequest)?;
        let shutdown = matches!(req, Request::Shutdown);
        let response = self.dispatch(conn, req)?;
        write_json(conn, FrameKind::Response, &response).map_err(ServeError::SendResponse)?;
        Ok(shutdown)
    }

    fn dispatch(&self, conn: &mut UnixStream, req: Request) -> Result<Response, ServeError> {
        Ok(match req {
            Request::Ping => Response::Pong(self.pong()),
            Request::Exec(req) => return exec::run(conn, req, &self.reaper, &self.running),
            Request::Signal(req) => self.running.signal(req),
            Request::ReadFile { path } => return files::read_file(conn, &path),
            Request::WriteFile(req) => return files::write_file(conn, &req),
            Request::List { path } => files::list(&path),
            Request::Stat { path } => files::stat(&path),
            Request::Mkdir(req) => files::mkdir(&req),
            Request::Remove { path, recursive } => files::remove(&path, recursive),
            Request::Rename { from, to } => files::rename(&from, &to),
            Request::Eval { code } => match &self.interp {
                Some(interp) => interp.eval(&code).map_or_else(Response::Error, Response::Eval),
                None => Response::Error(AgentError::new(
                    ErrorKind::Unsupported,
                    "eval: no warm interpreter configured (start the agent with --python)",
                )),
            },
            Request::Identity(req) => {
                let mut sandbox_id = self.sandbox_id.lock().unwrap_or_else(|e| e.into_inner());
                let started = Instant::now();
                match identity::apply(&*self.identity_sys, &req) {
                    Ok(entropy) => {
                        let kernel = started.elapsed();
                        self.reseed_interpreter(&req.interpreter_seed);
                        let timings = IdentityTimings {
                            kernel_us: kernel.as_micros() as u64,
                            interpreter_us: (started.elapsed() - kernel).as_micros() as u64,
                        };
                        *sandbox_id = Some(req.sandbox_id);
                        let generation = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
                        // Not at info: the console is a serial port, ~0.3 ms a byte where
                        // the guest kernel is emulated, and every fork's first answer
                        // would wait for this line.
                        tracing::debug!(sandbox_id = ?*sandbox_id, generation, "identity applied");
                        Response::Identity(forkvm_proto::IdentityApplied {
                            generation,
                            entropy,
                            timings: Some(timings),
                        })
                    }
                    Err(e) => Response::Error(e),
                }
            }
            Request::Shutdown => Response::ShuttingDown,
            Request::Watch(req) => return watch::run(conn, &req),
            Request::MountVolume(req) => crate::volumes::mount(&req),
            Request::Sync => crate::volumes::sync(),
            Request::Untar(req) => return crate::untar::run(conn, &req),
            Request::Tar { path } => return crate::tar_out::tar(conn, &path),
            Request::HashFile { path } => crate::tar_out::hash_file(&path),
            Request::ProcStart(req) => self.procs.start(&req, &self.reaper, &self.running),
            Request::ProcList => self.procs.list(),
            Request::ProcAttach(req) => return crate::procs::attach(conn, &req, &self.procs),
            Request::ProcInput(req) => return self.procs.input(conn, &req),
            Request::ProcResize(req) => self.procs.resize(&req),
        })
    }

    /// Clones of one snapshot share the warm interpreter's random generators (`random`
    /// and numpy's global one were seeded before the snapshot): reseed them from the
    /// host's fresh bytes (else from the kernel's freshly reseeded CRNG), so no two
    /// sandboxes draw the same numbers.
    fn reseed_interpreter(&self, seed: &[u8]) {
        let Some(interp) = &self.interp else { return };
        match interp.eval(&reseed_python(seed)) {
            Ok(r) => {
                if let forkvm_proto::EvalOutcome::Exception { exception, .. } = r.outcome {
                    tracing::warn!(%exception, "reseeding the interpreter's generators failed");
                }
            }
            Err(e) => tracing::warn!(error = %e, "reseeding the interpreter's generators failed"),
        }
    }

    fn pong(&self) -> Pong {
        Pong {
            agent_version: env!("CARGO_PKG_VERSION").into(),
            protocol_version: PROTOCOL_VERSION,
            uptime_ms: self.started.elapsed().as_millis() as u64,
            sandbox_id: self.sandbox_id.lock().unwrap_or_else(|e| e.into_inner()).clone(),
            generation: self.generation.load(Ordering::SeqCst),
            eval_available: self.interp.is_some(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::reseed_python;

    #[test]
    fn the_interpreter_is_reseeded_from_two_halves_of_the_host_seed() {
        let seed: Vec<u8> = (1..=16).collect();
        let code = reseed_python(&seed);
        assert!(code.contains(".seed(0x0102030405060708)"), "{code}");
        // numpy's key: the second half as little-endian 32-bit words.
        assert!(code.contains(&format!(".random.seed([{}, {}])", 0x0c0b0a09u32, 0x100f0e0du32)), "{code}");
    }

    #[test]
    fn without_a_seed_the_interpreter_reseeds_from_the_kernel() {
        for seed in [&[][..], &[9][..]] {
            let code = reseed_python(seed);
            assert!(code.contains("['random'].seed()") && code.contains("random.seed()\n"), "{code}");
        }
    }
}
