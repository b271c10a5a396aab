//! Deleting a sandbox, the only destructive verb: what `kill` (CLI) and `DELETE
//! /v1/sandboxes/{id}` (daemon) both do, in one place.
//!
//! A running (or paused) sandbox is stopped; an archived one loses its archive. With
//! `purge`, its disk snapshots go too (`disk_snapshots::purge`), also for a sandbox
//! deleted before, of which only the vault is left.

use crate::disk_snapshots::{purge, vault_dir, DiskSnapshotError};
use crate::registry::{Registry, RegistryError};
use crate::state::SandboxState;
use crate::verbs::{kill_record, LifecycleError};
use forkvm_snapshot::Store;

/// What there was to delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deleted {
    /// A running or paused sandbox, now stopped.
    Running,
    /// An archived sandbox, whose archive is now removed.
    Archived,
    /// Only its disk snapshots (a sandbox deleted before), now purged.
    SnapshotsOnly,
    /// Nothing of that id.
    Nothing,
}

#[derive(Debug, thiserror::Error)]
pub enum DeleteError {
    #[error(transparent)]
    Lifecycle(#[from] LifecycleError),
    #[error("removing the archive of {id}: {source}")]
    Archive { id: String, source: std::io::Error },
    #[error(transparent)]
    Purge(#[from] DiskSnapshotError),
}

/// Deletes sandbox `id` (see the module doc). The sandbox is stopped or its archive
/// removed before a purge is tried, so a refused purge (`DiskSnapshotError::InUse`)
/// leaves it deleted, its snapshots kept.
pub fn delete(registry: &Registry, store: &Store, id: &str, purge_snapshots: bool) -> Result<Deleted, DeleteError> {
    let had_snapshots = vault_dir(store, id).exists();
    let found = match registry.get(id) {
        Ok(r) => {
            kill_record(registry, &r)?;
            Deleted::Running
        }
        Err(RegistryError::NotFound(_)) if crate::archive::has_archive(store, id) => {
            crate::archive::format::remove_all(store, id)
                .map_err(|source| DeleteError::Archive { id: id.to_string(), source })?;
            registry.remove(id).map_err(LifecycleError::from)?;
            Deleted::Archived
        }
        // Recorded archived, its archive already gone.
        Err(RegistryError::NotFound(_)) if registry.row(id).is_some_and(|r| r.state == SandboxState::Archived) => {
            registry.remove(id).map_err(LifecycleError::from)?;
            Deleted::Archived
        }
        Err(RegistryError::NotFound(_)) if purge_snapshots && had_snapshots => Deleted::SnapshotsOnly,
        Err(RegistryError::NotFound(_)) => Deleted::Nothing,
        Err(e) => return Err(LifecycleError::from(e).into()),
    };
    if purge_snapshots && found != Deleted::Nothing {
        purge(store, id)?;
    }
    Ok(found)
}
