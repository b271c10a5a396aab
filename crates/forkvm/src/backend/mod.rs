//! Where a sandbox verb is carried out: on this host's registry and store ([`Local`]) or
//! through a forkvm daemon ([`Daemon`], `--daemon ENDPOINT`). Both answer with the REST
//! API's types, so every verb built on a [`Backend`] prints the same JSON either way
//! (`crates/forkvm/tests/cli_daemon.rs` checks it); the verb prints, the backend acts.

mod daemon;
mod local;
pub mod processes;

pub use daemon::Daemon;
pub use local::Local;

use crate::remote_cmd::RemoteArgs;
use anyhow::Result;
use forkvm_client::api::{
    ArchiveReport, BranchSandboxRequest, EvalResponse, ExecRequest, NetworkPolicy, SandboxInfo, SnapshotInfo,
    WatchEvent,
};
use forkvm_client::ExecExit;
use serde::Serialize;

/// The sandbox verbs both ways. The snapshot and disk verbs are store verbs; they stay
/// in `remote_cmd/`, and print the API's shapes either way.
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
    /// Sets sandbox `id`'s TTL (0: none); only a daemon keeps TTLs.
    fn set_ttl(&self, id: &str, seconds: u64) -> Result<SandboxInfo>;
    /// Sets sandbox `id`'s egress policy; only a daemon serves policies.
    fn set_network(&self, id: &str, policy: &NetworkPolicy) -> Result<SandboxInfo>;
    /// Starts `n` new sandboxes from `from`, each ready and re-identified, under
    /// `network` (none: anywhere, or a running source's policy; only a daemon serves
    /// policies).
    fn start(
        &self,
        from: NewFrom<'_>,
        n: usize,
        limits: &crate::limit_args::LimitArgs,
        network: Option<&NetworkPolicy>,
        volumes: &[forkvm_sandbox::volumes::VolumeMount],
    ) -> Result<Started>;
    /// Runs `req` in sandbox `id`, handing its output to `out` as it comes; how it ended
    /// (a program that could not be started ends with 127 or 126, as in a shell).
    fn exec(&self, id: &str, req: &ExecRequest, out: &mut dyn FnMut(Output, &[u8])) -> Result<ExecExit>;
    /// Watches directory `path` in sandbox `id`, handing each line (`armed` first) to
    /// `on_event` until it returns `false` (`Ok(None)`) or the sandbox ends the watch
    /// (`Ok(Some(reason))`; a failure is an error).
    fn watch(
        &self,
        id: &str,
        path: &str,
        recursive: bool,
        on_event: &mut dyn FnMut(WatchEvent) -> bool,
    ) -> Result<Option<String>>;
    /// The daemon's endpoint; `None` for this host.
    fn endpoint(&self) -> Option<String> {
        None
    }
    /// Cleans up after what crashed, before a verb on every sandbox (a daemon sweeps on
    /// its own).
    fn sweep(&self) {}
}

/// Where new sandboxes come from.
#[derive(Debug, Clone, Copy)]
pub enum NewFrom<'a> {
    /// A tag in the snapshot store.
    Tag(&'a str),
    /// A template's cached snapshot (booted and warmed once; this host only).
    Image(&'a str),
    /// A running sandbox, forked without a disk round trip.
    Sandbox(&'a str),
}

/// New sandboxes, and what starting them cost this host when it was this host that
/// started them (a daemon reports no timings).
#[derive(Debug)]
pub struct Started {
    pub sandboxes: Vec<SandboxInfo>,
    pub host: Option<HostTimings>,
}

/// Host-side costs of a start (`forkvm_sandbox::SpawnTimings`).
#[derive(Debug, Default, Serialize)]
pub struct HostTimings {
    /// Reading the snapshot once (the zygote).
    pub prepare_ms: f64,
    /// Forking every VMM.
    pub host_spawn_ms: f64,
    /// Pages of the memory playbook replayed.
    pub memory_prefetch_pages: u64,
    /// A fork of a running sandbox: how long its source was paused.
    pub source_pause_ms: Option<f64>,
}

/// Which stream a chunk of an exec's output came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    Stdout,
    Stderr,
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
