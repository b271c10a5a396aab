//! The `proc_attach` conversation: a background process's output from an offset, as it
//! comes when following, while the host's `Stdin` frames go to the process and its
//! `Control` frames resize the terminal or end the input. A hang-up detaches; the
//! process runs on.

use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use forkvm_proto::{
    read_frame, write_frame, write_json, AgentError, ErrorKind, FrameKind, ProcAttachRequest, ProcControl, ProcNews,
    Response, DATA_CHUNK,
};

use super::ring::Stream;
use super::{close_input, resize, write_input, Proc, Procs};
use crate::server::ServeError;

/// How long an attachment stays silent before a keepalive (which also finds a host that
/// went away while nothing happened).
const KEEPALIVE: Duration = Duration::from_secs(5);
/// How often an ended process is looked at while its output drains.
const DRAIN_LOOK: Duration = Duration::from_millis(50);
/// Output sent per look at the ring (the lock is not held while it goes out).
const BATCH: usize = 256 << 10;

/// Runs one attachment on `conn`; returns the final response.
pub fn attach(conn: &mut UnixStream, req: &ProcAttachRequest, procs: &Procs) -> Result<Response, ServeError> {
    let proc = match procs.get(req.pid) {
        Ok(p) => p,
        Err(e) => return Ok(Response::Error(e)),
    };
    let (start, end) = {
        let st = proc.lock();
        (st.ring.start(), st.ring.end())
    };
    let asked = req.offset.unwrap_or(start);
    if asked > end {
        let message = format!("offset {asked} is past the end of process {}'s output ({end})", req.pid);
        return Ok(Response::Error(AgentError::new(ErrorKind::InvalidInput, message)));
    }
    let mut offset = asked.max(start);
    news(conn, &ProcNews::Attached { offset, skipped: offset - asked })?;
    let left = Arc::new(AtomicBool::new(false));
    let host = conn.try_clone().map_err(ServeError::CloneConnection)?;
    {
        let (proc, left) = (proc.clone(), left.clone());
        std::thread::spawn(move || take_host_frames(host, &proc, &left));
    }
    let outcome = stream(conn, req, &proc, &left, &mut offset);
    // Ends the host-frame thread's read (the host may still be sending).
    let _ = conn.shutdown(Shutdown::Read);
    outcome
}

/// Sends output from `offset` until the conversation is over.
fn stream(
    conn: &mut UnixStream,
    req: &ProcAttachRequest,
    proc: &Proc,
    left: &AtomicBool,
    offset: &mut u64,
) -> Result<Response, ServeError> {
    loop {
        let (batch, gap, done, quiet) = {
            let mut st = proc.lock();
            let mut quiet = false;
            while st.ring.end() == *offset && !Proc::output_ended(&st) && !left.load(Ordering::SeqCst) && req.follow {
                let wait = if st.exit.is_some() { DRAIN_LOOK } else { KEEPALIVE };
                let (guard, waited) = proc.changed.wait_timeout(st, wait).unwrap_or_else(|p| p.into_inner());
                st = guard;
                if waited.timed_out() && st.exit.is_none() {
                    quiet = true;
                    break;
                }
            }
            // A follower that fell behind the ring resumes at its oldest byte.
            let gap = st.ring.start().saturating_sub(*offset);
            *offset += gap;
            let batch = st.ring.read_from(*offset, DATA_CHUNK, BATCH);
            let caught_up = *offset + batch.iter().map(|(_, b)| b.len() as u64).sum::<u64>() == st.ring.end();
            let done = caught_up && (!req.follow || Proc::output_ended(&st));
            (batch, gap, done, quiet)
        };
        if left.load(Ordering::SeqCst) {
            return Err(ServeError::HostLeft);
        }
        if gap > 0 {
            news(conn, &ProcNews::Attached { offset: *offset, skipped: gap })?;
        }
        for (stream, bytes) in &batch {
            let kind = match stream {
                Stream::Stdout => FrameKind::Stdout,
                Stream::Stderr => FrameKind::Stderr,
            };
            write_frame(conn, kind, bytes).map_err(|_| ServeError::HostLeft)?;
            *offset += bytes.len() as u64;
        }
        if done {
            return Ok(Response::Proc(proc.info()));
        }
        if quiet && batch.is_empty() {
            news(conn, &ProcNews::Keepalive)?;
        }
    }
}

fn news(conn: &mut UnixStream, n: &ProcNews) -> Result<(), ServeError> {
    write_json(conn, FrameKind::ProcNews, n).map_err(|_| ServeError::HostLeft)
}

/// The host's frames on an attachment: input, resizes and the end of input, until it
/// hangs up (or sends something else), which detaches.
fn take_host_frames(mut host: UnixStream, proc: &Proc, left: &AtomicBool) {
    while let Ok(frame) = read_frame(&mut host) {
        match frame.kind {
            // Input for a process that takes none any more is dropped, as a closed
            // pipe's would be.
            FrameKind::Stdin => {
                let _ = write_input(proc, &frame.payload);
            }
            FrameKind::Control => match frame.json::<ProcControl>() {
                Ok(ProcControl::Resize { size }) => {
                    if let Err(e) = resize(proc, size) {
                        tracing::debug!(error = %e, "an attachment's resize");
                    }
                }
                Ok(ProcControl::CloseStdin) => close_input(proc),
                Err(_) => break,
            },
            // No more input from this host; it still reads.
            FrameKind::End => {}
            _ => break,
        }
    }
    left.store(true, Ordering::SeqCst);
    proc.changed.notify_all();
}
