//! Startup reconciliation: make the registry and the daemon's database agree with what
//! is on disk and running, after a clean stop or a `kill -9`.
//!
//! - Sandboxes: [`forkvm_sandbox::Registry::recover`] — interrupted spawns and forks
//!   (rows still `starting` whose owner died) are killed and forgotten (a spawn gives
//!   all of its sandboxes or none), interrupted restores settled, running sandboxes
//!   re-attached (their VMMs outlive the daemon), archives without a row adopted.
//!   Sandboxes started without the daemon need no adoption: they are in the same
//!   registry.
//! - Branches in flight are settled: a snapshot whose writer finished is recorded ready,
//!   one still being written is watched, one whose writer died is removed.
//! - Snapshot rows follow the store.
//! - The checkpoints of sandboxes that are gone are removed (`checkpoints::sweep_orphans`).

use crate::state::AppState;
use crate::views::{snapshot_info, snapshot_row};
use forkvm_sandbox::registry::Recovered;
use forkvm_sandbox::SandboxState;
use forkvm_snapshot::SnapshotStatus;
use serde::Serialize;

/// What reconciliation did, logged at start and returned for tests.
#[derive(Debug, Default, Clone, Serialize, PartialEq, Eq)]
pub struct Reconciled {
    /// Sandboxes: [`forkvm_sandbox::Registry::recover`].
    #[serde(flatten)]
    pub sandboxes: Recovered,
    /// Sandbox rows an older forkvmd kept in its own database, merged into the registry.
    pub merged: Vec<String>,
    /// Branch snapshots still being written, now watched.
    pub branches_watched: Vec<String>,
    /// Branches settled (ready, or cleaned up when their writer died).
    pub branches_settled: Vec<String>,
    /// Leftovers removed from the store (dead writers, staging directories).
    pub swept_snapshots: Vec<String>,
    /// Running sandboxes whose network (DNS, policy) this daemon serves again.
    pub networks_served: Vec<String>,
    /// Sandboxes that are gone whose checkpoints were removed.
    pub checkpoints_swept: Vec<String>,
}

/// Runs before the listeners open. Returns the branches (op, tag) still being written.
pub fn reconcile(s: &AppState) -> (Reconciled, Vec<(String, String)>) {
    let mut out = Reconciled { swept_snapshots: s.store.sweep(), ..Reconciled::default() };
    out.merged = merge_legacy_rows(s);
    out.sandboxes = s.registry.recover();
    out.networks_served = serve_networks(s);

    let mut watch = Vec::new();
    let entries = s.store.list();
    // (Bound first: the database lock must not be held while a branch is settled.)
    let branches = s.db().branches().unwrap_or_default();
    for b in branches {
        // A branch with a default tag: the VMM chose it; find the source's snapshot in writing.
        let tag = b.tag.clone().or_else(|| {
            entries
                .iter()
                .find(|e| {
                    e.meta.status == SnapshotStatus::Writing && e.meta.branched_from.as_deref() == Some(&b.sandbox_id)
                })
                .map(|e| e.tag.clone())
        });
        match tag {
            Some(t) if !crate::routes::branch::settle_branch(s, &b.op, &t) => {
                out.branches_watched.push(t.clone());
                watch.push((b.op.clone(), t));
            }
            Some(t) => out.branches_settled.push(t),
            None => {
                let _ = s.db().delete_branch(&b.op);
                out.branches_settled.push(b.op.clone());
            }
        }
    }

    out.checkpoints_swept = crate::checkpoints::sweep_orphans(s);

    let rows = s.snapshot_rows();
    let entries = s.store.list();
    for r in &rows {
        if !entries.iter().any(|e| e.tag == r.tag) {
            let _ = s.db().delete_snapshot(&r.tag);
        }
    }
    for e in &entries {
        let info = snapshot_info(&s.store, e, rows.iter().find(|r| r.tag == e.tag));
        let _ = s.db().upsert_snapshot(&snapshot_row(&info));
    }
    (out, watch)
}

/// Serves the network of every sandbox whose VMM runs (their DNS went with the process
/// that served it); returns their ids. A failure is logged: the sandbox runs on, its
/// guest's names unresolved until a policy change serves it again.
fn serve_networks(s: &AppState) -> Vec<String> {
    let mut served = Vec::new();
    for row in s.registry.rows() {
        let r = &row.record;
        if !matches!(row.state, SandboxState::Running | SandboxState::Paused) || !forkvm_sandbox::registry::vmm_runs(r)
        {
            continue;
        }
        match forkvm_sandbox::network::attach::adopt(&r.id, r.pid, r.network.as_ref()) {
            Ok(true) => served.push(r.id.clone()),
            Ok(false) => {}
            Err(e) => tracing::warn!(id = %r.id, error = %e, "serving a running sandbox's network again failed"),
        }
    }
    served
}

/// Merges the sandbox rows of an older forkvmd's database into the registry, then drops
/// them (so a crash in between merges them again, harmlessly). Returns their ids.
fn merge_legacy_rows(s: &AppState) -> Vec<String> {
    let rows = match s.db().legacy_sandboxes(&s.registry) {
        Ok(rows) => rows,
        Err(e) => {
            tracing::warn!(error = %e, "reading an older daemon's sandbox rows");
            return Vec::new();
        }
    };
    let mut merged = Vec::new();
    for row in &rows {
        match s.registry.import(row) {
            Ok(()) => merged.push(row.id().to_string()),
            Err(e) => {
                tracing::warn!(id = row.id(), error = %e, "merging an older daemon's sandbox row; kept for the next start");
                return merged;
            }
        }
    }
    if let Err(e) = s.db().drop_legacy_sandboxes() {
        tracing::warn!(error = %e, "dropping an older daemon's sandbox rows after merging them");
    }
    merged
}
