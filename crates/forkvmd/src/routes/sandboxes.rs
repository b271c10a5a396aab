//! `/v1/sandboxes`: spawn from a snapshot, list, get, kill, and fork a running one.
//!
//! A spawn or fork records its sandboxes in the registry as `starting`, owned by the
//! daemon, before any process exists, and as `running` once every one answered and
//! took its identity: a daemon killed in between leaves `starting` rows whose owner is
//! gone, and the next start (or sweep) removes those sandboxes (a spawn gives all of its
//! sandboxes or none).

use crate::error::ApiError;
use crate::extract::{JsonBody, Param, QueryArgs};
use crate::lifecycle::{apply_ttl, archived_conflict, use_sandbox};
use crate::spawner::SpawnOrder;
use crate::state::AppState;
use crate::views::sandbox_info;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use forkvm_api::{
    ArchiveReport, CreateSandboxRequest, DiskForkRequest, ForkSandboxRequest, NetworkPolicy, RestoreRequest,
    SandboxInfo, SetTtlRequest, MAX_SANDBOXES_PER_CALL,
};
use forkvm_sandbox::registry::Origin;
use forkvm_sandbox::start::new_sandbox_id;
use forkvm_sandbox::{RegistryError, SandboxRecord, SandboxState, SpawnOptions, SpawnSource, SpawnedSandbox};
use forkvm_snapshot::validate_tag;
use std::time::Instant;

fn check_count(n: u32) -> Result<(), ApiError> {
    if n == 0 || n > MAX_SANDBOXES_PER_CALL {
        return Err(ApiError::bad_request(format!("n must be between 1 and {MAX_SANDBOXES_PER_CALL}, got {n}")));
    }
    Ok(())
}

/// The limits a request asks for, checked (a bad one is named in a 400).
pub(crate) fn asked_limits(
    memory_limit_mib: Option<u64>,
    cpu_limit_millis: Option<u32>,
    pids_limit: Option<u32>,
    io_limits: Option<forkvm_api::IoLimits>,
) -> Result<SpawnOptions, ApiError> {
    let memory_limit_bytes = match memory_limit_mib {
        Some(0) => return Err(ApiError::bad_request("memory_limit_mib must be at least 1")),
        Some(m) if m > (1 << 30) => {
            return Err(ApiError::bad_request(format!("memory_limit_mib {m} is not a sane limit")))
        }
        other => other.map(|m| m << 20),
    };
    let opts = SpawnOptions {
        memory_limit_bytes,
        cpu_millis: cpu_limit_millis,
        pids_max: pids_limit,
        io: io_limits.unwrap_or_default(),
    };
    opts.validate().map_err(|e| ApiError::bad_request(e.to_string()))?;
    Ok(opts)
}

/// A new operation id (names the call in the database).
fn op_id(kind: &str) -> String {
    format!("{kind}-{}", new_sandbox_id())
}

pub async fn list(State(s): State<AppState>) -> Result<Json<Vec<SandboxInfo>>, ApiError> {
    s.blocking(|s| {
        let rows = forkvm_sandbox::info::listed(&s.registry);
        Ok(Json(rows.iter().map(|r| sandbox_info(r, &s.disk)).collect()))
    })
    .await
}

/// The record of a running sandbox the API may show (not one still starting).
pub fn running(s: &AppState, id: &str) -> Result<SandboxRecord, ApiError> {
    let (r, alive) = match s.registry.lookup(id) {
        Ok(found) => found,
        Err(RegistryError::NotFound(_)) => {
            return Err(
                archived_conflict(s, id).unwrap_or_else(|| ApiError::not_found(format!("sandbox {id:?} not found")))
            )
        }
        Err(e) => return Err(e.into()),
    };
    if !alive {
        // A read changes nothing: the run directory (with the console that says why it
        // stopped, and disk writes to salvage) stays until the daemon's sweep.
        let console = forkvm_sandbox::ready::console_tail(&r);
        return Err(ApiError::not_found(format!("sandbox {id:?} has stopped; its console ended with: {console}")));
    }
    if s.sandbox_row(id).is_some_and(|row| row.state.is_starting()) {
        return Err(ApiError::conflict(format!("sandbox {id:?} is still starting"), SandboxState::Starting.as_str()));
    }
    Ok(r)
}

pub async fn get(State(s): State<AppState>, Param(id): Param) -> Result<Json<SandboxInfo>, ApiError> {
    s.blocking(move |s| {
        if let Some(row) = s.sandbox_row(&id).filter(|r| r.state == SandboxState::Archived) {
            return Ok(Json(sandbox_info(&row, &s.disk)));
        }
        let record = running(&s, &id)?;
        let row = s.known_sandbox(&id)?;
        let jail = forkvm_sandbox::info::vmm_jail(record.pid);
        Ok(Json(SandboxInfo { jail, ..sandbox_info(&row, &s.disk) }))
    })
    .await
}

/// `DELETE /v1/sandboxes/{id}` query.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeleteArgs {
    /// Also destroy its disk snapshots (key, then vault).
    #[serde(default)]
    pub purge: bool,
}

/// Stops a running sandbox, or removes an archived one's archive: the only call that
/// deletes a sandbox. Its vault of disk snapshots stays (a disk-only fork can still
/// start from it) unless `purge`, which also works on a sandbox deleted before.
pub async fn delete(
    State(s): State<AppState>,
    Param(id): Param,
    QueryArgs(args): QueryArgs<DeleteArgs>,
) -> Result<StatusCode, ApiError> {
    let sandbox_lock = s.disk.sandbox_lock(&id);
    let _held = sandbox_lock.lock().await;
    s.blocking(move |s| {
        if args.purge {
            // A purge shreds the key its checkpoints' memory is sealed with.
            crate::checkpoints::check_none_in_use(&s, &id)?;
        }
        let found = forkvm_sandbox::delete(&s.registry, &s.store, &id, args.purge).map_err(|e| match e {
            forkvm_sandbox::DeleteError::Lifecycle(e) => e.into(),
            forkvm_sandbox::DeleteError::Purge(e) if e.code() == forkvm_api::ErrorCode::Conflict => {
                ApiError::conflict(e.to_string(), "in_use")
            }
            e => ApiError::internal(e.to_string()),
        })?;
        if found == forkvm_sandbox::Deleted::Nothing {
            return Err(ApiError::not_found(format!("sandbox {id:?} not found")));
        }
        crate::checkpoints::forget(&s, &id);
        tracing::info!(sandbox_id = %id, purge = args.purge, "deleted");
        Ok(StatusCode::NO_CONTENT)
    })
    .await
}

/// The views of a finished spawn or fork (its rows are `running` already), or, when it
/// failed, the rows of sandboxes that never ran removed.
fn settle(
    s: &AppState,
    kind: &str,
    started: Instant,
    made: Result<Vec<SpawnedSandbox>, ApiError>,
    ids: &[String],
    ttl: Option<u64>,
) -> Result<Vec<SandboxInfo>, ApiError> {
    let seconds = started.elapsed().as_secs_f64();
    match made {
        Ok(sandboxes) => {
            apply_ttl(s, ids, ttl);
            s.metrics.inc("forkvm_spawns_total", &[("kind", kind), ("outcome", "ok")]);
            s.metrics.add("forkvm_sandboxes_spawned_total", &[("kind", kind)], sandboxes.len() as u64);
            s.metrics.observe("forkvm_spawn_duration_seconds", &[("kind", kind)], seconds);
            sandboxes
                .iter()
                .map(|x| {
                    let row = s.sandbox_row(&x.record.id).ok_or_else(|| {
                        ApiError::internal(format!("sandbox {:?} started but has no registry row", x.record.id))
                    })?;
                    Ok(sandbox_info(&row, &s.disk))
                })
                .collect()
        }
        Err(e) => {
            for id in ids {
                let _ = s.registry.remove_if(id, &[SandboxState::Starting]);
            }
            s.metrics.inc("forkvm_spawns_total", &[("kind", kind), ("outcome", e.code.as_str())]);
            Err(e)
        }
    }
}

pub async fn create(
    State(s): State<AppState>,
    JsonBody(req): JsonBody<CreateSandboxRequest>,
) -> Result<(StatusCode, Json<Vec<SandboxInfo>>), ApiError> {
    check_count(req.n)?;
    let limits = asked_limits(req.memory_limit_mib, req.cpu_limit_millis, req.pids_limit, req.io_limits)?;
    // forkd's `per_child_netns` and `live_fork` (memory a live BRANCH can be taken of)
    // ask for what every sandbox has here: accepted (docs/forkd-compat.md).
    checked_network(req.network.as_ref())?;
    validate_tag(&req.snapshot_tag)?;
    if let Some(p) = &req.checkpoints {
        p.validate().map_err(|e| ApiError::bad_request(format!("checkpoints: {e}")))?;
    }
    let ttl = s.lifecycle.ttl_for(req.ttl_seconds)?;
    s.blocking(move |s| {
        let started = Instant::now();
        let source = SpawnSource::from_tag(&s.store, &req.snapshot_tag)?;
        forkvm_sandbox::source::check_vcpus(&req.snapshot_tag, &source.meta, req.vcpus)?;
        let spawner = s.spawner.clone().ok_or_else(|| ApiError::internal("this daemon has no spawner process"))?;
        let op = op_id("spawn");
        let ids: Vec<String> = (0..req.n).map(|_| new_sandbox_id()).collect();
        let origin = Origin {
            template: source.template().map(String::from),
            source_tag: Some(req.snapshot_tag.clone()),
            // A tag may carry a policy of its own, which a spawn asking none takes.
            network: req.network.clone().or_else(|| source.meta.default_network.clone()),
            vcpus: Some(source.meta.vcpu_count),
            ..Origin::default()
        };
        s.begin_sandboxes(&ids, &op, &limits.recorded_in(origin))?;
        forkvm_sandbox::volumes::attach::check_mounts(&req.volumes, ids.len()).map_err(ApiError::from)?;
        let order =
            SpawnOrder { tag: req.snapshot_tag.clone(), ids: ids.clone(), limits, volumes: req.volumes.clone() };
        let made = spawner.start_vmms(&order).map_err(|r| ApiError::new(r.code, r.message)).and_then(|vmms| {
            let ready = forkvm_sandbox::finish(&s.registry, vmms.records, started).map_err(ApiError::from)?;
            forkvm_sandbox::ready::learn_memory(vmms.memory_playbook.as_deref(), &ready);
            forkvm_sandbox::volumes::attach::mount_in_all(&s.registry, &ready, &order.volumes, &vmms.volume_slots)?;
            Ok(ready)
        });
        let infos = settle(&s, "snapshot", started, made, &ids, ttl)?;
        if let Some(policy) = &req.checkpoints {
            for id in &ids {
                crate::checkpoints::records::set_policy(&s.db(), id, policy)
                    .map_err(|e| ApiError::internal(format!("setting sandbox {id}'s checkpoint policy: {e}")))?;
            }
        }
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
    let asked = asked_limits(req.memory_limit_mib, req.cpu_limit_millis, req.pids_limit, req.io_limits)?;
    let ttl = s.lifecycle.ttl_for(req.ttl_seconds)?;
    checked_network(req.network.as_ref())?;
    s.blocking(move |s| {
        let started = Instant::now();
        let (source, _in_use) = use_sandbox(&s, &id)?;
        let op = op_id("fork");
        let ids: Vec<String> = (0..req.n).map(|_| new_sandbox_id()).collect();
        // The children keep their source's limits, but for those asked anew.
        let opts = SpawnOptions::for_fork_of(&source, asked);
        // The children keep their source's policy, but for one asked anew.
        let network = req.network.clone().or_else(|| source.network.clone());
        let origin = Origin { forked_from: Some(id.clone()), network, ..Origin::of(&source) };
        s.begin_sandboxes(&ids, &op, &opts.recorded_in(origin))?;
        let made = forkvm_sandbox::fork_running_as(&s.registry, &id, &ids, &opts)
            .map(|(sandboxes, _pause_ms)| sandboxes)
            .map_err(ApiError::from);
        let infos = settle(&s, "fork", started, made, &ids, ttl)?;
        // The children serve the ports their source exposed, each under tokens of its own.
        for child in &infos {
            if let Err(e) = s.registry.expose_like(&child.id, &id) {
                tracing::warn!(sandbox_id = %child.id, error = %e, "exposing a fork's ports failed");
            }
        }
        Ok((StatusCode::CREATED, Json(infos)))
    })
    .await
}

/// `POST /v1/sandboxes/{id}/archive`: the sandbox leaves memory for
/// `<store>/archives/<id>/` (its VMM stops); listed as `archived` until restored or deleted.
pub async fn archive(State(s): State<AppState>, Param(id): Param) -> Result<Json<ArchiveReport>, ApiError> {
    crate::lifecycle::archive_sandbox(&s, &id, forkvm_sandbox::StateReason::Api).await.map(Json)
}

/// `POST /v1/sandboxes/{id}/restore`: an archived sandbox runs again, same id.
pub async fn restore(
    State(s): State<AppState>,
    Param(id): Param,
    JsonBody(req): JsonBody<RestoreRequest>,
) -> Result<Json<SandboxInfo>, ApiError> {
    crate::lifecycle::restore_sandbox(&s, &id, req.ttl_seconds).await.map(Json)
}

/// `POST /v1/sandboxes/{id}/ttl`: archive it `ttl_seconds` from now (`0`: never).
pub async fn set_ttl(
    State(s): State<AppState>,
    Param(id): Param,
    JsonBody(req): JsonBody<SetTtlRequest>,
) -> Result<Json<SandboxInfo>, ApiError> {
    let ttl = s.lifecycle.ttl_for(Some(req.ttl_seconds))?;
    s.blocking(move |s| {
        running(&s, &id)?;
        let expires = ttl.map(|t| forkvm_sandbox::registry::now_unix_ms() + t * 1000);
        s.registry.set_ttl(&id, ttl, expires)?;
        let row = s.known_sandbox(&id)?;
        Ok(Json(sandbox_info(&row, &s.disk)))
    })
    .await
}

/// A policy a request asks for, checked (400 naming the entry).
fn checked_network(policy: Option<&NetworkPolicy>) -> Result<(), ApiError> {
    if let Some(p) = policy {
        forkvm_sandbox::network::policy::EgressPolicy::parse(p).map_err(|e| ApiError::bad_request(e.to_string()))?;
    }
    Ok(())
}

/// `PUT /v1/sandboxes/{id}/network`: where its guest may connect to, from now on, for
/// connections already open too. An archived sandbox's is recorded and in force once it
/// is restored.
pub async fn set_network(
    State(s): State<AppState>,
    Param(id): Param,
    JsonBody(req): JsonBody<NetworkPolicy>,
) -> Result<Json<SandboxInfo>, ApiError> {
    checked_network(Some(&req))?;
    s.blocking(move |s| {
        let archived = s.sandbox_row(&id).is_some_and(|row| row.state == SandboxState::Archived);
        if !archived {
            let r = running(&s, &id)?;
            forkvm_sandbox::network::attach::update(&id, r.pid, &req)?;
        }
        s.registry.set_network(&id, &req)?;
        let row = s.known_sandbox(&id)?;
        Ok(Json(sandbox_info(&row, &s.disk)))
    })
    .await
}

/// `POST /v1/sandboxes/{id}/disk-fork`: a new sandbox cold-booted on a disk snapshot of
/// `{id}` (running, archived or gone). The spawner restores the disk and starts the VMM;
/// the boot is awaited here (long: about a minute on PVM hosts).
pub async fn disk_fork(
    State(s): State<AppState>,
    Param(id): Param,
    JsonBody(req): JsonBody<DiskForkRequest>,
) -> Result<(StatusCode, Json<SandboxInfo>), ApiError> {
    let limits = asked_limits(req.memory_limit_mib, req.cpu_limit_millis, req.pids_limit, req.io_limits)?;
    let ttl = s.lifecycle.ttl_for(req.ttl_seconds)?;
    s.blocking(move |s| {
        let started = Instant::now();
        // Validates the id before it names a directory.
        if let Err(e @ RegistryError::BadId(_)) = s.registry.lookup(&id) {
            return Err(e.into());
        }
        if !forkvm_sandbox::disk_snapshots::vault_dir(&s.store, &id).is_dir() {
            return Err(ApiError::not_found(format!("sandbox {id:?} not found, or it has no disk snapshots")));
        }
        let spawner = s.spawner.clone().ok_or_else(|| ApiError::internal("this daemon has no spawner process"))?;
        let new_id = new_sandbox_id();
        let origin = Origin { forked_from: Some(id.clone()), ..Origin::default() };
        s.begin_sandboxes(std::slice::from_ref(&new_id), &op_id("disk-fork"), &limits.recorded_in(origin))?;
        let made = spawner
            .start_disk_fork(&id, req.seq, &new_id, limits, restore_mode(req.restore))
            .map_err(|r| crate::spawner::refused(r, "conflict"))
            .and_then(|record| {
                let timeout = forkvm_sandbox::guest::BOOT_TIMEOUT;
                let ready = forkvm_sandbox::ready::finish_within(&s.registry, vec![record], started, timeout)
                    .map_err(ApiError::from)?;
                // The playbook learns what this boot read (best effort: the fork stands).
                for r in &ready {
                    if let Err(e) = forkvm_sandbox::start::disk::end_restore_recording(&s.store, &r.record) {
                        tracing::warn!(sandbox = %r.record.id, error = %e, "ending the restore's recording failed");
                    }
                }
                Ok(ready)
            });
        let ids = [new_id];
        let mut infos = settle(&s, "disk_fork", started, made, &ids, ttl)?;
        Ok((StatusCode::CREATED, Json(infos.remove(0))))
    })
    .await
}

/// The library's restore mode for the API's (absent: lazy with the playbook).
fn restore_mode(m: Option<forkvm_api::DiskRestoreMode>) -> forkvm_sandbox::start::disk::DiskRestore {
    use forkvm_api::DiskRestoreMode as Api;
    use forkvm_sandbox::start::disk::DiskRestore;
    match m {
        Some(Api::Eager) => DiskRestore::Eager,
        Some(Api::Lazy) => DiskRestore::Lazy,
        Some(Api::LazyPlaybook) | None => DiskRestore::LazyPlaybook,
    }
}
