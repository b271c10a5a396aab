//! Startup reconciliation: make the state database agree with what is on disk and
//! running, after a clean stop or a `kill -9`.
//!
//! - Sandboxes of a spawn or fork that was interrupted (rows still `starting`) are
//!   killed and forgotten: a spawn gives all of its sandboxes or none.
//! - Running sandboxes are re-attached: their VMMs outlive the daemon, and each is
//!   asked for its status over its control socket.
//! - Rows of sandboxes that stopped meanwhile are dropped; sandboxes started without the
//!   daemon (`forkvm fork`) are adopted.
//! - Branches in flight are settled: a snapshot whose writer finished is recorded ready,
//!   one still being written is watched, one whose writer died is removed.
//! - Snapshot rows follow the store.

use crate::db::SandboxRow;
use crate::state::{new_row, AppState, Origin};
use crate::views::{snapshot_info, snapshot_row};
use forkvm_sandbox::{archive, SandboxState};
use forkvm_snapshot::SnapshotStatus;
use forkvm_vmm::control::ControlClient;
use serde::Serialize;

/// What reconciliation did, logged at start and returned for tests.
#[derive(Debug, Default, Clone, Serialize, PartialEq, Eq)]
pub struct Reconciled {
    /// Sandboxes of interrupted spawns, killed.
    pub interrupted: Vec<String>,
    /// Running sandboxes that answered on their control socket.
    pub reattached: Vec<String>,
    /// Rows of sandboxes that had stopped.
    pub gone: Vec<String>,
    /// Sandboxes found running that the database did not know.
    pub adopted: Vec<String>,
    /// Branch snapshots still being written, now watched.
    pub branches_watched: Vec<String>,
    /// Branches settled (ready, or cleaned up when their writer died).
    pub branches_settled: Vec<String>,
    /// Leftovers removed from the store (dead writers, staging directories).
    pub swept_snapshots: Vec<String>,
    /// Archived sandboxes (recorded, or archives found that the database did not know:
    /// archived without the daemon, or whose VMM stopped after the archive was written).
    pub archived: Vec<String>,
    /// Restores the daemon died in: finished ones marked running, others back to archived.
    pub restores_settled: Vec<String>,
}

/// Runs before the listeners open. Returns the branches (op, tag) still being written.
pub fn reconcile(s: &AppState) -> (Reconciled, Vec<(String, String)>) {
    let mut out = Reconciled { swept_snapshots: s.store.sweep(), ..Reconciled::default() };
    s.registry.sweep();
    let rows = s.db().sandboxes().unwrap_or_default();
    let mut drop_ids = Vec::new();
    let has_archive = |id: &str| archive::has_archive(&s.store, id);
    let now = forkvm_sandbox::registry::now_unix_ms();
    for row in &rows {
        let record = s.registry.get(&row.id).ok();
        match (row.state, record) {
            (SandboxState::Archived, None) if has_archive(&row.id) => out.archived.push(row.id.clone()),
            // Restored without the daemon (`forkvm unarchive`): running again.
            (SandboxState::Archived, Some(r)) => {
                let _ = s.db().mark_restored(&row.id, r.pid, now);
                out.reattached.push(row.id.clone());
            }
            (SandboxState::Restoring, Some(r)) if archive::linked_archive(&r.run_dir).is_some() => {
                let _ = s.db().mark_restored(&row.id, r.pid, now);
                out.restores_settled.push(row.id.clone());
            }
            (SandboxState::Restoring, rec) if has_archive(&row.id) => {
                // Not yet linked to its archive, so stopping it leaves the archive.
                if let Some(r) = rec {
                    let _ = forkvm_sandbox::kill_record(&s.registry, &r);
                }
                let _ = s.db().set_state(&row.id, SandboxState::Archived, row.reason.as_deref(), now);
                out.restores_settled.push(row.id.clone());
            }
            // Its VMM stopped after the archive was written (a daemon killed mid-archive,
            // or a restored sandbox that crashed): archived, as the archive says.
            (state, None) if state.is_live() && has_archive(&row.id) => {
                let _ = s.db().set_state(&row.id, SandboxState::Archived, Some("recovered"), now);
                out.archived.push(row.id.clone());
            }
            (SandboxState::Starting, rec) => {
                match rec {
                    Some(r) => {
                        let _ = forkvm_sandbox::kill_record(&s.registry, &r);
                    }
                    // The spawner died between making its run directory and its record.
                    None => s.registry.abandon_unrecorded(&row.id),
                }
                out.interrupted.push(row.id.clone());
                drop_ids.push(row.id.clone());
            }
            (_, None) => {
                out.gone.push(row.id.clone());
                drop_ids.push(row.id.clone());
            }
            (_, Some(r)) => {
                let answers = ControlClient::connect(&r.control_socket()).and_then(|mut c| c.status());
                match answers {
                    Ok(_) => out.reattached.push(row.id.clone()),
                    Err(e) => {
                        tracing::warn!(id = %row.id, %e, "a running sandbox does not answer on its control socket")
                    }
                }
            }
        }
    }
    let _ = s.db().delete_sandboxes(&drop_ids);
    let known: Vec<&str> = rows.iter().map(|r| r.id.as_str()).collect();
    let adopted: Vec<SandboxRow> = s
        .registry
        .list()
        .into_iter()
        .filter(|r| !known.contains(&r.id.as_str()))
        .map(|r| new_row(&r.id, SandboxState::Running, "adopted", &Origin::of(&r), r.created_at_unix_ms / 1000))
        .collect();
    out.adopted = adopted.iter().map(|r| r.id.clone()).collect();
    let _ = s.db().insert_sandboxes(&adopted);
    // Archives made without the daemon.
    for id in archive::list(&s.registry, &s.store) {
        if known.contains(&id.as_str()) {
            continue;
        }
        let a = archive::archived_record(&s.store, &id);
        let origin = a.as_ref().map(Origin::of).unwrap_or_default();
        let created = a.map(|r| r.created_at_unix_ms / 1000).unwrap_or(0);
        let row = new_row(&id, SandboxState::Archived, "adopted", &origin, created);
        if s.db().insert_sandboxes(&[row]).is_ok() {
            let _ = s.db().set_state(&id, SandboxState::Archived, Some("api"), now);
            out.archived.push(id);
        }
    }

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
