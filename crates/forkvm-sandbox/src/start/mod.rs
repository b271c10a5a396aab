//! The only code that starts a sandbox's VMM. There are five ways, one file each:
//!
//! - [`snapshot`]: N children of a snapshot, forked from one zygote that read it once
//!   (`spawn`, and the restore of an archive);
//! - [`running`]: N children of a running sandbox, forked by its own VMM, with no disk
//!   round trip;
//! - [`disk`]: a cold boot on a disk snapshot of another sandbox;
//! - [`restore`]: an archived sandbox back under its own id (through [`snapshot`]);
//! - [`in_process`]: a VM inside this process, not registered (`forkvm run`'s one-shot
//!   sandbox, the template's cold boot, benchmarks).
//!
//! Every registered start goes through one [`Batch`]: the rows first (`starting`, owned by
//! this process, one transaction), then each child's run directory and cgroup, then the
//! VMMs, each built from the same [`Batch::vmm_spec`], then one transaction with their
//! pids. Whatever fails on the way, the batch undoes all of it: a start gives every
//! sandbox it was asked for, or none. [`crate::ready`] then makes them ready.

pub mod disk;
pub mod in_process;
mod inherited_layers;
pub mod jail;
pub mod limits;
pub mod memory_server;
pub mod restore;
pub mod rewind;
pub mod running;
pub mod snapshot;

use crate::registry::{Origin, Registry, RegistryError, SandboxRecord};
use crate::state::SandboxState;
use forkvm_vmm::devices::attach::DeviceConfig;
use forkvm_vmm::host::cgroup::{CgroupError, CgroupRoot};
use forkvm_vmm::vmm::VmmLabels;
use forkvm_vmm::zygote::{ChildSpec, Owned, ZygoteError};
use std::sync::Arc;
use std::time::Instant;

pub use limits::{default_cpu_millis, LimitError, SpawnOptions, DEFAULT_CPU_MILLIS, DEFAULT_PIDS_MAX};

/// Most sandboxes one call spawns.
pub const MAX_SPAWN: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("spawn: n must be between 1 and {MAX_SPAWN}, got {0}")]
    Count(usize),
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error(transparent)]
    Zygote(#[from] ZygoteError),
    #[error("cgroup limits: {0}")]
    Cgroup(#[from] CgroupError),
    #[error("sandbox {id} (pid {pid}) {}; its console said: {console}", if *exited { "stopped before its agent answered" } else { "did not answer in time" })]
    NotReady { id: String, pid: i32, exited: bool, console: String },
    #[error("sandbox {id}: applying its identity: {source}")]
    Identity { id: String, source: forkvm_proto::ClientError },
    #[error("a readiness worker thread panicked")]
    Worker,
    #[error(transparent)]
    Jail(#[from] forkvm_vmm::host::jail::JailError),
    #[error(transparent)]
    Limit(#[from] LimitError),
    #[error("a sandbox's network: {0}")]
    Network(#[from] crate::network::NetworkError),
    #[error(transparent)]
    Volume(#[from] crate::volumes::VolumeError),
    #[error(transparent)]
    MemoryServer(#[from] memory_server::MemoryServerError),
}

impl SpawnError {
    pub fn code(&self) -> forkvm_api::ErrorCode {
        match self {
            SpawnError::Count(_) | SpawnError::Limit(_) => forkvm_api::ErrorCode::BadRequest,
            SpawnError::Registry(e) => e.code(),
            SpawnError::Volume(e) => e.code(),
            _ => forkvm_api::ErrorCode::Internal,
        }
    }
}

/// Whether making a cgroup failed for want of permission (forkvm run by a user).
fn is_permission(e: &CgroupError) -> bool {
    let io = match e {
        CgroupError::CreateDir { source, .. } | CgroupError::SetLimit { source, .. } => source,
        CgroupError::EnableController { source, .. } => source,
        _ => return false,
    };
    matches!(io.raw_os_error(), Some(libc::EACCES) | Some(libc::EPERM) | Some(libc::EROFS))
}

/// Says once per process that sandboxes start without cgroup limits, and why.
fn warn_once_without_cgroups(e: &CgroupError) {
    static WARNED: std::sync::Once = std::sync::Once::new();
    WARNED.call_once(|| tracing::warn!(error = %e, "sandboxes start without cgroup limits (CPU, tasks)"));
}

/// Up to `n` bytes from the host's getrandom (fewer only if it fails).
pub(crate) fn host_random(n: usize) -> Vec<u8> {
    let mut b = vec![0u8; n];
    // SAFETY: getrandom writes at most `b.len()` bytes into `b`.
    let got = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    b.truncate(got.max(0) as usize);
    b
}

fn random_hex(bytes: usize) -> String {
    let mut b = host_random(bytes);
    if b.len() != bytes {
        // Fall back to time and pid: ids must differ, not be secret.
        let seed = format!("{:?}{}", Instant::now(), std::process::id());
        b = blake3::hash(seed.as_bytes()).as_bytes()[..bytes].to_vec();
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A fresh sandbox id (16 hex digits).
pub fn new_sandbox_id() -> String {
    random_hex(8)
}

/// Which uid a batch's VMMs run as (`forkvm_vmm::host::ids`), where sandboxes get uids
/// at all ([`crate::sandbox_uid::confines_by_uid`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum VmmUids {
    /// Each its own, new.
    Own,
    /// Their source's (children of a running sandbox, forked by its VMM under its uid;
    /// none when the source has none).
    Source(Option<u32>),
}

/// Sandboxes being started together: their rows, run directories and cgroups, and which
/// of their VMMs run so far. Dropped before [`Batch::commit`], it stops those VMMs and
/// removes everything else it made.
pub(crate) struct Batch<'r> {
    registry: &'r Registry,
    records: Vec<SandboxRecord>,
    /// `records[..started]` have a VMM.
    started: usize,
    committed: bool,
    /// The jail its VMMs enter, found for the first (the children of a batch differ only
    /// in paths inside their run directories, which every jail shows).
    jail: Option<Option<Arc<forkvm_vmm::host::jail::JailNamespaces>>>,
    /// The caps its VMMs' devices get.
    rate_limits: forkvm_vmm::devices::attach::RateLimits,
}

impl<'r> Batch<'r> {
    /// Records `ids` as starting from `origin` (one transaction: a crash from here on
    /// leaves rows the sweep finds abandoned), then makes each one's run directory and its
    /// cgroup `sb-<id>` with [`SpawnOptions::limits`].
    pub(crate) fn begin(
        registry: &'r Registry,
        ids: &[String],
        origin: Origin,
        opts: &SpawnOptions,
        uids: VmmUids,
    ) -> Result<Batch<'r>, SpawnError> {
        if ids.is_empty() || ids.len() > MAX_SPAWN {
            return Err(SpawnError::Count(ids.len()));
        }
        opts.validate()?;
        // The record keeps what was asked (a fork or restore asks the same), not the
        // defaults, which a start without cgroups does not have.
        let origin = opts.recorded_in(origin);
        let limits = opts.limits(origin.vcpus.unwrap_or(1));
        let records: Vec<SandboxRecord> =
            ids.iter().map(|id| registry.new_record(id, origin.clone())).collect::<Result<_, _>>()?;
        registry.begin(&records.iter().collect::<Vec<_>>(), None)?;
        let rate_limits = opts.rate_limits();
        let mut batch = Batch { registry, records, started: 0, committed: false, jail: None, rate_limits };
        let family = match uids {
            VmmUids::Own => Some(None),
            VmmUids::Source(uid) => uid.map(Some),
        };
        if let Some(family) = family.filter(|_| crate::sandbox_uid::confines_by_uid(registry)) {
            registry.assign_uids(&mut batch.records, family)?;
        }
        let root = match CgroupRoot::detect() {
            Ok(root) => Some(root),
            Err(e) if opts.asks() => return Err(e.into()),
            Err(e) => {
                warn_once_without_cgroups(&e);
                None
            }
        };
        for r in &mut batch.records {
            let dir = registry.create_run_dir(&r.id)?;
            if let Some(uid) = r.uid {
                crate::sandbox_uid::own_tree(&dir, uid, uid)
                    .map_err(|source| RegistryError::Io { path: dir, source })?;
            }
            let Some(root) = &root else { continue };
            let name = format!("sb-{}", r.id);
            match root.create(&name, &limits) {
                Ok(_) => r.cgroup = Some(name),
                // Only a limit the caller asked for must hold; the defaults are best
                // effort where this process may not make cgroups (not root).
                Err(e) if opts.asks() || !is_permission(&e) => return Err(e.into()),
                Err(e) => warn_once_without_cgroups(&e),
            }
        }
        Ok(batch)
    }

    pub(crate) fn records(&self) -> &[SandboxRecord] {
        &self.records
    }

    pub(crate) fn records_mut(&mut self) -> &mut [SandboxRecord] {
        &mut self.records
    }

    /// The caps the batch's VMMs' devices get.
    pub(crate) fn rate_limits(&self) -> forkvm_vmm::devices::attach::RateLimits {
        self.rate_limits
    }

    /// How child `i`'s VMM process is made: its control socket and console log in its run
    /// directory, `devices` (with the batch's I/O caps), its labels, and the run directory and cgroup it owns (removed
    /// when it stops). Notes the disks it will have in its record.
    pub(crate) fn vmm_spec(&mut self, i: usize, mut devices: DeviceConfig) -> Result<ChildSpec, SpawnError> {
        devices.rate_limits = self.rate_limits;
        let jail = match &self.jail {
            Some(j) => j.clone(),
            None => self.jail.insert(jail::for_vmms(self.registry, &devices)?).clone(),
        };
        let r = &mut self.records[i];
        r.disks = crate::registry::recorded_disks(&devices);
        if let Some(uid) = r.uid {
            // What was made in it since (a restored disk layer, a link to an archive).
            let dir = &r.run_dir;
            crate::sandbox_uid::own_tree(dir, uid, uid)
                .map_err(|source| RegistryError::Io { path: dir.clone(), source })?;
        }
        Ok(ChildSpec {
            socket: Some(r.control_socket()),
            console_log: Some(r.console()),
            console_stream: None,
            detach: true,
            devices,
            labels: VmmLabels { sandbox_id: Some(r.id.clone()), template: r.template.clone() },
            owned: Owned {
                run_dir: Some(r.run_dir.clone()),
                cgroup: r.cgroup.clone(),
                seccomp: self.registry.seccomp(),
                jail,
                ids: r.uid.map(forkvm_vmm::host::ids::SandboxIds::of),
            },
            memory_source: None,
        })
    }

    /// Notes that child `i`'s VMM runs as `pid` (`vmm.start`, before the row has it).
    /// Children start in order.
    pub(crate) fn started(&mut self, i: usize, pid: i32) {
        debug_assert_eq!(i, self.started, "children start in order");
        self.records[i].pid = pid;
        self.registry.note_started(&self.records[i]);
        self.started = i + 1;
    }

    /// Moves child `i`'s VMM (started) into its cgroup, if it has one: for VMMs forked
    /// by another VMM, which may not write cgroup files.
    pub(crate) fn move_into_group(&self, i: usize) -> Result<(), SpawnError> {
        let r = &self.records[i];
        let Some(name) = &r.cgroup else { return Ok(()) };
        let group = CgroupRoot::detected()?.open_made(name)?;
        Ok(group.join(r.pid as u32)?)
    }

    /// Writes every child's VMM into its row, in one transaction, and hands the records
    /// out; without the rows the VMMs could not be found, so a failure stops them.
    pub(crate) fn commit(mut self) -> Result<Vec<SandboxRecord>, SpawnError> {
        self.registry.write_all(&self.records.iter().collect::<Vec<_>>())?;
        self.committed = true;
        Ok(std::mem::take(&mut self.records))
    }
}

impl Drop for Batch<'_> {
    fn drop(&mut self) {
        if self.committed {
            return;
        }
        for (i, r) in self.records.iter().enumerate() {
            if i < self.started {
                let _ = crate::verbs::kill_record(self.registry, r);
            } else {
                self.registry.clean_up(r);
            }
            let _ = self.registry.remove_if(&r.id, &[SandboxState::Starting]);
        }
    }
}

/// Milliseconds since `t`.
pub(crate) fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}
