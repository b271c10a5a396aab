//! A VMM gives up its privileges before it runs guest code: every capability (bounding,
//! ambient, inheritable, effective and permitted sets) and, with `no_new_privs`, any way
//! to gain one back through `execve`. Started by a root daemon, it also becomes its
//! sandbox's own uid and gid (`host::ids`), which own its run directory and nothing
//! else; the files it reads from the store it opened before (`host::preopen`), and it
//! writes its branches into an inbox of its own, which the host side adopts. A VMM that
//! has no ids given (not started by root, or outside a jail) keeps its uid without
//! capabilities: for root, the owner of root's files, but
//! unable to load modules, mount, trace, bypass file permissions, change ids or open raw
//! sockets. It writes no cgroup file: its starter moved it into its group
//! (`zygote::owned`).
//!
//! It also stops being a source of guest memory for anyone but root: no core dump (a
//! VMM's core would be the guest's memory, in the clear, wherever the host puts cores)
//! and not dumpable, so another process of its uid cannot trace it or read
//! `/proc/<pid>/mem`.
//!
//! Capabilities are per thread: this runs in the VMM process while it has one thread
//! (right after the fork), so every thread it starts inherits the empty sets.

use caps::{CapSet, Capability};

#[derive(Debug, thiserror::Error)]
pub enum PrivilegeError {
    #[error("dropping capabilities: {step}: {source}")]
    Caps { step: &'static str, source: caps::errors::CapsError },
    #[error("setting no_new_privs: {0}")]
    NoNewPrivs(std::io::Error),
    #[error("turning core dumps off: {0}")]
    NoCore(std::io::Error),
    #[error("dropping capabilities: {0:?} are still effective or permitted")]
    Left(Vec<Capability>),
    #[error(transparent)]
    Ids(#[from] super::ids::IdsError),
}

/// Drops every capability of the calling thread and sets `no_new_privs` (see the module
/// doc). The bounding set is emptied when the thread may (`CAP_SETPCAP`); a process that
/// may not has no capability to give up there.
pub fn drop_privileges(ids: Option<super::ids::SandboxIds>) -> Result<(), PrivilegeError> {
    let caps_err = |step| move |source| PrivilegeError::Caps { step, source };
    if caps::has_cap(None, CapSet::Effective, Capability::CAP_SETPCAP).map_err(caps_err("reading CAP_SETPCAP"))? {
        caps::clear(None, CapSet::Bounding).map_err(caps_err("emptying the bounding set"))?;
    }
    // While it still may (CAP_SETUID, CAP_SETGID): leaving uid 0 also empties the
    // effective and permitted sets; the clears below make sure of every set.
    if let Some(ids) = ids {
        super::ids::become_sandbox(ids)?;
    }
    caps::clear(None, CapSet::Ambient).map_err(caps_err("clearing the ambient set"))?;
    caps::clear(None, CapSet::Inheritable).map_err(caps_err("clearing the inheritable set"))?;
    caps::clear(None, CapSet::Effective).map_err(caps_err("clearing the effective set"))?;
    caps::clear(None, CapSet::Permitted).map_err(caps_err("clearing the permitted set"))?;
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(PrivilegeError::NoNewPrivs(std::io::Error::last_os_error()));
    }
    let no_core = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: setrlimit only reads the struct, which lives across the call.
    let limited = unsafe { libc::setrlimit(libc::RLIMIT_CORE, &no_core) } == 0;
    // SAFETY: prctl with integer arguments only.
    if !limited || unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        return Err(PrivilegeError::NoCore(std::io::Error::last_os_error()));
    }
    let mut left: Vec<Capability> = Vec::new();
    for set in [CapSet::Effective, CapSet::Permitted] {
        left.extend(caps::read(None, set).map_err(caps_err("reading the sets back"))?);
    }
    if !left.is_empty() {
        return Err(PrivilegeError::Left(left));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// In a forked child (the test process keeps its own): after the drop, nothing is
    /// effective or permitted, `no_new_privs` is set, the process is not dumpable, and as
    /// root the bounding set is empty.
    #[test]
    fn a_child_keeps_no_capability() {
        // SAFETY: the child only makes syscalls and exits with `_exit`.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let ok = drop_privileges(None).is_ok()
                && caps::read(None, CapSet::Effective).is_ok_and(|s| s.is_empty())
                && caps::read(None, CapSet::Permitted).is_ok_and(|s| s.is_empty())
                // SAFETY: prctl with integer arguments only.
                && unsafe { libc::prctl(libc::PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) } == 1
                // SAFETY: prctl with integer arguments only.
                && unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) } == 0
                // SAFETY: geteuid has no preconditions.
                && (unsafe { libc::geteuid() } != 0 || caps::read(None, CapSet::Bounding).is_ok_and(|s| s.is_empty()));
            // SAFETY: _exit ends the child without running the test harness's atexit.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waits for the child forked above.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "status {status:#x}");
    }
}
