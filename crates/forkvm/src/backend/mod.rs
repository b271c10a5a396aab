//! Where a sandbox verb is carried out: on this host's registry and store ([`Local`]) or
//! through a forkvm daemon ([`Daemon`], `--daemon ENDPOINT`). Both answer with the REST
//! API's types, so every verb built on a [`Backend`] prints the same JSON either way
//! (`crates/forkvm/tests/cli_daemon.rs` checks it); the verb prints, the backend acts.

mod daemon;
mod local;

pub use daemon::Daemon;
pub use local::Local;

use crate::remote_cmd::RemoteArgs;
use anyhow::Result;
use forkvm_client::api::{ArchiveReport, BranchSandboxRequest, EvalResponse, SandboxInfo, SnapshotInfo};

/// The sandbox verbs both ways.
pub trait Backend {
    /// What `GET /v1/sandboxes` lists: running, paused and archived sandboxes.
    fn list(&self) -> Result<Vec<SandboxInfo>>;
    /// Stops sandbox `id` or removes its archive (`purge`: its disk snapshots too). A
    /// sandbox that is not there is an error whose [`not_found`] is true.
    fn delete(&self, id: &str, purge: bool) -> Result<()>;
    /// Runs `code` in sandbox `id`'s warm interpreter.
    fn eval(&self, id: &str, code: &str) -> Result<EvalResponse>;
    /// Snapshots running sandbox `id` (`req.mode`: full, live or diff).
    fn branch(&self, id: &str, req: &BranchSandboxRequest) -> Result<SnapshotInfo>;
    /// Moves sandbox `id` to the store (its VMM stops).
    fn archive(&self, id: &str) -> Result<ArchiveReport>;
    /// Runs archived sandbox `id` again (`ttl_seconds`: only a daemon keeps TTLs).
    fn restore(&self, id: &str, ttl_seconds: Option<u64>) -> Result<SandboxInfo>;
    /// Cleans up after what crashed, before a verb on every sandbox (a daemon sweeps on
    /// its own).
    fn sweep(&self) {}
}

/// The backend `remote` asks for: the daemon it names (or `auto` found), else this host.
pub fn open(remote: &RemoteArgs) -> Result<Box<dyn Backend>> {
    Ok(match remote.client()? {
        Some(client) => Box::new(Daemon::new(client)),
        None => Box::new(Local::open_default()),
    })
}

/// A sandbox that was not found, as either backend reports it.
#[derive(Debug, thiserror::Error)]
#[error("sandbox {0:?} not found: not running, not archived")]
pub struct NotFound(pub String);

/// Whether `e` says the sandbox was not there.
pub fn not_found(e: &anyhow::Error) -> bool {
    e.downcast_ref::<NotFound>().is_some()
        || e.downcast_ref::<forkvm_client::ClientError>().is_some_and(|c| c.is_not_found())
}
