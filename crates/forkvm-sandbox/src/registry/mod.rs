//! The registry of sandboxes: one record per sandbox (who it is, its VMM pid, where it
//! came from, its disks) in `<run root>/registry.db`, the one SQLite file every forkvm
//! process on the host opens (`records`), and one run directory per sandbox under
//! `<run root>/sandboxes/<id>/` holding only runtime files: its control socket, vsock
//! socket, console log, `vmm.start` and its disks' writable layers.
//!
//! The sandbox's VMM process owns its run directory and removes it when it stops;
//! whether a sandbox lives is its VMM's pid (and start time), never the record alone.
//! Reads ([`Registry::get`], [`Registry::list`]) change nothing. A VMM killed with
//! `kill -9` cannot clean up: [`Registry::sweep`], an explicit pass (the daemon's
//! timer, `forkvm sweep`), salvages its disks, removes its run directory and record,
//! and forkvm cgroups no live sandbox uses. The run root is `$FORKVM_RUN`, else
//! `$XDG_RUNTIME_DIR/forkvm`, else `/run/forkvm` for root, else `/tmp/forkvm-<uid>`.

mod records;

use forkvm_vmm::host::cgroup::CgroupRoot;
use records::Records;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use records::REGISTRY_DB;

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("sandbox {0:?} not found (no running sandbox has this id)")]
    NotFound(String),
    #[error("invalid sandbox id {0:?}: ids are 1 to 64 ASCII letters, digits, '-' or '_'")]
    BadId(String),
    #[error("sandbox registry {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("sandbox record in {path}: {source}")]
    Record { path: PathBuf, source: serde_json::Error },
    #[error("sandbox registry {path}: {source}")]
    Db { path: PathBuf, source: rusqlite::Error },
    #[error("sandbox registry {path} has layout version {found}; this forkvm knows 1 (stop every sandbox, then remove the file)")]
    Version { path: PathBuf, found: i64 },
}

impl RegistryError {
    pub fn code(&self) -> forkvm_api::ErrorCode {
        match self {
            RegistryError::NotFound(_) => forkvm_api::ErrorCode::NotFound,
            RegistryError::BadId(_) => forkvm_api::ErrorCode::BadRequest,
            _ => forkvm_api::ErrorCode::Internal,
        }
    }
}

/// What the registry knows about one sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxRecord {
    pub id: String,
    /// Its VMM process.
    pub pid: i32,
    /// The run directory (sockets, console log, this record).
    pub run_dir: PathBuf,
    #[serde(default)]
    pub template: Option<String>,
    /// The tag it was spawned from, if any.
    #[serde(default)]
    pub source_tag: Option<String>,
    /// The sandbox it was forked from while running, if any.
    #[serde(default)]
    pub forked_from: Option<String>,
    pub created_at_unix_ms: u64,
    #[serde(default)]
    pub memory_limit_bytes: Option<u64>,
    /// Its memory cgroup (name under the forkvm cgroup root).
    #[serde(default)]
    pub cgroup: Option<String>,
    /// Its layered disks as its VMM opened them (`salvage` finds their layers after a
    /// crash from these).
    #[serde(default)]
    pub disks: Vec<RecordedDisk>,
}

/// A layered disk as a sandbox's VMM opened it: with the layers the VMM made in `dir`
/// since, every layer of the disk, so that what the guest wrote after the last disk
/// snapshot can be salvaged when the VMM dies (`salvage`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordedDisk {
    /// Its serial (the vault's disk id).
    pub id: String,
    /// The base image.
    pub base: PathBuf,
    /// The sealed layers it was opened on, oldest first (elsewhere than `dir`).
    pub sealed: Vec<PathBuf>,
    /// The VM's own directory for it: tops, sealed tops, merges, inherited links, caches.
    pub dir: PathBuf,
}

/// The layered disks of `devices` (a VM about to start), as a record keeps them.
pub fn recorded_disks(devices: &forkvm_vmm::devices::attach::DeviceConfig) -> Vec<RecordedDisk> {
    devices
        .blocks
        .iter()
        .filter_map(|b| {
            let l = b.layers.as_ref()?;
            Some(RecordedDisk { id: b.id.clone(), base: b.path.clone(), sealed: l.sealed.clone(), dir: l.dir.clone() })
        })
        .collect()
}

impl SandboxRecord {
    pub fn control_socket(&self) -> PathBuf {
        self.run_dir.join("control.sock")
    }
    pub fn vsock(&self) -> PathBuf {
        self.run_dir.join("vsock.sock")
    }
    pub fn console(&self) -> PathBuf {
        self.run_dir.join("console.log")
    }
    /// Where the sandbox's layered disks keep their writable layers (`disk<i>/`).
    pub fn disk_dir(&self) -> PathBuf {
        self.run_dir.join("disks")
    }
}

/// Whether process `pid` exists and is not a zombie (reaping it if it is our child).
pub fn vmm_alive(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    if forkvm_vmm::zygote::exit_status(pid).is_some() {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => stat.rsplit_once(')').map(|(_, rest)| rest.trim_start()).is_some_and(|r| !r.starts_with('Z')),
        Err(_) => false,
    }
}

/// Whether sandbox `r`'s VMM runs: its pid is alive and is that VMM, not a process
/// that got the pid after the VMM died (see [`vmm_pidfd`]).
pub fn record_alive(r: &SandboxRecord) -> bool {
    vmm_alive(r.pid) && process_start_unix_ms(r.pid).is_some_and(|t| started_in_time(r, t))
}

/// Whether a process with `r`'s pid that started at `started_unix_ms` is `r`'s VMM: it
/// started before the record naming that pid was last written (`vmm.start`; the VMM was
/// alive then, so a process that got its pid after it died started later), give or take
/// the clock's rounding; for a record without that file, no later than
/// [`PID_START_SLACK`] after the record was made.
fn started_in_time(r: &SandboxRecord, started_unix_ms: u64) -> bool {
    let recorded = std::fs::read_to_string(r.run_dir.join(VMM_START)).ok().and_then(|text| {
        let mut f = text.split_whitespace();
        let pid: i32 = f.next()?.parse().ok()?;
        let t: u64 = f.next()?.parse().ok()?;
        (pid == r.pid).then_some(t)
    });
    match recorded {
        Some(written) => started_unix_ms <= written.saturating_add(2000),
        None => started_unix_ms <= r.created_at_unix_ms.saturating_add(PID_START_SLACK.as_millis() as u64),
    }
}

/// The file beside a record holding its VMM's pid and when the record was written.
const VMM_START: &str = "vmm.start";

/// A pidfd for sandbox `r`'s VMM, if a process with its pid runs and is that VMM: it
/// started no later than [`PID_START_SLACK`] after the record was made. A pid the kernel
/// gave to a new process after the VMM died is not signalled: signals go through the
/// pidfd, which stays bound to the process checked here.
pub fn vmm_pidfd(r: &SandboxRecord) -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    if r.pid <= 0 {
        return None;
    }
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, r.pid, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: the descriptor was just returned to us and is owned by nobody else.
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) };
    let started = process_start_unix_ms(r.pid)?;
    started_in_time(r, started).then_some(fd)
}

/// How long after its record a sandbox's VMM may have started (records are written
/// after their VMM is forked, within a spawn).
pub const PID_START_SLACK: std::time::Duration = std::time::Duration::from_secs(30);

/// Sends `signal` through `pidfd`.
pub fn pidfd_signal(pidfd: &std::os::fd::OwnedFd, signal: i32) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: pidfd_send_signal with no siginfo; the descriptor is valid for the call.
    let rc = unsafe {
        libc::syscall(libc::SYS_pidfd_send_signal, pidfd.as_raw_fd(), signal, std::ptr::null::<libc::siginfo_t>(), 0)
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// When process `pid` started, in Unix milliseconds (`/proc/<pid>/stat` field 22 and
/// the boot time).
fn process_start_unix_ms(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    let ticks: u64 = rest.split_whitespace().nth(19)?.parse().ok()?;
    // Boot time and clock rate do not change: read once per process (spawns write
    // records in a loop).
    static CLOCK: std::sync::OnceLock<Option<(u64, u64)>> = std::sync::OnceLock::new();
    let (btime, hz) = (*CLOCK.get_or_init(|| {
        let btime: u64 = std::fs::read_to_string("/proc/stat")
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix("btime ").and_then(|v| v.trim().parse().ok()))?;
        // SAFETY: sysconf has no memory effects.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
        Some((btime, hz))
    }))?;
    Some(btime * 1000 + ticks * 1000 / hz)
}

pub fn now_unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Whether `path` is `dir` or below it, with no `..` (lexically).
fn is_inside(path: &Path, dir: &Path) -> bool {
    path.starts_with(dir) && !path.components().any(|c| matches!(c, std::path::Component::ParentDir))
}

/// `r`, if every disk directory it records lies inside its run directory.
fn checked(r: SandboxRecord) -> Option<SandboxRecord> {
    disks_inside(&r).then_some(r)
}

/// Whether every disk directory `r` records lies inside its run directory (logged if not).
fn disks_inside(r: &SandboxRecord) -> bool {
    match r.disks.iter().find(|d| !is_inside(&d.dir, &r.run_dir)) {
        Some(d) => {
            tracing::warn!(id = %r.id, disk = %d.dir.display(), "a sandbox record's disk is outside its run directory; ignored");
            false
        }
        None => true,
    }
}

fn valid_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

#[derive(Debug, Clone)]
pub struct Registry {
    root: PathBuf,
    /// The store whose vaults a dead sandbox's disks are salvaged into before its run
    /// directory goes (`salvage`); none: no salvage.
    salvage_into: Option<PathBuf>,
    records: Arc<Records>,
}

impl Registry {
    /// `$FORKVM_RUN`, `$XDG_RUNTIME_DIR/forkvm`, `/run/forkvm` (root) or `/tmp/forkvm-<uid>`
    /// ([`forkvm_api::paths::default_run_root`]: the daemon's socket is there too).
    pub fn default_root() -> PathBuf {
        forkvm_api::paths::default_run_root()
    }

    /// The registry at `root`, salvaging nothing (see [`Registry::salvaging_into`]).
    pub fn open(root: impl Into<PathBuf>) -> Registry {
        let root = root.into();
        Registry { records: Arc::new(Records::at(&root)), root, salvage_into: None }
    }

    /// The default registry, salvaging into the default store.
    pub fn open_default() -> Registry {
        Registry::open(Registry::default_root()).salvaging_into(&forkvm_snapshot::Store::default_root())
    }

    /// Salvages a dead sandbox's disk writes into its vault in the store at
    /// `store_root` before removing its run directory (`salvage`).
    pub fn salvaging_into(mut self, store_root: &Path) -> Registry {
        self.salvage_into = Some(store_root.to_path_buf());
        self
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn sandboxes_dir(&self) -> PathBuf {
        self.root.join("sandboxes")
    }

    /// Where sandbox `id`'s run directory is (whether or not it exists); `None` for an
    /// invalid id.
    pub fn run_dir(&self, id: &str) -> Option<PathBuf> {
        valid_id(id).then(|| self.sandboxes_dir().join(id))
    }

    /// Creates the run directory of a new sandbox.
    pub fn create_run_dir(&self, id: &str) -> Result<PathBuf, RegistryError> {
        if !valid_id(id) {
            return Err(RegistryError::BadId(id.to_string()));
        }
        let dir = self.sandboxes_dir().join(id);
        std::fs::create_dir_all(&dir).map_err(|source| RegistryError::Io { path: dir.clone(), source })?;
        Ok(dir)
    }

    /// Writes `record` (one row, replacing any earlier one), and beside it in its run
    /// directory when it was written (`vmm.start`).
    pub fn write(&self, record: &SandboxRecord) -> Result<(), RegistryError> {
        if !valid_id(&record.id) {
            return Err(RegistryError::BadId(record.id.clone()));
        }
        // When the record was written, with the pid: a process that got the pid later
        // (after the VMM died) started after this (`record_alive`). The wall clock
        // only: reading the new VMM's /proc entry here cost a spawn 0.7 ms a child.
        if record.pid > 0 {
            let dir = self.sandboxes_dir().join(&record.id);
            let _ = std::fs::write(dir.join(VMM_START), format!("{} {}\n", record.pid, now_unix_ms()));
        }
        self.records.put(record)
    }

    /// The record of sandbox `id` (a valid id), if it has one and its run directory is
    /// there. The run directory is derived from the id, never stored; a recorded disk
    /// directory outside it makes the record unreadable (it would be removed or
    /// salvaged from).
    fn read(&self, id: &str) -> Option<SandboxRecord> {
        let dir = self.sandboxes_dir().join(id);
        if !dir.is_dir() {
            return None;
        }
        let r = match self.records.get(id, &dir) {
            Ok(r) => r?,
            Err(e) => {
                tracing::warn!(id, error = %e, "reading a sandbox record failed");
                return None;
            }
        };
        checked(r)
    }

    /// Sandbox `id`'s record and whether its VMM is alive, without cleaning up a dead one
    /// (so its console log can still be read).
    pub fn lookup(&self, id: &str) -> Result<(SandboxRecord, bool), RegistryError> {
        if !valid_id(id) {
            return Err(RegistryError::BadId(id.to_string()));
        }
        let r = self.read(id).ok_or_else(|| RegistryError::NotFound(id.to_string()))?;
        let alive = record_alive(&r);
        Ok((r, alive))
    }

    /// The live sandbox `id`. A pure read: a dead one is not found, and what it left is
    /// for [`Registry::sweep`].
    pub fn get(&self, id: &str) -> Result<SandboxRecord, RegistryError> {
        match self.lookup(id)? {
            (r, true) => Ok(r),
            (_, false) => Err(RegistryError::NotFound(id.to_string())),
        }
    }

    /// Ids of the live sandboxes spawned from tag `tag` (their disks still read its
    /// sealed layers, which their branches and disk snapshots link by name).
    pub fn spawned_from(&self, tag: &str) -> Vec<String> {
        self.list().into_iter().filter(|r| r.source_tag.as_deref() == Some(tag)).map(|r| r.id).collect()
    }

    /// Every live sandbox, oldest first. A pure read: dead ones are left for
    /// [`Registry::sweep`].
    pub fn list(&self) -> Vec<SandboxRecord> {
        self.records().into_iter().filter_map(checked).filter(record_alive).collect()
    }

    /// Every record, oldest first (none when the registry cannot be read: logged).
    fn records(&self) -> Vec<SandboxRecord> {
        let dir = self.sandboxes_dir();
        self.records.all(|id| dir.join(id)).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "reading the sandbox registry failed");
            Vec::new()
        })
    }

    /// The clean-up pass, the only one that removes anything (reads never do): salvages
    /// the disk writes of sandboxes whose VMM died (when this registry knows the store),
    /// then removes their run directories (those without a record yet are left alone for
    /// a minute: their spawner may still be writing it), and forkvm cgroups of sandboxes
    /// that are not running. The daemon runs it on a timer, the CLI as `forkvm sweep`.
    /// Returns the ids removed.
    pub fn sweep(&self) -> Vec<String> {
        let mut removed = Vec::new();
        let mut live = Vec::new();
        let mut recorded = std::collections::HashSet::new();
        for r in self.records() {
            recorded.insert(r.id.clone());
            if record_alive(&r) {
                live.push(r.cgroup.clone().unwrap_or_default());
                continue;
            }
            let gone = if !disks_inside(&r) {
                // Disks outside its run directory: never salvaged from.
                self.clean_up(&r);
                true
            } else if !r.run_dir.is_dir() {
                // Its VMM stopped and removed its run directory: only the record is left.
                self.forget(&r);
                true
            } else {
                self.clean_up_dead(&r)
            };
            if gone {
                removed.push(r.id);
            }
        }
        for e in std::fs::read_dir(self.sandboxes_dir()).into_iter().flatten().flatten() {
            let id = e.file_name().to_string_lossy().into_owned();
            if recorded.contains(&id) {
                continue;
            }
            // No record yet: its spawner may still be writing it; left alone for a minute.
            let old = e.metadata().and_then(|m| m.modified()).ok().and_then(|t| t.elapsed().ok());
            if old.is_some_and(|age| age.as_secs() > 60) && std::fs::remove_dir_all(e.path()).is_ok() {
                removed.push(id);
            } else {
                live.push(format!("sb-{id}"));
            }
        }
        if let Ok(root) = CgroupRoot::detect() {
            root.sweep(&|name| live.iter().any(|l| l == name));
        }
        removed.sort();
        removed
    }

    /// Abandons sandbox `id` whose spawner died before writing its record (a daemon
    /// restarting after a kill mid-spawn): asks a VMM that may already serve its control
    /// socket to stop, then removes the run directory. Does nothing to a sandbox with a
    /// record (use `lifecycle::kill_record`) or an invalid id.
    pub fn abandon_unrecorded(&self, id: &str) {
        if !valid_id(id) {
            return;
        }
        let dir = self.sandboxes_dir().join(id);
        if self.records.get(id, &dir).ok().flatten().is_some() {
            return;
        }
        let socket = dir.join("control.sock");
        if let Ok(mut c) = forkvm_vmm::control::ControlClient::connect(&socket) {
            let _ = c.shutdown();
            // A VMM that stops cleanly removes its run directory itself.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while dir.exists() && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Cleans up after sandbox `r`, whose VMM died without being stopped: salvages its
    /// disks first when this registry knows the store (`salvage`). A run directory whose
    /// salvage failed is kept (with `salvage-failed` saying why) and retried later; one
    /// another process is salvaging is left to it. Returns whether it is gone.
    fn clean_up_dead(&self, r: &SandboxRecord) -> bool {
        let Some(store) = &self.salvage_into else {
            self.clean_up(r);
            return true;
        };
        if r.disks.iter().any(|d| d.dir.is_dir()) {
            if crate::salvage::failed_recently(&r.run_dir) || !crate::salvage::claim(&r.run_dir) {
                return false;
            }
            match crate::salvage::salvage(&forkvm_snapshot::Store::open(store), r) {
                Ok(Some(info)) => tracing::info!(sandbox = %r.id, seq = info.seq, written_bytes = info.written_bytes,
                    "salvaged the disk writes of a sandbox whose VMM died"),
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(sandbox = %r.id, error = %e, "salvaging a dead sandbox's disks failed; its run directory is kept");
                    crate::salvage::mark_failed(&r.run_dir, &e.to_string());
                    return false;
                }
            }
        }
        self.clean_up(r);
        true
    }

    /// Removes what sandbox `r` left: its run directory, its cgroup and its record.
    pub fn clean_up(&self, r: &SandboxRecord) {
        let _ = std::fs::remove_dir_all(&r.run_dir);
        self.forget(r);
    }

    /// Removes sandbox `r`'s cgroup and record (its run directory is gone).
    fn forget(&self, r: &SandboxRecord) {
        if let (Some(name), Ok(root)) = (&r.cgroup, CgroupRoot::detect()) {
            if let Some(g) = root.open(name) {
                let _ = g.remove();
            }
        }
        if let Err(e) = self.records.delete(&r.id) {
            tracing::warn!(id = %r.id, error = %e, "removing a sandbox record failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(reg: &Registry, id: &str, pid: i32) -> SandboxRecord {
        SandboxRecord {
            id: id.into(),
            pid,
            run_dir: reg.create_run_dir(id).unwrap(),
            template: Some("tiny".into()),
            source_tag: None,
            forked_from: None,
            created_at_unix_ms: now_unix_ms(),
            memory_limit_bytes: None,
            cgroup: None,
            disks: Vec::new(),
        }
    }

    #[test]
    fn paths_in_a_record_are_re_derived_not_trusted() {
        let tmp = tempfile::tempdir().unwrap();
        let reg = Registry::open(tmp.path().join("run"));
        let victim = tmp.path().join("victim");
        std::fs::create_dir(&victim).unwrap();
        std::fs::write(victim.join("keep"), "x").unwrap();
        // A record written naming another directory: its run directory is where its id says.
        let mut r = record(&reg, "sb1", std::process::id() as i32);
        let real = r.run_dir.clone();
        r.run_dir = victim.clone();
        reg.write(&r).unwrap();
        assert!(!victim.join(VMM_START).exists() && real.join(VMM_START).exists());
        let read = reg.get("sb1").unwrap();
        assert_eq!(read.run_dir, real);
        reg.clean_up(&read);
        assert!(victim.join("keep").exists() && !real.exists());
        assert!(matches!(reg.lookup("sb1"), Err(RegistryError::NotFound(_))), "cleaning up forgets the record");
        // A disk directory outside the run directory: the record is ignored, and the
        // sweep removes it without touching that directory.
        let mut r = record(&reg, "sb2", std::process::id() as i32);
        r.disks.push(RecordedDisk { id: "d".into(), base: "/b".into(), sealed: Vec::new(), dir: victim.clone() });
        reg.write(&r).unwrap();
        assert!(matches!(reg.get("sb2"), Err(RegistryError::NotFound(_))));
        assert_eq!(reg.list(), Vec::new());
        assert!(victim.join("keep").exists());
    }

    #[test]
    fn a_reused_pid_is_not_the_vmm() {
        let tmp = tempfile::tempdir().unwrap();
        let reg = Registry::open(tmp.path());
        let mut r = record(&reg, "sb", std::process::id() as i32);
        assert!(vmm_pidfd(&r).is_some(), "this process started before its record");
        // A record made long before this process started: its pid now names another process.
        reg.write(&r).unwrap();
        assert!(record_alive(&r) && reg.get("sb").is_ok());
        // When the record was last written decides, not when it was made (a restored
        // sandbox keeps its first creation time).
        r.created_at_unix_ms = process_start_unix_ms(r.pid).unwrap() - 3_600_000;
        reg.write(&r).unwrap();
        assert!(record_alive(&r) && vmm_pidfd(&r).is_some());
        // The pid now names a process that started at another time: not the VMM.
        std::fs::write(r.run_dir.join(VMM_START), format!("{} 1000\n", r.pid)).unwrap();
        assert!(vmm_pidfd(&r).is_none());
        assert!(!record_alive(&r));
        assert!(reg.get("sb").is_err(), "a record whose pid was reused is not alive");
        // Without the file: no later than the slack after the record was made.
        let mut old = record(&reg, "old", std::process::id() as i32);
        old.created_at_unix_ms = process_start_unix_ms(old.pid).unwrap() - 3_600_000;
        assert!(!record_alive(&old));
        old.created_at_unix_ms = now_unix_ms();
        assert!(record_alive(&old));
        r.pid = i32::MAX;
        assert!(vmm_pidfd(&r).is_none());
    }

    #[test]
    fn reads_are_pure_and_the_sweep_removes_dead_sandboxes() {
        let tmp = tempfile::tempdir().unwrap();
        let reg = Registry::open(tmp.path());
        let me = record(&reg, "alive", std::process::id() as i32);
        reg.write(&me).unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead_pid = child.id() as i32;
        child.wait().unwrap();
        let dead = record(&reg, "dead", dead_pid);
        reg.write(&dead).unwrap();
        assert_eq!(reg.get("alive").unwrap(), me);
        assert!(matches!(reg.get("dead"), Err(RegistryError::NotFound(_))));
        assert_eq!(reg.list(), vec![me.clone()]);
        assert_eq!(reg.spawned_from("t"), Vec::<String>::new());
        assert!(dead.run_dir.exists(), "reads leave a dead sandbox's run directory to the sweep");
        assert_eq!(reg.sweep(), vec!["dead".to_string()]);
        assert!(!dead.run_dir.exists(), "the sweep removes a dead sandbox's run directory");
        assert_eq!(reg.list(), vec![me]);
        assert_eq!(reg.get("../x").unwrap_err().code(), forkvm_api::ErrorCode::BadRequest);
        assert_eq!(reg.get("nope").unwrap_err().code(), forkvm_api::ErrorCode::NotFound);
    }

    #[test]
    // The zombie is the point; `vmm_alive` reaps it.
    #[allow(clippy::zombie_processes)]
    fn zombies_are_not_alive() {
        let child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        std::thread::sleep(std::time::Duration::from_millis(100));
        // `true` has exited but was not waited for: a zombie until vmm_alive reaps it.
        assert!(!vmm_alive(pid));
        assert!(vmm_alive(std::process::id() as i32));
    }
}
