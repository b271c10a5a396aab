//! Background processes (`proc_*` requests): the agent starts a command, keeps it and
//! its output (a bounded ring per process, `ring`), and lets any number of later
//! connections attach to it (`attach`), feed its stdin, resize its terminal (`pty`) and
//! signal it, while the process outlives them all. Unlike an `exec`, nothing ends when a
//! connection does: a client that went away attaches again from the offset it had.
//!
//! The table lives in the agent's memory, so a fork or branch of the sandbox has the
//! same processes (copied with the guest) and the same output; only the connections
//! attached to them stay behind. At most [`MAX_PROCS`] are kept: a new one takes the
//! place of the oldest that ended, and is refused when all of them run.

mod attach;
pub mod pty;
pub mod ring;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use forkvm_proto::procs::{DEFAULT_RING_BYTES, MAX_PROCS, MAX_RING_BYTES, MAX_TAG};
use forkvm_proto::{
    read_frame, AgentError, ErrorKind, ExitStatus, FrameKind, ProcInfo, ProcInputRequest, ProcResizeRequest,
    ProcStartRequest, PtySize, Response, DATA_CHUNK,
};

use crate::exec::Running;
use crate::reaper::{decode_status, Reaper};
use crate::server::ServeError;
use ring::{OutputRing, Stream};

pub use attach::attach;

/// How long output is still read after the process exited (something it left behind may
/// hold its pipes or terminal open).
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(250);

/// One background process.
#[derive(Debug)]
pub struct Proc {
    pid: u32,
    argv: Vec<String>,
    tag: Option<String>,
    started_at_unix_ms: u64,
    started: Instant,
    state: Mutex<ProcState>,
    /// Woken on new output, the exit, and the end of output.
    changed: Condvar,
}

#[derive(Debug)]
struct ProcState {
    ring: OutputRing,
    /// Where input goes: the stdin pipe, or the terminal's master.
    input: Option<File>,
    /// The terminal's master and size, on one.
    terminal: Option<(File, PtySize)>,
    exit: Option<(ExitStatus, Instant)>,
    /// Its timeout passed and its group was killed.
    timed_out: bool,
    /// Output readers still reading.
    readers: usize,
}

impl Proc {
    fn lock(&self) -> MutexGuard<'_, ProcState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn info(&self) -> ProcInfo {
        let st = self.lock();
        ProcInfo {
            pid: self.pid,
            argv: self.argv.clone(),
            tag: self.tag.clone(),
            pty: st.terminal.as_ref().map(|(_, size)| *size),
            started_at_unix_ms: self.started_at_unix_ms,
            output_end: st.ring.end(),
            output_start: st.ring.start(),
            stdin_open: st.input.is_some() && st.exit.is_none(),
            // Shown once the output is complete too, so a caller that saw the exit reads
            // all of it (the readers may still be draining the pipes right after it).
            exit: st.exit.as_ref().filter(|_| Proc::output_ended(&st)).map(|(status, _)| status.clone()),
        }
    }

    /// Whether its output is complete: it exited and its readers are done (or had their
    /// time after the exit).
    fn output_ended(st: &ProcState) -> bool {
        st.exit.as_ref().is_some_and(|(_, at)| st.readers == 0 || at.elapsed() >= DRAIN_AFTER_EXIT)
    }

    /// Reads `from` into the ring until it ends (EOF, or EIO once a terminal's last
    /// holder closed it).
    fn read_output(self: Arc<Self>, mut from: File, stream: Stream) {
        let mut buf = vec![0u8; DATA_CHUNK];
        loop {
            match from.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    self.lock().ring.push(stream, &buf[..n]);
                    self.changed.notify_all();
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        self.lock().readers -= 1;
        self.changed.notify_all();
    }
}

/// The background processes of this agent.
#[derive(Debug, Default)]
pub struct Procs {
    table: Mutex<BTreeMap<u32, Arc<Proc>>>,
}

impl Procs {
    fn table(&self) -> MutexGuard<'_, BTreeMap<u32, Arc<Proc>>> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn get(&self, pid: u32) -> Result<Arc<Proc>, AgentError> {
        self.table()
            .get(&pid)
            .cloned()
            .ok_or_else(|| AgentError::new(ErrorKind::NotFound, format!("no background process has pid {pid}")))
    }

    /// Starts `req`'s command in the background.
    pub fn start(&self, req: &ProcStartRequest, reaper: &Reaper, running: &Arc<Running>) -> Response {
        self.start_checked(req, reaper, running).map_or_else(Response::Error, Response::Proc)
    }

    fn start_checked(
        &self,
        req: &ProcStartRequest,
        reaper: &Reaper,
        running: &Arc<Running>,
    ) -> Result<ProcInfo, AgentError> {
        let invalid = |m: String| AgentError::new(ErrorKind::InvalidInput, m);
        let ring_bytes = req.ring_bytes.unwrap_or(DEFAULT_RING_BYTES);
        if !(1..=MAX_RING_BYTES).contains(&ring_bytes) {
            return Err(invalid(format!("ring_bytes {ring_bytes} is not in 1..={MAX_RING_BYTES}")));
        }
        if req.tag.as_ref().is_some_and(|t| t.len() > MAX_TAG) {
            return Err(invalid(format!("a tag is at most {MAX_TAG} bytes")));
        }
        if let Some(size) = req.pty.filter(|s| !s.is_valid()) {
            return Err(invalid(format!("a terminal of {}x{} (rows and columns are 1..=1000)", size.rows, size.cols)));
        }
        self.make_room()?;
        let argv = crate::exec::argv_of(&req.command);
        let mut program = crate::exec::program_for(&req.command, &req.env, req.cwd.as_ref(), req.user.as_ref())?;
        let terminal = match req.pty {
            Some(size) => {
                let pty = pty::open(size).map_err(|e| AgentError::from_io("opening a terminal", &e))?;
                program.on_terminal(&pty.slave_path);
                Some((pty.master, size))
            }
            None => {
                program.stdin_piped(true);
                None
            }
        };
        let started = Instant::now();
        // The exit callback needs the process, which needs the pid: it reaches it
        // through this slot, filled before the reaper can call it (the reaper waits for
        // its lock, held by spawn_program, and the slot is set right after).
        let slot: Arc<Mutex<Option<Arc<Proc>>>> = Arc::new(Mutex::new(None));
        let on_exit = {
            let slot = slot.clone();
            let running = running.clone();
            Box::new(move |status: i32| {
                let Some(proc) = slot.lock().unwrap_or_else(|p| p.into_inner()).take() else { return };
                running.remove(proc.pid as libc::pid_t);
                let (code, signal) = decode_status(status);
                let mut st = proc.lock();
                let duration_ms = proc.started.elapsed().as_millis() as u64;
                let timed_out = st.timed_out;
                st.exit = Some((ExitStatus { code, signal, timed_out, duration_ms }, Instant::now()));
                drop(st);
                proc.changed.notify_all();
            })
        };
        let mut slot_guard = slot.lock().unwrap_or_else(|p| p.into_inner());
        let spawned = reaper
            .spawn_program(&program, on_exit)
            .map_err(|e| AgentError::from_io(&format!("spawning {argv:?}"), &e))?;
        let input = match &terminal {
            Some((master, _)) => Some(master.try_clone().map_err(|e| AgentError::from_io("sharing the terminal", &e))?),
            None => spawned.stdin,
        };
        let outputs: Vec<(File, Stream)> = match &terminal {
            Some((master, _)) => {
                vec![(master.try_clone().map_err(|e| AgentError::from_io("sharing the terminal", &e))?, Stream::Stdout)]
            }
            None => [(spawned.stdout, Stream::Stdout), (spawned.stderr, Stream::Stderr)]
                .into_iter()
                .filter_map(|(f, s)| Some((f?, s)))
                .collect(),
        };
        let proc = Arc::new(Proc {
            pid: spawned.pid as u32,
            argv,
            tag: req.tag.clone(),
            started_at_unix_ms: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64),
            started,
            state: Mutex::new(ProcState {
                ring: OutputRing::new(ring_bytes),
                input,
                terminal,
                exit: None,
                timed_out: false,
                readers: outputs.len(),
            }),
            changed: Condvar::new(),
        });
        *slot_guard = Some(proc.clone());
        drop(slot_guard);
        running.add(spawned.pid);
        for (from, stream) in outputs {
            let proc = proc.clone();
            std::thread::spawn(move || proc.read_output(from, stream));
        }
        if let Some(ms) = req.timeout_ms {
            let proc = proc.clone();
            std::thread::spawn(move || kill_after(&proc, Duration::from_millis(ms)));
        }
        self.table().insert(proc.pid, proc.clone());
        Ok(proc.info())
    }

    /// Drops the oldest ended process when the table is full; an error when every one
    /// of them still runs.
    fn make_room(&self) -> Result<(), AgentError> {
        let mut table = self.table();
        if table.len() < MAX_PROCS {
            return Ok(());
        }
        let oldest_ended =
            table.values().filter(|p| p.lock().exit.is_some()).min_by_key(|p| p.started_at_unix_ms).map(|p| p.pid);
        match oldest_ended {
            Some(pid) => {
                table.remove(&pid);
                Ok(())
            }
            None => Err(AgentError::new(
                ErrorKind::Unsupported,
                format!("{MAX_PROCS} background processes run already; end one first"),
            )),
        }
    }

    /// Every process kept, by pid.
    pub fn list(&self) -> Response {
        let procs: Vec<Arc<Proc>> = self.table().values().cloned().collect();
        Response::Procs { procs: procs.iter().map(|p| p.info()).collect() }
    }

    /// Writes the `Stdin` frames that follow to the process's input (discarding them
    /// once it takes no more), closing it after `End` when asked.
    pub fn input(&self, conn: &mut UnixStream, req: &ProcInputRequest) -> Result<Response, ServeError> {
        let proc = self.get(req.pid);
        let mut written = 0u64;
        let mut failed = None;
        loop {
            let frame = read_frame(conn).map_err(ServeError::ReceiveInput)?;
            match frame.kind {
                FrameKind::Stdin => {
                    let Ok(proc) = &proc else { continue };
                    if failed.is_none() {
                        match write_input(proc, &frame.payload) {
                            Ok(()) => written += frame.payload.len() as u64,
                            Err(e) => failed = Some(e),
                        }
                    }
                }
                FrameKind::End => break,
                kind => return Err(ServeError::UnexpectedFrame { step: "proc_input", kind }),
            }
        }
        let proc = match proc {
            Ok(p) => p,
            Err(e) => return Ok(Response::Error(e)),
        };
        if let Some(e) = failed {
            return Ok(Response::Error(e));
        }
        if req.close {
            close_input(&proc);
        }
        Ok(Response::Written { bytes: written })
    }

    /// Sets the process's terminal size.
    pub fn resize(&self, req: &ProcResizeRequest) -> Response {
        match self.get(req.pid).and_then(|p| resize(&p, req.size)) {
            Ok(()) => Response::Done,
            Err(e) => Response::Error(e),
        }
    }
}

/// Writes `bytes` to the process's input.
fn write_input(proc: &Proc, bytes: &[u8]) -> Result<(), AgentError> {
    // A clone, so a full pipe blocks this writer, not everyone who looks at the process.
    let input = proc.lock().input.as_ref().map(File::try_clone);
    match input {
        None => Err(AgentError::new(ErrorKind::InvalidInput, format!("process {}'s stdin is closed", proc.pid))),
        Some(Err(e)) => Err(AgentError::from_io("sharing the process's stdin", &e)),
        Some(Ok(mut f)) => f.write_all(bytes).map_err(|e| AgentError::from_io("writing the process's stdin", &e)),
    }
}

/// Ends the process's input: closes its stdin pipe, or sends its terminal's EOF
/// character (a terminal stays open for output).
fn close_input(proc: &Proc) {
    let mut st = proc.lock();
    if st.terminal.is_some() {
        if let Some(f) = st.input.as_mut() {
            // ^D at the start of a line: the reader's read returns 0.
            let _ = f.write_all(b"\x04");
        }
    } else {
        st.input = None;
    }
}

fn resize(proc: &Proc, size: PtySize) -> Result<(), AgentError> {
    if !size.is_valid() {
        return Err(AgentError::new(
            ErrorKind::InvalidInput,
            format!("a terminal of {}x{} (rows and columns are 1..=1000)", size.rows, size.cols),
        ));
    }
    let mut st = proc.lock();
    let Some((master, current)) = st.terminal.as_mut() else {
        return Err(AgentError::new(ErrorKind::InvalidInput, format!("process {} has no terminal", proc.pid)));
    };
    pty::resize(master, size).map_err(|e| AgentError::from_io("resizing the terminal", &e))?;
    *current = size;
    Ok(())
}

/// Kills the process's group once `limit` passed, unless it ended first.
fn kill_after(proc: &Proc, limit: Duration) {
    let deadline = proc.started + limit;
    let mut st = proc.lock();
    loop {
        if st.exit.is_some() {
            return;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        st = proc.changed.wait_timeout(st, left).unwrap_or_else(|p| p.into_inner()).0;
    }
    // Marked before the kill: the exit callback sees it and reports `timed_out`.
    st.timed_out = true;
    drop(st);
    crate::exec::kill_group(proc.pid as libc::pid_t);
}
