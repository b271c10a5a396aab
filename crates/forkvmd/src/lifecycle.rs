//! Sandbox lifecycle in the daemon: auto-pause when idle, transparent resume, time to
//! live, archive and restore.
//!
//! - **Activity.** Every call that uses a sandbox (exec, files, eval, ping, branch,
//!   fork, archive) holds an [`InUse`] guard while it runs. Taking one resumes a sandbox
//!   the daemon paused (the caller never sees it paused) and notes the time; while one
//!   is held the sandbox is never paused.
//! - **Idle pause.** Every tick, a running sandbox without a guard and without activity
//!   for `--idle-pause` is paused (its VMM's vCPUs stop; memory, disks and processes
//!   stay) and shown `paused` with reason `idle`. Taking a guard and pausing both happen
//!   under the sandbox's activity mutex, so a call can never find the sandbox paused
//!   under its feet. Disk snapshots go on for paused sandboxes.
//! - **TTL.** A sandbox whose `expires_at_unix_ms` passed is **archived** (never
//!   deleted), reason `ttl`, and the event is audit-logged. A failed attempt is retried
//!   after [`TTL_RETRY`].
//! - **Archive / restore** are serialized with disk snapshots (the sandbox's async
//!   lock). The registry row says `archived`, so a restarted daemon (and the CLI) still
//!   lists the sandbox; a restore starts the VMM in the spawner (it forks) and waits for
//!   the guest here. Only `DELETE /v1/sandboxes/{id}` removes an archive.
//!
//! Every state change is a compare-and-set on the registry row
//! ([`forkvm_sandbox::Registry::transition`]): a pause that finds the sandbox archived
//! meanwhile changes nothing.

use crate::audit::AuditLog;
use crate::error::ApiError;
use crate::routes::sandboxes::running;
use crate::state::AppState;
use forkvm_sandbox::archive::{self, ArchiveError};
use forkvm_sandbox::registry::{now_unix_ms, SandboxRow};
use forkvm_sandbox::{SandboxRecord, SandboxState, StateReason};
use forkvm_vmm::control::ControlClient;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Default `--idle-pause`.
pub const DEFAULT_IDLE_PAUSE: Duration = Duration::from_secs(300);
/// Longest TTL accepted (ten years).
pub const MAX_TTL_SECONDS: u64 = 10 * 365 * 86_400;
/// A TTL archive that failed is tried again after this long.
pub const TTL_RETRY: Duration = Duration::from_secs(30);

/// The daemon's lifecycle policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LifecycleConfig {
    /// Pause a sandbox idle this long; `None`: never.
    pub idle_pause: Option<Duration>,
    /// The TTL of sandboxes whose request names none; `None`: no TTL.
    pub default_ttl: Option<Duration>,
}

impl Default for LifecycleConfig {
    fn default() -> Self {
        LifecycleConfig { idle_pause: Some(DEFAULT_IDLE_PAUSE), default_ttl: None }
    }
}

#[derive(Debug, Default)]
struct Activity {
    in_flight: u32,
    /// Last use (Unix ms); 0 until known (then the database's is used).
    last_ms: u64,
}

/// Per-sandbox activity, the policy, and TTL archives to retry later.
#[derive(Debug, Default)]
pub struct Lifecycle {
    config: Mutex<LifecycleConfig>,
    activity: Mutex<HashMap<String, Arc<Mutex<Activity>>>>,
    ttl_failed: Mutex<HashMap<String, Instant>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Lifecycle {
    pub fn config(&self) -> LifecycleConfig {
        *lock(&self.config)
    }

    pub fn set_config(&self, c: LifecycleConfig) {
        *lock(&self.config) = c;
    }

    fn entry(&self, id: &str) -> Arc<Mutex<Activity>> {
        lock(&self.activity).entry(id.to_string()).or_default().clone()
    }

    fn forget(&self, id: &str) {
        lock(&self.activity).remove(id);
        lock(&self.ttl_failed).remove(id);
    }

    /// The TTL a new sandbox gets: the request's (`0`: none), else the daemon's default.
    pub fn ttl_for(&self, requested: Option<u64>) -> Result<Option<u64>, ApiError> {
        match requested {
            Some(n) if n > MAX_TTL_SECONDS => {
                Err(ApiError::bad_request(format!("ttl_seconds {n} is more than {MAX_TTL_SECONDS} (ten years)")))
            }
            Some(0) => Ok(None),
            Some(n) => Ok(Some(n)),
            None => Ok(self.config().default_ttl.map(|d| d.as_secs().max(1))),
        }
    }
}

/// A call using a sandbox: while held, the sandbox is not paused for idleness; dropping
/// it notes the time (a long exec counts as activity until it ends).
#[derive(Debug)]
pub struct InUse {
    entry: Arc<Mutex<Activity>>,
}

impl Drop for InUse {
    fn drop(&mut self) {
        let mut a = lock(&self.entry);
        a.in_flight = a.in_flight.saturating_sub(1);
        a.last_ms = now_unix_ms();
    }
}

/// Pauses (`pause`) or resumes sandbox `r`'s vCPUs.
fn set_paused(r: &SandboxRecord, pause: bool) -> Result<(), ApiError> {
    ControlClient::connect(&r.control_socket())
        .and_then(|mut c| if pause { c.pause() } else { c.resume() })
        .map(|_| ())
        .map_err(|e| ApiError::internal(format!("sandbox {}: {e}", r.id)))
}

/// Starts a call on running sandbox `id` (blocking): checks it runs, resumes it if the
/// daemon paused it, notes the activity. Keep the guard for as long as the call runs.
pub fn use_sandbox(s: &AppState, id: &str) -> Result<(SandboxRecord, InUse), ApiError> {
    let r = running(s, id)?;
    let entry = s.lifecycle.entry(id);
    let mut a = lock(&entry);
    let now = now_unix_ms();
    if s.sandbox_row(id).is_some_and(|row| row.state == SandboxState::Paused) {
        set_paused(&r, false)?;
        s.registry.transition(id, &[SandboxState::Paused], SandboxState::Running, None)?;
        s.metrics.inc("forkvm_auto_resumes_total", &[]);
        tracing::info!(sandbox_id = %id, "resumed a sandbox paused when idle");
    }
    a.in_flight += 1;
    a.last_ms = now;
    drop(a);
    let _ = s.registry.touch(id, now);
    Ok((r, InUse { entry }))
}

/// Pauses sandbox `id` because a client asked (E2B's pause; blocking): its vCPUs stop
/// and its row says `paused`, reason `api`. One the daemon paused when idle keeps its
/// stopped vCPUs and takes the new reason. Returns `false` when a client had paused it
/// already. A forkvm call that uses it later resumes it, as it resumes an idle one.
pub fn pause_requested(s: &AppState, id: &str) -> Result<bool, ApiError> {
    let entry = s.lifecycle.entry(id);
    let _a = lock(&entry);
    let row = s.known_sandbox(id)?;
    match (row.state, row.reason) {
        (SandboxState::Paused, Some(StateReason::Api)) => Ok(false),
        (SandboxState::Paused, _) => {
            s.registry.transition(id, &[SandboxState::Paused], SandboxState::Paused, Some(StateReason::Api))?;
            Ok(true)
        }
        (SandboxState::Running, _) => {
            let r = running(s, id)?;
            set_paused(&r, true)?;
            if !s.registry.transition(id, &[SandboxState::Running], SandboxState::Paused, Some(StateReason::Api))? {
                set_paused(&r, false)?;
                return Err(ApiError::conflict(format!("sandbox {id:?} changed state while pausing"), "changed"));
            }
            s.metrics.inc("forkvm_requested_pauses_total", &[]);
            Ok(true)
        }
        (state, _) => {
            Err(ApiError::conflict(format!("sandbox {id:?} is {state}: only a running one pauses"), state.as_str()))
        }
    }
}

/// Resumes sandbox `id` if it is paused (blocking); `false` when it was running.
pub fn resume_requested(s: &AppState, id: &str) -> Result<bool, ApiError> {
    let entry = s.lifecycle.entry(id);
    let mut a = lock(&entry);
    let row = s.known_sandbox(id)?;
    if row.state != SandboxState::Paused {
        return Ok(false);
    }
    let r = running(s, id)?;
    set_paused(&r, false)?;
    s.registry.transition(id, &[SandboxState::Paused], SandboxState::Running, None)?;
    a.last_ms = now_unix_ms();
    Ok(true)
}

/// Pauses sandbox `row` if it is running, unused and idle for `idle` (blocking).
/// Returns whether it paused it.
pub fn pause_if_idle(s: &AppState, row: &SandboxRow, idle: Duration) -> Result<bool, ApiError> {
    let id = row.id();
    let entry = s.lifecycle.entry(id);
    let mut a = lock(&entry);
    // The row's activity counts too: the CLI notes its own calls there.
    a.last_ms = a.last_ms.max(row.last_activity_unix_ms).max(row.record.created_at_unix_ms);
    let now = now_unix_ms();
    if a.in_flight > 0 || now.saturating_sub(a.last_ms) < idle.as_millis() as u64 {
        return Ok(false);
    }
    // Read again under the activity lock: an archive or a resume may have happened.
    if s.sandbox_row(id).is_none_or(|r| r.state != SandboxState::Running) {
        return Ok(false);
    }
    let Ok((r, true)) = s.registry.lookup(id) else { return Ok(false) };
    set_paused(&r, true)?;
    if !s.registry.transition(id, &[SandboxState::Running], SandboxState::Paused, Some(StateReason::Idle))? {
        // Moved meanwhile (a call outside this daemon): as it was.
        set_paused(&r, false)?;
        return Ok(false);
    }
    s.metrics.inc("forkvm_auto_pauses_total", &[]);
    tracing::info!(sandbox_id = %id, idle_ms = now - a.last_ms, "paused an idle sandbox");
    Ok(true)
}

impl From<ArchiveError> for ApiError {
    fn from(e: ArchiveError) -> ApiError {
        match e {
            ArchiveError::Lifecycle(l) => l.into(),
            ArchiveError::Spawn(sp) => sp.into(),
            ArchiveError::Running(_) => ApiError::conflict(e.to_string(), SandboxState::Running.as_str()),
            other => ApiError::new(other.code(), other.to_string()),
        }
    }
}

/// A 409 when sandbox `id` is archived (the daemon's record says so), for calls that
/// need it running.
pub fn archived_conflict(s: &AppState, id: &str) -> Option<ApiError> {
    s.sandbox_row(id).filter(|r| r.state == SandboxState::Archived).map(|_| {
        ApiError::conflict(
            format!("sandbox {id:?} is archived: restore it first (POST .../restore)"),
            SandboxState::Archived.as_str(),
        )
    })
}

/// Archives sandbox `id` (`reason`: `api` or `ttl`): waits for a disk snapshot of it in
/// progress, then writes it to `<store>/archives/<id>/` and stops its VMM.
pub async fn archive_sandbox(
    s: &AppState,
    id: &str,
    reason: StateReason,
) -> Result<forkvm_api::ArchiveReport, ApiError> {
    let sandbox_lock = s.disk.sandbox_lock(id);
    let _held = sandbox_lock.lock().await;
    let id = id.to_string();
    let out = s
        .blocking(move |s| {
            let (_record, in_use) = use_sandbox(&s, &id)?;
            let report = archive::archive(&s.registry, &s.store, &id, reason)?;
            drop(in_use);
            s.lifecycle.forget(&id);
            Ok(report.to_api())
        })
        .await;
    let outcome = match &out {
        Ok(_) => "ok",
        Err(e) => e.code.as_str(),
    };
    s.metrics.inc("forkvm_archives_total", &[("reason", reason.as_str()), ("outcome", outcome)]);
    out
}

/// Restores archived sandbox `id` (same id, processes and files) with TTL `ttl_seconds`
/// from now: the VMM is started by the spawner, the guest awaited here.
pub async fn restore_sandbox(
    s: &AppState,
    id: &str,
    ttl_seconds: Option<u64>,
) -> Result<forkvm_api::SandboxInfo, ApiError> {
    let ttl = s.lifecycle.ttl_for(ttl_seconds)?;
    let sandbox_lock = s.disk.sandbox_lock(id);
    let _held = sandbox_lock.lock().await;
    let id = id.to_string();
    let out = s
        .blocking(move |s| {
            let started = Instant::now();
            let row = s.sandbox_row(&id);
            match s.registry.lookup(&id) {
                Ok((_, true)) => {
                    let state = match row.map_or(SandboxState::Running, |r| r.state) {
                        SandboxState::Restoring => SandboxState::Starting,
                        state => state,
                    };
                    return Err(ApiError::conflict(
                        format!("sandbox {id:?} is {state}: only an archived one can be restored"),
                        state.as_str(),
                    ));
                }
                Ok((r, false)) => s.registry.clean_up(&r),
                Err(forkvm_sandbox::RegistryError::NotFound(_)) => {}
                Err(e) => return Err(e.into()),
            }
            if !archive::has_archive(&s.store, &id) {
                return Err(ApiError::not_found(format!("sandbox {id:?} not found, and it has no archive")));
            }
            let spawner = s.spawner.clone().ok_or_else(|| ApiError::internal("this daemon has no spawner process"))?;
            // The spawner moves the row to `restoring`, `finish_restore` to `running`; a
            // failure at either step puts it back to `archived`.
            let pending =
                spawner.start_restore(&id).map_err(|r| crate::spawner::refused(r, SandboxState::Running.as_str()))?;
            let sandbox = forkvm_sandbox::start::restore::finish_restore(&s.registry, &s.store, pending, started)?;
            let now = now_unix_ms();
            s.registry.set_ttl(&id, ttl, ttl.map(|t| now + t * 1000))?;
            let row = s
                .sandbox_row(&sandbox.record.id)
                .ok_or_else(|| ApiError::internal(format!("sandbox {id:?} restored but has no registry row")))?;
            Ok(crate::views::sandbox_info(&row, &s.disk))
        })
        .await;
    let outcome = match &out {
        Ok(_) => "ok",
        Err(e) => e.code.as_str(),
    };
    s.metrics.inc("forkvm_restores_total", &[("outcome", outcome)]);
    out
}

/// Sets the TTLs of new sandboxes `ids` (the request's, else the daemon's default).
pub fn apply_ttl(s: &AppState, ids: &[String], ttl: Option<u64>) {
    if let Some(t) = ttl {
        let expires = now_unix_ms() + t * 1000;
        for id in ids {
            let _ = s.registry.set_ttl(id, Some(t), Some(expires));
        }
    }
}

/// One tick: archive the sandboxes whose TTL ran out, pause the idle ones.
pub async fn tick(s: &AppState, audit: Option<&AuditLog>) {
    let rows = match s.blocking(|s| Ok(s.registry.rows())).await {
        Ok(rows) => rows,
        Err(e) => {
            tracing::warn!(error = %e.message, "reading sandboxes for the lifecycle tick");
            return;
        }
    };
    let now = now_unix_ms();
    let cfg = s.lifecycle.config();
    for row in rows.iter().filter(|r| r.state.is_live()) {
        if row.expires_at_unix_ms.is_some_and(|t| t <= now) {
            let retry_at = lock(&s.lifecycle.ttl_failed).get(row.id()).copied();
            if retry_at.is_some_and(|t| Instant::now() < t) {
                continue;
            }
            let outcome = archive_sandbox(s, row.id(), StateReason::Ttl).await;
            let details = match &outcome {
                Ok(r) => {
                    serde_json::json!({ "outcome": SandboxState::Archived, "reason": StateReason::Ttl, "dir": r.dir })
                }
                Err(e) => {
                    tracing::warn!(sandbox_id = %row.id(), error = %e.message, "archiving a sandbox whose TTL ran out");
                    lock(&s.lifecycle.ttl_failed).insert(row.id().to_string(), Instant::now() + TTL_RETRY);
                    serde_json::json!({ "outcome": "failed", "reason": StateReason::Ttl, "error": e.message })
                }
            };
            s.metrics.inc("forkvm_ttl_archives_total", &[("outcome", if outcome.is_ok() { "ok" } else { "failed" })]);
            if let Some(a) = audit {
                a.event("archive", Some(row.id()), details);
            }
            continue;
        }
        let Some(idle) = cfg.idle_pause else { continue };
        if row.state != SandboxState::Running {
            continue;
        }
        let r = row.clone();
        match s.blocking(move |s| pause_if_idle(&s, &r, idle)).await {
            Ok(true) => {
                if let Some(a) = audit {
                    a.event(
                        "pause",
                        Some(row.id()),
                        serde_json::json!({ "outcome": SandboxState::Paused, "reason": StateReason::Idle }),
                    );
                }
            }
            Ok(false) => {}
            Err(e) => tracing::warn!(sandbox_id = %row.id(), error = %e.message, "pausing an idle sandbox"),
        }
    }
}

/// The tick period for `cfg`: fine enough for a short idle timeout, at most a second.
pub fn period(cfg: LifecycleConfig) -> Duration {
    let idle = cfg.idle_pause.unwrap_or(Duration::from_secs(4));
    (idle / 4).clamp(Duration::from_millis(100), Duration::from_secs(1))
}

/// Runs [`tick`] until the runtime stops.
pub async fn schedule(s: AppState, audit: Option<AuditLog>) {
    let every = period(s.lifecycle.config());
    let mut t = tokio::time::interval(every);
    t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        t.tick().await;
        tick(&s, audit.as_ref()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_and_periods() {
        let l = Lifecycle::default();
        assert_eq!(l.ttl_for(None).unwrap(), None);
        assert_eq!(l.ttl_for(Some(0)).unwrap(), None);
        assert_eq!(l.ttl_for(Some(5)).unwrap(), Some(5));
        assert!(l.ttl_for(Some(MAX_TTL_SECONDS + 1)).is_err());
        l.set_config(LifecycleConfig { idle_pause: None, default_ttl: Some(Duration::from_secs(60)) });
        assert_eq!(l.ttl_for(None).unwrap(), Some(60));
        assert_eq!(l.ttl_for(Some(0)).unwrap(), None);
        let p = |ms| period(LifecycleConfig { idle_pause: Some(Duration::from_millis(ms)), default_ttl: None });
        assert_eq!(p(1000), Duration::from_millis(250));
        assert_eq!(p(300_000), Duration::from_secs(1));
        assert_eq!(p(100), Duration::from_millis(100));
    }
}
