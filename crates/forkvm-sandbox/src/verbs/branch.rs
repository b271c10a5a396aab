//! Branch: a running sandbox's snapshot under a new tag (full, live or into a staging
//! directory for a diff), made by its VMM, which checks the tag before it pauses anything.

use super::{call, check_ready, LifecycleError};
use crate::registry::Registry;
use forkvm_snapshot::Store;
use forkvm_vmm::vmm::{BranchMode, BranchReport, BranchRequest};

/// Snapshots running sandbox `id` under `tag` (default `branch-<id>-<seq>`) in `store`.
pub fn branch(
    registry: &Registry,
    store: &Store,
    id: &str,
    tag: Option<&str>,
    mode: BranchMode,
    wait: bool,
) -> Result<BranchReport, LifecycleError> {
    let snapshots = store.ensure()?;
    let report = branch_to_dir(registry, &snapshots, id, tag, mode, wait)?;
    // Counted in its row (best effort: the snapshot stands either way).
    let _ = registry.record_branch(id, &report.tag);
    Ok(report)
}

/// [`branch`] into `<dir>/<tag>` instead of the store (a staging place for a diff).
pub fn branch_to_dir(
    registry: &Registry,
    dir: &std::path::Path,
    id: &str,
    tag: Option<&str>,
    mode: BranchMode,
    wait: bool,
) -> Result<BranchReport, LifecycleError> {
    let (r, _) = check_ready(registry, id)?;
    // The VMM checks the tag (rule, collision) before it pauses anything.
    // The branch keeps the limits the sandbox was started with, as its defaults.
    let req = BranchRequest {
        store: dir.to_path_buf(),
        tag: tag.map(String::from),
        mode,
        wait,
        disks: Default::default(),
        default_limits: crate::SpawnOptions::of_record(&r).as_snapshot_defaults(),
    };
    call(&r, |c| c.branch(req))
}
