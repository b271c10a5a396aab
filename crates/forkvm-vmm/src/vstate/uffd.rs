//! The few userfaultfd calls lazy guest memory makes (`include/uapi/linux/userfaultfd.h`):
//! create, register a range for missing-page faults, read fault messages, copy a filled
//! range in, wake waiters, unregister.
//!
//! Written here rather than taken from the `userfaultfd` crate: that crate generates its
//! bindings with bindgen at build time (libclang on every build machine) and opens
//! `/dev/userfaultfd` by path, which a jailed VMM cannot name. The ABI is four structs.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use vmm_sys_util::{ioctl_ior_nr, ioctl_iowr_nr};

const UFFDIO: u32 = 0xAA;
const UFFD_API: u64 = 0xAA;
const UFFDIO_REGISTER_MODE_MISSING: u64 = 1;
/// `uffd_msg.event` of a page fault.
const UFFD_EVENT_PAGEFAULT: u8 = 0x12;

#[repr(C)]
#[derive(Default)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct UffdioRange {
    start: u64,
    len: u64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioCopy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}

/// `struct uffd_msg`: the event byte, padding, then the page fault's flags and address.
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct UffdMsg {
    event: u8,
    reserved1: u8,
    reserved2: u16,
    reserved3: u32,
    flags: u64,
    address: u64,
    ptid: u64,
}

ioctl_iowr_nr!(UFFDIO_API, UFFDIO, 0x3F, UffdioApi);
ioctl_iowr_nr!(UFFDIO_REGISTER, UFFDIO, 0x00, UffdioRegister);
ioctl_ior_nr!(UFFDIO_UNREGISTER, UFFDIO, 0x01, UffdioRange);
ioctl_ior_nr!(UFFDIO_WAKE, UFFDIO, 0x02, UffdioRange);
ioctl_iowr_nr!(UFFDIO_COPY, UFFDIO, 0x03, UffdioCopy);

/// The requests a thread serving faults makes (for the seccomp filters).
pub fn serving_ioctls() -> Vec<u64> {
    vec![UFFDIO_COPY(), UFFDIO_WAKE(), UFFDIO_UNREGISTER()]
}

/// A userfaultfd of this process's memory.
#[derive(Debug)]
pub struct Uffd {
    fd: OwnedFd,
}

fn ioctl<T>(fd: &OwnedFd, request: u64, arg: &mut T) -> io::Result<()> {
    // SAFETY: `arg` is the struct `request` is declared with, valid for the call.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), request as _, arg as *mut T) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl Uffd {
    /// A new non-blocking userfaultfd that reports kernel-mode faults too (KVM's
    /// accesses to guest memory are the kernel's): needs `CAP_SYS_PTRACE` here
    /// (`vm.unprivileged_userfaultfd=0`), so a VMM makes it before it drops privileges.
    pub fn new() -> io::Result<Uffd> {
        // SAFETY: the system call takes flags only and returns a new descriptor.
        let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the descriptor is new and owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        let mut api = UffdioApi { api: UFFD_API, ..Default::default() };
        ioctl(&fd, UFFDIO_API(), &mut api)?;
        Ok(Uffd { fd })
    }

    /// Reports missing-page faults in `[start, start + len)` (a private anonymous mapping).
    pub fn register_missing(&self, start: u64, len: u64) -> io::Result<()> {
        let mut reg =
            UffdioRegister { range: UffdioRange { start, len }, mode: UFFDIO_REGISTER_MODE_MISSING, ioctls: 0 };
        ioctl(&self.fd, UFFDIO_REGISTER(), &mut reg)
    }

    /// Stops reporting faults in the range: missing pages are then ordinary zero pages.
    pub fn unregister(&self, start: u64, len: u64) -> io::Result<()> {
        let mut range = UffdioRange { start, len };
        ioctl(&self.fd, UFFDIO_UNREGISTER(), &mut range)
    }

    /// Copies `src` into the missing pages at `dst` and wakes the threads waiting on
    /// them. `Ok(false)`: some pages were there already (EEXIST; the waiters are woken).
    pub fn copy(&self, dst: u64, src: &[u8]) -> io::Result<bool> {
        let mut c = UffdioCopy { dst, src: src.as_ptr() as u64, len: src.len() as u64, mode: 0, copy: 0 };
        match ioctl(&self.fd, UFFDIO_COPY(), &mut c) {
            Ok(()) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                self.wake(dst, src.len() as u64)?;
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Wakes threads waiting on faults in the range.
    pub fn wake(&self, start: u64, len: u64) -> io::Result<()> {
        let mut range = UffdioRange { start, len };
        ioctl(&self.fd, UFFDIO_WAKE(), &mut range)
    }

    /// Waits up to `timeout_ms` (-1: for ever) for a page fault; returns its address.
    /// `Ok(None)`: none came in time, or the message was another event.
    pub fn next_fault(&self, timeout_ms: i32) -> io::Result<Option<u64>> {
        let mut pfd = libc::pollfd { fd: self.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted { Ok(None) } else { Err(e) };
        }
        if n == 0 {
            return Ok(None);
        }
        let mut msg = UffdMsg::default();
        let size = std::mem::size_of::<UffdMsg>();
        // SAFETY: reads at most `size` bytes into `msg`, a plain struct of that size.
        let got = unsafe { libc::read(self.fd.as_raw_fd(), (&mut msg as *mut UffdMsg).cast(), size) };
        if got < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::WouldBlock { Ok(None) } else { Err(e) };
        }
        if got as usize != size {
            return Err(io::Error::other(format!("a userfaultfd message of {got} bytes")));
        }
        Ok((msg.event == UFFD_EVENT_PAGEFAULT).then_some(msg.address))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_structs_have_the_kernel_sizes() {
        assert_eq!(std::mem::size_of::<UffdioApi>(), 24);
        assert_eq!(std::mem::size_of::<UffdioRegister>(), 32);
        assert_eq!(std::mem::size_of::<UffdioCopy>(), 40);
        assert_eq!(std::mem::size_of::<UffdMsg>(), 32);
        // _IOWR(0xAA, 0x03, 40 bytes) as the kernel's headers spell it.
        assert_eq!(UFFDIO_COPY(), 0xc028_aa03);
        assert_eq!(UFFDIO_REGISTER(), 0xc020_aa00);
        assert_eq!(UFFDIO_API(), 0xc018_aa3f);
        assert_eq!(UFFDIO_WAKE(), 0x8010_aa02);
    }
}
