//! Disk snapshots in the daemon: taken on request (`POST /v1/sandboxes/{id}/disk-snapshots`)
//! and continuously, every `--disk-snapshot-interval`, for every running sandbox.
//!
//! The work is `forkvm_sandbox::disk_snapshots::take` (the VMM seals the layered disks,
//! then the new layers are encrypted into `<store>/vault/<id>/`), run off the async
//! threads. Two snapshots of one sandbox never run at once: each takes the sandbox's
//! async mutex first, whichever asked (the schedule or a request), so a request made
//! during a scheduled snapshot waits for it and then takes its own. The schedule goes
//! through the sandboxes one at a time. A failed attempt is logged (tracing, the audit
//! log for scheduled ones), counted in the metrics and shown in the sandbox's view; it
//! deletes nothing (the vault commits a snapshot by renaming its manifest, and retention
//! only runs after a snapshot was written), and the next round tries again.

use crate::audit::AuditLog;
use crate::error::ApiError;
use crate::state::AppState;
use forkvm_api::{DiskSnapshotInfo, LastDiskSnapshot};
use forkvm_sandbox::disk_snapshots::{self, DiskSnapshotError, DiskSnapshotReport, DEFAULT_RETENTION};
use forkvm_sandbox::replication::Replication;
use forkvm_snapshot::vault::{RetentionPolicy, SnapshotInfo};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Default `--disk-snapshot-interval`.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);
/// Shortest interval accepted (other than 0, which disables the schedule).
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);

/// How the daemon takes disk snapshots on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskSnapshotConfig {
    /// Time between rounds; `None` disables the schedule (requests still work).
    pub interval: Option<Duration>,
    /// Retention applied after each snapshot (scheduled ones, and requests that name none).
    pub retention: RetentionPolicy,
}

impl Default for DiskSnapshotConfig {
    fn default() -> Self {
        DiskSnapshotConfig { interval: Some(DEFAULT_INTERVAL), retention: DEFAULT_RETENTION }
    }
}

/// Parses `--disk-snapshot-interval`: an integer with an optional unit (`ms`, `s`, `m`,
/// `h`; none means seconds). `0` disables the schedule (`None`).
pub fn parse_interval(text: &str) -> Result<Option<Duration>, BadInterval> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let bad = || BadInterval::NotAnInterval(text.to_string());
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let d = match unit.trim() {
        "ms" => Duration::from_millis(n),
        "" | "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        "h" => Duration::from_secs(n.saturating_mul(3600)),
        _ => return Err(bad()),
    };
    if d.is_zero() {
        return Ok(None);
    }
    if d < MIN_INTERVAL {
        return Err(BadInterval::TooShort(text.to_string()));
    }
    Ok(Some(d))
}

/// A `--disk-snapshot-interval` that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadInterval {
    #[error("{0:?} is not an interval: use e.g. 60, 30s, 5m, 1h, or 0 to disable")]
    NotAnInterval(String),
    #[error("{0:?} is too short: the interval is at least {MIN_INTERVAL:?} (or 0 to disable)")]
    TooShort(String),
}

/// What asked for a snapshot (the metrics' `trigger` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    Schedule,
    Api,
}

impl Trigger {
    fn label(self) -> &'static str {
        match self {
            Trigger::Schedule => "schedule",
            Trigger::Api => "api",
        }
    }
}

/// The daemon's disk snapshot state: the retention to apply, one lock per sandbox, and
/// each sandbox's last attempt (in memory: a restarted daemon starts without).
#[derive(Debug)]
pub struct DiskSnapshots {
    retention: Mutex<RetentionPolicy>,
    /// The remote disk snapshots are shipped to, if any.
    replication: Mutex<Option<Arc<Replication>>>,
    /// Sandboxes this daemon replicated at least once (an unchanged snapshot of one of
    /// them ships nothing new).
    replicated: Mutex<HashSet<String>>,
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    last: Mutex<HashMap<String, LastDiskSnapshot>>,
    /// One branch push to the replication remote at a time ([`crate::replicate_branch`]).
    branch_pushes: Arc<tokio::sync::Semaphore>,
}

impl Default for DiskSnapshots {
    fn default() -> Self {
        DiskSnapshots {
            retention: Mutex::new(DEFAULT_RETENTION),
            replication: Mutex::new(None),
            replicated: Mutex::new(HashSet::new()),
            locks: Mutex::new(HashMap::new()),
            last: Mutex::new(HashMap::new()),
            branch_pushes: Arc::new(tokio::sync::Semaphore::new(1)),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl DiskSnapshots {
    pub fn retention(&self) -> RetentionPolicy {
        *lock(&self.retention)
    }

    pub fn set_retention(&self, policy: RetentionPolicy) {
        *lock(&self.retention) = policy;
    }

    pub fn set_replication(&self, replication: Option<Arc<Replication>>) {
        *lock(&self.replication) = replication;
    }

    /// The remote disk snapshots are shipped to, if any.
    pub fn replication(&self) -> Option<Arc<Replication>> {
        lock(&self.replication).clone()
    }

    /// The turn of branch pushes to the replication remote.
    pub fn branch_pushes(&self) -> Arc<tokio::sync::Semaphore> {
        self.branch_pushes.clone()
    }

    /// The last attempt on sandbox `id`, if this daemon made one.
    pub fn last(&self, id: &str) -> Option<LastDiskSnapshot> {
        lock(&self.last).get(id).cloned()
    }

    /// The async lock that serializes disk snapshots, archive, restore and delete of `id`.
    pub fn sandbox_lock(&self, id: &str) -> Arc<tokio::sync::Mutex<()>> {
        lock(&self.locks).entry(id.to_string()).or_default().clone()
    }

    /// Drops what is kept about sandboxes no longer running (not their vaults).
    fn forget_all_but(&self, running: &HashSet<String>) {
        lock(&self.locks).retain(|id, l| running.contains(id) || Arc::strong_count(l) > 1);
        lock(&self.last).retain(|id, _| running.contains(id));
    }

    fn record(&self, id: &str, outcome: &Result<DiskSnapshotReport, DiskSnapshotError>) {
        let mut last = lock(&self.last);
        let previous = last.get(id).and_then(|l| l.seq);
        let at_unix_ms = forkvm_sandbox::registry::now_unix_ms();
        let entry = match outcome {
            Ok(r) => LastDiskSnapshot { seq: (r.seq > 0).then_some(r.seq).or(previous), at_unix_ms, error: None },
            Err(e) => LastDiskSnapshot { seq: previous, at_unix_ms, error: Some(e.to_string()) },
        };
        last.insert(id.to_string(), entry);
    }
}

/// Takes one disk snapshot of sandbox `id` now, after any other of the same sandbox
/// finished; records its outcome (metrics, the sandbox's last attempt). The library's
/// error is returned as is, so callers can tell "no layered disk" from a failure.
pub async fn take(
    s: &AppState,
    id: &str,
    policy: RetentionPolicy,
    trigger: Trigger,
) -> Result<Result<DiskSnapshotReport, DiskSnapshotError>, ApiError> {
    let sandbox_lock = s.disk.sandbox_lock(id);
    let _held = sandbox_lock.lock().await;
    let started = Instant::now();
    let owned = id.to_string();
    let outcome = s.blocking(move |s| Ok(disk_snapshots::take(&s.registry, &s.store, &owned, &policy))).await?;
    let seconds = started.elapsed().as_secs_f64();
    let t = trigger.label();
    match &outcome {
        Ok(r) => {
            let result = if r.unchanged { "unchanged" } else { "ok" };
            s.metrics.inc("forkvm_disk_snapshots_total", &[("trigger", t), ("outcome", result)]);
            s.metrics.add("forkvm_disk_snapshot_written_bytes_total", &[], r.written_bytes);
            s.metrics.set("forkvm_disk_snapshot_last_success_unix", &[], crate::state::now_unix() as f64);
            tracing::info!(sandbox_id = %id, trigger = t, seq = r.seq, unchanged = r.unchanged,
                written_bytes = r.written_bytes, seal_ms = r.seal_ms, retired = r.retired, "disk snapshot");
        }
        // Not a failure: nothing to snapshot (no layered disk), or the sandbox just went.
        Err(e) if skippable(e) => return Ok(outcome),
        Err(e) => {
            s.metrics.inc("forkvm_disk_snapshots_total", &[("trigger", t), ("outcome", "failed")]);
            tracing::warn!(sandbox_id = %id, trigger = t, error = %e, "disk snapshot failed");
        }
    }
    s.metrics.observe("forkvm_disk_snapshot_duration_seconds", &[("trigger", t)], seconds);
    s.metrics.set("forkvm_disk_snapshot_last_duration_seconds", &[], seconds);
    s.disk.record(id, &outcome);
    if let (Ok(r), Some(replication)) = (&outcome, s.disk.replication()) {
        if !r.unchanged || !lock(&s.disk.replicated).contains(id) {
            replicate(s, id, replication).await?;
        }
    }
    Ok(outcome)
}

/// Ships sandbox `id`'s new disk snapshot off the host (under the sandbox's lock, held
/// by the caller). A failure is logged and counted, never a failed disk snapshot: the
/// next snapshot ships what this one missed.
async fn replicate(s: &AppState, id: &str, replication: Arc<Replication>) -> Result<(), ApiError> {
    let owned = id.to_string();
    let result = s.blocking(move |s| Ok(replication.replicate(&s.store, &owned))).await?;
    match result {
        Ok(r) => {
            s.metrics.inc("forkvm_replications_total", &[("outcome", "ok")]);
            s.metrics.add("forkvm_replicated_bytes_total", &[], r.bytes_uploaded);
            s.metrics.set("forkvm_replication_last_success_unix", &[], crate::state::now_unix() as f64);
            lock(&s.disk.replicated).insert(id.to_string());
            tracing::info!(sandbox_id = %id, remote = %r.remote, newest_seq = ?r.newest_seq,
                files = r.files_uploaded, bytes = r.bytes_uploaded, ms = r.ms, "disk snapshots replicated");
        }
        Err(e) => {
            s.metrics.inc("forkvm_replications_total", &[("outcome", "failed")]);
            tracing::warn!(sandbox_id = %id, error = %e, "replicating disk snapshots failed");
        }
    }
    Ok(())
}

/// Errors a scheduled round passes over quietly: the sandbox has no layered disk, or it
/// stopped between the listing and the snapshot.
fn skippable(e: &DiskSnapshotError) -> bool {
    matches!(e, DiskSnapshotError::NoLayeredDisk(_)) || e.code() == forkvm_api::ErrorCode::NotFound
}

/// The API's view of a vault snapshot.
pub fn info_view(s: &SnapshotInfo) -> DiskSnapshotInfo {
    DiskSnapshotInfo {
        seq: s.seq,
        created_unix_ms: s.created_unix_ms,
        stored_bytes: s.stored_bytes,
        disks: s
            .disks
            .iter()
            .map(|d| forkvm_api::DiskSnapshotDisk {
                id: d.id.clone(),
                base_key: d.base_key.clone(),
                size: d.size,
                layer_id: d.layer_id.clone(),
                blocks: d.blocks,
                extents: d.extents,
            })
            .collect(),
    }
}

/// The API's view of a report.
pub fn report_view(r: &DiskSnapshotReport) -> forkvm_api::DiskSnapshotReport {
    forkvm_api::DiskSnapshotReport {
        sandbox_id: r.sandbox_id.clone(),
        seq: r.seq,
        unchanged: r.unchanged,
        new_layers: r.new_layers as u64,
        seal_ms: r.seal_ms,
        write_ms: r.write_ms,
        written_chunks: r.written_chunks,
        written_bytes: r.written_bytes,
        stored_bytes: r.stored_bytes,
        retired: r.retired as u64,
    }
}

/// The sandboxes a round snapshots: running ones the daemon is not still starting.
fn running_ids(s: &AppState) -> Vec<String> {
    let runs =
        |r: &forkvm_sandbox::registry::SandboxRow| r.state.is_live() && forkvm_sandbox::registry::vmm_runs(&r.record);
    s.registry.rows().into_iter().filter(runs).map(|r| r.record.id).collect()
}

/// One round: a disk snapshot of every running sandbox, one at a time. Returns how many
/// were attempted (skipped ones not counted).
pub async fn round(s: &AppState, audit: Option<&AuditLog>) -> usize {
    let ids = match s.blocking(|s| Ok(running_ids(&s))).await {
        Ok(ids) => ids,
        Err(e) => {
            tracing::warn!(error = %e.message, "listing sandboxes for disk snapshots");
            return 0;
        }
    };
    s.disk.forget_all_but(&ids.iter().cloned().collect());
    let policy = s.disk.retention();
    let mut attempted = 0;
    for id in &ids {
        let error = match take(s, id, policy, Trigger::Schedule).await {
            Ok(Ok(_)) => None,
            Ok(Err(e)) if skippable(&e) => continue,
            Ok(Err(e)) => Some(e.to_string()),
            // The worker thread itself failed (a panic): say so, go on with the others.
            Err(e) => {
                tracing::warn!(sandbox_id = %id, error = %e.message, "disk snapshot failed");
                Some(e.message)
            }
        };
        if let (Some(error), Some(a)) = (error, audit) {
            a.event("disk_snapshot", Some(id), serde_json::json!({ "outcome": "failed", "error": error }));
        }
        attempted += 1;
    }
    attempted
}

/// Runs a round every `every` until the runtime stops. A round longer than the interval
/// delays the next one (rounds never overlap).
pub async fn schedule(s: AppState, every: Duration, audit: Option<AuditLog>) {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        round(&s, audit.as_ref()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals() {
        assert_eq!(parse_interval("0"), Ok(None));
        assert_eq!(parse_interval("0s"), Ok(None));
        assert_eq!(parse_interval("60"), Ok(Some(Duration::from_secs(60))));
        assert_eq!(parse_interval(" 1s "), Ok(Some(Duration::from_secs(1))));
        assert_eq!(parse_interval("1500ms"), Ok(Some(Duration::from_millis(1500))));
        assert_eq!(parse_interval("5m"), Ok(Some(Duration::from_secs(300))));
        assert_eq!(parse_interval("2h"), Ok(Some(Duration::from_secs(7200))));
        for bad in ["", "s", "-1", "1.5", "ten", "10x", "1 2", "99999999999999999999"] {
            let e = parse_interval(bad).unwrap_err().to_string();
            assert!(e.contains("not an interval"), "{bad:?}: {e}");
        }
        assert!(parse_interval("500ms").unwrap_err().to_string().contains("at least"));
    }
}
