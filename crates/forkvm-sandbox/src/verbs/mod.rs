//! Verbs on sandboxes that run, one file each: [`agent`] (a client for exec, eval and
//! files), [`branch`] (a snapshot under a new tag, full or live), [`kill`]. Archive is
//! [`crate::archive`]; the verbs that start sandboxes are [`crate::start`].
//!
//! Each verb checks state first: an unknown id is `not_found`; a sandbox still starting
//! or being restored is `conflict` naming its state; a paused one is resumed; a tag
//! collision or a `writing` source is `conflict`; the VMM's own refusals keep their code
//! (`disk_full`, ...). See `docs/branching.md` for the failure-mode table.

mod agent;
mod branch;
mod kill;

pub use agent::agent;
pub use branch::{branch, branch_to_dir_then};
pub use kill::{kill, kill_record, stop_vmm};

use crate::registry::{Registry, RegistryError, SandboxRecord};
use crate::start::SpawnError;
use crate::state::SandboxState;
use forkvm_api::ErrorCode;
use forkvm_vmm::control::{ControlClient, ControlClientError};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error(transparent)]
    Store(#[from] forkvm_snapshot::StoreError),
    #[error("sandbox {id}: {source}")]
    Control { id: String, source: ControlClientError },
    #[error("sandbox {id}: removing its archive {}: {source}", dir.display())]
    RemoveArchive { id: String, dir: std::path::PathBuf, source: std::io::Error },
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    #[error("sandbox {id} is {state}: it takes calls once it runs")]
    NotReady { id: String, state: SandboxState },
    #[error("sandbox {id} (pid {pid}) did not stop within {waited:?} of shutdown and SIGKILL")]
    Unkillable { id: String, pid: i32, waited: Duration },
    #[error("fork of sandbox {source_id}: its child {index} (pid {ns_pid} in its jail) is not its child any more: it stopped at once")]
    ForkedChildLost { source_id: String, index: usize, ns_pid: i32 },
    #[error("saving the memory playbook: {0}")]
    Playbook(String),
    #[error("making the sandbox's branch inbox: {0}")]
    Inbox(String),
    #[error(transparent)]
    Adopt(#[from] crate::branch_inbox::AdoptError),
    #[error("branch {tag}: its memory was not written: {reason}")]
    NotWritten { tag: String, reason: String },
}

impl LifecycleError {
    /// The API code: `not_found`, `conflict`, `bad_request`, `disk_full`, `internal`.
    pub fn code(&self) -> ErrorCode {
        match self {
            LifecycleError::Registry(e) => e.code(),
            LifecycleError::Store(e) => e.code(),
            // The VMM's refusals keep their class; anything else it says is internal.
            LifecycleError::Control { source, .. } => match ControlClient::code(source) {
                Some(c @ (ErrorCode::Conflict | ErrorCode::BadRequest | ErrorCode::DiskFull)) => c,
                _ => ErrorCode::Internal,
            },
            LifecycleError::Spawn(e) => e.code(),
            LifecycleError::NotReady { .. } => ErrorCode::Conflict,
            LifecycleError::Adopt(e) => e.code(),
            _ => ErrorCode::Internal,
        }
    }

    /// For a conflict: the state the API reports, `writing` for a snapshot still being
    /// written, else `exists`.
    pub fn conflict_state(&self) -> &'static str {
        match self {
            LifecycleError::Store(forkvm_snapshot::StoreError::Writing { .. }) => "writing",
            LifecycleError::NotReady { state, .. } => state.as_str(),
            _ => "exists",
        }
    }
}

fn control(r: &SandboxRecord) -> Result<ControlClient, LifecycleError> {
    ControlClient::connect(&r.control_socket()).map_err(|source| LifecycleError::Control { id: r.id.clone(), source })
}

/// One request to sandbox `r`'s VMM, made by `f` on its typed control client.
pub(crate) fn call<T>(
    r: &SandboxRecord,
    f: impl FnOnce(&mut ControlClient) -> Result<T, ControlClientError>,
) -> Result<T, LifecycleError> {
    f(&mut control(r)?).map_err(|source| LifecycleError::Control { id: r.id.clone(), source })
}

/// Sandbox `id`'s record and state, if it takes calls: refused naming its state while
/// it is still starting or being restored. A paused sandbox takes calls once resumed
/// ([`agent`] does that).
pub(crate) fn check_ready(
    registry: &Registry,
    id: &str,
) -> Result<(SandboxRecord, Option<SandboxState>), LifecycleError> {
    let r = registry.get(id)?;
    match registry.row(id).map(|row| row.state) {
        Some(state) if state.is_starting() => Err(LifecycleError::NotReady { id: id.to_string(), state }),
        state => Ok((r, state)),
    }
}
