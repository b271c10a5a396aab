//! Disk-only forks: a new sandbox that boots fresh on a copy of another sandbox's disk,
//! as of one of its encrypted disk snapshots.
//!
//! A memory fork (`fork --tag`, `fork --from-sandbox`) continues a machine: same
//! processes, same page cache. A disk-only fork starts a new machine — the template's
//! kernel and root image, cold-booted — whose data disk is the snapshot's: the files
//! the source wrote, none of its processes, a fresh identity (id, hostname, entropy,
//! agent state) and its own lifetime. The source may be running, archived or gone: the
//! snapshot lives in its vault, and the vault's owner record names the template.
//!
//! The snapshot's blocks are decrypted into one sealed layer in the new sandbox's own
//! directory (over the blank base, which must be the one the snapshot names); the new
//! sandbox writes to its own top above it, so the fork and its source diverge.
//! A cold boot runs the guest kernel's start-up, which is emulated on PVM hosts
//! (about a minute here); on hardware-virtualised hosts it is about a second.

use crate::artifacts::{Artifacts, ArtifactsError};
use crate::disk_snapshots::{base_key, open_vault, read_owner, DiskSnapshotError};
use crate::registry::{now_unix_ms, Registry, SandboxRecord};
use crate::sandbox::new_sandbox_id;
use crate::source::DATA_DISK_ID;
use crate::spawn::{finish_within, make_cgroup, SpawnError, SpawnOptions, SpawnedSandbox};
use crate::template_snapshot::{boot_devices, cmdline, BOOT_TIMEOUT, IRQCHIP, MEM_MIB};
use forkvm_snapshot::Store;
use forkvm_vmm::arch::x86_64::cpuid::CpuTemplate;
use forkvm_vmm::cold_boot::{boot_detached, Machine};
use forkvm_vmm::host::cgroup::CgroupRoot;
use forkvm_vmm::host::HostKind;
use forkvm_vmm::vmm::VmmLabels;
use forkvm_vmm::zygote::{ChildSpec, Owned};
use forkvm_vmm::Payload;
use std::time::Instant;

#[derive(Debug, thiserror::Error)]
pub enum DiskForkError {
    #[error(transparent)]
    Snapshot(#[from] DiskSnapshotError),
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    #[error(transparent)]
    Artifacts(#[from] ArtifactsError),
    #[error("sandbox {0} has no disk snapshot")]
    NoSnapshot(String),
    #[error("sandbox {id} has no disk snapshot {seq}")]
    NoSuchSnapshot { id: String, seq: u64 },
    #[error("disk snapshot {seq} of {id} has no data disk")]
    NoDataDisk { id: String, seq: u64 },
    #[error("the template of {0}'s disk snapshots is not recorded: cannot boot them")]
    UnknownTemplate(String),
    #[error("disk snapshot {seq} of {id} sits on base {want}, but this host's data-disk base is {have}")]
    BaseMismatch { id: String, seq: u64, want: String, have: String },
    #[error("disk fork of {id}: {step}: {reason}")]
    Step { id: String, step: &'static str, reason: String },
}

impl DiskForkError {
    /// The API code: `not_found`, `conflict`, `bad_request`, `internal`.
    pub fn code(&self) -> &'static str {
        match self {
            DiskForkError::Snapshot(e) => e.code(),
            DiskForkError::Spawn(e) => e.code(),
            DiskForkError::NoSnapshot(_) | DiskForkError::NoSuchSnapshot { .. } => "not_found",
            DiskForkError::NoDataDisk { .. } | DiskForkError::UnknownTemplate(_) => "bad_request",
            DiskForkError::BaseMismatch { .. } => "conflict",
            _ => "internal",
        }
    }
}

/// Boots a new sandbox on disk snapshot `seq` (default: the newest) of sandbox `source`.
/// The caller must be single-threaded (the VMM process is forked from it).
pub fn fork_from_disk(
    registry: &Registry,
    store: &Store,
    source: &str,
    seq: Option<u64>,
    opts: &SpawnOptions,
) -> Result<SpawnedSandbox, DiskForkError> {
    let started = Instant::now();
    let record = start_disk_fork(registry, store, source, seq, &new_sandbox_id(), opts)?;
    let mut ready = finish_within(registry, vec![record], started, BOOT_TIMEOUT)?;
    Ok(ready.remove(0))
}

/// The first half of [`fork_from_disk`]: the new sandbox `id`'s disk is restored and its
/// VMM started (cold boot under way, not yet answering); finish with
/// [`crate::spawn::finish_within`] and [`BOOT_TIMEOUT`]. The caller must be
/// single-threaded; the daemon calls this in its spawner process.
pub fn start_disk_fork(
    registry: &Registry,
    store: &Store,
    source: &str,
    seq: Option<u64>,
    id: &str,
    opts: &SpawnOptions,
) -> Result<SandboxRecord, DiskForkError> {
    let id = id.to_string();
    let vault = open_vault(store, source)?;
    let vault_err = |e| DiskSnapshotError::Vault { id: source.to_string(), source: e };
    let all = vault.list().map_err(vault_err)?;
    let snap = match seq {
        Some(seq) => {
            all.iter().find(|s| s.seq == seq).ok_or(DiskForkError::NoSuchSnapshot { id: source.into(), seq })?
        }
        None => all.iter().max_by_key(|s| s.seq).ok_or_else(|| DiskForkError::NoSnapshot(source.into()))?,
    };
    let disk = snap
        .disks
        .iter()
        .find(|d| d.id == DATA_DISK_ID)
        .ok_or(DiskForkError::NoDataDisk { id: source.into(), seq: snap.seq })?;
    let owner = read_owner(store, source)
        .and_then(|o| o.template)
        .ok_or_else(|| DiskForkError::UnknownTemplate(source.into()))?;
    let artifacts = Artifacts::ensure(&owner, &mut |_| {})?;
    let have = base_key(&artifacts.scratch).map_err(|e| DiskForkError::Step {
        id: source.into(),
        step: "reading the data-disk base",
        reason: e.to_string(),
    })?;
    if have != disk.base_key {
        return Err(DiskForkError::BaseMismatch {
            id: source.into(),
            seq: snap.seq,
            want: disk.base_key.clone(),
            have,
        });
    }

    let run_dir = registry.create_run_dir(&id).map_err(SpawnError::from)?;
    let cgroups = opts.memory_limit_bytes.map(|_| CgroupRoot::detect()).transpose().map_err(SpawnError::from)?;
    let cgroup = make_cgroup(&cgroups, &id, opts.memory_limit_bytes).map_err(SpawnError::from)?;
    let mut record = SandboxRecord {
        id: id.clone(),
        pid: 0,
        run_dir: run_dir.clone(),
        template: Some(owner.clone()),
        source_tag: None,
        forked_from: Some(source.to_string()),
        created_at_unix_ms: now_unix_ms(),
        memory_limit_bytes: opts.memory_limit_bytes,
        cgroup: cgroup.clone(),
    };
    let fail = |record: &SandboxRecord, step: &'static str, reason: String| {
        registry.clean_up(record);
        DiskForkError::Step { id: source.to_string(), step, reason }
    };
    // The snapshot, decrypted into one sealed layer of the new sandbox's own.
    let restored = record.disk_dir().join("disk1").join(format!("from-{source}-{}", snap.seq));
    if let Err(e) = vault.restore_layer(snap.seq, DATA_DISK_ID, &restored) {
        return Err(fail(&record, "restoring the disk snapshot", e.to_string()));
    }
    let machine = Machine {
        mem_size: MEM_MIB << 20,
        vcpu_count: 1,
        irqchip: IRQCHIP,
        cpu_template: CpuTemplate::for_host(HostKind::detect()),
        payload: Payload::Linux { kernel: artifacts.kernel.clone(), initrd: None, cmdline: cmdline(&artifacts) },
    };
    let spec = ChildSpec {
        socket: Some(record.control_socket()),
        console_log: Some(record.console()),
        console_stream: None,
        detach: true,
        devices: boot_devices(&artifacts, &record.vsock(), &record.disk_dir(), vec![restored]),
        labels: VmmLabels { sandbox_id: Some(id.clone()), template: Some(owner) },
        owned: Owned { run_dir: Some(run_dir), cgroup },
    };
    record.pid = match boot_detached(machine, spec) {
        Ok(pid) => pid,
        Err(e) => return Err(fail(&record, "starting the VMM", e.to_string())),
    };
    let _ = registry.write(&record);
    Ok(record)
}
