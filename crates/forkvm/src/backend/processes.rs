//! Background processes both ways ([`Processes`]): through the sandbox's agent on this
//! host, or through the daemon's `/v1/sandboxes/{id}/processes*`. Both speak the API's
//! types, so `forkvm proc` and `forkvm shell` print and behave the same either way.

use crate::remote_cmd::RemoteArgs;
use anyhow::{Context, Result};
use forkvm_client::api::{ProcessInfo, ProcessOutputEvent, StartProcessRequest, TerminalSize};
use forkvm_client::{Client, ProcessSocket, SocketEvent, SocketInput};
use forkvm_proto::{AgentClient, ClientError, ProcAttachRequest, ProcAttachment, ProcEvent, ProcInput};
use forkvm_sandbox::process_view;
use forkvm_sandbox::registry::Registry;
use std::io::Read;
use std::os::unix::net::UnixStream;

/// The process verbs.
pub trait Processes: Send + Sync {
    fn start(&self, id: &str, req: &StartProcessRequest) -> Result<ProcessInfo>;
    fn list(&self, id: &str) -> Result<Vec<ProcessInfo>>;
    /// Hands `on_event` the output lines from `offset` (`from` first) until it returns
    /// `false` (`Ok(None)`) or the end (`Ok(Some(process))`).
    fn output(
        &self,
        id: &str,
        pid: u32,
        offset: Option<u64>,
        follow: bool,
        on_event: &mut dyn FnMut(&ProcessOutputEvent) -> bool,
    ) -> Result<Option<ProcessInfo>>;
    fn input(&self, id: &str, pid: u32, src: &mut dyn Read, close: bool) -> Result<u64>;
    fn signal(&self, id: &str, pid: u32, signal: i32) -> Result<()>;
    fn resize(&self, id: &str, pid: u32, size: TerminalSize) -> Result<()>;
    /// One connection that reads the output from `offset` as it comes and takes input
    /// and resizes: a terminal session's.
    fn attach(&self, id: &str, pid: u32, offset: Option<u64>) -> Result<Box<dyn Attached>>;
}

/// What an attachment brings ([`Processes::attach`]).
#[derive(Debug)]
pub enum AttachedEvent {
    /// Output (stdout or stderr; a terminal's is all stdout).
    Output(Vec<u8>),
    /// Something else: the offset, a keepalive.
    Other,
    /// The process ended and its output all came.
    End(ProcessInfo),
}

/// An attachment's reading side; dropping it detaches.
pub trait Attached: Send {
    /// The next event; `None` once detached.
    fn next(&mut self) -> Result<Option<AttachedEvent>>;
    /// A handle that types and resizes from another thread.
    fn input(&self) -> Result<Box<dyn AttachedInput>>;
}

/// An attachment's writing side.
pub trait AttachedInput: Send {
    fn send(&mut self, bytes: &[u8]) -> Result<()>;
    fn resize(&mut self, size: TerminalSize) -> Result<()>;
    fn close_stdin(&mut self) -> Result<()>;
    /// Ends the attachment (its reader sees the end soon after); the process runs on.
    fn detach(&mut self);
}

/// The process verbs `remote` asks for.
pub fn open(remote: &RemoteArgs) -> Result<Box<dyn Processes>> {
    Ok(match remote.client()? {
        Some(client) => Box::new(ThroughDaemon(client)),
        None => Box::new(OnThisHost(Registry::open_default())),
    })
}

struct ThroughDaemon(Client);

impl Processes for ThroughDaemon {
    fn start(&self, id: &str, req: &StartProcessRequest) -> Result<ProcessInfo> {
        Ok(self.0.start_process(id, req)?)
    }

    fn list(&self, id: &str) -> Result<Vec<ProcessInfo>> {
        Ok(self.0.list_processes(id)?)
    }

    fn output(
        &self,
        id: &str,
        pid: u32,
        offset: Option<u64>,
        follow: bool,
        on_event: &mut dyn FnMut(&ProcessOutputEvent) -> bool,
    ) -> Result<Option<ProcessInfo>> {
        Ok(self.0.process_output(id, pid, offset, follow, on_event)?)
    }

    fn input(&self, id: &str, pid: u32, src: &mut dyn Read, close: bool) -> Result<u64> {
        Ok(self.0.process_input(id, pid, src, close)?)
    }

    fn signal(&self, id: &str, pid: u32, signal: i32) -> Result<()> {
        Ok(self.0.signal_process(id, pid, signal)?)
    }

    fn resize(&self, id: &str, pid: u32, size: TerminalSize) -> Result<()> {
        Ok(self.0.resize_process(id, pid, size)?)
    }

    fn attach(&self, id: &str, pid: u32, offset: Option<u64>) -> Result<Box<dyn Attached>> {
        let socket = self.0.attach_process(id, pid, offset)?;
        Ok(Box::new(socket))
    }
}

impl Attached for ProcessSocket {
    fn next(&mut self) -> Result<Option<AttachedEvent>> {
        Ok(self.recv()?.map(|e| match e {
            SocketEvent::Stdout(b) | SocketEvent::Stderr(b) => AttachedEvent::Output(b),
            SocketEvent::End(p) => AttachedEvent::End(p),
            SocketEvent::From { .. } | SocketEvent::Keepalive => AttachedEvent::Other,
        }))
    }

    fn input(&self) -> Result<Box<dyn AttachedInput>> {
        Ok(Box::new(ProcessSocket::input(self)))
    }
}

impl AttachedInput for SocketInput {
    fn send(&mut self, bytes: &[u8]) -> Result<()> {
        Ok(SocketInput::send(self, bytes)?)
    }

    fn resize(&mut self, size: TerminalSize) -> Result<()> {
        Ok(SocketInput::resize(self, size)?)
    }

    fn close_stdin(&mut self) -> Result<()> {
        Ok(SocketInput::close_stdin(self)?)
    }

    fn detach(&mut self) {
        SocketInput::detach(self)
    }
}

struct OnThisHost(Registry);

impl OnThisHost {
    /// `f` on sandbox `id`'s agent; its error names `what` and, for an agent older than
    /// background processes, says so.
    fn call<T>(
        &self,
        id: &str,
        what: impl FnOnce() -> String,
        f: impl FnOnce(&AgentClient<UnixStream>) -> Result<T, ClientError>,
    ) -> Result<T> {
        let agent = forkvm_sandbox::verbs::agent(&self.0, id)?;
        f(&agent)
            .map_err(|e| match process_view::agent_too_old(id, &e) {
                Some(message) => anyhow::anyhow!(message),
                None => e.into(),
            })
            .with_context(what)
    }
}

impl Processes for OnThisHost {
    fn start(&self, id: &str, req: &StartProcessRequest) -> Result<ProcessInfo> {
        let agent_req = process_view::agent_request(req)?;
        let started = self.call(id, || format!("starting in sandbox {id}"), |a| a.proc_start(&agent_req))?;
        Ok(process_view::info(started))
    }

    fn list(&self, id: &str) -> Result<Vec<ProcessInfo>> {
        let procs = self.call(id, || format!("listing sandbox {id}'s processes"), |a| a.proc_list())?;
        Ok(procs.into_iter().map(process_view::info).collect())
    }

    fn output(
        &self,
        id: &str,
        pid: u32,
        offset: Option<u64>,
        follow: bool,
        on_event: &mut dyn FnMut(&ProcessOutputEvent) -> bool,
    ) -> Result<Option<ProcessInfo>> {
        let what = || format!("reading process {pid} of sandbox {id}");
        let attachment = self.call(id, what, |a| a.proc_attach(&ProcAttachRequest { pid, offset, follow }))?;
        let mut end = None;
        process_view::relay(attachment, &mut |e| match e {
            ProcessOutputEvent::End { process } => {
                end = Some(process);
                false
            }
            e => on_event(&e),
        })
        .with_context(what)?;
        Ok(end)
    }

    fn input(&self, id: &str, pid: u32, src: &mut dyn Read, close: bool) -> Result<u64> {
        let what = || format!("input for process {pid} of sandbox {id}");
        self.call(id, what, |a| a.proc_input(pid, src, close))
    }

    fn signal(&self, id: &str, pid: u32, signal: i32) -> Result<()> {
        self.call(id, || format!("signalling process {pid} of sandbox {id}"), |a| a.signal(pid, signal))
    }

    fn resize(&self, id: &str, pid: u32, size: TerminalSize) -> Result<()> {
        let what = || format!("resizing process {pid}'s terminal in sandbox {id}");
        self.call(id, what, |a| a.proc_resize(pid, process_view::pty_size(size)))
    }

    fn attach(&self, id: &str, pid: u32, offset: Option<u64>) -> Result<Box<dyn Attached>> {
        let what = || format!("attaching to process {pid} of sandbox {id}");
        let attachment = self.call(id, what, |a| a.proc_attach(&ProcAttachRequest { pid, offset, follow: true }))?;
        Ok(Box::new(attachment))
    }
}

impl Attached for ProcAttachment<UnixStream> {
    fn next(&mut self) -> Result<Option<AttachedEvent>> {
        Ok(self.recv()?.map(|e| match e {
            ProcEvent::Stdout(b) | ProcEvent::Stderr(b) => AttachedEvent::Output(b),
            ProcEvent::End(p) => AttachedEvent::End(process_view::info(p)),
            ProcEvent::From { .. } | ProcEvent::Keepalive => AttachedEvent::Other,
        }))
    }

    fn input(&self) -> Result<Box<dyn AttachedInput>> {
        Ok(Box::new(ProcAttachment::input(self).context("a second handle on the attachment")?))
    }
}

impl AttachedInput for ProcInput {
    fn send(&mut self, bytes: &[u8]) -> Result<()> {
        Ok(ProcInput::send(self, bytes)?)
    }

    fn resize(&mut self, size: TerminalSize) -> Result<()> {
        Ok(ProcInput::resize(self, process_view::pty_size(size))?)
    }

    fn close_stdin(&mut self) -> Result<()> {
        Ok(ProcInput::close_stdin(self)?)
    }

    fn detach(&mut self) {
        ProcInput::detach(self)
    }
}
