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
    let report = branch_into(registry, store, &snapshots, id, &tag, mode, wait)?;
    // Counted in its row (best effort: the snapshot stands either way).
    let _ = registry.record_branch(id, &report.tag);
    Ok(report)
}

/// [`branch`] into `<dir>/<tag>` instead of the store's snapshots (a staging place for a
/// diff, on the store's file system).
pub fn branch_to_dir(
    registry: &Registry,
    store: &Store,
    dir: &Path,
    id: &str,
    tag: &str,
    mode: BranchMode,
    wait: bool,
) -> Result<BranchReport, LifecycleError> {
    branch_into(registry, store, dir, id, tag, mode, wait)
}

fn branch_into(
    registry: &Registry,
    store: &Store,
    dir: &Path,
    id: &str,
    tag: &str,
    mode: BranchMode,
    wait: bool,
) -> Result<BranchReport, LifecycleError> {
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
    Ok(report)
}

fn grant_of(store: &Store, r: &SandboxRecord) -> DiskGrant {
    DiskGrant::of(store, r)
}

/// `branch-<id>-<n>` for the first `n` from 1 not taken in `store`.
fn default_tag(store: &Store, id: &str) -> String {
    (1u64..).map(|n| format!("branch-{id}-{n}")).find(|t| store.check_free(t).is_ok()).expect("a free tag exists")
}
