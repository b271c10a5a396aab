//! Rewind: a running sandbox put back, in place, to one of its checkpoints (a snapshot
//! of it taken earlier, `crate::checkpoint`): same id, the processes, interpreter state
//! and files it had then.
//!
//! Its row is claimed first (`running`/`paused` → `restoring`, owned by this process,
//! so calls are refused as `starting` and the sweep leaves it alone), then its VMM is
//! stopped and its run directory and cgroup released while the row stays; a VMM is
//! started from the checkpoint under the same id ([`super::snapshot::start_vmms`]: its
//! disks become a new layer over the checkpoint's sealed ones, its limits are the
//! sandbox's). [`finish_rewind`] waits for its agent and moves the row back to
//! `running`. What the sandbox did after the checkpoint is gone, by design; open
//! connections are reset (the new VMM has a new tap).
//!
//! A failure after the stop leaves no sandbox: the row is removed and the error says
//! so. The checkpoints stay, so any of them still starts a copy (`fork --tag`).

use super::snapshot::{start_vmms, StartedVmms};
use super::{SpawnError, SpawnOptions};
use crate::ready::{finish, SpawnedSandbox};
use crate::registry::{Registry, SandboxRecord};
use crate::source::{SourceError, SpawnSource};
use crate::state::SandboxState;
use crate::verbs::{stop_vmm, LifecycleError};
use forkvm_snapshot::Store;
use serde::{Deserialize, Serialize};
use std::time::Instant;

#[derive(Debug, thiserror::Error)]
pub enum RewindError {
    #[error(transparent)]
    Lifecycle(#[from] LifecycleError),
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error("sandbox {id} is {state}: only a running or paused sandbox is rewound")]
    Busy { id: String, state: SandboxState },
    #[error("sandbox {id} {why}: it cannot be rewound (yet)")]
    Unsupported { id: String, why: &'static str },
    #[error("rewind of sandbox {id} to {tag}: {step}: {source}; the sandbox has stopped (its checkpoints are kept: `forkvm fork --tag {tag}` starts a copy)")]
    Lost { id: String, tag: String, step: &'static str, source: Box<dyn std::error::Error + Send + Sync> },
}

impl RewindError {
    /// The API code: `not_found`, `conflict`, `bad_request`, `internal`.
    pub fn code(&self) -> forkvm_api::ErrorCode {
        match self {
            RewindError::Lifecycle(e) => e.code(),
            RewindError::Source(e) => e.code(),
            RewindError::Busy { .. } => forkvm_api::ErrorCode::Conflict,
            RewindError::Unsupported { .. } => forkvm_api::ErrorCode::BadRequest,
            RewindError::Lost { .. } => forkvm_api::ErrorCode::Internal,
        }
    }
}

/// A rewind whose VMM is started but not yet answering (see [`start_rewind`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PendingRewind {
    pub vmms: StartedVmms,
    /// The record the sandbox had before the rewind.
    pub previous: SandboxRecord,
    pub tag: String,
    /// Stopping the old VMM and releasing its run directory.
    pub stop_ms: f64,
}

/// The first half of a rewind of sandbox `id` to snapshot `tag`: claims its row, stops
/// its VMM and starts one from `tag` under the same id. The caller must be
/// single-threaded (it forks the VMM); the daemon calls this in its spawner process.
pub fn start_rewind(registry: &Registry, store: &Store, id: &str, tag: &str) -> Result<PendingRewind, RewindError> {
    let previous = registry.get(id).map_err(LifecycleError::from)?;
    check_supported(registry, &previous)?;
    // Read (and its chain checked) before anything stops.
    let source = SpawnSource::from_tag(store, tag)?;
    let live = [SandboxState::Running, SandboxState::Paused];
    if !registry.transition(id, &live, SandboxState::Restoring, None).map_err(LifecycleError::from)? {
        let state = registry.row(id).map_or(SandboxState::Starting, |r| r.state);
        return Err(RewindError::Busy { id: id.into(), state });
    }
    let stopping = Instant::now();
    let lost = |step: &'static str, e: Box<dyn std::error::Error + Send + Sync>| {
        registry.clean_up(&previous);
        RewindError::Lost { id: id.into(), tag: tag.into(), step, source: e }
    };
    if let Err(e) = stop_vmm(&previous) {
        // Still running: the row goes back to what it was.
        let _ = registry.transition(id, &[SandboxState::Restoring], SandboxState::Running, None);
        return Err(e.into());
    }
    registry.release(&previous);
    let stop_ms = stopping.elapsed().as_secs_f64() * 1e3;
    let opts = SpawnOptions::of_record(&previous);
    let vmms = start_vmms(registry, &source, &[id.to_string()], &opts)
        .map_err(|e: SpawnError| lost("starting its VMM from the checkpoint", Box::new(e)))?;
    Ok(PendingRewind { vmms, previous, tag: tag.to_string(), stop_ms })
}

/// What in a sandbox a rewind cannot carry yet.
fn check_supported(registry: &Registry, r: &SandboxRecord) -> Result<(), RewindError> {
    if crate::archive::linked_archive(&r.run_dir).is_some() {
        // Its lower disk layers are served from its archive, which a new VMM from a
        // checkpoint would leave behind.
        return Err(RewindError::Unsupported { id: r.id.clone(), why: "was restored from an archive" });
    }
    let volume = registry
        .store_root()
        .is_some_and(|root| r.disks.iter().any(|d| crate::volumes::is_writer_dir(root, &d.dir, &r.id)));
    if volume {
        return Err(RewindError::Unsupported { id: r.id.clone(), why: "writes a volume (a volume is not rewound)" });
    }
    Ok(())
}

/// The second half of a rewind: waits for the agent, puts back what the sandbox's record
/// said of its origin, and moves its row to `running`. Needs no single-threaded caller.
pub fn finish_rewind(
    registry: &Registry,
    pending: PendingRewind,
    started: Instant,
) -> Result<SpawnedSandbox, RewindError> {
    let PendingRewind { vmms, previous, tag, .. } = pending;
    let id = previous.id.clone();
    let lost = |step: &'static str, e: Box<dyn std::error::Error + Send + Sync>, r: &SandboxRecord| {
        let _ = crate::verbs::kill_record(registry, r);
        registry.clean_up(r);
        RewindError::Lost { id: id.clone(), tag: tag.clone(), step, source: e }
    };
    let started_record = vmms.records.first().cloned().ok_or_else(|| RewindError::Lost {
        id: id.clone(),
        tag: tag.clone(),
        step: "starting its VMM",
        source: "the spawner started no VMM".into(),
    })?;
    let ready = finish(registry, vmms.records, started)
        .map_err(|e| lost("waiting for its agent", Box::new(e), &started_record))?;
    let mut sandbox = ready.into_iter().next().expect("one sandbox per rewind");
    // Its memory and disks are the checkpoint's (`source_tag`, which keeps the
    // checkpoint in use while it runs); where it came from before is kept.
    let record = &mut sandbox.record;
    record.forked_from.clone_from(&previous.forked_from);
    record.created_at_unix_ms = previous.created_at_unix_ms;
    if record.template.is_none() {
        record.template.clone_from(&previous.template);
    }
    let record = record.clone();
    registry.write(&record).map_err(|e| lost("recording it", Box::new(e), &record))?;
    registry
        .transition(&id, &[SandboxState::Restoring], SandboxState::Running, None)
        .map_err(|e| lost("marking it running", Box::new(e), &record))?;
    Ok(sandbox)
}
