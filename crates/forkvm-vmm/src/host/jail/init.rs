//! The init of a jail's pid namespace: the first process in it, which must outlive every
//! VMM born there (when a pid namespace's init exits, the kernel kills the rest).
//!
//! It reaps what is orphaned inside the namespace (children of a VMM that stopped) and
//! exits once both are true: the process that made the jail let it go (the pipe's write
//! end closed: it exited, or dropped the jail), so no VMM can be born there any more, and
//! no other process is left in the namespace (`kill(-1, 0)` finds none). It runs inside
//! the jail (no files to reach) and keeps no descriptor but that pipe's read end.

use std::os::fd::RawFd;

/// How often it checks whether it can go, once released.
const POLL_MS: i32 = 1000;

/// Never returns; system calls only (it is a child of a fork).
pub(super) fn serve(release: RawFd) -> ! {
    // SAFETY: system calls on local memory and on descriptors this process owns; the
    // process leaves through `_exit`.
    unsafe {
        for fd in 0..1024 {
            if fd != release {
                libc::close(fd);
            }
        }
        libc::prctl(libc::PR_SET_NAME, c"forkvm-pidns".as_ptr());
        let mut released = false;
        loop {
            while libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) > 0 {}
            if released {
                let none = libc::kill(-1, 0) != 0 && *libc::__errno_location() == libc::ESRCH;
                if none {
                    libc::_exit(0);
                }
                let pause = libc::timespec { tv_sec: (POLL_MS / 1000) as libc::time_t, tv_nsec: 0 };
                libc::nanosleep(&pause, std::ptr::null_mut());
                continue;
            }
            let mut pfd = libc::pollfd { fd: release, events: libc::POLLIN, revents: 0 };
            if libc::poll(&mut pfd, 1, POLL_MS) > 0 {
                // Nothing is ever written: readable means the write end is closed.
                let mut byte = 0u8;
                if libc::read(release, (&mut byte as *mut u8).cast(), 1) <= 0 {
                    libc::close(release);
                    released = true;
                }
            }
        }
    }
}
