//! The jail a VMM process enters before it runs guest code: mount, pid, IPC, UTS and
//! network namespaces that are not the host's, and a root directory that holds only
//! forkvm's own files.
//!
//! The root is a read-only tmpfs into which the host paths a VMM uses are bind-mounted at
//! the same absolute paths ([`JailLayout`]): the sandboxes' run directories, the snapshot
//! store, the artefact cache, forkvm's cgroup directories and `/dev/kvm` and `/dev/null`.
//! Because the paths are the same, the paths a VMM is given (devices, snapshot and branch
//! directories, sockets) mean the same thing inside as outside, and nothing else on the
//! host can be named at all: not `/etc`, not `/proc`, not the daemon's state, token or
//! keys, not the daemon's API socket. The network namespace has only a loopback device
//! that is down, the IPC namespace no shared memory of anyone's, the UTS namespace its own
//! host name.
//!
//! **Made once, entered many times.** Creating namespaces is the expensive part here (a
//! network namespace ~0.25 ms of CPU, a mount namespace ~0.08 ms, plus the mounts), and
//! entering existing ones with `setns(2)` costs ~8 µs for all four. So a process that forks
//! VMMs (the daemon's spawner, a CLI) makes one set per layout ([`JailNamespaces::shared`])
//! with a helper process it forks once, keeps descriptors to them, and every VMM it forks
//! is born in its pid namespace ([`JailNamespaces::forking_into`]) and enters the others
//! ([`JailNamespaces::enter`]) right after the fork, while it still has the privilege to.
//! The pid namespace's first process is a small init ([`init`]) that outlives the VMMs.
//! A VMM forked from a running VMM (a fork of a running sandbox, a live-branch writer) is
//! born inside its parent's jail. The VMMs of one spawner share the jail: it separates
//! them from the host, not yet from each other (docs/security.md says what is left).
//!
//! Nothing is left on the host: the mounts exist only in the private mount namespace, and
//! the namespaces go with the last process or descriptor that holds them.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Whether VMM processes enter their jail. Off only for debugging (`--no-jail`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Jail {
    #[default]
    Enforce,
    Off,
}

/// A host path made visible in the jail, at the same path.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Bind {
    pub path: PathBuf,
    pub writable: bool,
}

/// What a jail's root holds: `binds` (directories or device files), minus `hidden`
/// directories inside them (an empty, unreadable directory is mounted over each).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct JailLayout {
    binds: Vec<Bind>,
    hidden: Vec<PathBuf>,
}

impl JailLayout {
    pub fn new() -> JailLayout {
        JailLayout::default()
    }

    /// Adds `path` (an absolute path; symbolic links are resolved) unless it is missing or
    /// already inside a bind at least as permissive.
    pub fn bind(mut self, path: &Path, writable: bool) -> JailLayout {
        let Ok(path) = path.canonicalize() else { return self };
        if self.binds.iter().any(|b| path.starts_with(&b.path) && (b.writable || !writable)) {
            return self;
        }
        self.binds.retain(|b| !(b.path.starts_with(&path) && (writable || !b.writable)));
        self.binds.push(Bind { path, writable });
        self.binds.sort();
        self
    }

    /// Hides directory `path` if it exists inside one of the binds.
    pub fn hide(mut self, path: &Path) -> JailLayout {
        let Ok(path) = path.canonicalize() else { return self };
        if path.is_dir() && self.binds.iter().any(|b| path.starts_with(&b.path) && path != b.path) {
            self.hidden.push(path);
            self.hidden.sort();
            self.hidden.dedup();
        }
        self
    }

    pub fn binds(&self) -> &[Bind] {
        &self.binds
    }

    pub fn hidden(&self) -> &[PathBuf] {
        &self.hidden
    }

    /// Whether `path` (absolute) can be reached inside the jail.
    pub fn covers(&self, path: &Path) -> bool {
        let path = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
        self.binds.iter().any(|b| path.starts_with(&b.path)) && !self.hidden.iter().any(|h| path.starts_with(h))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum JailError {
    #[error("building the jail: {0}")]
    Prepare(String),
    #[error("making the jail's namespaces: {step} failed: {source}")]
    Helper { step: String, source: std::io::Error },
    #[error("making the jail's namespaces: the helper process ended before it was done")]
    HelperLost,
    #[error("opening the jail's {ns} namespace: {source}")]
    OpenNamespace { ns: &'static str, source: std::io::Error },
    #[error("entering the jail's {ns} namespace: {source}")]
    Enter { ns: &'static str, source: std::io::Error },
}

/// Descriptors of a jail's namespaces (mount, IPC, UTS, network, pid), which keep them
/// alive, and the pipe whose closing lets the pid namespace's init go ([`init`]).
#[derive(Debug)]
pub struct JailNamespaces {
    layout: JailLayout,
    namespaces: Vec<(&'static str, libc::c_int, OwnedFd)>,
    /// The pid namespace VMMs are born in, and ours, to come back to after each fork.
    pid: OwnedFd,
    own_pid: OwnedFd,
    /// The init's pid, here.
    init: libc::pid_t,
    release: OwnedFd,
}

/// Namespaces a VMM enters after its fork, with their `setns` flag (it is born in the
/// pid namespace).
const KINDS: [(&str, libc::c_int); 4] =
    [("ipc", libc::CLONE_NEWIPC), ("uts", libc::CLONE_NEWUTS), ("net", libc::CLONE_NEWNET), ("mnt", libc::CLONE_NEWNS)];

/// The jails this process made, one per layout.
static SHARED: Mutex<Vec<Arc<JailNamespaces>>> = Mutex::new(Vec::new());

impl JailNamespaces {
    /// This process's jail of `layout`, made on first use (by a helper process: see the
    /// module doc). Needs root (CAP_SYS_ADMIN).
    pub fn shared(layout: &JailLayout) -> Result<Arc<JailNamespaces>, JailError> {
        let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(j) = shared.iter().find(|j| &j.layout == layout) {
            return Ok(j.clone());
        }
        let made = Arc::new(helper::make(layout)?);
        shared.push(made.clone());
        Ok(made)
    }

    pub fn layout(&self) -> &JailLayout {
        &self.layout
    }

    /// The pid of the jail's pid-namespace init, in ours.
    pub fn init_pid(&self) -> libc::pid_t {
        self.init
    }

    /// Descriptors a forked child must keep until it has entered.
    pub fn fds(&self) -> Vec<RawFd> {
        let mut fds: Vec<RawFd> = self.namespaces.iter().map(|(_, _, fd)| fd.as_raw_fd()).collect();
        fds.extend([self.pid.as_raw_fd(), self.own_pid.as_raw_fd(), self.release.as_raw_fd()]);
        fds
    }

    /// Runs `fork` (which forks once) so that its child is born in the jail's pid
    /// namespace; the calling thread's later children are born in ours again.
    pub fn forking_into<T>(&self, fork: impl FnOnce() -> T) -> Result<T, JailError> {
        // SAFETY: setns on pid-namespace descriptors we own; it changes only where the
        // calling thread's children are born.
        if unsafe { libc::setns(self.pid.as_raw_fd(), libc::CLONE_NEWPID) } != 0 {
            return Err(JailError::Enter { ns: "pid", source: std::io::Error::last_os_error() });
        }
        let out = fork();
        // SAFETY: as above, back to the namespace this process runs in.
        if unsafe { libc::setns(self.own_pid.as_raw_fd(), libc::CLONE_NEWPID) } != 0 {
            tracing::error!(error = %std::io::Error::last_os_error(), "returning to our own pid namespace after a fork into a jail");
        }
        Ok(out)
    }

    /// Moves the calling process, born in the jail's pid namespace
    /// ([`JailNamespaces::forking_into`]), into its other namespaces: its root becomes the
    /// jail's root and its working directory `/`. The caller must be single-threaded
    /// (entering a mount namespace requires it) and still privileged; the descriptors are
    /// closed after, so the process keeps no way back. Call only in a forked child that
    /// leaves by `_exit`.
    pub fn enter(&self) -> Result<(), JailError> {
        for (ns, flag, fd) in &self.namespaces {
            // SAFETY: setns on a namespace descriptor we own.
            if unsafe { libc::setns(fd.as_raw_fd(), *flag) } != 0 {
                return Err(JailError::Enter { ns, source: std::io::Error::last_os_error() });
            }
        }
        // Its neighbours can name its sockets: serve forkvm's clients only.
        super::peer_guard::arm();
        for fd in self.fds() {
            // SAFETY: this process's copies of the descriptors, not used again: the caller
            // never drops its copy of `self` (it leaves by `_exit`).
            unsafe { libc::close(fd) };
        }
        Ok(())
    }

    fn from_init(layout: &JailLayout, init: libc::pid_t, release: OwnedFd) -> Result<JailNamespaces, JailError> {
        let open = |ns: &'static str, path: String| {
            std::fs::File::open(path).map(OwnedFd::from).map_err(|source| JailError::OpenNamespace { ns, source })
        };
        let mut namespaces = Vec::new();
        for (ns, flag) in KINDS {
            namespaces.push((ns, flag, open(ns, format!("/proc/{init}/ns/{ns}"))?));
        }
        let pid = open("pid", format!("/proc/{init}/ns/pid"))?;
        let own_pid = open("pid", "/proc/self/ns/pid".to_string())?;
        // The init is what every VMM of the jail dies with: the OOM killer must pick
        // anything else first. Best effort.
        let _ = std::fs::write(format!("/proc/{init}/oom_score_adj"), "-1000");
        Ok(JailNamespaces { layout: layout.clone(), namespaces, pid, own_pid, init, release })
    }
}

/// Runs `fork` (which forks once) so that its child is born in `jail`'s pid namespace, if
/// there is a jail ([`JailNamespaces::forking_into`]).
pub fn fork_into<T>(jail: Option<&JailNamespaces>, fork: impl FnOnce() -> T) -> Result<T, JailError> {
    match jail {
        Some(j) => j.forking_into(fork),
        None => Ok(fork()),
    }
}

mod helper;
mod host_pids;
mod init;

pub use host_pids::host_pids_of_children;

#[cfg(test)]
mod tests;
