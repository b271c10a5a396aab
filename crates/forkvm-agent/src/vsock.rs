//! AF_VSOCK listener: `socket(AF_VSOCK, SOCK_STREAM)` bound to `VMADDR_CID_ANY:port`.
//!
//! Accepted connections are wrapped in `UnixStream`: std's `UnixStream` is a thin owner
//! of a stream-socket fd whose `Read`/`Write`/`try_clone`/`shutdown`/timeouts are plain
//! `read`/`write`/`dup`/`shutdown`/`setsockopt` calls, which behave the same on vsock.
//! That lets every handler take one concrete stream type.

use std::io;
use std::mem;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

/// A listening vsock socket.
#[derive(Debug)]
pub struct VsockListener {
    fd: OwnedFd,
}

impl VsockListener {
    /// Binds `VMADDR_CID_ANY:port` and listens.
    pub fn bind(port: u32) -> io::Result<Self> {
        // SAFETY: plain socket(2) call; the result is checked below.
        let fd = unsafe { libc::socket(libc::AF_VSOCK, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: socket(2) returned a new fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: sockaddr_vm is plain data; zero is valid for the reserved fields.
        let mut addr: libc::sockaddr_vm = unsafe { mem::zeroed() };
        addr.svm_family = libc::AF_VSOCK as libc::sa_family_t;
        addr.svm_port = port;
        addr.svm_cid = libc::VMADDR_CID_ANY;
        let len = mem::size_of::<libc::sockaddr_vm>() as libc::socklen_t;
        // SAFETY: `addr` is a valid sockaddr_vm and `len` is its size.
        if unsafe { libc::bind(fd.as_raw_fd(), (&addr as *const libc::sockaddr_vm).cast(), len) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: listen(2) on the socket we own.
        if unsafe { libc::listen(fd.as_raw_fd(), 128) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self { fd })
    }

    /// Waits for the next connection.
    pub fn accept(&self) -> io::Result<UnixStream> {
        loop {
            // SAFETY: null address pointers are allowed when the peer address is unwanted.
            let fd = unsafe {
                libc::accept4(self.fd.as_raw_fd(), std::ptr::null_mut(), std::ptr::null_mut(), libc::SOCK_CLOEXEC)
            };
            if fd >= 0 {
                // SAFETY: accept4 returned a new connected socket fd that nothing owns.
                return Ok(UnixStream::from(unsafe { OwnedFd::from_raw_fd(fd) }));
            }
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(err);
            }
        }
    }
}
