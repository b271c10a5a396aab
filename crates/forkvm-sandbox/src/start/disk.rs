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
//! How the snapshot reaches the new sandbox's disk ([`DiskRestore`]):
//!
//! * **lazy with playbook** (the default): the VMM opens the snapshot as a lazy layer
//!   (blocks fetched and decrypted into a cache layer in the new sandbox's directory on
//!   first read) and replays the template's playbook — the blocks earlier disk forks of
//!   this template read while booting — in the background. Once the sandbox answers,
//!   its own first reads are merged into the playbook, which so improves with use.
//! * **lazy**: the same, without the replay (reads fetch on demand; still recorded).
//! * **eager**: every block is decrypted into one sealed layer before the VMM starts.
//!
//! Either way the base must be the one the snapshot names, and the new sandbox writes
//! to its own top, so the fork and its source diverge. A lazy disk becomes an ordinary
//! one (its cache, completed, sealed) at its first seal: the first disk snapshot,
//! branch or fork. A cold boot runs the guest kernel's start-up, which is emulated on
//! PVM hosts (about a minute here); on hardware-virtualised hosts it is about a second.

use super::{ms_since, new_sandbox_id, Batch, SpawnError, SpawnOptions, VmmUids};
use crate::artifacts::{Artifacts, ArtifactsError};
use crate::disk_snapshots::{base_key, keys_dir, open_vault, read_owner, vault_dir, DiskSnapshotError};
use crate::guest::{boot_devices, machine, BOOT_TIMEOUT};
use crate::ready::{finish_within, SpawnedSandbox};
use crate::registry::{Origin, Registry, SandboxRecord};
use crate::source::DATA_DISK_ID;
use crate::verbs::{call, LifecycleError};
use forkvm_snapshot::vault::lazy::{MergeRule, Playbook, Recording};
use forkvm_snapshot::vault::KeyStore;
use forkvm_snapshot::Store;
use forkvm_vmm::arch::x86_64::cpuid::CpuTemplate;
use forkvm_vmm::cold_boot::boot_detached;
use forkvm_vmm::devices::virtio::blk::{LazySource, RecordingSaved};
use forkvm_vmm::vmm::disks::LazyDisk;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
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
    pub fn code(&self) -> forkvm_api::ErrorCode {
        match self {
            DiskForkError::Snapshot(e) => e.code(),
            DiskForkError::Spawn(e) => e.code(),
            DiskForkError::NoSnapshot(_) | DiskForkError::NoSuchSnapshot { .. } => forkvm_api::ErrorCode::NotFound,
            DiskForkError::NoDataDisk { .. } | DiskForkError::UnknownTemplate(_) => forkvm_api::ErrorCode::BadRequest,
            DiskForkError::BaseMismatch { .. } => forkvm_api::ErrorCode::Conflict,
            _ => forkvm_api::ErrorCode::Internal,
        }
    }
}

/// How a disk fork's disk is restored from the snapshot (see the module doc).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DiskRestore {
    /// Decrypt everything before the VMM starts.
    Eager,
    /// Fetch on first read.
    Lazy,
    /// Fetch on first read, and replay the template's playbook right after start.
    #[default]
    LazyPlaybook,
}

impl DiskRestore {
    pub fn name(self) -> &'static str {
        match self {
            DiskRestore::Eager => "eager",
            DiskRestore::Lazy => "lazy",
            DiskRestore::LazyPlaybook => "lazy_playbook",
        }
    }
}

/// A disk fork whose VMM has started (see [`start_disk_fork`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StartedDiskFork {
    pub record: SandboxRecord,
    pub restore: DiskRestore,
    /// Host time spent making the disk ready before the VMM started: decrypting the
    /// whole snapshot (eager), or opening it lazily.
    pub restore_ms: f64,
}

/// A disk fork that answers.
#[derive(Debug)]
pub struct DiskFork {
    pub sandbox: SpawnedSandbox,
    pub restore: DiskRestore,
    /// See [`StartedDiskFork::restore_ms`].
    pub restore_ms: f64,
    /// The lazy disks' counters when the sandbox first answered (empty when eager).
    pub lazy: Vec<LazyDisk>,
}

/// Boots a new sandbox on disk snapshot `seq` (default: the newest) of sandbox `source`.
/// The caller must be single-threaded (the VMM process is forked from it).
pub fn fork_from_disk(
    registry: &Registry,
    store: &Store,
    source: &str,
    seq: Option<u64>,
    restore: DiskRestore,
    opts: &SpawnOptions,
) -> Result<DiskFork, DiskForkError> {
    let started = Instant::now();
    let fork = start_disk_fork(registry, store, source, seq, &new_sandbox_id(), restore, opts)?;
    let sandbox = finish_within(registry, vec![fork.record], started, BOOT_TIMEOUT)?.remove(0);
    let lazy = end_restore_recording(store, &sandbox.record).unwrap_or_else(|e| {
        tracing::warn!(sandbox = %sandbox.record.id, error = %e, "ending the restore's recording failed");
        Vec::new()
    });
    Ok(DiskFork { sandbox, restore: fork.restore, restore_ms: fork.restore_ms, lazy })
}

/// Ends the recording of a disk fork's first reads, merges them into its template's
/// playbook, and returns its lazy disks' counters: what a disk fork does once the
/// sandbox answers. Empty for a sandbox with no lazy disk. The VMM, under its
/// sandbox's uid, cannot write the store: it reports its first reads and this merges
/// them (into the one playbook the library names: the template's, for its data disk).
pub fn end_restore_recording(store: &Store, record: &SandboxRecord) -> Result<Vec<LazyDisk>, LifecycleError> {
    let mut disks = lazy_disks(record, true)?;
    for d in &mut disks {
        let Some(recording) = d.report.take_recording() else { continue };
        let Some(template) = record.template.as_deref().filter(|_| d.id == DATA_DISK_ID) else { continue };
        let path = playbook_path(store, template, DATA_DISK_ID);
        d.report.recording = Some(learn_playbook(&path, d.report.size, &recording));
    }
    Ok(disks)
}

/// Merges one restore's first reads into the playbook at `path` (a hint: a failure is
/// reported, not raised).
fn learn_playbook(path: &Path, disk_size: u64, recording: &Recording) -> RecordingSaved {
    let mut saved = RecordingSaved { touches: recording.touches.len(), saved_to: None, runs: 0, error: None };
    match Playbook::merge_into_file(path, disk_size, recording, &MergeRule::default()) {
        Ok(book) => {
            saved.saved_to = Some(path.to_path_buf());
            saved.runs = book.runs();
        }
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "saving the playbook failed");
            saved.error = Some(e.to_string());
        }
    }
    saved
}

/// A running sandbox's lazy disks' counters; `finish_recording` ends their recordings
/// (the reports then carry the first reads, see [`end_restore_recording`]).
pub fn lazy_disks(record: &SandboxRecord, finish_recording: bool) -> Result<Vec<LazyDisk>, LifecycleError> {
    call(record, |c| c.lazy_disks(finish_recording))
}

/// Where the playbook of `template`'s disk `disk_id` lives in `store`.
pub fn playbook_path(store: &Store, template: &str, disk_id: &str) -> PathBuf {
    store.root().join("playbooks").join(template).join(format!("{disk_id}.playbook"))
}

/// The first half of [`fork_from_disk`]: the new sandbox `id`'s disk is restored and its
/// VMM started (cold boot under way, not yet answering); finish with
/// [`crate::ready::finish_within`] and [`BOOT_TIMEOUT`]. The caller must be
/// single-threaded; the daemon calls this in its spawner process.
pub fn start_disk_fork(
    registry: &Registry,
    store: &Store,
    source: &str,
    seq: Option<u64>,
    id: &str,
    restore: DiskRestore,
    opts: &SpawnOptions,
) -> Result<StartedDiskFork, DiskForkError> {
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
    let recorded = read_owner(store, source);
    let vcpus = recorded.as_ref().and_then(|o| o.vcpus).unwrap_or(1);
    let owner = recorded.and_then(|o| o.template).ok_or_else(|| DiskForkError::UnknownTemplate(source.into()))?;
    // The new sandbox boots on as many vCPUs as its source had.
    let artifacts = Artifacts::ensure(&owner, &mut |_| {})?.with_vcpus(Some(vcpus), &mut |_| {})?;
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

    let origin = Origin {
        template: Some(owner.clone()),
        forked_from: Some(source.to_string()),
        vcpus: Some(vcpus),
        ..Origin::default()
    };
    let mut batch = Batch::begin(registry, std::slice::from_ref(&id), origin, opts, VmmUids::Own)?;
    let step = |step: &'static str, reason: String| DiskForkError::Step { id: source.to_string(), step, reason };
    // The snapshot as the new sandbox's own lowest layer: decrypted now (eager), or a
    // cache that fills in as the guest reads (lazy; opened here once so that a bad
    // source fails this call, then again by the VMM, which keeps no inherited file).
    let disk_dir = batch.records()[0].disk_dir();
    let restored = disk_dir.join("disk1").join(format!("from-{source}-{}", snap.seq));
    let restoring = Instant::now();
    let (sealed, lazy) = match restore {
        DiskRestore::Eager => {
            vault
                .restore_layer(snap.seq, DATA_DISK_ID, &restored)
                .map_err(|e| step("restoring the disk snapshot", e.to_string()))?;
            (vec![restored], None)
        }
        DiskRestore::Lazy | DiskRestore::LazyPlaybook => {
            let key = KeyStore::open(&keys_dir())
                .and_then(|k| k.sandbox_key(source))
                .map_err(|e| step("unlocking the source's vault", e.to_string()))?;
            let lazy = LazySource {
                vault: vault_dir(store, source),
                key,
                seq: snap.seq,
                disk_id: DATA_DISK_ID.to_string(),
                cache: restored,
                playbook: Some(playbook_path(store, &owner, DATA_DISK_ID)),
                prefetch: restore == DiskRestore::LazyPlaybook,
            };
            lazy.open().map_err(|e| step("opening the disk snapshot lazily", e.to_string()))?;
            (Vec::new(), Some(lazy))
        }
    };
    let restore_ms = ms_since(restoring);
    let vsock = batch.records()[0].vsock();
    // Its own network namespace (the VMM's tap keeps it) when templates have a network.
    let net = if crate::guest::has_network() {
        Some(crate::network::pool::take().map_err(|e| step("making its network", e.to_string()))?)
    } else {
        None
    };
    let spec = batch.vmm_spec(0, boot_devices(&artifacts, &vsock, &disk_dir, sealed, lazy, net.as_ref()))?;
    let pid = boot_detached(machine(&artifacts, CpuTemplate::for_this_host()), spec)
        .map_err(|e| step("starting the VMM", e.to_string()))?;
    batch.started(0, pid);
    drop(net);
    let record = batch.commit()?.remove(0);
    Ok(StartedDiskFork { record, restore, restore_ms })
}
