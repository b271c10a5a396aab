//! Per-sandbox cgroups: memory, CPU and pids limits for each sandbox VMM process, and a
//! teardown after which no group outlives its sandbox.
//!
//! Each sandbox process runs in `<own cgroup>/forkvm/<name>`, where `<own cgroup>` is the
//! cgroup of the process that calls [`CgroupRoot::detect`] (normally the daemon). Both
//! cgroup v1 and v2 (the unified hierarchy) are handled; v2 is picked when it offers the
//! memory controller to our group, otherwise v1. On v1 every controller is a hierarchy of
//! its own: the group is made in the `memory` hierarchy and, where they are mounted, in
//! the `cpu` and `pids` ones, under the same name; on v2 it is one directory with the
//! controllers the parent delegates. A limit for a controller the host lacks is skipped
//! ([`CgroupRoot::controllers`] says which there are; `forkvm doctor` shows it).
//!
//! A sandbox process never writes a cgroup file: its starter moves it in
//! ([`SandboxCgroup::join`] with its pid) before it builds its VM, and a cgroup directory
//! can only be removed (rmdir) once no process is in it, so teardown has two paths:
//! 1. a supervisor that saw the process end (`kill`, the registry's sweep) calls
//!    [`SandboxCgroup::remove`];
//! 2. after a crash of everything (kill -9), [`CgroupRoot::sweep`] removes every empty group
//!    that is no longer wanted.
//!
//! forkvm's own processes, the daemon and its spawner, have groups beside the sandboxes'
//! ([`service`]), which no sandbox can be named after and no sweep removes.

mod detect;
mod service;
#[cfg(test)]
mod tests;

pub use service::Service;

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The shared leaf that exiting sandbox processes of earlier versions moved to, kept by
/// the sweep. Not a valid sandbox name.
const EXITING: &str = "exiting";
/// How long a supervisor's rmdir is retried while the group is still busy with leaving
/// threads/processes. A VMM's leader reads as exited while its other threads still
/// leave, the last one unmapping the guest's memory: tens of ms for a GiB, more on a
/// loaded host (at 100 ms a restore right after an archive found the group still there).
const RMDIR_RETRY_FOR: Duration = Duration::from_secs(2);
/// The sweep's retry: it removes groups nobody is known to use, and one still busy is
/// left for the next sweep rather than waited for.
const SWEEP_RMDIR_RETRY_FOR: Duration = Duration::from_millis(100);

/// Which cgroup hierarchy holds the memory controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    /// The v1 `memory` hierarchy (`memory.limit_in_bytes`).
    V1,
    /// The v2 unified hierarchy (`memory.max`).
    V2,
}

/// A resource controller a sandbox's group limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Controller {
    Memory,
    Cpu,
    Pids,
}

impl Controller {
    pub fn name(self) -> &'static str {
        match self {
            Controller::Memory => "memory",
            Controller::Cpu => "cpu",
            Controller::Pids => "pids",
        }
    }
}

/// What one sandbox may use; `None`: no limit on that resource.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Limits {
    pub memory_bytes: Option<u64>,
    /// CPU time, in thousandths of a CPU (1000: one CPU's worth per period).
    pub cpu_millis: Option<u32>,
    /// Tasks (processes and threads) in the group.
    pub pids_max: Option<u32>,
}

/// The CFS period the CPU quota is a share of (100 ms, the kernel's default).
const CPU_PERIOD_US: u64 = 100_000;

/// What went wrong, named by the step that failed.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("cannot read {path}: {source}")]
    ReadProc { path: PathBuf, source: io::Error },
    #[error("no usable memory cgroup on this host (checked: {checked})")]
    NoMemoryController { checked: String },
    #[error("invalid sandbox cgroup name {0:?}: use 1 to 64 of [A-Za-z0-9_-], and not \"exiting\", \"daemon\" or \"spawner\"")]
    InvalidName(String),
    #[error("sandbox cgroup {0} already exists")]
    AlreadyExists(PathBuf),
    #[error("cgroup v2 group {parent} does not delegate the memory controller (memory is not in its cgroup.subtree_control); run forkvm from a cgroup whose subtree has memory enabled")]
    MemoryNotDelegated { parent: PathBuf },
    #[error("create cgroup directory {path}: {source}")]
    CreateDir { path: PathBuf, source: io::Error },
    #[error("set a limit in {path}: {source}")]
    SetLimit { path: PathBuf, source: io::Error },
    #[error("enable the controllers {controllers} in {path}: {source}")]
    EnableController { controllers: String, path: PathBuf, source: io::Error },
    #[error("move pid {pid} into cgroup (write {path}): {source}")]
    Join { pid: u32, path: PathBuf, source: io::Error },
    #[error("read cgroup file {path}: {source}")]
    ReadControl { path: PathBuf, source: io::Error },
    #[error("parse cgroup file {path}: unexpected content {content:?}")]
    ParseControl { path: PathBuf, content: String },
    #[error("remove cgroup directory {path}: {source}")]
    Remove { path: PathBuf, source: io::Error },
    #[error("sandbox cgroup {name} does not exist under {}", root.display())]
    Missing { name: String, root: PathBuf },
}

/// The forkvm parent group, `<mount>/<own cgroup path>/forkvm` (created on first use):
/// in the memory hierarchy (v1) or the unified one (v2), plus, on v1, in the cpu and pids
/// hierarchies where they are mounted.
#[derive(Debug, Clone)]
pub struct CgroupRoot {
    version: CgroupVersion,
    dir: PathBuf,
    /// v1 only: the `forkvm` directory in the cpu and pids hierarchies that exist.
    v1_extra: Vec<(Controller, PathBuf)>,
}

impl CgroupRoot {
    /// Detects the host's memory cgroup from `/proc/self/mountinfo` and `/proc/self/cgroup`.
    pub fn detect() -> Result<CgroupRoot, CgroupError> {
        let read = |path: &str| {
            std::fs::read_to_string(path).map_err(|source| CgroupError::ReadProc { path: path.into(), source })
        };
        Self::detect_from(&read("/proc/self/mountinfo")?, &read("/proc/self/cgroup")?, Path::new("/"))
    }

    /// [`CgroupRoot::detect`], once per process: a process that forks VMMs detects it
    /// before the first fork and its children inherit the answer, which they could not
    /// find themselves inside their jail (no `/proc` there).
    pub fn detected() -> Result<&'static CgroupRoot, CgroupError> {
        static DETECTED: std::sync::OnceLock<CgroupRoot> = std::sync::OnceLock::new();
        if let Some(root) = DETECTED.get() {
            return Ok(root);
        }
        let root = CgroupRoot::detect()?;
        Ok(DETECTED.get_or_init(|| root))
    }

    /// The `forkvm` parent group's directory in every hierarchy it is in, the memory one
    /// first. Creates them if missing.
    pub fn forkvm_dirs(&self) -> Result<Vec<PathBuf>, CgroupError> {
        self.ensure_parent()?;
        let mut dirs = vec![self.dir.clone()];
        dirs.extend(self.v1_extra.iter().map(|(_, d)| d.clone()));
        Ok(dirs)
    }

    /// Detection on given mountinfo and `/proc/self/cgroup` texts; `fs_prefix` is put in front
    /// of mount points (tests pass a tempdir holding a fake tree).
    pub fn detect_from(mountinfo: &str, self_cgroup: &str, fs_prefix: &Path) -> Result<CgroupRoot, CgroupError> {
        let (version, own) = detect::own_memory_cgroup(mountinfo, self_cgroup, fs_prefix)?;
        let v1_extra = match version {
            CgroupVersion::V2 => Vec::new(),
            CgroupVersion::V1 => [Controller::Cpu, Controller::Pids]
                .into_iter()
                .filter_map(|c| {
                    detect::own_v1_dir(mountinfo, self_cgroup, fs_prefix, c.name()).map(|d| (c, forkvm_dir(d)))
                })
                .collect(),
        };
        Ok(CgroupRoot { version, dir: forkvm_dir(own), v1_extra })
    }

    /// The controllers a sandbox's group gets on this host (memory always).
    pub fn controllers(&self) -> Vec<Controller> {
        let mut out = vec![Controller::Memory];
        match self.version {
            CgroupVersion::V1 => out.extend(self.v1_extra.iter().map(|(c, _)| *c)),
            CgroupVersion::V2 => {
                let parent = self.dir.parent().unwrap_or(&self.dir);
                let delegated = std::fs::read_to_string(parent.join("cgroup.subtree_control")).unwrap_or_default();
                out.extend(
                    [Controller::Cpu, Controller::Pids]
                        .into_iter()
                        .filter(|c| delegated.split_whitespace().any(|d| d == c.name())),
                );
            }
        }
        out
    }

    pub fn version(&self) -> CgroupVersion {
        self.version
    }

    /// The `forkvm` parent group directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Creates the group `<dir>/<name>` (in every hierarchy on v1) with `limits` (v1:
    /// `memory.limit_in_bytes`, `cpu.cfs_quota_us`, `pids.max`; v2: `memory.max` plus
    /// `memory.swap.max = 0` where swap is accounted, `cpu.max`, `pids.max`). A limit for
    /// a controller this host lacks is skipped. On failure, what was made is removed.
    pub fn create(&self, name: &str, limits: &Limits) -> Result<SandboxCgroup, CgroupError> {
        validate_name(name)?;
        self.ensure_parent()?;
        let group = self.group(name);
        let mut made: Vec<&Path> = Vec::new();
        let undo = |made: &[&Path]| {
            for d in made {
                let _ = std::fs::remove_dir(d);
            }
        };
        for dir in &group.dirs {
            match std::fs::create_dir(dir) {
                Ok(()) => made.push(dir),
                Err(e) => {
                    undo(&made);
                    return Err(if e.kind() == io::ErrorKind::AlreadyExists {
                        CgroupError::AlreadyExists(dir.clone())
                    } else {
                        CgroupError::CreateDir { path: dir.clone(), source: e }
                    });
                }
            }
        }
        if let Err(e) = self.set_limits(&group, limits) {
            undo(&made);
            return Err(e);
        }
        Ok(group)
    }

    /// The existing group `name`, if there is one.
    pub fn open(&self, name: &str) -> Option<SandboxCgroup> {
        validate_name(name).ok()?;
        let group = self.group(name);
        group.dir().is_dir().then_some(group)
    }

    /// Group `name`, which a starter made and must still exist (an error names it).
    pub fn open_made(&self, name: &str) -> Result<SandboxCgroup, CgroupError> {
        self.open(name).ok_or_else(|| CgroupError::Missing { name: name.to_string(), root: self.dir.clone() })
    }

    /// Removes every group under `forkvm/` (but the `exiting` leaf) that has no live process
    /// and for whose name `keep` returns false; returns the names removed, sorted. For
    /// cleaning up after a kill -9 of sandboxes or of the daemon.
    pub fn sweep(&self, keep: &dyn Fn(&str) -> bool) -> Vec<String> {
        let mut names = std::collections::BTreeSet::new();
        for dir in std::iter::once(&self.dir).chain(self.v1_extra.iter().map(|(_, d)| d)) {
            let Ok(entries) = std::fs::read_dir(dir) else { continue };
            for entry in entries.flatten() {
                if let (Ok(name), true) = (entry.file_name().into_string(), entry.file_type().is_ok_and(|t| t.is_dir()))
                {
                    names.insert(name);
                }
            }
        }
        let mut removed = Vec::new();
        for name in names {
            if validate_name(&name).is_err() || keep(&name) {
                continue;
            }
            let group = self.group(&name);
            if !group.pids().is_ok_and(|pids| pids.is_empty()) {
                continue;
            }
            match group.remove_within(SWEEP_RMDIR_RETRY_FOR) {
                Ok(()) => removed.push(name),
                Err(e) => tracing::warn!(sandbox_id = %name, error = %e, "cgroup sweep could not remove a group"),
            }
        }
        removed.sort();
        removed
    }

    /// How long ago group `name` was made (its directory's time), if it exists.
    pub fn age_of(&self, name: &str) -> Option<Duration> {
        std::fs::metadata(self.dir.join(name)).and_then(|m| m.modified()).ok()?.elapsed().ok()
    }

    fn group(&self, name: &str) -> SandboxCgroup {
        let dirs =
            std::iter::once(&self.dir).chain(self.v1_extra.iter().map(|(_, d)| d)).map(|d| d.join(name)).collect();
        SandboxCgroup { version: self.version, dirs }
    }

    /// Makes sure `forkvm/` exists (in every hierarchy on v1) and, in v2, hands the
    /// memory controller, and the cpu and pids ones where delegated, to its children.
    fn ensure_parent(&self) -> Result<(), CgroupError> {
        if self.version == CgroupVersion::V2 {
            let parent = self.dir.parent().unwrap_or(&self.dir);
            if !lists(&parent.join("cgroup.subtree_control"), "memory") {
                return Err(CgroupError::MemoryNotDelegated { parent: parent.to_path_buf() });
            }
        }
        create_dir_if_missing(&self.dir)?;
        for (_, dir) in &self.v1_extra {
            create_dir_if_missing(dir)?;
        }
        if self.version == CgroupVersion::V2 {
            let path = self.dir.join("cgroup.subtree_control");
            let missing: Vec<String> = self
                .controllers()
                .iter()
                .filter(|c| !lists(&path, c.name()))
                .map(|c| format!("+{}", c.name()))
                .collect();
            if !missing.is_empty() {
                std::fs::write(&path, missing.join(" ")).map_err(|source| CgroupError::EnableController {
                    controllers: missing.join(" "),
                    path: path.clone(),
                    source,
                })?;
            }
        }
        Ok(())
    }

    /// The group directory of `group` that holds `controller`'s files, if any.
    fn dir_for<'g>(&self, group: &'g SandboxCgroup, controller: Controller) -> Option<&'g Path> {
        match (self.version, controller) {
            (_, Controller::Memory) | (CgroupVersion::V2, _) => {
                self.controllers().contains(&controller).then(|| group.dir())
            }
            (CgroupVersion::V1, c) => {
                let i = self.v1_extra.iter().position(|(x, _)| *x == c)?;
                group.dirs.get(i + 1).map(|d| d.as_path())
            }
        }
    }

    fn set_limits(&self, group: &SandboxCgroup, limits: &Limits) -> Result<(), CgroupError> {
        let write = |dir: &Path, file: &str, value: &str| {
            let path = dir.join(file);
            std::fs::write(&path, value).map_err(|source| CgroupError::SetLimit { path, source })
        };
        if let Some(bytes) = limits.memory_bytes {
            let dir = group.dir();
            match self.version {
                CgroupVersion::V1 => write(dir, "memory.limit_in_bytes", &bytes.to_string())?,
                CgroupVersion::V2 => {
                    write(dir, "memory.max", &bytes.to_string())?;
                    // Every non-root group has memory.swap.max when swap is accounted, so the
                    // (older, pre-existing) parent tells whether the new group has it too.
                    if self.dir.join("memory.swap.max").exists() {
                        write(dir, "memory.swap.max", "0")?;
                    }
                }
            }
        }
        if let (Some(millis), Some(dir)) = (limits.cpu_millis, self.dir_for(group, Controller::Cpu)) {
            let quota = (u64::from(millis) * CPU_PERIOD_US / 1000).max(1000);
            match self.version {
                CgroupVersion::V1 => {
                    write(dir, "cpu.cfs_period_us", &CPU_PERIOD_US.to_string())?;
                    write(dir, "cpu.cfs_quota_us", &quota.to_string())?;
                }
                CgroupVersion::V2 => write(dir, "cpu.max", &format!("{quota} {CPU_PERIOD_US}"))?,
            }
        }
        if let (Some(max), Some(dir)) = (limits.pids_max, self.dir_for(group, Controller::Pids)) {
            write(dir, "pids.max", &max.to_string())?;
        }
        Ok(())
    }

    /// The limits `group` has, as its files say (`None` where unlimited or the controller
    /// is missing).
    pub fn limits_of(&self, group: &SandboxCgroup) -> Limits {
        let read = |dir: Option<&Path>, file: &str| -> Option<String> {
            std::fs::read_to_string(dir?.join(file)).ok().map(|t| t.trim().to_string())
        };
        let number = |t: Option<String>| t.and_then(|t| t.split_whitespace().next()?.parse::<u64>().ok());
        let memory_bytes = match self.version {
            CgroupVersion::V1 => number(read(Some(group.dir()), "memory.limit_in_bytes")).filter(|b| *b < (1 << 62)),
            CgroupVersion::V2 => number(read(Some(group.dir()), "memory.max")),
        };
        let cpu = self.dir_for(group, Controller::Cpu);
        let quota = match self.version {
            // -1: no quota.
            CgroupVersion::V1 => read(cpu, "cpu.cfs_quota_us").and_then(|q| q.parse::<i64>().ok()).filter(|q| *q > 0),
            CgroupVersion::V2 => number(read(cpu, "cpu.max")).map(|q| q as i64),
        }
        .map(|q| q as u64);
        Limits {
            memory_bytes,
            cpu_millis: quota.map(|q| (q * 1000 / CPU_PERIOD_US) as u32),
            pids_max: number(read(self.dir_for(group, Controller::Pids), "pids.max")).map(|p| p as u32),
        }
    }
}

/// One sandbox's group, `<root>/forkvm/<name>`: on v1 one directory per hierarchy, the
/// memory one first.
/// `usage_usec` of a v2 `cpu.stat`.
fn cpu_stat_usage_usec(text: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix("usage_usec ")).and_then(|v| v.trim().parse().ok())
}

#[derive(Debug, Clone)]
pub struct SandboxCgroup {
    version: CgroupVersion,
    /// The group's directory in each hierarchy, the memory one first.
    dirs: Vec<PathBuf>,
}

impl SandboxCgroup {
    /// The group's directory in the memory (v1) or unified (v2) hierarchy.
    pub fn dir(&self) -> &Path {
        &self.dirs[0]
    }

    pub fn name(&self) -> &str {
        self.dir().file_name().and_then(|n| n.to_str()).unwrap_or_default()
    }

    /// Moves process `pid` (0 = the caller), all its threads, into the group, in every
    /// hierarchy.
    pub fn join(&self, pid: u32) -> Result<(), CgroupError> {
        for dir in &self.dirs {
            let path = dir.join("cgroup.procs");
            std::fs::write(&path, pid.to_string()).map_err(|source| CgroupError::Join { pid, path, source })?;
        }
        Ok(())
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

    /// CPU time the group used since it was made, in microseconds: v2's `cpu.stat`
    /// `usage_usec`, v1's `cpuacct.usage` (nanoseconds) in whichever hierarchy has it.
    pub fn cpu_usage_usec(&self) -> Result<u64, CgroupError> {
        match self.version {
            CgroupVersion::V2 => {
                let path = self.dir().join("cpu.stat");
                let text = read_control(&path)?;
                cpu_stat_usage_usec(&text).ok_or(CgroupError::ParseControl { path, content: text })
            }
            CgroupVersion::V1 => {
                let path = self
                    .dirs
                    .iter()
                    .map(|d| d.join("cpuacct.usage"))
                    .find(|p| p.exists())
                    .unwrap_or_else(|| self.dir().join("cpuacct.usage"));
                let text = read_control(&path)?;
                let ns: u64 = text.trim().parse().map_err(|_| CgroupError::ParseControl { path, content: text })?;
                Ok(ns / 1000)
            }
        }
    }

    /// The processes in the group.
    pub fn pids(&self) -> Result<Vec<u32>, CgroupError> {
        let path = self.dir().join("cgroup.procs");
        let text = read_control(&path)?;
        text.split_whitespace()
            .map(|p| p.parse().map_err(|_| CgroupError::ParseControl { path: path.clone(), content: text.clone() }))
            .collect()
    }

    /// For a supervisor after the group's process died: removes the group (retrying briefly
    /// while the kernel finishes with the dead process).
    pub fn remove(self) -> Result<(), CgroupError> {
        self.remove_within(RMDIR_RETRY_FOR)
    }

    fn remove_within(self, retry_for: Duration) -> Result<(), CgroupError> {
        let mut first_error = None;
        for dir in &self.dirs {
            if let Err(e) = remove_dir_retrying(dir, retry_for) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    fn read_u64(&self, file: &str) -> Result<u64, CgroupError> {
        let path = self.dir().join(file);
        let text = read_control(&path)?;
        match text.trim() {
            "max" => Ok(u64::MAX),
            t => t.parse().map_err(|_| CgroupError::ParseControl { path, content: text }),
        }
    }
}

/// The `forkvm` group for a process whose own group is `own`: `<own>/forkvm`, or, for a
/// process already in a sandbox's group (a VMM forking a child of its running sandbox,
/// which must join the child's group beside its own), that group's parent.
fn forkvm_dir(own: PathBuf) -> PathBuf {
    match own.parent() {
        Some(parent) if parent.file_name().is_some_and(|n| n == "forkvm") => parent.to_path_buf(),
        _ => own.join("forkvm"),
    }
}

fn validate_name(name: &str) -> Result<(), CgroupError> {
    let ok = (1..=64).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        && name != EXITING
        && Service::ALL.iter().all(|s| s.name() != name);
    if ok {
        Ok(())
    } else {
        Err(CgroupError::InvalidName(name.to_string()))
    }
}

fn read_control(path: &Path) -> Result<String, CgroupError> {
    std::fs::read_to_string(path).map_err(|source| CgroupError::ReadControl { path: path.to_path_buf(), source })
}

/// Whether a controller list file (`cgroup.controllers`, `cgroup.subtree_control`) has
/// `controller`.
fn lists(path: &Path, controller: &str) -> bool {
    std::fs::read_to_string(path).is_ok_and(|t| t.split_whitespace().any(|c| c == controller))
}

fn create_dir_if_missing(dir: &Path) -> Result<(), CgroupError> {
    match std::fs::create_dir(dir) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
            Err(CgroupError::CreateDir { path: dir.to_path_buf(), source: e })
        }
        _ => Ok(()),
    }
}

/// rmdir, retried on EBUSY for up to `retry_for`: threads and processes that were just
/// moved out or killed may take a moment to leave the group.
fn remove_dir_retrying(dir: &Path, retry_for: Duration) -> Result<(), CgroupError> {
    let deadline = Instant::now() + retry_for;
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
