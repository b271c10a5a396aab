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

mod ports;
mod records;
mod recover;
mod row;
mod sweep;

use crate::run_dir::RunDir;
use crate::state::{SandboxState, StateReason};
use forkvm_vmm::host::cgroup::CgroupRoot;
use forkvm_vmm::host::jail::Jail;
use forkvm_vmm::host::seccomp::Seccomp;
use records::Records;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use ports::{ExposedPortRecord, TOKEN_PREFIX};
pub use records::REGISTRY_DB;
pub use recover::Recovered;
pub use row::{Owner, SandboxRow};
pub use sweep::Swept;

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("sandbox {0:?} not found (no running sandbox has this id)")]
    NotFound(String),
    #[error("invalid sandbox id {0:?}: ids are 1 to 64 ASCII letters, digits, '-' or '_'")]
    BadId(String),
    #[error("invalid port {0}: a guest port is 1 to 65535")]
    BadPort(u16),
    #[error("port {port} of sandbox {id:?} is exposed with another key binding: unexpose it first")]
    PortBound { id: String, port: u16 },
    #[error("sandbox registry {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("sandbox record in {path}: {source}")]
    Record { path: PathBuf, source: serde_json::Error },
    #[error("sandbox registry {path}: {source}")]
    Db { path: PathBuf, source: rusqlite::Error },
    #[error("sandbox registry {path} has layout version {found}; this forkvm knows 1 to 7 (stop every sandbox, then remove the file)")]
    Version { path: PathBuf, found: i64 },
    #[error("sandbox registry {path} holds a sandbox state or reason {state:?} this forkvm does not know")]
    BadState { path: PathBuf, state: String },
    #[error("sandbox {id:?} is {state} now: another call moved it while it started")]
    Moved { id: String, state: SandboxState },
    #[error("every sandbox uid ({count} from {first}) is taken by a live sandbox: stop some first")]
    NoFreeUid { first: u32, count: usize },
}

impl RegistryError {
    pub fn code(&self) -> forkvm_api::ErrorCode {
        match self {
            RegistryError::NotFound(_) => forkvm_api::ErrorCode::NotFound,
            RegistryError::BadId(_) | RegistryError::BadPort(_) => forkvm_api::ErrorCode::BadRequest,
            RegistryError::Moved { .. } | RegistryError::PortBound { .. } => forkvm_api::ErrorCode::Conflict,
            RegistryError::NoFreeUid { .. } => forkvm_api::ErrorCode::Conflict,
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
    /// The CPU limit asked for, thousandths of a CPU (none: the default).
    #[serde(default)]
    pub cpu_millis: Option<u32>,
    /// The tasks limit asked for (none: the default).
    #[serde(default)]
    pub pids_max: Option<u32>,
    /// Caps on its disk and entropy I/O (none: no cap).
    pub io_limits: forkvm_api::IoLimits,
    /// Its memory cgroup (name under the forkvm cgroup root).
    #[serde(default)]
    pub cgroup: Option<String>,
    /// Its layered disks as its VMM opened them (`salvage` finds their layers after a
    /// crash from these).
    #[serde(default)]
    pub disks: Vec<RecordedDisk>,
    /// The uid (and gid) its VMM runs as (`forkvm_vmm::host::ids`); none: the VMM has
    /// no ids of its own.
    #[serde(default)]
    pub uid: Option<u32>,
    /// Where its guest may connect to (none: anywhere).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<forkvm_api::NetworkPolicy>,
    /// Its vCPUs (its snapshot's; a record from before vCPUs counted: one).
    #[serde(default = "one_vcpu")]
    pub vcpus: u8,
}

fn one_vcpu() -> u8 {
    1
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
    /// Its run directory's layout.
    pub fn dir(&self) -> RunDir<'_> {
        RunDir::at(&self.run_dir)
    }
    pub fn control_socket(&self) -> PathBuf {
        self.dir().control_socket()
    }
    pub fn vsock(&self) -> PathBuf {
        self.dir().vsock()
    }
    pub fn console(&self) -> PathBuf {
        self.dir().console()
    }
    /// Where the sandbox's layered disks keep their writable layers (`disk<i>/`).
    pub fn disk_dir(&self) -> PathBuf {
        self.dir().disks()
    }
}

/// Whether process `pid` exists and is not a zombie (reaping it if it is our child).
pub fn vmm_alive(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    if forkvm_vmm::host::process::exit_status(pid).is_some() {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => stat.rsplit_once(')').map(|(_, rest)| rest.trim_start()).is_some_and(|r| !r.starts_with('Z')),
        Err(_) => false,
    }
}

/// Whether record `r` names a VMM that runs in its run directory ([`Registry::list`]'s test).
pub fn vmm_runs(r: &SandboxRecord) -> bool {
    r.pid > 0 && r.run_dir.is_dir() && record_alive(r)
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
    let recorded = std::fs::read_to_string(r.dir().vmm_start()).ok().and_then(|text| {
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

/// The pid `vmm.start` in `run_dir` names, if any (a VMM started but not yet in its row).
fn noted_pid(run_dir: &Path) -> Option<i32> {
    let text = std::fs::read_to_string(RunDir::at(run_dir).vmm_start()).ok()?;
    text.split_whitespace().next()?.parse().ok().filter(|p: &i32| *p > 0)
}

/// A pidfd for sandbox `r`'s VMM, if a process with its pid runs and is that VMM: it
/// started no later than [`PID_START_SLACK`] after the record was made. A pid the kernel
/// gave to a new process after the VMM died is not signalled: signals go through the
/// pidfd, which stays bound to the process checked here.
pub fn vmm_pidfd(r: &SandboxRecord) -> Option<std::os::fd::OwnedFd> {
    if r.pid <= 0 {
        return None;
    }
    let fd = pidfd_open(r.pid).ok()?;
    let started = process_start_unix_ms(r.pid)?;
    started_in_time(r, started).then_some(fd)
}

/// How long after its record a sandbox's VMM may have started (records are written
/// after their VMM is forked, within a spawn).
pub const PID_START_SLACK: std::time::Duration = std::time::Duration::from_secs(30);

/// A pidfd for process `pid` (it turns readable when the process ends).
pub fn pidfd_open(pid: i32) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the descriptor was just returned to us and is owned by nobody else.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
}

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

/// Whether every disk directory `r` records lies inside its run directory, or is its
/// own writer directory of a volume (`<store>/volumes/<name>/writers/<its id>`, which
/// outlives it: the volume takes its writes in). Logged if not.
fn disks_inside(r: &SandboxRecord, store: Option<&Path>) -> bool {
    let own_writer = |dir: &Path| store.is_some_and(|s| crate::volumes::is_writer_dir(s, dir, &r.id));
    match r.disks.iter().find(|d| !is_inside(&d.dir, &r.run_dir) && !own_writer(&d.dir)) {
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
    /// directory goes (`salvage`), and whose archives say whether an archived sandbox
    /// still has one; none: no salvage, archives assumed kept.
    store: Option<PathBuf>,
    records: Arc<Records>,
    /// Whether the VMMs this registry starts run under their seccomp filters (on unless
    /// a debugging flag turned them off: [`Registry::without_seccomp`]).
    seccomp: Seccomp,
    /// Whether the VMMs this registry starts enter their jail (on unless a debugging flag
    /// turned it off: [`Registry::without_jail`]).
    jail: Jail,
}

/// Every state but `archived`: the rows a stopped VMM takes with it.
const WITH_A_VMM: [SandboxState; 4] =
    [SandboxState::Starting, SandboxState::Running, SandboxState::Paused, SandboxState::Restoring];

impl Registry {
    /// `$FORKVM_RUN`, `$XDG_RUNTIME_DIR/forkvm`, `/run/forkvm` (root) or `/tmp/forkvm-<uid>`
    /// ([`forkvm_api::paths::default_run_root`]: the daemon's socket is there too).
    pub fn default_root() -> PathBuf {
        forkvm_api::paths::default_run_root()
    }

    /// The registry at `root`, salvaging nothing (see [`Registry::salvaging_into`]).
    pub fn open(root: impl Into<PathBuf>) -> Registry {
        let root = root.into();
        Registry {
            records: Arc::new(Records::at(&root)),
            root,
            store: None,
            seccomp: Seccomp::Enforce,
            jail: Jail::Enforce,
        }
    }

    /// The default registry, salvaging into the default store.
    pub fn open_default() -> Registry {
        Registry::open(Registry::default_root()).salvaging_into(&forkvm_snapshot::Store::default_root())
    }

    /// Salvages a dead sandbox's disk writes into its vault in the store at
    /// `store_root` before removing its run directory (`salvage`), and checks archives
    /// there.
    pub fn salvaging_into(mut self, store_root: &Path) -> Registry {
        self.store = Some(store_root.to_path_buf());
        self
    }

    /// Starts VMMs without their seccomp filters (`--no-seccomp`, for debugging only).
    pub fn without_seccomp(mut self) -> Registry {
        self.seccomp = Seccomp::Off;
        self
    }

    /// Whether the VMMs this registry starts run under their seccomp filters.
    pub fn seccomp(&self) -> Seccomp {
        self.seccomp
    }

    /// Starts VMMs outside their jail (`--no-jail`, for debugging only).
    pub fn without_jail(mut self) -> Registry {
        self.jail = Jail::Off;
        self
    }

    /// Whether the VMMs this registry starts enter their jail.
    pub fn jail(&self) -> Jail {
        self.jail
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The store this registry salvages into and checks archives in, if it knows one.
    pub fn store_root(&self) -> Option<&Path> {
        self.store.as_deref()
    }

    /// The registry database file.
    pub fn db_path(&self) -> &Path {
        self.records.path()
    }

    fn sandboxes_dir(&self) -> PathBuf {
        self.root.join("sandboxes")
    }

    /// Where sandbox `id`'s run directory is (whether or not it exists); `None` for an
    /// invalid id.
    pub fn run_dir(&self, id: &str) -> Option<PathBuf> {
        valid_id(id).then(|| self.sandboxes_dir().join(id))
    }

    fn checked_id(id: &str) -> Result<(), RegistryError> {
        if valid_id(id) {
            Ok(())
        } else {
            Err(RegistryError::BadId(id.to_string()))
        }
    }

    /// Creates the run directory of a new sandbox. Their parent lets every uid pass
    /// (to the run directory its own uid owns) where sandboxes have uids.
    pub fn create_run_dir(&self, id: &str) -> Result<PathBuf, RegistryError> {
        Registry::checked_id(id)?;
        let dir = self.sandboxes_dir().join(id);
        std::fs::create_dir_all(&dir).map_err(|source| RegistryError::Io { path: dir.clone(), source })?;
        if crate::sandbox_uid::confines_by_uid(self) {
            let parent = self.sandboxes_dir();
            crate::sandbox_uid::traversable(&parent).map_err(|source| RegistryError::Io { path: parent, source })?;
        }
        Ok(dir)
    }

    /// Gives each of `records` (rows this process began) a uid of its own (`family`: that
    /// one, its source's), unique among live sandboxes, in one transaction.
    pub fn assign_uids(&self, records: &mut [SandboxRecord], family: Option<u32>) -> Result<(), RegistryError> {
        let ids: Vec<&str> = records.iter().map(|r| r.id.as_str()).collect();
        let uids = self.records.assign_uids(&ids, forkvm_vmm::host::ids::SANDBOX_ID_RANGE, family)?;
        for (r, uid) in records.iter_mut().zip(uids) {
            r.uid = Some(uid);
        }
        Ok(())
    }

    /// A record for new sandbox `id`: no VMM yet, its run directory where its id says.
    pub fn new_record(&self, id: &str, origin: Origin) -> Result<SandboxRecord, RegistryError> {
        Registry::checked_id(id)?;
        Ok(SandboxRecord {
            id: id.to_string(),
            pid: 0,
            run_dir: self.sandboxes_dir().join(id),
            template: origin.template,
            source_tag: origin.source_tag,
            forked_from: origin.forked_from,
            created_at_unix_ms: now_unix_ms(),
            memory_limit_bytes: origin.memory_limit_bytes,
            cpu_millis: origin.cpu_millis,
            pids_max: origin.pids_max,
            io_limits: origin.io_limits,
            cgroup: None,
            disks: Vec::new(),
            uid: None,
            network: origin.network,
            vcpus: origin.vcpus.unwrap_or(1),
        })
    }

    /// Records sandboxes about to start, `starting` and owned by this process, before
    /// any of their processes exists (one transaction): a crash from here on leaves rows
    /// that [`Registry::sweep`] finds abandoned. Ids that have a row keep it.
    pub fn begin(&self, records: &[&SandboxRecord], op: Option<&str>) -> Result<(), RegistryError> {
        self.begin_in(records, op, SandboxState::Starting)
    }

    /// [`Registry::begin`] in another state (`restoring`, or `archived` for an archive
    /// found without a row).
    pub fn begin_in(
        &self,
        records: &[&SandboxRecord],
        op: Option<&str>,
        state: SandboxState,
    ) -> Result<(), RegistryError> {
        if let Some(r) = records.iter().find(|r| !valid_id(&r.id)) {
            return Err(RegistryError::BadId(r.id.clone()));
        }
        self.records.begin(records, records::NewRow { state, op, now_ms: now_unix_ms() })
    }

    /// Notes in `record`'s run directory that its VMM was just started, with its pid
    /// and the time (`vmm.start`): written right after the fork, before the row has the
    /// pid, so that a start interrupted before [`Registry::write_all`] still names its
    /// VMM, and so that a process that gets the pid after the VMM died is told apart
    /// (it started later: `record_alive`). The wall clock only: reading the new VMM's
    /// /proc entry here cost a spawn 0.7 ms a child.
    pub fn note_started(&self, record: &SandboxRecord) {
        if record.pid > 0 && valid_id(&record.id) {
            let file = RunDir::at(&self.sandboxes_dir().join(&record.id)).vmm_start();
            let _ = std::fs::write(file, format!("{} {}\n", record.pid, now_unix_ms()));
        }
    }

    /// Writes what `record` says about its VMM (one row: pid, cgroup, disks, origin)
    /// and notes it started ([`Registry::note_started`]). A row keeps its state and
    /// lifecycle; a sandbox without one is recorded `starting`.
    pub fn write(&self, record: &SandboxRecord) -> Result<(), RegistryError> {
        self.note_started(record);
        self.write_all(&[record])
    }

    /// What `records` say about their VMMs, in one transaction (a spawn's children, each
    /// noted with [`Registry::note_started`] as it was forked).
    pub fn write_all(&self, records: &[&SandboxRecord]) -> Result<(), RegistryError> {
        if let Some(r) = records.iter().find(|r| !valid_id(&r.id)) {
            return Err(RegistryError::BadId(r.id.clone()));
        }
        self.records.put(records, now_unix_ms())
    }

    /// Moves sandbox `id` from one of `from` to `to` with `reason` (compare-and-set, one
    /// statement). Returns whether it moved: `false` when it is in another state or has
    /// no row.
    pub fn transition(
        &self,
        id: &str,
        from: &[SandboxState],
        to: SandboxState,
        reason: Option<StateReason>,
    ) -> Result<bool, RegistryError> {
        Registry::checked_id(id)?;
        Ok(!self.records.transition(&[id], from, to, reason, now_unix_ms())?.is_empty())
    }

    /// Marks sandboxes whose agents answered as running (from `starting`, one
    /// transaction). A sandbox being restored stays `restoring` until its archive is
    /// linked. Fails naming a sandbox whose row is gone or was moved meanwhile.
    pub fn mark_ready(&self, ids: &[&str]) -> Result<(), RegistryError> {
        let moved =
            self.records.transition(ids, &[SandboxState::Starting], SandboxState::Running, None, now_unix_ms())?;
        for id in ids.iter().filter(|id| !moved.iter().any(|m| m == *id)) {
            match self.row(id) {
                Some(r) if r.state == SandboxState::Restoring || r.state == SandboxState::Running => {}
                Some(r) => return Err(RegistryError::Moved { id: id.to_string(), state: r.state }),
                None => return Err(RegistryError::NotFound(id.to_string())),
            }
        }
        Ok(())
    }

    /// Merges `row` from elsewhere (an older forkvmd's own table): inserted whole, or its
    /// lifecycle set on the row the sandbox has.
    pub fn import(&self, row: &SandboxRow) -> Result<(), RegistryError> {
        Registry::checked_id(row.id())?;
        self.records.import(row)
    }

    /// Notes a call that used sandbox `id` at `now_ms`.
    pub fn touch(&self, id: &str, now_ms: u64) -> Result<(), RegistryError> {
        self.records.update(
            "UPDATE sandboxes SET last_activity_unix_ms = ?2 WHERE id = ?1",
            id,
            &[&(now_ms as i64)],
        )?;
        Ok(())
    }

    /// Sets sandbox `id`'s TTL (`None`: none) and when it runs out.
    pub fn set_ttl(
        &self,
        id: &str,
        ttl_seconds: Option<u64>,
        expires_at_unix_ms: Option<u64>,
    ) -> Result<bool, RegistryError> {
        self.records.update(
            "UPDATE sandboxes SET ttl_seconds = ?2, expires_at_unix_ms = ?3 WHERE id = ?1",
            id,
            &[&ttl_seconds.map(|v| v as i64), &expires_at_unix_ms.map(|v| v as i64)],
        )
    }

    /// Records sandbox `id`'s egress policy; whether it has a row.
    pub fn set_network(&self, id: &str, policy: &forkvm_api::NetworkPolicy) -> Result<bool, RegistryError> {
        let column = records::network_column(&Some(policy.clone()));
        self.records.update("UPDATE sandboxes SET network = ?2 WHERE id = ?1", id, &[&column])
    }

    /// Counts a branch of sandbox `id` that made snapshot `tag`.
    pub fn record_branch(&self, id: &str, tag: &str) -> Result<(), RegistryError> {
        self.records.update(
            "UPDATE sandboxes SET branch_count = branch_count + 1, last_branch_tag = ?2 WHERE id = ?1",
            id,
            &[&tag],
        )?;
        Ok(())
    }

    /// Removes sandbox `id`'s row whatever its state (deleting an archived sandbox);
    /// whether it had one.
    pub fn remove(&self, id: &str) -> Result<bool, RegistryError> {
        Registry::checked_id(id)?;
        self.records.delete(id, None)
    }

    /// Removes sandbox `id`'s row if it is in one of `states` (a start that failed before
    /// any VMM ran); whether it did.
    pub fn remove_if(&self, id: &str, states: &[SandboxState]) -> Result<bool, RegistryError> {
        Registry::checked_id(id)?;
        self.records.delete(id, Some(states))
    }

    /// Sandbox `id`'s row, whatever its state (a pure read; `None` for an invalid id or
    /// an unreadable registry, logged).
    pub fn row(&self, id: &str) -> Option<SandboxRow> {
        let dir = self.run_dir(id)?;
        match self.records.get(id, &dir) {
            Ok(r) => r.filter(|r| disks_inside(&r.record, self.store.as_deref())),
            Err(e) => {
                tracing::warn!(id, error = %e, "reading a sandbox record failed");
                None
            }
        }
    }

    /// Every row, oldest first, whatever its state (a pure read).
    pub fn rows(&self) -> Vec<SandboxRow> {
        self.all_rows().into_iter().filter(|r| disks_inside(&r.record, self.store.as_deref())).collect()
    }

    /// Every row, including those whose disks lie outside their run directory (which
    /// only the sweep looks at, to remove them).
    fn all_rows(&self) -> Vec<SandboxRow> {
        let dir = self.sandboxes_dir();
        self.records.all(|id| dir.join(id)).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "reading the sandbox registry failed");
            Vec::new()
        })
    }

    /// The record of sandbox `id` (a valid id) with a VMM, if its run directory is there.
    /// The run directory is derived from the id, never stored; a recorded disk directory
    /// outside it makes the record unreadable (it would be removed or salvaged from).
    fn read(&self, id: &str) -> Option<SandboxRecord> {
        let dir = self.sandboxes_dir().join(id);
        if !dir.is_dir() {
            return None;
        }
        self.row(id).map(|r| r.record).filter(|r| r.pid > 0)
    }

    /// Sandbox `id`'s record and whether its VMM is alive, without cleaning up a dead one
    /// (so its console log can still be read).
    pub fn lookup(&self, id: &str) -> Result<(SandboxRecord, bool), RegistryError> {
        Registry::checked_id(id)?;
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

    /// Every sandbox whose VMM lives, oldest first (a pure read: dead ones are left for
    /// [`Registry::sweep`]).
    pub fn list(&self) -> Vec<SandboxRecord> {
        self.rows().into_iter().map(|r| r.record).filter(vmm_runs).collect()
    }

    /// Removes what sandbox `r` left: its run directory, its cgroup and its row (an
    /// archived sandbox keeps its row: only its VMM is gone).
    pub fn clean_up(&self, r: &SandboxRecord) {
        let _ = std::fs::remove_dir_all(&r.run_dir);
        self.forget(r);
    }

    /// Removes sandbox `r`'s run directory and cgroup but keeps its row: its VMM has
    /// stopped and another starts under the same id (a rewind).
    pub fn release(&self, r: &SandboxRecord) {
        let _ = std::fs::remove_dir_all(&r.run_dir);
        remove_cgroup(r);
    }

    /// Removes sandbox `r`'s cgroup and row (unless archived); its run directory is gone.
    fn forget(&self, r: &SandboxRecord) {
        remove_cgroup(r);
        if let Err(e) = self.records.delete(&r.id, Some(&WITH_A_VMM)) {
            tracing::warn!(id = %r.id, error = %e, "removing a sandbox record failed");
        }
    }
}

fn remove_cgroup(r: &SandboxRecord) {
    if let (Some(name), Ok(root)) = (&r.cgroup, CgroupRoot::detect()) {
        if let Some(g) = root.open(name) {
            let _ = g.remove();
        }
    }
}

/// Where a new sandbox comes from, as its row keeps it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Origin {
    pub template: Option<String>,
    pub source_tag: Option<String>,
    pub forked_from: Option<String>,
    pub memory_limit_bytes: Option<u64>,
    pub cpu_millis: Option<u32>,
    pub pids_max: Option<u32>,
    pub io_limits: forkvm_api::IoLimits,
    /// Its egress policy (none: anywhere).
    pub network: Option<forkvm_api::NetworkPolicy>,
    /// Its vCPUs (none: one).
    pub vcpus: Option<u8>,
}

impl Origin {
    /// The origin sandbox `r` has.
    pub fn of(r: &SandboxRecord) -> Origin {
        Origin {
            template: r.template.clone(),
            source_tag: r.source_tag.clone(),
            forked_from: r.forked_from.clone(),
            memory_limit_bytes: r.memory_limit_bytes,
            cpu_millis: r.cpu_millis,
            pids_max: r.pids_max,
            io_limits: r.io_limits,
            network: r.network.clone(),
            vcpus: Some(r.vcpus),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn record(reg: &Registry, id: &str, pid: i32) -> SandboxRecord {
        SandboxRecord {
            id: id.into(),
            pid,
            run_dir: reg.create_run_dir(id).unwrap(),
            template: Some("tiny".into()),
            source_tag: None,
            forked_from: None,
            created_at_unix_ms: now_unix_ms(),
            memory_limit_bytes: None,
            cpu_millis: None,
            pids_max: None,
            io_limits: Default::default(),
            cgroup: None,
            disks: Vec::new(),
            uid: None,
            network: None,
            vcpus: 1,
        }
    }

    /// Records `r` as a started sandbox whose agent answered.
    fn register(reg: &Registry, r: &SandboxRecord) {
        reg.write(r).unwrap();
        reg.mark_ready(&[r.id.as_str()]).unwrap();
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
        register(&reg, &r);
        assert!(!RunDir::at(&victim).vmm_start().exists() && RunDir::at(&real).vmm_start().exists());
        let read = reg.get("sb1").unwrap();
        assert_eq!(read.run_dir, real);
        reg.clean_up(&read);
        assert!(victim.join("keep").exists() && !real.exists());
        assert!(matches!(reg.lookup("sb1"), Err(RegistryError::NotFound(_))), "cleaning up forgets the record");
        // A disk directory outside the run directory: the record is ignored, and the
        // sweep removes it without touching that directory.
        let mut r = record(&reg, "sb2", std::process::id() as i32);
        r.disks.push(RecordedDisk { id: "d".into(), base: "/b".into(), sealed: Vec::new(), dir: victim.clone() });
        register(&reg, &r);
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
        register(&reg, &r);
        assert!(record_alive(&r) && reg.get("sb").is_ok());
        // When the record was last written decides, not when it was made (a restored
        // sandbox keeps its first creation time).
        r.created_at_unix_ms = process_start_unix_ms(r.pid).unwrap() - 3_600_000;
        register(&reg, &r);
        assert!(record_alive(&r) && vmm_pidfd(&r).is_some());
        // The pid now names a process that started at another time: not the VMM.
        std::fs::write(r.dir().vmm_start(), format!("{} 1000\n", r.pid)).unwrap();
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
        register(&reg, &me);
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead_pid = child.id() as i32;
        child.wait().unwrap();
        let dead = record(&reg, "dead", dead_pid);
        register(&reg, &dead);
        assert_eq!(reg.get("alive").unwrap(), me);
        assert!(matches!(reg.get("dead"), Err(RegistryError::NotFound(_))));
        assert_eq!(reg.list(), vec![me.clone()]);
        assert_eq!(reg.spawned_from("t"), Vec::<String>::new());
        assert!(dead.run_dir.exists(), "reads leave a dead sandbox's run directory to the sweep");
        assert_eq!(reg.sweep().stopped, vec!["dead".to_string()]);
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
