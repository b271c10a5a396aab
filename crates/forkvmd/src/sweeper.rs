//! The daemon's clean-up pass, kept apart from reads.
//!
//! A sandbox whose VMM died leaves its run directory: the console log that says why, and
//! disk writes not yet in a disk snapshot. Reads (`GET /v1/sandboxes`, `GET
//! /v1/sandboxes/{id}`, `/metrics`) never touch it, so a Prometheus scrape or a client
//! polling a sandbox cannot remove or salvage anything. This pass does, every
//! [`PERIOD`]: [`Registry::sweep`](forkvm_sandbox::Registry::sweep) salvages the disk
//! writes into the sandbox's vault and removes the run directory and the row (a restored
//! sandbox goes back to `archived`), and settles starts whose starter died; then the
//! checkpoints of sandboxes that are gone are removed
//! ([`crate::checkpoints::sweep_orphans`]).

use crate::state::AppState;
use forkvm_sandbox::registry::Swept;
use std::time::Duration;

/// How often the daemon sweeps.
pub const PERIOD: Duration = Duration::from_secs(5);

/// One pass (blocking: salvage reads and writes disks).
pub fn sweep_once(s: &AppState) -> Swept {
    let swept = s.registry.sweep();
    for id in &swept.seccomp_denied {
        tracing::warn!(sandbox = %id, "a seccomp filter stopped the sandbox's VMM (its console log names the call)");
    }
    s.metrics.add("forkvm_vmm_seccomp_kills_total", &[], swept.seccomp_denied.len() as u64);
    if !swept.is_empty() {
        tracing::info!(?swept, "swept sandboxes whose VMM or starter had stopped");
    }
    let orphans = crate::checkpoints::sweep_orphans(s);
    if !orphans.is_empty() {
        tracing::info!(sandboxes = ?orphans, "removed the checkpoints of sandboxes that are gone");
    }
    swept
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
