//! The fan-out process of a fork of a running VM (`fork_running`): one copy of the paused
//! source that forks the children while the source runs again, and tells the source
//! their pids through a pipe.
//!
//! The pipe carries one little-endian `i64` per record: a child's pid (positive), or the
//! negated errno of the `fork()` that stopped the loop. The source reads as many records
//! as it asked for children, or until the first failure or the end of the pipe (the
//! fan-out process died), then reaps the fan-out process; by then its children have
//! been handed to the source, which is their subreaper.

use super::fork_running::ForkRunningError;
use crate::host::process::fork_and_run;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// The fan-out process's end of the pipe.
#[derive(Debug)]
pub struct Reporter {
    pipe: File,
}

impl Reporter {
    /// A child's VMM was forked.
    pub fn started(&mut self, pid: libc::pid_t) {
        self.send(i64::from(pid));
    }

    /// Forking the next child failed; no more follow.
    pub fn failed(&mut self, e: &std::io::Error) {
        self.send(-i64::from(e.raw_os_error().unwrap_or(libc::EIO).max(1)));
    }

    fn send(&mut self, record: i64) {
        // If the source stopped reading, nobody is left to tell.
        let _ = self.pipe.write_all(&record.to_le_bytes());
    }
}

/// A running fan-out process, seen from the source.
#[derive(Debug)]
pub struct FanOut {
    pid: libc::pid_t,
    reports: File,
}

/// Forks the fan-out process, which runs `body` and exits with its result. The caller
/// must be single-threaded in the sense of [`fork_and_run`] (only the calling thread
/// exists in the copy).
pub fn start(body: impl FnOnce(&mut Reporter) -> i32) -> std::io::Result<FanOut> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills the two-element array we own.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pipe2 just opened both descriptors; nothing else owns them.
    let (read_end, write_end) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let (read_raw, write_raw) = (read_end.as_raw_fd(), write_end.as_raw_fd());
    let pid = fork_and_run(false, move || {
        // SAFETY: in the fan-out process: its copy of the read end is ours to close,
        // and its copy of the write end is ours alone (the source keeps the originals).
        unsafe { libc::close(read_raw) };
        // SAFETY: as above; the File owns the write end from here.
        let mut reporter = Reporter { pipe: unsafe { File::from_raw_fd(write_raw) } };
        body(&mut reporter)
    })?;
    drop(write_end);
    Ok(FanOut { pid, reports: File::from(read_end) })
}

impl FanOut {
    /// Reads the pids of `wanted` children (stopping at a failure or when the fan-out
    /// process went away), then reaps the fan-out process. Returns the children that
    /// started, and what stopped the others.
    pub fn collect(mut self, wanted: usize) -> (Vec<libc::pid_t>, Result<(), ForkRunningError>) {
        let mut pids = Vec::with_capacity(wanted);
        let mut outcome = Ok(());
        while pids.len() < wanted {
            let mut record = [0u8; 8];
            if self.reports.read_exact(&mut record).is_err() {
                outcome = Err(ForkRunningError::FanOutLost { done: pids.len(), wanted });
                break;
            }
            match i64::from_le_bytes(record) {
                pid if pid > 0 && pid <= i64::from(i32::MAX) => pids.push(pid as libc::pid_t),
                errno if errno < 0 && errno >= -i64::from(i32::MAX) => {
                    let source = std::io::Error::from_raw_os_error((-errno) as i32);
                    outcome = Err(ForkRunningError::Fork { index: pids.len(), done: pids.len(), source });
                    break;
                }
                _ => {
                    outcome = Err(ForkRunningError::FanOutLost { done: pids.len(), wanted });
                    break;
                }
            }
        }
        self.reap();
        (pids, outcome)
    }

    /// Waits for the fan-out process; once it is gone, its children are the source's.
    fn reap(&self) {
        let mut status = 0;
        loop {
            // SAFETY: waits for our own child; `status` is a valid out pointer.
            let r = unsafe { libc::waitpid(self.pid, &mut status, 0) };
            if r >= 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The fan-out bodies below only write to the pipe: safe in a copy of a multi-threaded
    // test process.

    #[test]
    fn every_reported_child_is_collected() {
        let fan_out = start(|r| {
            for pid in [101, 102, 103] {
                r.started(pid);
            }
            0
        })
        .unwrap();
        let (pids, outcome) = fan_out.collect(3);
        assert_eq!(pids, vec![101, 102, 103]);
        outcome.unwrap();
    }

    #[test]
    fn a_failed_fork_stops_the_collection_and_names_its_index_and_errno() {
        let fan_out = start(|r| {
            r.started(7);
            r.failed(&std::io::Error::from_raw_os_error(libc::EAGAIN));
            1
        })
        .unwrap();
        let (pids, outcome) = fan_out.collect(4);
        assert_eq!(pids, vec![7]);
        match outcome {
            Err(ForkRunningError::Fork { index: 1, done: 1, source }) => {
                assert_eq!(source.raw_os_error(), Some(libc::EAGAIN))
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_fan_out_process_that_ends_early_is_reported_lost() {
        let fan_out = start(|r| {
            r.started(9);
            0
        })
        .unwrap();
        let (pids, outcome) = fan_out.collect(3);
        assert_eq!(pids, vec![9]);
        assert!(matches!(outcome, Err(ForkRunningError::FanOutLost { done: 1, wanted: 3 })), "{outcome:?}");
    }
}
