//! What a sandbox's VMM process owns and how it is confined: the starter forks it with
//! [`fork_vmm`], moves it into its cgroup and only then lets it go on; the process enters
//! its jail, drops its privileges and installs its filters ([`Owned::enter`]) before it
//! builds its VM, and removes its run directory when the VM stops ([`Owned::release`]).
//!
//! A VMM never writes a cgroup file: whoever starts it (the spawner, a CLI, the library
//! for a fork of a running sandbox) moves it into its group, and whoever sees it gone
//! (`kill`, the registry's sweep) removes the group. So forkvm's cgroup directories are
//! not in a VMM's jail at all, and a VMM cannot raise its own limits or leave its group.

use super::ZygoteError;
use crate::host::process::fork_and_run;
use std::path::PathBuf;

/// Whether this VMM process's VM stopped because it was asked to (`Owned::release`).
pub(crate) static STOP_REQUESTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// What a sandbox's VMM process owns: its run directory, which it removes when the VM
/// stops, and the cgroup its starter moves it into before it builds the VM (so the VM's
/// memory is charged there) and its supervisor removes once it is gone.
#[derive(Debug, Clone, Default)]
pub struct Owned {
    /// Run directory (control and vsock sockets, console log), removed at exit.
    pub run_dir: Option<PathBuf>,
    /// The cgroup (name under the forkvm cgroup root) the starter moves the process into.
    pub cgroup: Option<String>,
    /// Whether the process runs under its seccomp filters (`host::seccomp`).
    pub seccomp: crate::host::seccomp::Seccomp,
    /// The jail the process enters (`host::jail`); None: it stays where it was forked
    /// (a fork of a running VMM is born in its parent's).
    pub jail: Option<std::sync::Arc<crate::host::jail::JailNamespaces>>,
    /// The sandbox's own uid and gid, which the process takes (`host::ids`); None: it
    /// keeps its own (a fork of a running VMM already has its source's).
    pub ids: Option<crate::host::ids::SandboxIds>,
}

/// Why a VMM process could not be confined ([`Owned::enter`]).
#[derive(Debug, thiserror::Error)]
pub enum EnterError {
    #[error(transparent)]
    Privileges(#[from] crate::host::privileges::PrivilegeError),
    #[error(transparent)]
    Seccomp(#[from] crate::host::seccomp::SeccompError),
    #[error(transparent)]
    Rlimits(#[from] crate::host::rlimits::RlimitError),
    #[error(transparent)]
    Jail(#[from] crate::host::jail::JailError),
}

impl Owned {
    /// Confines the calling VMM process before it runs guest code: enters its jail
    /// ([`crate::host::jail`]), if any, drops every privilege and takes its sandbox's ids,
    /// if it has them ([`crate::host::privileges`]; what it reads of root's it offered
    /// first, `host::preopen`),
    /// sets its resource limits ([`crate::host::rlimits`]), then puts the process under its
    /// seccomp filters ([`crate::host::seccomp`]) unless they are off. Call it while the
    /// process has one thread, once its starter moved it into its cgroup. Errors name the
    /// step.
    pub fn enter(&self) -> Result<(), EnterError> {
        if let Some(jail) = &self.jail {
            // What the VMM reads of /proc later, opened while it can.
            crate::vstate::memory_playbook::open_pagemap_early();
            jail.enter()?;
        }
        crate::host::privileges::drop_privileges(self.ids)?;
        crate::host::rlimits::apply_vmm_rlimits()?;
        if self.seccomp == crate::host::seccomp::Seccomp::Enforce {
            crate::host::seccomp::enforce()?;
        }
        Ok(())
    }

    /// Descriptors a forked VMM keeps until it has entered its jail (none without one).
    pub fn jail_fds(&self) -> Vec<std::os::fd::RawFd> {
        self.jail.iter().flat_map(|j| j.fds()).collect()
    }

    /// The process's cgroup, if it has one (it must exist: the starter made it).
    pub fn open_cgroup(&self) -> Result<Option<crate::host::cgroup::SandboxCgroup>, crate::host::cgroup::CgroupError> {
        let Some(name) = &self.cgroup else { return Ok(None) };
        crate::host::cgroup::CgroupRoot::detected()?.open_made(name).map(Some)
    }

    /// Removes the run directory — unless the VMM failed: then its console log (which
    /// says why) stays for whoever waits for the sandbox, and registry sweeps remove it
    /// once they see the VMM is gone. It also stays when the VM stopped without being
    /// asked (the guest powered off) and its disks were written: the registry salvages
    /// those writes into the sandbox's vault before removing it. The cgroup is the
    /// supervisor's to remove (the module doc).
    pub fn release(&self, failed: bool) {
        let unasked_with_writes = || {
            !STOP_REQUESTED.load(std::sync::atomic::Ordering::SeqCst)
                && self.run_dir.as_ref().is_some_and(|d| {
                    std::fs::read_dir(d.join("disks")).is_ok_and(|mut entries| entries.next().is_some())
                })
        };
        if let (Some(dir), false) = (&self.run_dir, failed || unasked_with_writes()) {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Forks a VMM process that runs `child` — in `owned`'s jail, if any, and detached from
/// the caller's session with `detach` — and returns its pid. With a cgroup, the child
/// waits until this process has moved it into the group (so everything it allocates is
/// charged there); when the move fails the child exits without running `child` and the
/// start fails here. Moves into cgroups are cheap made in a row by one process (~0.1 ms
/// for the three v1 hierarchies here) and slow made by a hundred fresh children at once,
/// each its own (~120 ms each in `bench spawn -n 100`: they contend for the cgroup locks
/// and wait out RCU grace periods).
pub(crate) fn fork_vmm(owned: &Owned, detach: bool, child: impl FnOnce() -> i32) -> Result<libc::pid_t, ZygoteError> {
    let group = owned.open_cgroup().map_err(ZygoteError::Cgroup)?;
    let gate = group.as_ref().map(|_| Gate::new()).transpose().map_err(ZygoteError::Gate)?;
    let fork = || {
        fork_and_run(detach, || {
            if gate.as_ref().is_some_and(|g| !g.wait()) {
                // Not in its group: it must not build a VM outside it.
                return super::EXIT_RESTORE_FAILED;
            }
            child()
        })
    };
    let pid = crate::host::jail::fork_into(owned.jail.as_deref(), fork)
        .map_err(ZygoteError::Jail)?
        .map_err(ZygoteError::Fork)?;
    if let (Some(group), Some(gate)) = (group, gate) {
        let moved = group.join(pid as u32);
        gate.open_if(moved.is_ok());
        moved.map_err(ZygoteError::Cgroup)?;
    }
    Ok(pid)
}

/// A pipe a forked child waits on until its parent has moved it into its cgroup.
struct Gate {
    read: std::os::fd::OwnedFd,
    write: std::os::fd::OwnedFd,
}

impl Gate {
    fn new() -> std::io::Result<Gate> {
        use std::os::fd::FromRawFd;
        let mut fds = [0; 2];
        // SAFETY: pipe2 writes two descriptors into the array.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: both descriptors were just made and are owned by nothing else.
        Ok(unsafe {
            Gate { read: std::os::fd::OwnedFd::from_raw_fd(fds[0]), write: std::os::fd::OwnedFd::from_raw_fd(fds[1]) }
        })
    }

    /// In the child: whether the parent moved it (a byte) or not (end of file).
    fn wait(&self) -> bool {
        use std::os::fd::AsRawFd;
        // SAFETY: the child's copy of the write end, closed once here (its OwnedFd in
        // this copy of the process is never dropped: the child leaves through _exit).
        unsafe { libc::close(self.write.as_raw_fd()) };
        let mut byte = 0u8;
        loop {
            // SAFETY: reads at most one byte into a local.
            let n = unsafe { libc::read(self.read.as_raw_fd(), (&mut byte as *mut u8).cast(), 1) };
            if n >= 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                return n == 1;
            }
        }
    }

    /// In the parent: lets the child go, saying whether it was moved.
    fn open_if(self, moved: bool) {
        use std::os::fd::AsRawFd;
        if moved {
            // SAFETY: writes one byte from a local to the pipe.
            unsafe { libc::write(self.write.as_raw_fd(), b"1".as_ptr().cast(), 1) };
        }
    }
}
