//! Per-sandbox memory cgroups: a memory limit for each sandbox VMM process, and a teardown
//! after which no group outlives its sandbox.
//!
//! Each sandbox process runs in `<own cgroup>/forkvm/<name>`, where `<own cgroup>` is the
//! cgroup of the process that calls [`CgroupRoot::detect`] (normally the daemon). Both
//! cgroup v1 (the `memory` hierarchy) and v2 (the unified hierarchy) are handled; v2 is
//! picked when it offers the memory controller to our group, otherwise v1.
//!
//! A cgroup directory can only be removed (rmdir) once no process is in it, so teardown has
//! three paths:
//! 1. the sandbox process, at its end, calls [`SandboxCgroup::leave_and_remove`]: it moves
//!    itself to the shared leaf `forkvm/exiting` and removes its group;
//! 2. a supervisor that saw the process die calls [`SandboxCgroup::remove`];
//! 3. after a crash of everything (kill -9), [`CgroupRoot::sweep`] removes every empty group
//!    that is no longer wanted.

mod detect;
#[cfg(test)]
mod tests;

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The shared leaf that exiting sandbox processes move to (in v2 a process cannot stay in
/// the inner `forkvm` group). Not a valid sandbox name.
const EXITING: &str = "exiting";
/// How long rmdir is retried while the group is still busy with leaving threads/processes.
const RMDIR_RETRY_FOR: Duration = Duration::from_millis(100);

/// Which cgroup hierarchy holds the memory controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    /// The v1 `memory` hierarchy (`memory.limit_in_bytes`).
    V1,
    /// The v2 unified hierarchy (`memory.max`).
    V2,
}

/// What went wrong, named by the step that failed.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("cannot read {path}: {source}")]
    ReadProc { path: PathBuf, source: io::Error },
    #[error("no usable memory cgroup on this host (checked: {checked})")]
    NoMemoryController { checked: String },
    #[error("invalid sandbox cgroup name {0:?}: use 1 to 64 of [A-Za-z0-9_-], and not \"exiting\"")]
    InvalidName(String),
    #[error("sandbox cgroup {0} already exists")]
    AlreadyExists(PathBuf),
    #[error("cgroup v2 group {parent} does not delegate the memory controller (memory is not in its cgroup.subtree_control); run forkvm from a cgroup whose subtree has memory enabled")]
    MemoryNotDelegated { parent: PathBuf },
    #[error("create cgroup directory {path}: {source}")]
    CreateDir { path: PathBuf, source: io::Error },
    #[error("enable the memory controller in {path}: {source}")]
    EnableMemory { path: PathBuf, source: io::Error },
    #[error("set memory limit in {path}: {source}")]
    SetLimit { path: PathBuf, source: io::Error },
    #[error("move pid {pid} into cgroup (write {path}): {source}")]
    Join { pid: u32, path: PathBuf, source: io::Error },
    #[error("move the exiting process to the exiting leaf (write {path}): {source}")]
    MoveToExiting { path: PathBuf, source: io::Error },
    #[error("read cgroup file {path}: {source}")]
    ReadControl { path: PathBuf, source: io::Error },
    #[error("parse cgroup file {path}: unexpected content {content:?}")]
    ParseControl { path: PathBuf, content: String },
    #[error("remove cgroup directory {path}: {source}")]
    Remove { path: PathBuf, source: io::Error },
    #[error("sandbox cgroup {name} does not exist under {}", root.display())]
    Missing { name: String, root: PathBuf },
}

/// The forkvm parent group, `<mount>/<own cgroup path>/forkvm` (created on first use).
#[derive(Debug, Clone)]
pub struct CgroupRoot {
    version: CgroupVersion,
    dir: PathBuf,
}

impl CgroupRoot {
    /// Detects the host's memory cgroup from `/proc/self/mountinfo` and `/proc/self/cgroup`.
    pub fn detect() -> Result<CgroupRoot, CgroupError> {
        let read = |path: &str| {
            std::fs::read_to_string(path).map_err(|source| CgroupError::ReadProc { path: path.into(), source })
        };
        Self::detect_from(&read("/proc/self/mountinfo")?, &read("/proc/self/cgroup")?, Path::new("/"))
    }

    /// Detection on given mountinfo and `/proc/self/cgroup` texts; `fs_prefix` is put in front
    /// of mount points (tests pass a tempdir holding a fake tree).
    pub fn detect_from(mountinfo: &str, self_cgroup: &str, fs_prefix: &Path) -> Result<CgroupRoot, CgroupError> {
        let (version, own) = detect::own_memory_cgroup(mountinfo, self_cgroup, fs_prefix)?;
        Ok(CgroupRoot { version, dir: own.join("forkvm") })
    }

    pub fn version(&self) -> CgroupVersion {
        self.version
    }

    /// The `forkvm` parent group directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Creates the group `<dir>/<name>` limited to `memory_limit_bytes` (v1:
    /// `memory.limit_in_bytes`; v2: `memory.max`, plus `memory.swap.max = 0` where swap is
    /// accounted). On failure after the directory was made, it is removed again.
    pub fn create(&self, name: &str, memory_limit_bytes: u64) -> Result<SandboxCgroup, CgroupError> {
        validate_name(name)?;
        self.ensure_parent()?;
        let group = self.group(name);
        match std::fs::create_dir(&group.dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Err(CgroupError::AlreadyExists(group.dir)),
            Err(source) => return Err(CgroupError::CreateDir { path: group.dir, source }),
        }
        if let Err(e) = self.set_limit(&group.dir, memory_limit_bytes) {
            let _ = std::fs::remove_dir(&group.dir);
            return Err(e);
        }
        Ok(group)
    }

    /// The existing group `name`, if there is one.
    pub fn open(&self, name: &str) -> Option<SandboxCgroup> {
        validate_name(name).ok()?;
        let group = self.group(name);
        group.dir.is_dir().then_some(group)
    }

    /// Removes every group under `forkvm/` (but the `exiting` leaf) that has no live process
    /// and for whose name `keep` returns false; returns the names removed, sorted. For
    /// cleaning up after a kill -9 of sandboxes or of the daemon.
    pub fn sweep(&self, keep: &dyn Fn(&str) -> bool) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return Vec::new() };
        let mut removed = Vec::new();
        for entry in entries.flatten() {
            let Ok(name) = entry.file_name().into_string() else { continue };
            if !entry.file_type().is_ok_and(|t| t.is_dir()) || validate_name(&name).is_err() || keep(&name) {
                continue;
            }
            let group = self.group(&name);
            if !group.pids().is_ok_and(|pids| pids.is_empty()) {
                continue;
            }
            match group.remove() {
                Ok(()) => removed.push(name),
                Err(e) => tracing::warn!(sandbox_id = %name, error = %e, "cgroup sweep could not remove a group"),
            }
        }
        removed.sort();
        removed
    }

    fn group(&self, name: &str) -> SandboxCgroup {
        SandboxCgroup { version: self.version, dir: self.dir.join(name), exiting: self.dir.join(EXITING) }
    }

    /// Makes sure `forkvm/` exists and, in v2, hands the memory controller to its children.
    fn ensure_parent(&self) -> Result<(), CgroupError> {
        if self.version == CgroupVersion::V2 {
            let parent = self.dir.parent().unwrap_or(&self.dir);
            if !lists_memory(&parent.join("cgroup.subtree_control")) {
                return Err(CgroupError::MemoryNotDelegated { parent: parent.to_path_buf() });
            }
        }
        create_dir_if_missing(&self.dir)?;
        if self.version == CgroupVersion::V2 {
            let path = self.dir.join("cgroup.subtree_control");
            if !lists_memory(&path) {
                std::fs::write(&path, "+memory").map_err(|source| CgroupError::EnableMemory { path, source })?;
            }
        }
        Ok(())
    }

    fn set_limit(&self, dir: &Path, bytes: u64) -> Result<(), CgroupError> {
        let write = |file: &str, value: &str| {
            let path = dir.join(file);
            std::fs::write(&path, value).map_err(|source| CgroupError::SetLimit { path, source })
        };
        match self.version {
            CgroupVersion::V1 => write("memory.limit_in_bytes", &bytes.to_string()),
            CgroupVersion::V2 => {
                write("memory.max", &bytes.to_string())?;
                // Every non-root group has memory.swap.max when swap is accounted, so the
                // (older, pre-existing) parent tells whether the new group has it too.
                if self.dir.join("memory.swap.max").exists() {
                    write("memory.swap.max", "0")?;
                }
                Ok(())
            }
        }
    }
}

/// One sandbox's group, `<root>/forkvm/<name>`.
#[derive(Debug)]
pub struct SandboxCgroup {
    version: CgroupVersion,
    dir: PathBuf,
    exiting: PathBuf,
}

impl SandboxCgroup {
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn name(&self) -> &str {
        self.dir.file_name().and_then(|n| n.to_str()).unwrap_or_default()
    }

    /// Moves process `pid` (0 = the caller), all its threads, into the group.
    pub fn join(&self, pid: u32) -> Result<(), CgroupError> {
        let path = self.dir.join("cgroup.procs");
        std::fs::write(&path, pid.to_string()).map_err(|source| CgroupError::Join { pid, path, source })
    }

    /// The limit in bytes; `u64::MAX` for v2's "max". v1 reads back page-rounded values.
    pub fn memory_limit_bytes(&self) -> Result<u64, CgroupError> {
        self.read_u64(match self.version {
            CgroupVersion::V1 => "memory.limit_in_bytes",
            CgroupVersion::V2 => "memory.max",
        })
    }

    /// Memory currently charged to the group.
    pub fn memory_usage_bytes(&self) -> Result<u64, CgroupError> {
        self.read_u64(match self.version {
            CgroupVersion::V1 => "memory.usage_in_bytes",
            CgroupVersion::V2 => "memory.current",
        })
    }

    /// The processes in the group.
    pub fn pids(&self) -> Result<Vec<u32>, CgroupError> {
        let path = self.dir.join("cgroup.procs");
        let text = read_control(&path)?;
        text.split_whitespace()
            .map(|p| p.parse().map_err(|_| CgroupError::ParseControl { path: path.clone(), content: text.clone() }))
            .collect()
    }

    /// For the process inside the group, at its end: moves the caller to the shared leaf
    /// `forkvm/exiting`, then removes the group (retrying briefly while it is still busy).
    pub fn leave_and_remove(self) -> Result<(), CgroupError> {
        create_dir_if_missing(&self.exiting)?;
        let path = self.exiting.join("cgroup.procs");
        std::fs::write(&path, "0").map_err(|source| CgroupError::MoveToExiting { path, source })?;
        remove_dir_retrying(&self.dir)
    }

    /// For a supervisor after the group's process died: removes the group (retrying briefly
    /// while the kernel finishes with the dead process).
    pub fn remove(self) -> Result<(), CgroupError> {
        remove_dir_retrying(&self.dir)
    }

    fn read_u64(&self, file: &str) -> Result<u64, CgroupError> {
        let path = self.dir.join(file);
        let text = read_control(&path)?;
        match text.trim() {
            "max" => Ok(u64::MAX),
            t => t.parse().map_err(|_| CgroupError::ParseControl { path, content: text }),
        }
    }
}

fn validate_name(name: &str) -> Result<(), CgroupError> {
    let ok = (1..=64).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        && name != EXITING;
    if ok {
        Ok(())
    } else {
        Err(CgroupError::InvalidName(name.to_string()))
    }
}

fn read_control(path: &Path) -> Result<String, CgroupError> {
    std::fs::read_to_string(path).map_err(|source| CgroupError::ReadControl { path: path.to_path_buf(), source })
}

/// Whether a controller list file (`cgroup.controllers`, `cgroup.subtree_control`) has memory.
fn lists_memory(path: &Path) -> bool {
    std::fs::read_to_string(path).is_ok_and(|t| t.split_whitespace().any(|c| c == "memory"))
}

fn create_dir_if_missing(dir: &Path) -> Result<(), CgroupError> {
    match std::fs::create_dir(dir) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
            Err(CgroupError::CreateDir { path: dir.to_path_buf(), source: e })
        }
        _ => Ok(()),
    }
}

/// rmdir, retried on EBUSY for up to [`RMDIR_RETRY_FOR`]: threads and processes that were
/// just moved out or killed may take a moment to leave the group.
fn remove_dir_retrying(dir: &Path) -> Result<(), CgroupError> {
    let deadline = Instant::now() + RMDIR_RETRY_FOR;
    loop {
        match std::fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(source) => return Err(CgroupError::Remove { path: dir.to_path_buf(), source }),
        }
    }
}
