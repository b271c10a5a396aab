//! Archive and restore: a sandbox leaves the host's memory and comes back as it was.
//!
//! `archive` pauses the sandbox and captures it whole — vCPU and device state, memory,
//! disks — into its own run directory, then seals that capture into the store
//! encrypted ([`seal`]): memory and the layered disks' sealed layers as one snapshot of
//! the sandbox's vault, the state as a file sealed with the vault's key, described by
//! `<store>/archives/<id>/` ([`format`]). Only then does its VMM stop. Nothing is lost,
//! and nothing the guest wrote is in the store in the clear.
//!
//! `restore` rebuilds the capture in the new run directory ([`unseal`]: state unsealed,
//! memory decrypted, disks served lazily from the vault) and starts the same sandbox
//! (same id, same processes, same files) with a fresh clock and entropy. The archive
//! stays, linked from the run directory, until the sandbox is archived again (which
//! replaces it) or killed (which removes it): a restored VMM that crashes can be
//! restored from it again.

pub mod format;
mod seal;
mod unseal;

pub use format::{archives_dir, ArchiveManifest, ArchivedDisk};
pub use unseal::RESTORE_IMAGE_DIR;

use crate::lifecycle::{self, LifecycleError};
use crate::registry::{Origin, Registry, RegistryError, SandboxRecord};
use crate::source::{SourceError, SpawnSource};
use crate::spawn::{finish, start_vmms, SpawnError, SpawnOptions, SpawnedSandbox, StartedVmms};
use crate::state::{SandboxState, StateReason};
use forkvm_snapshot::{Store, StoreError};
use forkvm_vmm::vmm::{BranchMode, BranchRequest, DiskCapture};
use format::ARCHIVED_RECORD;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// In a restored sandbox's run directory: a link to its archive (which `kill` removes).
pub const ARCHIVE_LINK: &str = "archive";
/// In an archiving sandbox's run directory: where the capture is written.
const CAPTURE_DIR: &str = "archiving";
/// The capture's name in [`CAPTURE_DIR`].
const CAPTURE_TAG: &str = "capture";

#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error(transparent)]
    Lifecycle(#[from] LifecycleError),
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("sandbox {0} has no archive")]
    NotArchived(String),
    #[error("sandbox {0} is running: restore needs it archived")]
    Running(String),
    #[error("sandbox {id} is {state}: another call is restoring or starting it")]
    Busy { id: String, state: SandboxState },
    #[error("archive of sandbox {id}: {step}: {source}")]
    Io { id: String, step: String, source: std::io::Error },
    #[error("archive of sandbox {id}: {step}: {reason}")]
    Step { id: String, step: &'static str, reason: String },
}

impl ArchiveError {
    /// The API code: `not_found`, `conflict`, `bad_request`, `internal`.
    pub fn code(&self) -> forkvm_api::ErrorCode {
        match self {
            ArchiveError::Lifecycle(e) => e.code(),
            ArchiveError::Spawn(e) => e.code(),
            ArchiveError::Source(e) => e.code(),
            ArchiveError::Store(e) => e.code(),
            ArchiveError::NotArchived(_) => forkvm_api::ErrorCode::NotFound,
            ArchiveError::Running(_) | ArchiveError::Busy { .. } => forkvm_api::ErrorCode::Conflict,
            ArchiveError::Io { .. } | ArchiveError::Step { .. } => forkvm_api::ErrorCode::Internal,
        }
    }
}

/// What archiving did.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ArchiveReport {
    pub sandbox_id: String,
    pub dir: PathBuf,
    /// The vault snapshot holding the archived memory and disks.
    pub disk_snapshot_seq: Option<u64>,
    /// Capturing and sealing the archive (the sandbox was paused throughout).
    pub write_ms: f64,
    pub total_ms: f64,
    pub reason: StateReason,
}

impl ArchiveReport {
    /// As the API reports it (`POST /v1/sandboxes/{id}/archive`, `forkvm archive --json`).
    pub fn to_api(&self) -> forkvm_api::ArchiveReport {
        forkvm_api::ArchiveReport {
            sandbox_id: self.sandbox_id.clone(),
            dir: self.dir.display().to_string(),
            disk_snapshot_seq: self.disk_snapshot_seq,
            write_ms: self.write_ms,
            total_ms: self.total_ms,
            reason: self.reason.as_str().to_string(),
        }
    }
}

fn io(id: &str, step: impl Into<String>) -> impl FnOnce(std::io::Error) -> ArchiveError + '_ {
    let step = step.into();
    move |source| ArchiveError::Io { id: id.to_string(), step, source }
}

/// Archives running sandbox `id` (see the module doc); its row says `archived` for
/// `reason`.
pub fn archive(
    registry: &Registry,
    store: &Store,
    id: &str,
    reason: StateReason,
) -> Result<ArchiveReport, ArchiveError> {
    let started = Instant::now();
    let record = registry.get(id).map_err(LifecycleError::from)?;
    if let Some(row) = registry.row(id).filter(|r| !r.state.is_live()) {
        return Err(ArchiveError::Busy { id: id.to_string(), state: row.state });
    }
    let archives = archives_dir(store);
    std::fs::create_dir_all(&archives).map_err(io(id, format!("creating {}", archives.display())))?;
    let partial = format::partial_dir(store, id);
    format::remove(store, id, &partial).map_err(io(id, "removing an earlier, unfinished archive"))?;
    // Paused first, so nothing the guest does after the capture is lost with the process.
    lifecycle::call(&record, |c| c.pause())?;
    let resume = |e: ArchiveError| {
        let _ = lifecycle::call(&record, |c| c.resume());
        e
    };
    let writing = Instant::now();
    // The capture goes to the sandbox's own run directory, its disks only referenced;
    // sealing moves it into the store encrypted.
    let staging = record.run_dir.join(CAPTURE_DIR);
    let _ = std::fs::remove_dir_all(&staging);
    let req = BranchRequest {
        store: staging.clone(),
        tag: Some(CAPTURE_TAG.into()),
        mode: BranchMode::Full,
        wait: true,
        disks: DiskCapture::Reference,
    };
    let captured = lifecycle::call(&record, |c| c.branch(req)).map_err(|e| resume(e.into()))?;
    let sealed = seal::seal_capture(store, &record, &captured.dir, &partial);
    let _ = std::fs::remove_dir_all(&staging);
    let sealed = match sealed {
        Ok(s) => s,
        Err(e) => {
            let _ = format::remove(store, id, &partial);
            return Err(resume(e));
        }
    };
    let write_ms = writing.elapsed().as_secs_f64() * 1e3;
    // The new archive replaces the one this sandbox was restored from (if any) before
    // the VMM stops: there is always a complete archive or a running sandbox.
    let _ = std::fs::remove_file(record.run_dir.join(ARCHIVE_LINK));
    let final_dir = archives_dir(store).join(id);
    let old = archives_dir(store).join(format!("{id}.old"));
    format::remove(store, id, &old).map_err(|e| resume(io(id, "removing an old archive")(e)))?;
    match std::fs::rename(&final_dir, &old) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(resume(io(id, "setting the previous archive aside")(e)))
        }
        _ => {}
    }
    std::fs::rename(&partial, &final_dir).map_err(|e| resume(io(id, "moving the new archive into place")(e)))?;
    // The archive is complete: the row says so before the VMM stops (a crash in between
    // leaves an archived sandbox whose VMM the sweep stops).
    let live = [SandboxState::Running, SandboxState::Paused];
    registry.transition(id, &live, SandboxState::Archived, Some(reason)).map_err(LifecycleError::from)?;
    lifecycle::kill_record(registry, &record)?;
    format::remove(store, id, &old).map_err(io(id, "removing the previous archive"))?;
    Ok(ArchiveReport {
        sandbox_id: id.to_string(),
        dir: final_dir,
        disk_snapshot_seq: Some(sealed.vault_seq),
        write_ms,
        total_ms: started.elapsed().as_secs_f64() * 1e3,
        reason,
    })
}

/// Restores archived sandbox `id`: same id, processes and files; fresh clock and entropy.
/// [`start_restore`] (which forks: single-threaded callers only) then [`finish_restore`].
pub fn restore(registry: &Registry, store: &Store, id: &str) -> Result<SpawnedSandbox, ArchiveError> {
    let started = Instant::now();
    let pending = start_restore(registry, store, id)?;
    finish_restore(registry, store, pending, started)
}

/// A restore whose VMM is started but not yet answering (see [`start_restore`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PendingRestore {
    pub vmms: StartedVmms,
    /// The record the sandbox had when it was archived.
    pub archived: Option<SandboxRecord>,
    /// Why it was archived: its row says so again if the restore fails.
    #[serde(default)]
    pub reason: Option<StateReason>,
}

/// The record archived sandbox `id` had when it was archived, if its archive has one.
pub fn archived_record(store: &Store, id: &str) -> Option<SandboxRecord> {
    let dir = format::find(store, id)?;
    std::fs::read(dir.join(ARCHIVED_RECORD)).ok().and_then(|b| serde_json::from_slice(&b).ok())
}

/// Whether sandbox `id` has a complete archive in `store`.
pub fn has_archive(store: &Store, id: &str) -> bool {
    format::find(store, id).is_some()
}

/// The first half of [`restore`]: checks the sandbox is archived and not running, and
/// starts its VMM from the archive. The caller must be single-threaded (it forks the
/// VMM); the daemon calls this in its spawner process.
pub fn start_restore(registry: &Registry, store: &Store, id: &str) -> Result<PendingRestore, ArchiveError> {
    match registry.get(id) {
        Ok(_) => return Err(ArchiveError::Running(id.to_string())),
        Err(RegistryError::NotFound(_)) => {}
        Err(e) => return Err(LifecycleError::from(e).into()),
    }
    let dir = format::find(store, id).ok_or_else(|| ArchiveError::NotArchived(id.to_string()))?;
    let manifest = format::read_manifest(&dir, id).map_err(|e| ArchiveError::Step {
        id: id.into(),
        step: "reading archive.json",
        reason: e.to_string(),
    })?;
    let archived = archived_record(store, id);
    let reason = claim_restore(registry, id, archived.as_ref())?;
    let started = start_restore_vmm(registry, store, id, &dir, manifest, archived);
    match started {
        Ok(vmms) => Ok(PendingRestore { reason, ..vmms }),
        Err(e) => {
            let back = reason.or(Some(StateReason::Api));
            let _ = registry.transition(id, &[SandboxState::Restoring], SandboxState::Archived, back);
            Err(e)
        }
    }
}

/// Moves archived sandbox `id`'s row to `restoring`, owned by this process (a row is
/// made from its archived record if it has none: archived on an earlier boot). Refused
/// when another call restores it. Returns why it was archived.
fn claim_restore(
    registry: &Registry,
    id: &str,
    archived: Option<&SandboxRecord>,
) -> Result<Option<StateReason>, ArchiveError> {
    let reason = registry.row(id).and_then(|r| r.reason);
    if registry.row(id).is_none() {
        let record = match archived.filter(|r| r.id == id) {
            Some(r) => r.clone(),
            None => registry.new_record(id, Origin::default()).map_err(LifecycleError::from)?,
        };
        registry.begin_in(&[&record], None, SandboxState::Archived).map_err(LifecycleError::from)?;
    }
    let claimed = registry
        .transition(id, &[SandboxState::Archived], SandboxState::Restoring, None)
        .map_err(LifecycleError::from)?;
    if !claimed {
        let state = registry.row(id).map_or(SandboxState::Running, |r| r.state);
        return Err(ArchiveError::Busy { id: id.to_string(), state });
    }
    Ok(reason)
}

/// Starts restoring sandbox `id`'s VMM from its archive in `dir` (its row is `restoring`).
fn start_restore_vmm(
    registry: &Registry,
    store: &Store,
    id: &str,
    dir: &Path,
    manifest: Option<ArchiveManifest>,
    archived: Option<SandboxRecord>,
) -> Result<PendingRestore, ArchiveError> {
    let opts = SpawnOptions { memory_limit_bytes: archived.as_ref().and_then(|r| r.memory_limit_bytes) };
    let Some(manifest) = manifest else {
        // Format 0: a plaintext snapshot directory, restored as it is.
        let source = SpawnSource::from_dir(dir)?;
        let vmms = start_vmms(registry, &source, &[id.to_string()], &opts)?;
        return Ok(PendingRestore { vmms, archived, reason: None });
    };
    let run_dir = registry.create_run_dir(id).map_err(LifecycleError::from)?;
    let started = unseal::unseal(store, id, dir, &manifest, &run_dir)
        .and_then(|source| start_vmms(registry, &source, &[id.to_string()], &opts).map_err(ArchiveError::from));
    match started {
        Ok(mut vmms) => {
            // The rebuilt image is this restore's alone: no playbook to learn for it.
            vmms.memory_playbook = None;
            Ok(PendingRestore { vmms, archived, reason: None })
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&run_dir);
            Err(e)
        }
    }
}

/// The second half of [`restore`]: waits for the agent, re-identifies the sandbox, puts
/// its archived record back and links the archive. Needs no single-threaded caller.
pub fn finish_restore(
    registry: &Registry,
    store: &Store,
    pending: PendingRestore,
    started: Instant,
) -> Result<SpawnedSandbox, ArchiveError> {
    let PendingRestore { vmms, archived, reason } = pending;
    let id = vmms.records.first().map(|r| r.id.clone()).unwrap_or_default();
    let finished = finish_restore_vmm(registry, store, vmms, archived, started);
    if finished.is_err() {
        let back = reason.or(Some(StateReason::Api));
        let _ = registry.transition(&id, &[SandboxState::Restoring], SandboxState::Archived, back);
    }
    finished
}

fn finish_restore_vmm(
    registry: &Registry,
    store: &Store,
    vmms: StartedVmms,
    archived: Option<SandboxRecord>,
    started: Instant,
) -> Result<SpawnedSandbox, ArchiveError> {
    // Linked only once it runs: `kill` of a half-started restore must not take the
    // archive with it.
    let ready = finish(registry, vmms.records, started)?;
    crate::spawn::learn_memory(vmms.memory_playbook.as_deref(), &ready);
    let mut sandbox = ready.into_iter().next().expect("one sandbox per restore");
    let id = sandbox.record.id.clone();
    let dir = format::find(store, &id).ok_or_else(|| ArchiveError::NotArchived(id.clone()))?;
    let record = &mut sandbox.record;
    if let Some(a) = &archived {
        record.template.clone_from(&a.template);
        record.source_tag.clone_from(&a.source_tag);
        record.forked_from.clone_from(&a.forked_from);
        record.created_at_unix_ms = a.created_at_unix_ms;
    }
    std::os::unix::fs::symlink(&dir, record.run_dir.join(ARCHIVE_LINK)).map_err(io(&id, "linking the archive"))?;
    registry.write(record).map_err(LifecycleError::from)?;
    registry.transition(&id, &[SandboxState::Restoring], SandboxState::Running, None).map_err(LifecycleError::from)?;
    Ok(sandbox)
}

/// The archive a restored sandbox's run directory links to, if any.
pub fn linked_archive(run_dir: &Path) -> Option<PathBuf> {
    std::fs::read_link(run_dir.join(ARCHIVE_LINK)).ok()
}

/// Ids of the archived sandboxes in `store` that are not running.
pub fn list(registry: &Registry, store: &Store) -> Vec<String> {
    let mut ids: Vec<String> = std::fs::read_dir(archives_dir(store))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter_map(|n| n.strip_suffix(".partial").map(String::from).or((!n.contains('.')).then_some(n)))
        .filter(|n| has_archive(store, n) && registry.get(n).is_err())
        .collect();
    ids.sort();
    ids.dedup();
    ids
}
