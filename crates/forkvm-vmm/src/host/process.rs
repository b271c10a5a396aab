//! Process plumbing for the VMM's forks: fork a child that runs a closure and exits,
//! detach its standard streams, close the descriptors it must not keep, and reap it
//! without blocking. Used by the zygote, cold boots, running forks, live branches and
//! the daemon's spawner.

use std::fs::{File, OpenOptions};

/// Forks; the child runs `body` and exits with its result, the parent gets the pid.
/// The caller must be single-threaded.
pub fn fork_and_run(detach: bool, body: impl FnOnce() -> i32) -> std::io::Result<libc::pid_t> {
    // SAFETY: the caller is single-threaded (documented contract), so the child is a
    // complete copy; it only runs `body` and leaves through `_exit`.
    let pid = unsafe { libc::fork() };
    match pid {
        -1 => Err(std::io::Error::last_os_error()),
        0 => {
            if detach {
                // SAFETY: setsid has no memory-safety preconditions.
                unsafe { libc::setsid() };
            }
            let code = body();
            // SAFETY: `_exit` ends the child without running the parent's atexit
            // handlers or destructors, which belong to the parent.
            unsafe { libc::_exit(code) }
        }
        pid => Ok(pid),
    }
}

/// Points a detached child's standard streams away from the caller's: stdin and stdout
/// at /dev/null, stderr at the console log (or /dev/null). Otherwise a caller reading
/// our stdout to its end (a shell's `$(...)`, a test) would wait for every child.
pub fn detach_stdio(log: Option<&File>) {
    use std::os::fd::AsRawFd;
    let Ok(null) = OpenOptions::new().read(true).write(true).open("/dev/null") else {
        return;
    };
    let err_fd = log.map(|f| f.as_raw_fd()).unwrap_or(null.as_raw_fd());
    // SAFETY: dup2 onto the standard descriptors of this (single-threaded) child; the
    // source descriptors are open for the duration of the calls.
    unsafe {
        libc::dup2(null.as_raw_fd(), 0);
        libc::dup2(null.as_raw_fd(), 1);
        libc::dup2(err_fd, 2);
    }
}

/// Closes every descriptor from `first` to `last` (inclusive) in this process.
pub fn close_fds(first: u32, last: u32) {
    if first > last {
        return;
    }
    // SAFETY: close_range only closes descriptors; callers are forked children that own
    // nothing in that range they still need.
    let rc = unsafe { libc::syscall(libc::SYS_close_range, first, last, 0) };
    if rc != 0 {
        // Kernels before 5.9: close them one by one (up to the soft limit).
        let max = last.min(65_535);
        for fd in first..=max {
            // SAFETY: as above.
            unsafe { libc::close(fd as i32) };
        }
    }
}

/// Closes every descriptor of this process except those in `keep`.
pub fn close_fds_except(keep: &[std::os::fd::RawFd]) {
    let mut keep: Vec<u32> = keep.iter().filter(|fd| **fd >= 0).map(|fd| *fd as u32).collect();
    keep.sort_unstable();
    keep.dedup();
    let mut next = 0u32;
    for fd in keep {
        if fd > next {
            close_fds(next, fd - 1);
        }
        next = fd + 1;
    }
    close_fds(next, u32::MAX);
}

/// The wait status of child `pid` if it has exited (and reaps it), without blocking.
pub fn exit_status(pid: libc::pid_t) -> Option<i32> {
    let mut status = 0;
    // SAFETY: waitpid on our own child with WNOHANG has no memory preconditions.
    let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
    (r == pid).then_some(status)
}
