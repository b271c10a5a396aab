//! Reaching a port of a sandbox's guest from the host: a TCP socket is made inside the
//! sandbox's namespace (where 172.16.0.2 is the guest, behind its tap) and handed back;
//! a socket keeps the namespace it was made in, so the caller connects and talks from
//! any thread. Exposed ports and `port-forward` reach guests this way: nothing is
//! routed from the host to a guest, and clones that share one guest address stay apart.
//!
//! The namespace is the one the sandbox's forwarder is served in when this process
//! serves it, else it is found again from the VMM ([`super::enter`]); no descriptor of
//! it is kept past the call, so it still goes with the VMM.

use super::{attach, enter, NetworkError, GUEST_IP};
use std::net::{SocketAddr, SocketAddrV4};
use std::os::fd::{FromRawFd, OwnedFd};

/// The guest's address for `port`.
pub fn guest_addr(port: u16) -> SocketAddr {
    SocketAddr::V4(SocketAddrV4::new(GUEST_IP, port))
}

/// The namespace of sandbox `id` (VMM `pid`); [`NetworkError::NoNetwork`] when it has
/// none (its template has no NIC).
pub fn sandbox_namespace(id: &str, pid: i32) -> Result<OwnedFd, NetworkError> {
    match attach::served_namespace(id) {
        Some(ns) => Ok(ns),
        None => enter::namespace_of_vmm(pid).map_err(|e| match e {
            NetworkError::Enter(io) if io.kind() == std::io::ErrorKind::NotFound => NetworkError::NoNetwork,
            e => e,
        }),
    }
}

/// A new TCP socket (non-blocking, not yet connected) in the namespace of sandbox `id`,
/// whose VMM is `pid`; connect it to [`guest_addr`].
pub fn guest_socket(id: &str, pid: i32) -> Result<std::net::TcpStream, NetworkError> {
    let netns = sandbox_namespace(id, pid)?;
    socket_in(&netns)
}

/// A new TCP socket (non-blocking, not yet connected) in the namespace `netns`.
pub fn socket_in(netns: &OwnedFd) -> Result<std::net::TcpStream, NetworkError> {
    let fd = enter::run_in(netns, || {
        // SAFETY: socket(2) with constant arguments; the result is a new descriptor or -1.
        let raw =
            unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: just made, owned by nothing else.
        Ok(unsafe { OwnedFd::from_raw_fd(raw) })
    })?
    .map_err(|e| NetworkError::Interface { interface: "tcp socket".into(), step: "socket", source: e })?;
    Ok(std::net::TcpStream::from(fd))
}
