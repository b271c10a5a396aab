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
pub(crate) mod unseal;

pub use format::{archives_dir, ArchiveManifest, ArchivedDisk};

use crate::registry::{Registry, SandboxRecord};
use crate::run_dir::RunDir;
use crate::source::SourceError;
use crate::start::SpawnError;
use crate::state::{SandboxState, StateReason};
use crate::verbs::{self, LifecycleError};
use forkvm_snapshot::{Store, StoreError};
use forkvm_vmm::vmm::{BranchMode, BranchRequest, DiskCapture};
use format::ARCHIVED_RECORD;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The capture's name in its run directory's `RunDir::archive_capture`.
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

pub(crate) fn io(id: &str, step: impl Into<String>) -> impl FnOnce(std::io::Error) -> ArchiveError + '_ {
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
    verbs::call(&record, |c| c.pause())?;
    let resume = |e: ArchiveError| {
        let _ = verbs::call(&record, |c| c.resume());
        e
    };
    let writing = Instant::now();
    // The capture goes to the sandbox's own run directory, its disks only referenced;
    // sealing moves it into the store encrypted.
    let staging = record.dir().archive_capture();
    let _ = std::fs::remove_dir_all(&staging);
    let req = BranchRequest {
        store: staging.clone(),
        tag: Some(CAPTURE_TAG.into()),
        mode: BranchMode::Full,
        wait: true,
        disks: DiskCapture::Reference,
        default_limits: None,
        default_network: None,
    };
    let captured = verbs::call(&record, |c| c.branch(req)).map_err(|e| resume(e.into()))?;
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
    let _ = std::fs::remove_file(record.dir().archive_link());
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
    verbs::kill_record(registry, &record)?;
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

/// The record archived sandbox `id` had when it was archived, if its archive has one.
pub fn archived_record(store: &Store, id: &str) -> Option<SandboxRecord> {
    let dir = format::find(store, id)?;
    std::fs::read(dir.join(ARCHIVED_RECORD)).ok().and_then(|b| serde_json::from_slice(&b).ok())
}

/// Whether sandbox `id` has a complete archive in `store`.
pub fn has_archive(store: &Store, id: &str) -> bool {
    format::find(store, id).is_some()
}

/// The archive a restored sandbox's run directory links to, if any.
pub fn linked_archive(run_dir: &Path) -> Option<PathBuf> {
    std::fs::read_link(RunDir::at(run_dir).archive_link()).ok()
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
