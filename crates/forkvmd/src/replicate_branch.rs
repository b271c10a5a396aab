//! Branches shipped off the host as they are taken (`forkvm daemon --replicate URL`).
//!
//! Why this exists: a branch is a sandbox's whole state at a moment (memory, disks,
//! devices), the thing an agent wants back after losing the host mid-thought. With a
//! replication remote, every branch that becomes ready is pushed there in the
//! background (only the blocks the remote lacks: a branch shares most of its pages
//! with its template), and any host holding the remote key pulls and forks it
//! (`forkvm pull TAG`). One push at a time; a failure is logged and counted
//! (`forkvm_branch_replications_total{outcome="failed"}`), never a failed branch.

use crate::state::AppState;

/// Pushes branch `tag` to the daemon's replication remote, if it has one, in the background.
pub fn replicate_branch(s: &AppState, tag: String) {
    let Some(replication) = s.disk.replication() else { return };
    let s = s.clone();
    tokio::spawn(async move {
        let Ok(_turn) = s.disk.branch_pushes().acquire_owned().await else { return };
        let pushed = tag.clone();
        let result = s.blocking(move |s| Ok(replication.push_snapshot(&s.store, &pushed))).await;
        match result {
            Ok(Ok(r)) => {
                s.metrics.inc("forkvm_branch_replications_total", &[("outcome", "ok")]);
                s.metrics.add("forkvm_replicated_bytes_total", &[], r.bytes_uploaded);
                tracing::info!(%tag, remote = %r.remote, blocks = r.blocks_uploaded, bytes = r.bytes_uploaded,
                    ms = r.ms, "branch replicated");
            }
            Ok(Err(e)) => {
                s.metrics.inc("forkvm_branch_replications_total", &[("outcome", "failed")]);
                tracing::warn!(%tag, error = %e, "replicating a branch failed");
            }
            Err(e) => {
                s.metrics.inc("forkvm_branch_replications_total", &[("outcome", "failed")]);
                tracing::warn!(%tag, error = %e.message, "replicating a branch failed");
            }
        }
    });
}
