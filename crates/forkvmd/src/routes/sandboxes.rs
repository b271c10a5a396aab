//! `/v1/sandboxes`: spawn from a snapshot, list, get, kill, and fork a running one.
//!
//! A spawn or fork records its sandboxes as `starting` before any process exists, and
//! as `running` once every one answered and took its identity: a daemon killed in
//! between finds the `starting` rows on restart and removes those sandboxes (a spawn
//! gives all of its sandboxes or none).

use crate::error::ApiError;
use crate::extract::{JsonBody, Param};
use crate::spawner::SpawnOrder;
use crate::state::{new_row, now_unix, AppState, Origin};
use crate::views::sandbox_info;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use forkvm_api::{CreateSandboxRequest, ForkSandboxRequest, SandboxInfo, MAX_SANDBOXES_PER_CALL};
use forkvm_sandbox::sandbox::new_sandbox_id;
use forkvm_sandbox::{SandboxRecord, SpawnOptions, SpawnSource, SpawnedSandbox};
use forkvm_snapshot::validate_tag;
use std::time::Instant;

fn check_count(n: u32) -> Result<(), ApiError> {
    if n == 0 || n > MAX_SANDBOXES_PER_CALL {
        return Err(ApiError::bad_request(format!("n must be between 1 and {MAX_SANDBOXES_PER_CALL}, got {n}")));
    }
    Ok(())
}

fn limit_bytes(mib: Option<u64>) -> Result<Option<u64>, ApiError> {
    match mib {
        Some(0) => Err(ApiError::bad_request("memory_limit_mib must be at least 1")),
        Some(m) if m > (1 << 30) => Err(ApiError::bad_request(format!("memory_limit_mib {m} is not a sane limit"))),
        other => Ok(other.map(|m| m << 20)),
    }
}

/// A new operation id (names the call in the database).
fn op_id(kind: &str) -> String {
    format!("{kind}-{}", new_sandbox_id())
}

pub async fn list(State(s): State<AppState>) -> Result<Json<Vec<SandboxInfo>>, ApiError> {
    s.blocking(|s| {
        s.registry.sweep();
        let rows = s.db().sandboxes().unwrap_or_default();
        let mut out: Vec<SandboxInfo> = s
            .registry
            .list()
            .iter()
            .filter(|r| rows.iter().find(|x| x.id == r.id).is_none_or(|x| x.state == "running"))
            .map(|r| sandbox_info(r, rows.iter().find(|x| x.id == r.id)))
            .collect();
        out.sort_by(|a, b| (a.created_at_unix, &a.id).cmp(&(b.created_at_unix, &b.id)));
        Ok(Json(out))
    })
    .await
}

/// The record of a running sandbox the API may show (not one still starting).
pub fn running(s: &AppState, id: &str) -> Result<SandboxRecord, ApiError> {
    let (r, alive) = s.registry.lookup(id)?;
    if !alive {
        // Say why before the run directory goes: a crashed guest leaves its console.
        let console = forkvm_sandbox::spawn::console_tail(&r);
        s.registry.clean_up(&r);
        let _ = s.db().delete_sandboxes(&[id.to_string()]);
        return Err(ApiError::not_found(format!("sandbox {id:?} has stopped; its console ended with: {console}")));
    }
    if s.sandbox_row(id).is_some_and(|row| row.state == "starting") {
        return Err(ApiError::conflict(format!("sandbox {id:?} is still starting"), "starting"));
    }
    Ok(r)
}

pub async fn get(State(s): State<AppState>, Param(id): Param) -> Result<Json<SandboxInfo>, ApiError> {
    s.blocking(move |s| {
        let r = running(&s, &id)?;
        Ok(Json(sandbox_info(&r, s.sandbox_row(&id).as_ref())))
    })
    .await
}

pub async fn delete(State(s): State<AppState>, Param(id): Param) -> Result<StatusCode, ApiError> {
    s.blocking(move |s| {
        let r = s.registry.get(&id)?;
        forkvm_sandbox::kill_record(&s.registry, &r)?;
        let _ = s.db().delete_sandboxes(&[id]);
        Ok(StatusCode::NO_CONTENT)
    })
    .await
}

/// Records the sandboxes of a finished spawn or fork as running; their views.
fn settle(
    s: &AppState,
    kind: &str,
    started: Instant,
    made: Result<Vec<SpawnedSandbox>, ApiError>,
    ids: &[String],
) -> Result<Vec<SandboxInfo>, ApiError> {
    let seconds = started.elapsed().as_secs_f64();
    match made {
        Ok(sandboxes) => {
            let pids: Vec<(String, i32)> = sandboxes.iter().map(|x| (x.record.id.clone(), x.record.pid)).collect();
            s.db().mark_running(&pids).map_err(|e| ApiError::internal(e.to_string()))?;
            s.metrics.inc("forkvm_spawns_total", &[("kind", kind), ("outcome", "ok")]);
            s.metrics.add("forkvm_sandboxes_spawned_total", &[("kind", kind)], sandboxes.len() as u64);
            s.metrics.observe("forkvm_spawn_duration_seconds", &[("kind", kind)], seconds);
            let rows = s.db().sandboxes().unwrap_or_default();
            Ok(sandboxes.iter().map(|x| sandbox_info(&x.record, rows.iter().find(|r| r.id == x.record.id))).collect())
        }
        Err(e) => {
            let _ = s.db().delete_sandboxes(ids);
            s.metrics.inc("forkvm_spawns_total", &[("kind", kind), ("outcome", e.code)]);
            Err(e)
        }
    }
}

pub async fn create(
    State(s): State<AppState>,
    JsonBody(req): JsonBody<CreateSandboxRequest>,
) -> Result<(StatusCode, Json<Vec<SandboxInfo>>), ApiError> {
    check_count(req.n)?;
    let limit = limit_bytes(req.memory_limit_mib)?;
    if req.per_child_netns {
        return Err(ApiError::bad_request("per_child_netns is not supported: forkvm guests have no network device"));
    }
    if req.live_fork {
        return Err(ApiError::bad_request("live_fork: fork a running sandbox with POST /v1/sandboxes/{id}/fork"));
    }
    validate_tag(&req.snapshot_tag)?;
    s.blocking(move |s| {
        let started = Instant::now();
        let source = SpawnSource::from_tag(&s.store, &req.snapshot_tag)?;
        let spawner = s.spawner.clone().ok_or_else(|| ApiError::internal("this daemon has no spawner process"))?;
        let op = op_id("spawn");
        let ids: Vec<String> = (0..req.n).map(|_| new_sandbox_id()).collect();
        let origin = Origin {
            template: source.template().map(String::from),
            snapshot_tag: Some(req.snapshot_tag.clone()),
            forked_from: None,
            memory_limit_bytes: limit,
        };
        let rows: Vec<_> = ids.iter().map(|id| new_row(id, "starting", &op, &origin, now_unix())).collect();
        s.db().insert_sandboxes(&rows).map_err(|e| ApiError::internal(e.to_string()))?;
        let order = SpawnOrder { tag: req.snapshot_tag.clone(), ids: ids.clone(), memory_limit_bytes: limit };
        let made = spawner
            .start_vmms(&order)
            .map_err(|r| ApiError::from_code(&r.code, r.message))
            .and_then(|vmms| forkvm_sandbox::finish(&s.registry, vmms.records, started).map_err(ApiError::from));
        let infos = settle(&s, "snapshot", started, made, &ids)?;
        Ok((StatusCode::CREATED, Json(infos)))
    })
    .await
}

pub async fn fork(
    State(s): State<AppState>,
    Param(id): Param,
    JsonBody(req): JsonBody<ForkSandboxRequest>,
) -> Result<(StatusCode, Json<Vec<SandboxInfo>>), ApiError> {
    check_count(req.n)?;
    let limit = limit_bytes(req.memory_limit_mib)?;
    s.blocking(move |s| {
        let started = Instant::now();
        let source = running(&s, &id)?;
        let op = op_id("fork");
        let ids: Vec<String> = (0..req.n).map(|_| new_sandbox_id()).collect();
        let origin = Origin { forked_from: Some(id.clone()), memory_limit_bytes: limit, ..Origin::of(&source) };
        let rows: Vec<_> = ids.iter().map(|cid| new_row(cid, "starting", &op, &origin, now_unix())).collect();
        s.db().insert_sandboxes(&rows).map_err(|e| ApiError::internal(e.to_string()))?;
        s.touch(&id);
        let opts = SpawnOptions { memory_limit_bytes: limit };
        let made = forkvm_sandbox::fork_running_as(&s.registry, &id, &ids, &opts)
            .map(|(sandboxes, _pause_ms)| sandboxes)
            .map_err(ApiError::from);
        let infos = settle(&s, "fork", started, made, &ids)?;
        Ok((StatusCode::CREATED, Json(infos)))
    })
    .await
}
