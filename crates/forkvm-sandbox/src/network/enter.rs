//! Finding a running sandbox's namespace again, from its VMM: nothing names a sandbox's
//! namespace (its VMM's tap is what keeps it), so the way back in is that tap. This
//! process takes a copy of the VMM's tap descriptor (`pidfd_getfd`, which root may do
//! to any process) and asks the tun driver for the namespace the tap lives in
//! (`TUNGETDEVNETNS`). Works for any process that made the slot or not, after a daemon
//! restart too, and leaves nothing behind: both descriptors are this process's own.
//!
//! A VMM is forked from a process that holds other sandboxes' taps (the daemon's ready
//! slots, a fan-out's children's), and sheds them only once it runs: until then its
//! descriptors show taps of several namespaces. (A VMM may also hold its own tap twice:
//! its device works on a duplicate.) The namespace is taken only once every tap the VMM
//! holds is in one ([`SHED_LIMIT`]): taking the first tap's handed a sandbox's policy
//! to a namespace that was not its own and left its own open (a CI flake of
//! `daemon_network`).

use super::NetworkError;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// `TUNGETDEVNETNS` (`<linux/if_tun.h>`, `_IO('T', 227)`): a descriptor of the tap's
/// network namespace.
const TUNGETDEVNETNS: libc::c_ulong = 0x54e3;

/// How long a VMM whose taps are in several namespaces is given to shed what it
/// inherited (it does so before anything else; a busy host may not run it at once).
pub const SHED_LIMIT: Duration = Duration::from_secs(10);

/// The network namespace of the sandbox whose VMM is `pid`.
pub fn namespace_of_vmm(pid: i32) -> Result<OwnedFd, NetworkError> {
    namespace_of_vmm_within(pid, SHED_LIMIT)
}

/// [`namespace_of_vmm`], waiting at most `limit` for the VMM's taps to be in one
/// namespace.
pub fn namespace_of_vmm_within(pid: i32, limit: Duration) -> Result<OwnedFd, NetworkError> {
    let failed = |step: &str, e: std::io::Error| {
        NetworkError::Enter(std::io::Error::new(e.kind(), format!("{step} of VMM {pid}: {e}")))
    };
    let pidfd = crate::registry::pidfd_open(pid).map_err(|e| failed("a pidfd", e))?;
    let deadline = Instant::now() + limit;
    loop {
        let taps = tap_descriptors(pid).map_err(|e| failed("the tap descriptors", e))?;
        if taps.is_empty() {
            let why = "it has no tap (a sandbox without a network)";
            return Err(failed("the tap descriptor", std::io::Error::new(std::io::ErrorKind::NotFound, why)));
        }
        // A descriptor closed meanwhile (the VMM shedding it) is looked at again.
        let namespaces: Vec<(u64, OwnedFd)> = taps.iter().filter_map(|&fd| namespace_of_tap(&pidfd, fd).ok()).collect();
        let first = namespaces.first().map(|(inode, _)| *inode);
        let one = first.is_some() && namespaces.iter().all(|(inode, _)| Some(*inode) == first);
        if one && namespaces.len() == taps.len() {
            let (_, ns) = namespaces.into_iter().next().expect("one namespace at least");
            return Ok(ns);
        }
        if Instant::now() >= deadline {
            let why = format!(
                "its {} taps are still in more than one namespace after {limit:?}: which one is its own is unknown",
                taps.len()
            );
            return Err(failed("the tap descriptors", std::io::Error::other(why)));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The namespace (its inode and a descriptor) of the tap at descriptor `target` of the
/// process `pidfd` names.
fn namespace_of_tap(pidfd: &OwnedFd, target: i32) -> std::io::Result<(u64, OwnedFd)> {
    // SAFETY: pidfd_getfd with a pidfd we own, a descriptor number, no flags.
    let raw = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), target, 0) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: just made, owned by nothing else.
    let tap = unsafe { OwnedFd::from_raw_fd(raw as i32) };
    // SAFETY: an argument-less ioctl on a descriptor we own; the result is a new
    // descriptor or -1.
    let raw = unsafe { libc::ioctl(tap.as_raw_fd(), TUNGETDEVNETNS) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: just made, owned by nothing else.
    let ns = unsafe { OwnedFd::from_raw_fd(raw) };
    let inode = std::fs::metadata(format!("/proc/self/fd/{}", ns.as_raw_fd()))?;
    Ok((std::os::unix::fs::MetadataExt::ino(&inode), ns))
}

/// The numbers of the process's descriptors that are taps (open `/dev/net/tun`).
fn tap_descriptors(pid: i32) -> std::io::Result<Vec<i32>> {
    let mut taps = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd"))?.flatten() {
        if std::fs::read_link(entry.path()).is_ok_and(|l| l.as_os_str() == "/dev/net/tun") {
            if let Some(n) = entry.file_name().to_str().and_then(|n| n.parse().ok()) {
                taps.push(n);
            }
        }
    }
    Ok(taps)
}

/// The calling thread's network namespace.
pub fn thread_namespace() -> std::io::Result<OwnedFd> {
    let path = c"/proc/thread-self/ns/net";
    // SAFETY: a NUL-terminated path; the descriptor is ours.
    let raw = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: just opened, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// Moves the calling thread (only it) into the network namespace `netns`.
pub fn enter_thread(netns: &OwnedFd) -> std::io::Result<()> {
    // SAFETY: setns of this thread into a namespace descriptor the caller holds.
    if unsafe { libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Runs `f` on a thread inside the namespace `netns`.
pub fn run_in<T: Send + 'static>(netns: &OwnedFd, f: impl FnOnce() -> T + Send + 'static) -> Result<T, NetworkError> {
    let ns = netns.try_clone().map_err(NetworkError::OpenNamespace)?;
    let thread = std::thread::Builder::new().name("net-inside".into()).spawn(move || {
        enter_thread(&ns).map_err(NetworkError::Enter)?;
        Ok(f())
    });
    let joined = thread.map_err(NetworkError::Thread)?.join();
    joined.unwrap_or_else(|_| Err(NetworkError::Thread(std::io::Error::other("it panicked"))))
}
