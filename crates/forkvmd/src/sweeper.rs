//! The daemon's clean-up pass, kept apart from reads.
//!
//! A sandbox whose VMM died leaves its run directory: the console log that says why, and
//! disk writes not yet in a disk snapshot. Reads (`GET /v1/sandboxes`, `GET
//! /v1/sandboxes/{id}`, `/metrics`) never touch it, so a Prometheus scrape or a client
//! polling a sandbox cannot remove or salvage anything. This pass does, every
//! [`PERIOD`]: [`Registry::sweep`](forkvm_sandbox::Registry::sweep) salvages the disk
//! writes into the sandbox's vault and removes the run directory, then the database
//! forgets sandboxes that stopped (rows still `running` or `paused` with no record and
//! no archive).

use crate::state::AppState;
use forkvm_sandbox::archive;
use forkvm_sandbox::RegistryError;
use serde::Serialize;
use std::time::Duration;

/// How often the daemon sweeps.
pub const PERIOD: Duration = Duration::from_secs(5);

/// What one pass removed.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct Swept {
    /// Run directories removed (after salvage).
    pub run_dirs: Vec<String>,
    /// Database rows of sandboxes that had stopped.
    pub rows: Vec<String>,
}

/// One pass (blocking: salvage reads and writes disks).
pub fn sweep_once(s: &AppState) -> Swept {
    let run_dirs = s.registry.sweep();
    let rows = s.db().sandboxes().unwrap_or_default();
    let stopped: Vec<String> = rows
        .iter()
        .filter(|r| r.state.is_live())
        .filter(|r| matches!(s.registry.lookup(&r.id), Err(RegistryError::NotFound(_))))
        .filter(|r| !archive::has_archive(&s.store, &r.id))
        .map(|r| r.id.clone())
        .collect();
    if !stopped.is_empty() {
        if let Err(e) = s.db().delete_sandboxes(&stopped) {
            tracing::warn!(error = %e, "forgetting stopped sandboxes");
            return Swept { run_dirs, rows: Vec::new() };
        }
    }
    if !run_dirs.is_empty() || !stopped.is_empty() {
        tracing::info!(?run_dirs, rows = ?stopped, "swept sandboxes whose VMM had stopped");
    }
    Swept { run_dirs, rows: stopped }
}

/// Runs [`sweep_once`] every [`PERIOD`] until the runtime stops.
pub async fn schedule(s: AppState) {
    let mut t = tokio::time::interval(PERIOD);
    t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        t.tick().await;
        let _ = s.blocking(|s| Ok(sweep_once(&s))).await;
    }
}
