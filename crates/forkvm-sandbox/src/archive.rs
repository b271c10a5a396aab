//! Archive and restore: a sandbox leaves the host's memory and comes back as it was.
//!
//! `archive` pauses the sandbox, writes it whole — vCPU and device state, memory, and
//! its disks (the base and every sealed layer, by hard link) — to
//! `<store>/archives/<id>/`, takes a last encrypted disk snapshot when it has a
//! layered disk, and stops its VMM. Nothing is lost: the archive is a complete,
//! crash-safe snapshot directory, written before the process goes.
//!
//! `restore` starts the same sandbox (same id, same processes, same files) from its
//! archive and gives it a fresh clock and entropy. The archive then holds the restored
//! sandbox's lower disk layers, so it lives as long as the sandbox does: `kill` (the
//! only destructive verb) removes it; a VMM that merely crashes leaves it, and the
//! sandbox can be restored from it again.

use crate::lifecycle::{self, LifecycleError};
use crate::registry::{Registry, RegistryError, SandboxRecord};
use crate::source::{SourceError, SpawnSource};
use crate::spawn::{finish, start_vmms, SpawnError, SpawnOptions, SpawnedSandbox, StartedVmms};
use forkvm_snapshot::{Store, StoreError};
use forkvm_vmm::control::Request;
use forkvm_vmm::vmm::BranchMode;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// In a restored sandbox's run directory: a link to the archive holding its lower layers.
pub const ARCHIVE_LINK: &str = "archive";
/// In an archive: the sandbox's registry record as it was archived.
const ARCHIVED_RECORD: &str = "sandbox.json";

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
    #[error("archiving sandbox {id}: {step}: {source}")]
    Io { id: String, step: String, source: std::io::Error },
}

impl ArchiveError {
    /// The API code: `not_found`, `conflict`, `bad_request`, `internal`.
    pub fn code(&self) -> &'static str {
        match self {
            ArchiveError::Lifecycle(e) => e.code(),
            ArchiveError::Spawn(e) => e.code(),
            ArchiveError::Source(e) => e.code(),
            ArchiveError::Store(e) => e.code(),
            ArchiveError::NotArchived(_) => "not_found",
            ArchiveError::Running(_) => "conflict",
            ArchiveError::Io { .. } => "internal",
        }
    }
}

/// What archiving did.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ArchiveReport {
    pub sandbox_id: String,
    pub dir: PathBuf,
    /// The final encrypted disk snapshot, when the sandbox has a layered disk.
    pub disk_snapshot_seq: Option<u64>,
    /// Writing the archive (the sandbox was paused throughout).
    pub write_ms: f64,
    pub total_ms: f64,
}

/// Where archives live in `store`.
pub fn archives_dir(store: &Store) -> PathBuf {
    store.root().join("archives")
}

fn io(id: &str, step: impl Into<String>) -> impl FnOnce(std::io::Error) -> ArchiveError + '_ {
    let step = step.into();
    move |source| ArchiveError::Io { id: id.to_string(), step, source }
}

/// Archives running sandbox `id` (see the module doc).
pub fn archive(registry: &Registry, store: &Store, id: &str) -> Result<ArchiveReport, ArchiveError> {
    let started = Instant::now();
    let record = registry.get(id).map_err(LifecycleError::from)?;
    let dir = archives_dir(store);
    std::fs::create_dir_all(&dir).map_err(io(id, format!("creating {}", dir.display())))?;
    // A restored sandbox archived again: the new archive is written beside the old one
    // (whose layers it links), and replaces it once the sandbox is stopped.
    let final_dir = dir.join(id);
    let tag = if final_dir.exists() { format!("{id}.next") } else { id.to_string() };
    let _ = std::fs::remove_dir_all(dir.join(format!("{id}.next")));
    // Paused first, so nothing the guest does after the snapshot is lost with the process.
    lifecycle::call(&record, &Request::Pause {})?;
    let resume = |e: ArchiveError| {
        let _ = lifecycle::call(&record, &Request::Resume {});
        e
    };
    let disk_snapshot_seq =
        match crate::disk_snapshots::take(registry, store, id, &crate::disk_snapshots::DEFAULT_RETENTION) {
            Ok(r) => Some(r.seq),
            Err(crate::disk_snapshots::DiskSnapshotError::NoLayeredDisk(_)) => None,
            Err(e) => {
                return Err(resume(ArchiveError::Io {
                    id: id.into(),
                    step: "the final disk snapshot".into(),
                    source: std::io::Error::other(e.to_string()),
                }))
            }
        };
    let writing = Instant::now();
    let branched = lifecycle::branch_to_dir(registry, &dir, id, Some(&tag), BranchMode::Full, true);
    let report = branched.map_err(|e| resume(e.into()))?;
    let write_ms = writing.elapsed().as_secs_f64() * 1e3;
    let json = serde_json::to_vec_pretty(&record).expect("a record serializes");
    std::fs::write(report.dir.join(ARCHIVED_RECORD), json)
        .map_err(|e| resume(io(id, "saving the sandbox record")(e)))?;
    // Stopping a restored sandbox removes the archive it was restored from; the new
    // one links every file it needs.
    lifecycle::kill_record(registry, &record)?;
    if tag != id {
        match std::fs::remove_dir_all(&final_dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(id, "removing the old archive")(e)),
            _ => {}
        }
        std::fs::rename(&report.dir, &final_dir).map_err(io(id, "moving the new archive into place"))?;
    }
    Ok(ArchiveReport {
        sandbox_id: id.to_string(),
        dir: final_dir,
        disk_snapshot_seq,
        write_ms,
        total_ms: started.elapsed().as_secs_f64() * 1e3,
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
}

/// The record archived sandbox `id` had when it was archived, if its archive has one.
pub fn archived_record(store: &Store, id: &str) -> Option<SandboxRecord> {
    let dir = archives_dir(store).join(id);
    std::fs::read(dir.join(ARCHIVED_RECORD)).ok().and_then(|b| serde_json::from_slice(&b).ok())
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
    let dir = archives_dir(store).join(id);
    if !dir.join(forkvm_snapshot::SNAPSHOT_JSON).is_file() {
        return Err(ArchiveError::NotArchived(id.to_string()));
    }
    let archived = archived_record(store, id);
    let source = SpawnSource::from_dir(&dir)?;
    let opts = SpawnOptions { memory_limit_bytes: archived.as_ref().and_then(|r| r.memory_limit_bytes) };
    let vmms = start_vmms(registry, &source, &[id.to_string()], &opts)?;
    Ok(PendingRestore { vmms, archived })
}

/// The second half of [`restore`]: waits for the agent, re-identifies the sandbox, puts
/// its archived record back and links the archive. Needs no single-threaded caller.
pub fn finish_restore(
    registry: &Registry,
    store: &Store,
    pending: PendingRestore,
    started: Instant,
) -> Result<SpawnedSandbox, ArchiveError> {
    let PendingRestore { vmms, archived } = pending;
    // Linked only once it runs: `kill` of a half-started restore must not take the
    // archive with it.
    let ready = finish(registry, vmms.records, started)?;
    crate::spawn::learn_memory(vmms.memory_playbook.as_deref(), &ready);
    let mut sandbox = ready.into_iter().next().expect("one sandbox per restore");
    let id = sandbox.record.id.clone();
    let dir = archives_dir(store).join(&id);
    let record = &mut sandbox.record;
    if let Some(a) = &archived {
        record.template.clone_from(&a.template);
        record.source_tag.clone_from(&a.source_tag);
        record.forked_from.clone_from(&a.forked_from);
        record.created_at_unix_ms = a.created_at_unix_ms;
    }
    std::os::unix::fs::symlink(&dir, record.run_dir.join(ARCHIVE_LINK)).map_err(io(&id, "linking the archive"))?;
    registry.write(record).map_err(LifecycleError::from)?;
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
        .filter(|n| !n.contains('.'))
        .filter(|n| registry.get(n).is_err())
        .collect();
    ids.sort();
    ids
}
