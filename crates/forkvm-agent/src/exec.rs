//! The `exec` request: start a process in its own process group (without forking the
//! agent: spawn.rs), pump the host's stdin frames into it, stream its stdout/stderr back
//! as they are produced, enforce the timeout by killing the group, and report how it
//! ended.
//!
//! Output readers push chunks into an unbounded channel, so the child never blocks on a
//! full pipe while the host is still sending stdin (the host reads only after `End`).
//! After the process exits, output is drained until both pipes close or
//! [`DRAIN_AFTER_EXIT`] passes (a background process may keep them open).
//!
//! A request may name a guest user to run as ([`GuestUser`]) and ask for a `Started`
//! frame with the pid; running execs are listed in [`Running`] so a `signal` request can
//! reach them (and only them) while they run.

use std::collections::HashSet;
use std::ffi::OsString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

use forkvm_proto::{
    read_frame, write_frame, write_json, AgentError, ErrorKind, ExecRequest, ExitStatus, FrameKind, Response,
    SignalRequest, Started, DATA_CHUNK,
};

use crate::guest_user::GuestUser;
use crate::reaper::{decode_status, Reaper};
use crate::server::ServeError;
use crate::spawn::Program;

/// The process groups of the execs running now: what a `signal` request may reach.
#[derive(Debug, Default)]
pub struct Running {
    pgids: Mutex<HashSet<libc::pid_t>>,
}

impl Running {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<libc::pid_t>> {
        self.pgids.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lists a process group a `signal` request may reach (a background process's).
    pub fn add(&self, pgid: libc::pid_t) {
        self.lock().insert(pgid);
    }

    /// Takes a process group off the list (its leader was reaped).
    pub fn remove(&self, pgid: libc::pid_t) {
        self.lock().remove(&pgid);
    }

    /// Sends `req.signal` to the process group of a running exec.
    pub fn signal(&self, req: SignalRequest) -> Response {
        if !(1..=64).contains(&req.signal) {
            return Response::Error(AgentError::new(
                ErrorKind::InvalidInput,
                format!("signal {} is not a signal number (1..=64)", req.signal),
            ));
        }
        let Ok(pgid) = libc::pid_t::try_from(req.pid) else {
            return Response::Error(AgentError::new(
                ErrorKind::InvalidInput,
                format!("pid {} is out of range", req.pid),
            ));
        };
        // Held across kill(2): the group cannot be reaped and its pid reused meanwhile.
        let running = self.lock();
        if !running.contains(&pgid) {
            return Response::Error(AgentError::new(
                ErrorKind::NotFound,
                format!("no running exec or background process has pid {}", req.pid),
            ));
        }
        // SAFETY: kill(2) on a process group this agent created and has not reaped.
        if unsafe { libc::kill(-pgid, req.signal) } != 0 {
            let e = std::io::Error::last_os_error();
            return Response::Error(AgentError::from_io(&format!("signalling process group {pgid}"), &e));
        }
        Response::Done
    }
}

/// Removes an exec from [`Running`] when its conversation ends, however it ends.
struct Listed<'a> {
    running: &'a Running,
    pgid: libc::pid_t,
}

impl Drop for Listed<'_> {
    fn drop(&mut self) {
        self.running.lock().remove(&self.pgid);
    }
}

/// How long to keep forwarding output after the process exited.
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(250);

enum Event {
    Output(FrameKind, Vec<u8>),
    Eof,
    Exited(i32),
}

/// Runs one exec conversation on `conn` and returns the final response.
pub fn run(
    conn: &mut UnixStream,
    req: ExecRequest,
    reaper: &Reaper,
    running: &Running,
) -> Result<Response, ServeError> {
    let program = match build_program(&req) {
        Ok(program) => program,
        Err(e) => {
            if req.stdin {
                drain_input(conn, None)?;
            }
            return Ok(Response::Error(e));
        }
    };
    let (tx, rx) = mpsc::channel::<Event>();
    let exit_tx = tx.clone();
    let started = Instant::now();
    let spawned = reaper.spawn_program(
        &program,
        Box::new(move |status| {
            let _ = exit_tx.send(Event::Exited(status));
        }),
    );
    let child = match spawned {
        Ok(child) => child,
        Err(e) => {
            if req.stdin {
                drain_input(conn, None)?;
            }
            let what = format!("spawning {:?}", req.command);
            return Ok(Response::Error(AgentError::from_io(&what, &e)));
        }
    };
    let pgid = child.pid;
    running.lock().insert(pgid);
    let _listed = Listed { running, pgid };
    if req.report_start {
        write_json(conn, FrameKind::Started, &Started { pid: child.pid as u32 }).map_err(ServeError::SendOutput)?;
    }
    let pipes = [(child.stdout, FrameKind::Stdout), (child.stderr, FrameKind::Stderr)];
    for (mut pipe, kind) in pipes.into_iter().filter_map(|(p, kind)| Some((p?, kind))) {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; DATA_CHUNK];
            loop {
                match pipe.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if tx.send(Event::Output(kind, buf[..n].to_vec())).is_err() {
                            return;
                        }
                    }
                }
            }
            let _ = tx.send(Event::Eof);
        });
    }
    drop(tx);
    let stdin_pump = if req.stdin {
        let mut reader = conn.try_clone().map_err(ServeError::CloneConnection)?;
        let stdin = child.stdin;
        Some(std::thread::spawn(move || drain_input(&mut reader, stdin)))
    } else {
        None
    };
    let outcome = forward(conn, &rx, pgid, started, req.timeout_ms.map(Duration::from_millis));
    if outcome.is_err() {
        kill_group(pgid);
    }
    let (status, timed_out, duration) = outcome?;
    if let Some(pump) = stdin_pump {
        pump.join().unwrap_or(Ok(()))?;
    }
    let (code, signal) = decode_status(status);
    Ok(Response::Exit(ExitStatus { code, signal, timed_out, duration_ms: duration.as_millis() as u64 }))
}

fn build_program(req: &ExecRequest) -> Result<Program, AgentError> {
    let mut program = program_for(&req.command, &req.env, req.cwd.as_ref(), req.user.as_ref())?;
    program.stdin_piped(req.stdin);
    Ok(program)
}

/// The program of a command with its environment, working directory and user: the
/// image's defaults first (an OCI image's Env, WorkingDir, User), the request's own over
/// them.
pub(crate) fn program_for(
    command: &forkvm_proto::Command,
    env: &[(String, String)],
    cwd: Option<&String>,
    user: Option<&String>,
) -> Result<Program, AgentError> {
    let mut program = Program::new(argv_of(command).into_iter().map(OsString::from).collect());
    let defaults = crate::exec_defaults::get();
    for (k, v) in defaults.env.iter().chain(env) {
        program.env(k, v);
    }
    if let Some(cwd) = cwd.or(defaults.cwd.as_ref()) {
        program.current_dir(cwd);
    }
    if let Some(user) = user.or(defaults.user.as_ref()) {
        GuestUser::lookup(Path::new("/"), user)?.apply(&mut program);
    }
    Ok(program)
}

/// The argv a command runs as (a script through `/bin/sh -c`).
pub(crate) fn argv_of(command: &forkvm_proto::Command) -> Vec<String> {
    match command {
        forkvm_proto::Command::Argv(argv) => argv.clone(),
        forkvm_proto::Command::Shell(script) => vec!["/bin/sh".into(), "-c".into(), script.clone()],
    }
}

/// Forwards output until exit + EOFs (or the drain deadline); kills the group at the
/// timeout. Returns (raw wait status, timed out, spawn-to-exit duration).
fn forward(
    conn: &mut UnixStream,
    rx: &mpsc::Receiver<Event>,
    pgid: libc::pid_t,
    started: Instant,
    timeout: Option<Duration>,
) -> Result<(i32, bool, Duration), ServeError> {
    let kill_at = timeout.map(|t| started + t);
    let mut timed_out = false;
    let mut exited: Option<(i32, Instant)> = None;
    let mut open_pipes = 2;
    loop {
        if let Some((status, at)) = exited {
            if open_pipes == 0 {
                return Ok((status, timed_out, at - started));
            }
        }
        let wake = match exited {
            Some((_, at)) => Some(at + DRAIN_AFTER_EXIT),
            None if !timed_out => kill_at,
            None => None,
        };
        let event = match wake {
            Some(when) => rx.recv_timeout(when.saturating_duration_since(Instant::now())),
            None => rx.recv().map_err(|_| mpsc::RecvTimeoutError::Disconnected),
        };
        match event {
            Ok(Event::Output(kind, data)) => {
                write_frame(conn, kind, &data).map_err(ServeError::SendOutput)?;
            }
            Ok(Event::Eof) => open_pipes -= 1,
            Ok(Event::Exited(status)) => exited = Some((status, Instant::now())),
            Err(mpsc::RecvTimeoutError::Timeout) => match exited {
                Some((status, at)) => return Ok((status, timed_out, at - started)),
                None => {
                    kill_group(pgid);
                    timed_out = true;
                }
            },
            // Every sender is gone: the exit callback was dropped without running, which
            // only happens if the reaper thread died. Report what we know.
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = exited.map_or(-1, |(s, _)| s);
                return Ok((status, timed_out, started.elapsed()));
            }
        }
    }
}

pub(crate) fn kill_group(pgid: libc::pid_t) {
    // SAFETY: kill(2) with a negative pid signals the process group we created
    // (process_group(0) makes the child's pid its pgid); no memory is involved.
    unsafe { libc::kill(-pgid, libc::SIGKILL) };
}

/// Reads `Stdin` frames until `End`, writing them to `stdin` while the child accepts
/// them and discarding them after (so the host's writes always complete).
fn drain_input(conn: &mut UnixStream, mut stdin: Option<File>) -> Result<(), ServeError> {
    loop {
        let frame = read_frame(conn).map_err(ServeError::ReceiveInput)?;
        match frame.kind {
            FrameKind::Stdin => {
                if let Some(pipe) = stdin.as_mut() {
                    if pipe.write_all(&frame.payload).is_err() {
                        stdin = None;
                    }
                }
            }
            FrameKind::End => return Ok(()),
            kind => return Err(ServeError::UnexpectedFrame { step: "exec stdin", kind }),
        }
    }
}
