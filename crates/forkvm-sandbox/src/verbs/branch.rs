//! Branch: a running sandbox's snapshot under a new tag (full, live or into a staging
//! directory for a diff), made by its VMM into an inbox of its own and adopted into
//! place by us (`branch_inbox`). The tag is checked before anything is paused.

use super::{call, check_ready, LifecycleError};
use crate::branch_inbox::{BranchDefaults, Inbox};
use crate::disk_grant::DiskGrant;
use crate::registry::{Registry, SandboxRecord};
use forkvm_snapshot::{SnapshotStatus, Store};
use forkvm_vmm::vmm::{BranchMode, BranchReport, BranchRequest, DiskCapture};
use std::path::Path;
use std::time::{Duration, Instant};

/// Longest wait for a live branch's memory to be written once its pause is over (it
/// takes a fraction of a second here; the writer runs at idle priority).
const WRITE_DEADLINE: Duration = Duration::from_secs(300);
/// How often the wait looks.
const WRITE_POLL: Duration = Duration::from_millis(2);

/// Snapshots running sandbox `id` under `tag` (default `branch-<id>-<n>`, the first
/// free) in `store`.
pub fn branch(
    registry: &Registry,
    store: &Store,
    id: &str,
    tag: Option<&str>,
    mode: BranchMode,
    wait: bool,
) -> Result<BranchReport, LifecycleError> {
    let snapshots = store.ensure()?;
    let tag = match tag {
        Some(t) => t.to_string(),
        None => default_tag(store, id),
    };
    store.check_free(&tag)?;
    let (report, _) = branch_into(registry, store, &snapshots, id, &tag, mode, wait)?;
    // Counted in its row (best effort: the snapshot stands either way).
    let _ = registry.record_branch(id, &report.tag);
    Ok(report)
}

/// [`branch`] into `<dir>/<tag>` instead of the store's snapshots (a staging place for a
/// diff, on the store's file system), complete when it returns. It calls `paused` as soon
/// as the sandbox runs again (its state is captured by then), and only then waits for a
/// live branch's memory to be written and takes the snapshot over: a caller may answer
/// its own client in `paused` and let the writing go on.
pub fn branch_to_dir_then(
    registry: &Registry,
    store: &Store,
    dir: &Path,
    id: &str,
    tag: &str,
    mode: BranchMode,
    paused: &mut dyn FnMut(),
) -> Result<BranchReport, LifecycleError> {
    let (mut report, defaults) = branch_into(registry, store, dir, id, tag, mode, false)?;
    paused();
    if report.status == SnapshotStatus::Writing {
        wait_written(&report.dir, tag)?;
        store
            .adopt_ready(&report.dir)
            .map_err(|e| LifecycleError::NotWritten { tag: tag.to_string(), reason: format!("taking it over: {e}") })?;
        crate::branch_inbox::stamp_defaults(tag, &report.dir, &defaults)?;
        report.status = SnapshotStatus::Ready;
    }
    Ok(report)
}

/// Waits until the live branch at `dir` says it is ready. Its VMM removes it when the
/// writing fails, and a VMM that died writes nothing more: both end the wait, as does
/// [`WRITE_DEADLINE`].
fn wait_written(dir: &Path, tag: &str) -> Result<(), LifecycleError> {
    let not_written = |reason: String| LifecycleError::NotWritten { tag: tag.to_string(), reason };
    let started = Instant::now();
    loop {
        let meta = match forkvm_snapshot::read_meta(&dir.join(forkvm_snapshot::SNAPSHOT_JSON)) {
            Ok(m) => m,
            Err(e) => return Err(not_written(format!("its description: {e}"))),
        };
        if meta.status == SnapshotStatus::Ready {
            return Ok(());
        }
        match forkvm_snapshot::writer_pid(dir, None) {
            Some(pid) if !forkvm_snapshot::process_alive(pid) => {
                return Err(not_written(format!("its VMM (pid {pid}) exited while writing it")))
            }
            _ => {}
        }
        if started.elapsed() > WRITE_DEADLINE {
            return Err(not_written(format!("still being written after {WRITE_DEADLINE:?}")));
        }
        std::thread::sleep(WRITE_POLL);
    }
}

fn branch_into(
    registry: &Registry,
    store: &Store,
    dir: &Path,
    id: &str,
    tag: &str,
    mode: BranchMode,
    wait: bool,
) -> Result<(BranchReport, BranchDefaults), LifecycleError> {
    forkvm_snapshot::validate_tag(tag).map_err(forkvm_snapshot::StoreError::from)?;
    let (r, _) = check_ready(registry, id)?;
    let inbox = Inbox::make(store, &r).map_err(|e| LifecycleError::Inbox(e.to_string()))?;
    // The VMM checks the tag (rule, collision) before it pauses anything.
    // The branch keeps the limits the sandbox was started with and its policy now, as
    // its defaults.
    let defaults = BranchDefaults {
        limits: crate::SpawnOptions::of_record(&r).as_snapshot_defaults(),
        network: r.network.clone().filter(|p| !p.is_default()),
    };
    let req = BranchRequest {
        store: inbox.dir().to_path_buf(),
        tag: Some(tag.to_string()),
        mode,
        wait,
        disks: DiskCapture::Reference,
        default_limits: defaults.limits,
        default_network: defaults.network.clone(),
    };
    let mut report = call(&r, |c| c.branch(req))?;
    let dest = dir.join(tag);
    let writer = (report.status == SnapshotStatus::Writing).then_some(r.pid);
    inbox.adopt(tag, &grant_of(store, &r), &dest, writer, &defaults)?;
    report.dir = dest;
    Ok((report, defaults))
}

fn grant_of(store: &Store, r: &SandboxRecord) -> DiskGrant {
    DiskGrant::of(store, r)
}

/// `branch-<id>-<n>` for the first `n` from 1 not taken in `store`.
fn default_tag(store: &Store, id: &str) -> String {
    (1u64..).map(|n| format!("branch-{id}-{n}")).find(|t| store.check_free(t).is_ok()).expect("a free tag exists")
}
