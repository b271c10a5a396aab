//! An archived sandbox back under its own id: its row is claimed (`archived` →
//! `restoring`, owned by this process), its capture rebuilt from the archive
//! ([`crate::archive`]'s unseal) and started as a one-child snapshot start
//! ([`super::snapshot::start_vmms`]); once its agent answers, its archived record is put
//! back, its archive linked (a restored VMM that crashes can be restored again) and its
//! row moves to `running`. A failure at any point puts the row back to `archived`, with
//! the reason it had.

use super::snapshot::{start_vmms, StartedVmms};
use super::SpawnOptions;
use crate::archive::format::{self, ArchiveManifest};
use crate::archive::{archived_record, io, unseal, ArchiveError};
use crate::ready::{finish, learn_memory, SpawnedSandbox};
use crate::registry::{Origin, Registry, RegistryError, SandboxRecord};
use crate::source::SpawnSource;
use crate::state::{SandboxState, StateReason};
use crate::verbs::LifecycleError;
use forkvm_snapshot::Store;
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::time::Instant;

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
    let opts = archived.as_ref().map(SpawnOptions::of_record).unwrap_or_default();
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
    learn_memory(vmms.memory_playbook.as_deref(), &ready);
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
    std::os::unix::fs::symlink(&dir, record.dir().archive_link()).map_err(io(&id, "linking the archive"))?;
    registry.write(record).map_err(LifecycleError::from)?;
    registry.transition(&id, &[SandboxState::Restoring], SandboxState::Running, None).map_err(LifecycleError::from)?;
    Ok(sandbox)
}
