//! The one place that calls `waitpid`: reaps orphans (the agent is PID 1, or a child
//! subreaper when it is not) without stealing the exit status of processes the agent
//! spawned itself.
//!
//! SIGCHLD is blocked in every thread (so [`Reaper::start`] must run before any thread is
//! created) and read from a signalfd by the reaper thread. Spawns go through
//! [`Reaper::spawn`], which holds the registry lock across `Command::spawn` and the
//! registration; the reaper thread holds the same lock while it calls `waitpid`, so it
//! can neither reap a child before its waiter is registered nor race std's own `waitpid`
//! on a failed spawn. Statuses of registered pids go to their callback; others are
//! orphans and are dropped. [`Reaper::spawn_program`] does the same for execs, which
//! start without forking the agent (spawn.rs).
//!
//! A spawned program must not inherit that mask: a shell whose SIGCHLD stays blocked
//! sleeps for ever in `wait` once its child outlives the shell's first `waitpid`, which
//! on several vCPUs (the child runs beside the shell) happens within tens of rounds.
//! [`Reaper::spawn`] gives every child an empty mask and default signal dispositions.

use std::collections::HashMap;
use std::io;
use std::mem;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};

use crate::spawn::{Program, Spawned};

/// Called with the raw wait status when a registered child exits.
pub type ExitCallback = Box<dyn FnOnce(i32) + Send>;

/// Failures setting up the reaper, by step.
#[derive(Debug, thiserror::Error)]
pub enum ReaperError {
    /// `pthread_sigmask(SIG_BLOCK, SIGCHLD)` failed.
    #[error("blocking SIGCHLD: {0}")]
    BlockSigchld(io::Error),
    /// `signalfd` failed.
    #[error("creating the SIGCHLD signalfd: {0}")]
    Signalfd(io::Error),
    /// Spawning the reaper thread failed.
    #[error("spawning the reaper thread: {0}")]
    SpawnThread(io::Error),
}

/// Registry of the agent's own children plus the reaping thread.
pub struct Reaper {
    waiters: Mutex<HashMap<libc::pid_t, ExitCallback>>,
}

impl std::fmt::Debug for Reaper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reaper").finish_non_exhaustive()
    }
}

impl Reaper {
    /// Blocks SIGCHLD, becomes a child subreaper, and starts the reaper thread.
    /// Call before creating any other thread.
    pub fn start() -> Result<Arc<Self>, ReaperError> {
        // SAFETY: sigset_t is plain data; sigemptyset/sigaddset initialize it fully.
        let mut set: libc::sigset_t = unsafe { mem::zeroed() };
        // SAFETY: `set` is a valid, writable sigset_t.
        unsafe {
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGCHLD);
        }
        // SAFETY: `set` is initialized; a null old-set pointer is allowed.
        let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
        if rc != 0 {
            return Err(ReaperError::BlockSigchld(io::Error::from_raw_os_error(rc)));
        }
        // SAFETY: plain prctl with integer arguments; failure only means orphans of our
        // children go to the real init instead of us, which is harmless.
        unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
        // SAFETY: `set` is initialized; -1 asks for a new fd.
        let fd = unsafe { libc::signalfd(-1, &set, libc::SFD_CLOEXEC) };
        if fd < 0 {
            return Err(ReaperError::Signalfd(io::Error::last_os_error()));
        }
        // SAFETY: signalfd just returned this fd and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let reaper = Arc::new(Self { waiters: Mutex::new(HashMap::new()) });
        let thread_reaper = reaper.clone();
        std::thread::Builder::new()
            .name("reaper".into())
            .spawn(move || thread_reaper.run(fd))
            .map_err(ReaperError::SpawnThread)?;
        Ok(reaper)
    }

    /// Spawns `cmd` with nothing blocked and every signal at its default action, and
    /// registers `on_exit` for its pid, atomically with respect to reaping.
    pub fn spawn(&self, cmd: &mut Command, on_exit: ExitCallback) -> io::Result<Child> {
        // SAFETY: `reset_signals` only calls async-signal-safe functions.
        unsafe { cmd.pre_exec(reset_signals) };
        let mut waiters = self.waiters.lock().unwrap_or_else(|e| e.into_inner());
        let child = cmd.spawn()?;
        waiters.insert(child.id() as libc::pid_t, on_exit);
        Ok(child)
    }

    /// Starts `program` (posix_spawn, see spawn.rs) and registers `on_exit` for its
    /// pid, atomically with respect to reaping.
    pub fn spawn_program(&self, program: &Program, on_exit: ExitCallback) -> io::Result<Spawned> {
        let mut waiters = self.waiters.lock().unwrap_or_else(|e| e.into_inner());
        let spawned = program.spawn()?;
        waiters.insert(spawned.pid, on_exit);
        Ok(spawned)
    }

    fn run(&self, fd: OwnedFd) {
        let mut info = [0u8; mem::size_of::<libc::signalfd_siginfo>()];
        loop {
            self.reap_all();
            // SAFETY: reading into a buffer of exactly the buffer's length from our fd.
            let n = unsafe { libc::read(fd.as_raw_fd(), info.as_mut_ptr().cast(), info.len()) };
            if n < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                tracing::error!(error = %io::Error::last_os_error(), "reading SIGCHLD signalfd; reaper stops");
                return;
            }
        }
    }

    /// Reaps every exited child (non-blocking), under the registry lock.
    fn reap_all(&self) {
        let mut waiters = self.waiters.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let mut status = 0;
            // SAFETY: `status` is a valid out-pointer; WNOHANG never blocks.
            let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
            if pid <= 0 {
                return;
            }
            match waiters.remove(&pid) {
                Some(callback) => callback(status),
                None => tracing::debug!(pid, status, "reaped orphan"),
            }
        }
    }
}

/// The kernel's `struct sigaction` on x86-64, for `rt_sigaction` without libc (libc
/// refuses the signals it keeps for itself, 32 and 33, which may still be ignored).
#[repr(C)]
struct KernelSigaction {
    handler: usize,
    flags: u64,
    restorer: usize,
    mask: u64,
}

/// In a forked child before `exec`: unblocks every signal and sets every catchable one
/// back to its default action (the agent blocks SIGCHLD; what started the agent may have
/// ignored others).
fn reset_signals() -> io::Result<()> {
    let default = KernelSigaction { handler: libc::SIG_DFL, flags: 0, restorer: 0, mask: 0 };
    let empty: u64 = 0;
    // SAFETY: raw rt_sigprocmask/rt_sigaction (async-signal-safe) with pointers to
    // locals of the kernel's layouts and their size (8 bytes of signal mask).
    unsafe {
        if libc::syscall(libc::SYS_rt_sigprocmask, libc::SIG_SETMASK, &empty, std::ptr::null_mut::<u64>(), 8) != 0 {
            return Err(io::Error::last_os_error());
        }
        for sig in 1..=64 {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::syscall(libc::SYS_rt_sigaction, sig, &default, std::ptr::null_mut::<KernelSigaction>(), 8);
            }
        }
    }
    Ok(())
}

/// Decodes a raw wait status into (exit code, terminating signal).
pub fn decode_status(status: i32) -> (Option<i32>, Option<i32>) {
    if libc::WIFEXITED(status) {
        (Some(libc::WEXITSTATUS(status)), None)
    } else if libc::WIFSIGNALED(status) {
        (None, Some(libc::WTERMSIG(status)))
    } else {
        (None, None)
    }
}

#[cfg(test)]
mod tests {
    use super::decode_status;

    #[test]
    fn wait_status_decoding() {
        assert_eq!(decode_status(3 << 8), (Some(3), None));
        assert_eq!(decode_status(9), (None, Some(9)));
    }
}
