//! Making diff snapshots from sandboxes: `snapshot-diff` and the `diff` branch mode.
//!
//! Both take a branch of a sandbox spawned from a tag (live when its disks are read-only,
//! so the sandbox pauses for a fork of its VMM only; full otherwise) into a staging
//! directory on the store's filesystem, wait until it is written, then publish it as a
//! diff over that tag
//! ([`forkvm_snapshot::chain::write_diff`]): only the pages that differ from the parent go
//! into the chunk store, and the branch's memory image becomes the new snapshot's
//! assembled image. A whole-image parent is moved into the chunk store first (a diff's
//! parent must have a content hash).

use crate::ready::SpawnedSandbox;
use crate::registry::Registry;
use crate::source::{assembled_cache, SourceError, SpawnSource};
use crate::start::snapshot::spawn;
use crate::start::{SpawnError, SpawnOptions};
use crate::verbs::{self, LifecycleError};
use forkvm_proto::{AgentClient, ClientError, EvalOutcome, ExecRequest};
use forkvm_snapshot::chain::{self, ChainError, ConvertReport};
use forkvm_snapshot::{SnapshotDir, Store};
use forkvm_vmm::vmm::BranchMode;
use serde::Serialize;
use std::os::unix::net::UnixStream;
use std::time::Instant;

#[derive(Debug, thiserror::Error)]
pub enum ChainOpError {
    #[error(transparent)]
    Chain(#[from] ChainError),
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    #[error(transparent)]
    Lifecycle(#[from] LifecycleError),
    #[error("{step} in the sandbox: {source}")]
    Agent { step: String, source: ClientError },
    #[error("{step} failed ({outcome}); nothing was snapshotted{}", if output.is_empty() { String::new() } else { format!(". Output:\n{output}") })]
    StepFailed { step: String, outcome: String, output: String },
    #[error("sandbox {id} was not spawned from a tagged snapshot (it is a fork of a running sandbox or of a template): a diff needs a parent tag; take a full or live branch instead")]
    NoParent { id: String },
    #[error("sandbox {id} was spawned from {actual:?}, not from {expected:?}")]
    ParentMismatch { id: String, expected: String, actual: String },
    #[error("the staged branch could not be read: {0}")]
    Staged(String),
    #[error("{step}: {detail}; nothing was snapshotted")]
    Work { step: String, detail: String },
}

impl ChainOpError {
    /// The API code: `not_found`, `conflict`, `bad_request` or `internal`.
    pub fn code(&self) -> forkvm_api::ErrorCode {
        match self {
            ChainOpError::Chain(e) => e.code(),
            ChainOpError::Source(e) => e.code(),
            ChainOpError::Spawn(e) => e.code(),
            ChainOpError::Lifecycle(e) => e.code(),
            ChainOpError::StepFailed { .. }
            | ChainOpError::NoParent { .. }
            | ChainOpError::ParentMismatch { .. }
            | ChainOpError::Work { .. } => forkvm_api::ErrorCode::BadRequest,
            _ => forkvm_api::ErrorCode::Internal,
        }
    }
}

/// One thing to do in the sandbox before the diff is taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiffStep {
    /// A `sh -c` command; it must exit 0.
    Exec(String),
    /// Python code for the agent's persistent interpreter; it must not raise.
    Eval(String),
}

/// What `snapshot-diff` did and what each part cost.
#[derive(Debug, Clone, Serialize)]
pub struct SnapshotDiffReport {
    #[serde(flatten)]
    pub diff: ConvertReport,
    /// Whether the parent had to be moved into the chunk store first.
    pub parent_ingested: bool,
    pub spawn_ms: f64,
    pub steps_ms: f64,
    /// The sandbox's pause: a fork of its VMM (live branch), or while its memory was
    /// written (full branch, when it has writable disks).
    pub branch_pause_ms: f64,
    pub branch_ms: f64,
    pub diff_ms: f64,
    pub total_ms: f64,
    /// What the steps printed.
    pub output: String,
}

/// Spawns a sandbox from `from`, runs `steps` in it, and publishes what changed as the
/// diff snapshot `tag` (parent `from`). The sandbox is killed either way.
pub fn snapshot_diff(
    registry: &Registry,
    store: &Store,
    from: &str,
    tag: &str,
    steps: &[DiffStep],
    opts: &SpawnOptions,
) -> Result<SnapshotDiffReport, ChainOpError> {
    snapshot_diff_with(registry, store, from, tag, opts, |client| run_steps(client, steps))
}

/// [`snapshot_diff`] with the sandbox's work done by `work`, which returns what it
/// printed; an error from it publishes nothing.
pub fn snapshot_diff_with(
    registry: &Registry,
    store: &Store,
    from: &str,
    tag: &str,
    opts: &SpawnOptions,
    work: impl FnOnce(&AgentClient<UnixStream>) -> Result<String, ChainOpError>,
) -> Result<SnapshotDiffReport, ChainOpError> {
    let spawn_one = |from: &str| spawn_from_tag(registry, store, from, opts);
    snapshot_diff_via(registry, store, from, tag, &spawn_one, work)
}

/// [`snapshot_diff_with`], the sandbox started by `spawn_one` (given the parent tag):
/// a daemon starts VMMs through its spawner process, never by forking itself.
pub fn snapshot_diff_via(
    registry: &Registry,
    store: &Store,
    from: &str,
    tag: &str,
    spawn_one: &dyn Fn(&str) -> Result<SpawnedSandbox, ChainOpError>,
    work: impl FnOnce(&AgentClient<UnixStream>) -> Result<String, ChainOpError>,
) -> Result<SnapshotDiffReport, ChainOpError> {
    let started = Instant::now();
    store.check_free(tag).map_err(ChainError::from)?;
    let cache = assembled_cache();
    let ingested = chain::ingest(store, &cache, from)?.changed;
    let sandbox = spawn_one(from)?;
    let spawn_ms = started.elapsed().as_secs_f64() * 1e3;
    let id = sandbox.record.id.clone();
    let result = (|| {
        let steps_started = Instant::now();
        let output = work(&sandbox.client)?;
        let steps_ms = steps_started.elapsed().as_secs_f64() * 1e3;
        let (diff, pause_ms, branch_ms, diff_ms) = diff_branch(registry, store, &id, from, tag, None, None)?;
        Ok::<_, ChainOpError>((output, steps_ms, diff, pause_ms, branch_ms, diff_ms))
    })();
    let killed = verbs::kill(registry, &id);
    let (output, steps_ms, diff, branch_pause_ms, branch_ms, diff_ms) = result?;
    killed?;
    Ok(SnapshotDiffReport {
        diff,
        parent_ingested: ingested,
        spawn_ms,
        steps_ms,
        branch_pause_ms,
        branch_ms,
        diff_ms,
        total_ms: started.elapsed().as_secs_f64() * 1e3,
        output,
    })
}

fn run_steps(client: &AgentClient<UnixStream>, steps: &[DiffStep]) -> Result<String, ChainOpError> {
    let mut output = String::new();
    for step in steps {
        match step {
            DiffStep::Exec(cmd) => {
                let name = format!("exec {cmd:?}");
                let out = client
                    .exec_collect(&ExecRequest::shell(cmd.clone()), &[])
                    .map_err(|source| ChainOpError::Agent { step: name.clone(), source })?;
                output.push_str(&String::from_utf8_lossy(&out.stdout));
                output.push_str(&String::from_utf8_lossy(&out.stderr));
                if out.status.code != Some(0) {
                    return Err(ChainOpError::StepFailed { step: name, outcome: ended(&out.status), output });
                }
            }
            DiffStep::Eval(code) => {
                let name = format!("eval {code:?}");
                let r = client.eval(code).map_err(|source| ChainOpError::Agent { step: name.clone(), source })?;
                output.push_str(&r.stdout);
                output.push_str(&r.stderr);
                if let EvalOutcome::Exception { exception, .. } = r.outcome {
                    return Err(ChainOpError::StepFailed { step: name, outcome: exception, output });
                }
            }
        }
    }
    Ok(output)
}

/// How a process that did not exit 0 ended, for a step's error.
pub(crate) fn ended(status: &forkvm_proto::ExitStatus) -> String {
    match (status.code, status.signal) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("killed by signal {s}"),
        _ => "no exit status".into(),
    }
}

/// One sandbox started by this process from `tag`, as `fork --tag` starts it.
pub(crate) fn spawn_from_tag(
    registry: &Registry,
    store: &Store,
    tag: &str,
    opts: &SpawnOptions,
) -> Result<SpawnedSandbox, ChainOpError> {
    let source = SpawnSource::from_tag(store, tag)?;
    let (mut sandboxes, _) = spawn(registry, &source, 1, opts)?;
    Ok(sandboxes.remove(0))
}

/// Branches running sandbox `id` (spawned from `parent`) into a staging directory and
/// publishes it as the diff `tag` over `parent`. Returns the diff, the pause, the branch
/// time and the diff time. `paused`: called once the sandbox runs again, before its
/// memory is written and compared (`verbs::branch_to_dir_then`). `seal`: the diff's
/// chunks are sealed with that key.
pub(crate) fn diff_branch(
    registry: &Registry,
    store: &Store,
    id: &str,
    parent: &str,
    tag: &str,
    paused: Option<&mut dyn FnMut()>,
    seal: Option<&chain::MemorySeal>,
) -> Result<(ConvertReport, f64, f64, f64), ChainOpError> {
    store.check_free(tag).map_err(ChainError::from)?;
    let chain = chain::resolve(store, parent)?;
    // The sandbox has its parent's kinds of disks. Read-only and layered ones allow a
    // live branch (a layered disk is sealed in the pause): the pause is a fork of the
    // VMM, and the memory is written (and then diffed) while it runs on.
    let mut disks = chain.head().meta.devices.iter().flat_map(|d| d.disks.iter());
    let mode = if disks.all(|d| d.read_only || d.layers.is_some()) { BranchMode::Live } else { BranchMode::Full };
    let staging = chain::new_staging_dir(store, "diff")?;
    let result = (|| {
        let branched = Instant::now();
        let report = verbs::branch_to_dir_then(registry, store, &staging, id, tag, mode, paused.unwrap_or(&mut || {}))?;
        let branch_ms = branched.elapsed().as_secs_f64() * 1e3;
        let staged = SnapshotDir::open(&report.dir).map_err(|e| ChainOpError::Staged(e.to_string()))?;
        let diffing = Instant::now();
        let diff = chain::write_diff(store, &assembled_cache(), &chain, &staged, tag, seal)?;
        Ok::<_, ChainOpError>((diff, report.pause_ms, branch_ms, diffing.elapsed().as_secs_f64() * 1e3))
    })();
    let _ = std::fs::remove_dir_all(&staging);
    result
}

/// The `diff` branch mode: snapshots running sandbox `id` as a diff over the tag it was
/// spawned from (`expected_parent`, when given, must be that tag).
pub fn branch_diff(
    registry: &Registry,
    store: &Store,
    id: &str,
    tag: &str,
    expected_parent: Option<&str>,
) -> Result<(ConvertReport, f64), ChainOpError> {
    let parent = diff_parent(registry, id)?;
    if let Some(expected) = expected_parent.filter(|e| *e != parent) {
        return Err(ChainOpError::ParentMismatch { id: id.into(), expected: expected.into(), actual: parent });
    }
    let cache = assembled_cache();
    // The sandbox's memory started as the parent's: if the parent is still a whole
    // image, moving it into the chunk store does not change that.
    chain::ingest(store, &cache, &parent)?;
    let (diff, pause_ms, _, _) = diff_branch(registry, store, id, &parent, tag, None, None)?;
    let _ = registry.record_branch(id, tag);
    Ok((diff, pause_ms))
}

/// The tag a diff of sandbox `id` is taken over: the one it was spawned from (a fork of a
/// running sandbox or a template boot has none).
pub fn diff_parent(registry: &Registry, id: &str) -> Result<String, ChainOpError> {
    let record = registry.get(id).map_err(LifecycleError::from)?;
    record
        .source_tag
        .clone()
        .filter(|_| record.forked_from.is_none())
        .ok_or_else(|| ChainOpError::NoParent { id: id.into() })
}

/// forkd's `measure_diff`: how big a diff over `parent` (sandbox `id`'s [`diff_parent`])
/// full branch `tag` would have been.
pub fn measure_branch_diff(store: &Store, parent: &str, tag: &str) -> Result<chain::DiffMeasure, ChainOpError> {
    let branch =
        SnapshotDir::open(&store.snapshots_dir().join(tag)).map_err(|e| ChainOpError::Staged(e.to_string()))?;
    if branch.meta.memory_format != forkvm_snapshot::MemoryFormat::Image {
        return Err(ChainOpError::Staged(format!("branch {tag:?} is not a whole memory image")));
    }
    let parent = chain::resolve(store, parent)?;
    Ok(chain::measure_diff(store, &assembled_cache(), &parent, &branch.memory_path())?)
}
