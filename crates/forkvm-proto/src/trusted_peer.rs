//! Telling forkvm's own clients from everyone else on a VMM's sockets.
//!
//! A jailed VMM's control socket and vsock listener sit in run directories that every
//! VMM of its jail can name, and VMMs run as uid 0 (without capabilities) for now, so
//! file modes cannot tell the daemon from a neighbour VMM that its guest took over. Peer
//! credentials can: forkvm's clients (the daemon, a CLI, run as root) connect with their
//! *thread's* effective gid set to [`CLIENT_GID`] for the call, and the kernel records
//! the connecting thread's credentials with the connection (`SO_PEERCRED`). Taking an
//! effective gid one does not hold needs `CAP_SETGID`, which no VMM has, so a VMM cannot
//! forge it. The gid need not exist in `/etc/group`.
//!
//! The change is made with the raw system call, which applies to the calling thread
//! only (the C library's `setresgid` would change every thread of the process), and is
//! undone before [`connect`] returns. A client that may not change its gid (not root)
//! connects as it is: it starts VMMs without a jail, and those accept any peer.

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;

/// The effective gid forkvm's clients connect to VMM sockets with.
pub const CLIENT_GID: u32 = 2_147_483_600;

/// Sets the calling thread's effective gid (real and saved unchanged).
fn set_thread_egid(gid: u32) -> io::Result<()> {
    // SAFETY: a system call with integer arguments; -1 leaves those ids unchanged.
    let r = unsafe { libc::syscall(libc::SYS_setresgid, -1i64, i64::from(gid), -1i64) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Whether this thread may connect as a forkvm client: it can take [`CLIENT_GID`] as
/// its effective gid (it is root, and the gid is mapped in its user namespace). Leaves
/// the thread's gid as it was.
pub fn can_vouch() -> bool {
    // SAFETY: getegid has no preconditions.
    let own = unsafe { libc::getegid() };
    set_thread_egid(CLIENT_GID).is_ok() && set_thread_egid(own).is_ok()
}

/// Connects to the Unix socket at `path` as a forkvm client (see the module doc).
pub fn connect(path: impl AsRef<Path>) -> io::Result<UnixStream> {
    // SAFETY: getegid has no preconditions.
    let own = unsafe { libc::getegid() };
    if set_thread_egid(CLIENT_GID).is_err() {
        return UnixStream::connect(path);
    }
    let stream = UnixStream::connect(path);
    if let Err(e) = set_thread_egid(own) {
        // The thread would go on with another gid than its own: files it creates would
        // belong to that group. Nothing should carry on like that.
        panic!("restoring this thread's effective gid {own} after a connect: {e}");
    }
    stream
}

/// Whether the peer of `stream` connected as a forkvm client.
pub fn is_client(stream: &UnixStream) -> bool {
    peer_gid(stream.as_raw_fd()) == Some(CLIENT_GID)
}

/// The effective gid the peer of socket `fd` had when it connected.
fn peer_gid(fd: i32) -> Option<u32> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes of the sizes given.
    let r = unsafe {
        libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_PEERCRED, (&mut cred as *mut libc::ucred).cast(), &mut len)
    };
    (r == 0).then_some(cred.gid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    fn is_root() -> bool {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() == 0 }
    }

    #[test]
    fn a_client_connection_carries_the_client_gid_and_a_plain_one_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let listener = UnixListener::bind(&path).unwrap();
        // SAFETY: getegid has no preconditions.
        let before = unsafe { libc::getegid() };
        let vouched = connect(&path).unwrap();
        // SAFETY: getegid has no preconditions.
        let after = unsafe { libc::getegid() };
        assert_eq!(after, before, "the thread's gid is restored");
        let (accepted, _) = listener.accept().unwrap();
        assert_eq!(is_client(&accepted), is_root(), "only root can connect as a client");
        assert_eq!(can_vouch(), is_root());
        drop(vouched);
        let _plain = UnixStream::connect(&path).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        assert!(!is_client(&accepted), "a plain connection is no client's");
    }

    #[test]
    fn a_thread_without_the_gid_cannot_connect_as_a_client() {
        if !is_root() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let listener = UnixListener::bind(&path).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).unwrap();
        // A thread that gave up root's ids (as a VMM gives up its capabilities) may not
        // take the client gid: its connection is a plain one.
        let path2 = path.clone();
        std::thread::spawn(move || {
            // SAFETY: raw system calls on this thread only, with integer arguments.
            unsafe {
                assert_eq!(libc::syscall(libc::SYS_setresgid, 65534i64, 65534i64, 65534i64), 0);
                assert_eq!(libc::syscall(libc::SYS_setresuid, 65534i64, 65534i64, 65534i64), 0);
            }
            assert!(!can_vouch());
            connect(&path2).map(drop)
        })
        .join()
        .unwrap()
        .unwrap();
        let (accepted, _) = listener.accept().unwrap();
        assert!(!is_client(&accepted));
    }
}
