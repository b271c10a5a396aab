//! E2B's control plane (`--e2b-api`): create, connect, pause, kill, info, list, timeout
//! and metrics, in the v2 and v1 paths the shipped SDKs call (e2b-api.md §2.1), behind
//! the operator's API keys (`X-API-KEY`, compared in constant time).
//!
//! A create is a fork of the template tag's warm snapshot, answered 201 once the guest's
//! agent answers (milliseconds, not a boot). Lifetimes are E2B's: `timeout` seconds from
//! create or connect, ended by [`super::expiry`] with a kill (or a pause with
//! `autoPause`). Pause stops the vCPUs and keeps memory (E2B's default); connect resumes
//! (201) or finds it running (200), with the same `envdAccessToken` either way.

use super::metrics_history::{metric, Sample, Sizes};
use super::records::{self, E2bSandbox};
use super::wire::{
    rfc3339, ConnectSandbox, E2bError, Lifecycle, NewSandbox, Sandbox, SandboxDetail, SandboxMetric, SetTimeout,
    CLIENT_ID, DEFAULT_TIMEOUT_SECS, ENVD_VERSION, MAX_TIMEOUT_SECS,
};
use super::E2b;
use crate::extract::{JsonBody, Param, QueryArgs};
use crate::routes::sandboxes::DeleteArgs;
use axum::body::Bytes;
use axum::extract::{FromRequest, Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use forkvm_api::CreateSandboxRequest;
use forkvm_sandbox::registry::now_unix_ms;
use forkvm_sandbox::{SandboxState, StateReason};
use serde::de::DeserializeOwned;
use std::collections::BTreeMap;

/// Largest control-plane body read.
const MAX_BODY: usize = 1 << 20;
/// Page size of `GET /v2/sandboxes` when the client names none, and the most it may ask.
const DEFAULT_PAGE: usize = 100;
const MAX_PAGE: usize = 1000;

/// A JSON body; a bad one is E2B's 400 (`{"code","message"}`), never axum's text.
#[derive(Debug)]
pub struct E2bJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for E2bJson<T> {
    type Rejection = E2bError;

    async fn from_request(req: Request, state: &S) -> Result<Self, E2bError> {
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(|e| E2bError::bad_request(format!("reading the request body: {e}")))?;
        if bytes.len() > MAX_BODY {
            return Err(E2bError::bad_request(format!("the body is larger than {MAX_BODY} bytes")));
        }
        let text: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) { b"{}" } else { &bytes };
        serde_json::from_slice(text).map(E2bJson).map_err(|e| E2bError::bad_request(format!("invalid JSON body: {e}")))
    }
}

/// The control plane's routes, behind the API-key check.
pub fn router(e2b: E2b) -> Router {
    Router::new()
        .route("/v2/sandboxes", post(create).get(list_v2))
        .route("/sandboxes", post(create).get(list_v1))
        .route("/v2/sandboxes/{id}/connect", post(connect))
        .route("/sandboxes/{id}/connect", post(connect))
        .route("/sandboxes/{id}/resume", post(resume))
        .route("/sandboxes/{id}", get(info).delete(kill))
        .route("/sandboxes/{id}/timeout", post(set_timeout))
        .route("/sandboxes/{id}/pause", post(pause))
        .route("/sandboxes/{id}/metrics", get(metrics))
        .fallback(|req: Request| async move {
            E2bError::not_found(format!(
                "forkvm does not serve {} {} of E2B's API (docs/e2b.md)",
                req.method(),
                req.uri().path()
            ))
        })
        .layer(axum::middleware::from_fn_with_state(e2b.clone(), require_api_key))
        .with_state(e2b)
}

/// Every control-plane call needs one of the operator's keys in `X-API-KEY`.
async fn require_api_key(State(e2b): State<E2b>, req: Request, next: axum::middleware::Next) -> Response {
    let given = req.headers().get("x-api-key").map(HeaderValue::as_bytes).unwrap_or_default();
    if e2b.config.api_key_matches(given) {
        return next.run(req).await;
    }
    E2bError::new(StatusCode::UNAUTHORIZED, "Invalid API key: send one of the daemon's keys in X-API-KEY")
        .into_response()
}

/// How E2B sees one of its sandboxes now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    Running,
    /// Paused by a client (or archived): the data plane answers 502 until a connect.
    Paused,
    /// Killed, expired or its VMM died.
    Gone,
}

/// What sandbox `id` is, as E2B shows it. A sandbox the daemon paused when idle is
/// running to E2B: the next call resumes it.
pub fn seen(e2b: &E2b, id: &str) -> Seen {
    let Some(row) = e2b.app.sandbox_row(id) else { return Seen::Gone };
    match (row.state, row.reason) {
        (SandboxState::Paused, Some(StateReason::Api)) | (SandboxState::Archived, _) => Seen::Paused,
        (SandboxState::Running | SandboxState::Paused, _) => match e2b.app.registry.lookup(id) {
            Ok((_, true)) => Seen::Running,
            _ => Seen::Gone,
        },
        _ => Seen::Gone,
    }
}

/// The record of E2B sandbox `id` that is not gone, else E2B's 404.
pub fn record(e2b: &E2b, id: &str) -> Result<(E2bSandbox, Seen), E2bError> {
    let not_found = || E2bError::not_found(format!("sandbox \"{id}\" not found"));
    let rec = records::get(&e2b.app.db(), id).map_err(|e| E2bError::internal(e.to_string()))?.ok_or_else(not_found)?;
    match seen(e2b, id) {
        Seen::Gone => Err(not_found()),
        s => Ok((rec, s)),
    }
}

fn timeout_secs(asked: Option<u64>) -> Result<u64, E2bError> {
    match asked.unwrap_or(DEFAULT_TIMEOUT_SECS) {
        t if t > MAX_TIMEOUT_SECS => Err(E2bError::bad_request(format!(
            "timeout {t} s is more than the {MAX_TIMEOUT_SECS} s a sandbox may live"
        ))),
        t => Ok(t),
    }
}

fn sandbox_reply(e2b: &E2b, rec: &E2bSandbox) -> Sandbox {
    Sandbox {
        sandbox_id: rec.id.clone(),
        template_id: rec.template_id.clone(),
        client_id: CLIENT_ID,
        envd_version: ENVD_VERSION,
        envd_access_token: rec.access_token.clone(),
        traffic_access_token: Some(rec.access_token.clone()),
        domain: e2b.config.domain.clone(),
    }
}

/// vCPUs, memory and root disk size (MiB) of the sandboxes made from `tag`.
fn sizes(e2b: &E2b, tag: &str) -> (u32, u64, u64) {
    match forkvm_sandbox::SpawnSource::from_tag(&e2b.app.store, tag) {
        Ok(src) => {
            let disk = src
                .meta
                .devices
                .as_ref()
                .and_then(|d| d.disks.iter().find(|d| !d.read_only))
                .and_then(|d| std::fs::metadata(src.dir.join(&d.file)).ok())
                .map_or(0, |m| m.len() >> 20);
            (u32::from(src.meta.vcpu_count), src.meta.mem_size_bytes >> 20, disk)
        }
        Err(_) => (1, 0, 0),
    }
}

/// `POST /v2/sandboxes` (and v1 `POST /sandboxes`): a fork of the template's snapshot.
async fn create(State(e2b): State<E2b>, E2bJson(req): E2bJson<NewSandbox>) -> Result<Response, E2bError> {
    let timeout = timeout_secs(req.timeout)?;
    let tag = e2b.config.tag_for(&req.template_id);
    forkvm_snapshot::validate_tag(&tag)
        .map_err(|_| E2bError::bad_request(format!("templateID {:?} names no forkvm tag", req.template_id)))?;
    // The lifetime is E2B's, kept here (`expiry`): no TTL of the daemon's on top.
    let spawn = CreateSandboxRequest { ttl_seconds: Some(0), ..CreateSandboxRequest::new(tag.clone(), 1) };
    let made = crate::routes::sandboxes::create(State(e2b.app.clone()), JsonBody(spawn)).await.map_err(|e| {
        if e.status() == StatusCode::NOT_FOUND {
            E2bError::not_found(format!("template {:?} not found (forkvm tag {tag:?}): {}", req.template_id, e.message))
        } else {
            E2bError::from(e)
        }
    })?;
    let id = made.1 .0.first().map(|s| s.id.clone()).ok_or_else(|| E2bError::internal("the spawn made no sandbox"))?;
    let now = now_unix_ms();
    let (cpu_count, memory_mb, disk_mb) = sizes(&e2b, &tag);
    let rec = E2bSandbox {
        id: id.clone(),
        template_id: req.template_id,
        access_token: records::new_access_token().map_err(|e| E2bError::internal(e.to_string()))?,
        metadata: req.metadata.unwrap_or_default(),
        env_vars: req.env_vars.unwrap_or_default(),
        started_at_ms: now,
        end_at_ms: now + timeout * 1000,
        auto_pause: req.auto_pause.unwrap_or(false),
        cpu_count,
        memory_mb,
        disk_mb,
    };
    let inserted = records::insert(&e2b.app.db(), &rec);
    if let Err(e) = inserted {
        // Nobody could reach it: it goes.
        kill_sandbox(&e2b, &id).await.ok();
        return Err(E2bError::internal(format!("recording sandbox {id}: {e}")));
    }
    tracing::info!(sandbox_id = %id, template = %rec.template_id, %tag, "E2B create");
    Ok((StatusCode::CREATED, Json(sandbox_reply(&e2b, &rec))).into_response())
}

/// Resumes `id` if a client paused it; whether it did.
async fn resume_if_paused(e2b: &E2b, id: &str, seen: Seen) -> Result<bool, E2bError> {
    if seen != Seen::Paused {
        return Ok(false);
    }
    let archived = e2b.app.sandbox_row(id).is_some_and(|r| r.state == SandboxState::Archived);
    if archived {
        crate::lifecycle::restore_sandbox(&e2b.app, id, Some(0)).await?;
        return Ok(true);
    }
    let id = id.to_string();
    Ok(e2b.app.blocking(move |s| crate::lifecycle::resume_requested(&s, &id)).await?)
}

/// Extends the lifetime of `rec` to `timeout` from now, never shortening it.
fn extend(e2b: &E2b, rec: &mut E2bSandbox, timeout: u64) -> Result<(), E2bError> {
    let end = rec.end_at_ms.max(now_unix_ms() + timeout * 1000);
    records::set_end(&e2b.app.db(), &rec.id, end).map_err(|e| E2bError::internal(e.to_string()))?;
    rec.end_at_ms = end;
    Ok(())
}

/// Resumes sandbox `id` if it is paused and extends its lifetime to `timeout` (seconds)
/// from now; the record, and whether it was paused.
async fn resume_and_extend(e2b: &E2b, id: &str, timeout: Option<u64>) -> Result<(E2bSandbox, bool), E2bError> {
    let timeout = timeout_secs(timeout)?;
    let (mut rec, seen) = record(e2b, id)?;
    let resumed = resume_if_paused(e2b, id, seen).await?;
    extend(e2b, &mut rec, timeout)?;
    Ok((rec, resumed))
}

/// `POST /v2/sandboxes/{id}/connect` and v1: 201 when it was paused (now resumed), 200
/// when it ran.
async fn connect(
    State(e2b): State<E2b>,
    Path(id): Path<String>,
    E2bJson(req): E2bJson<ConnectSandbox>,
) -> Result<Response, E2bError> {
    let (rec, resumed) = resume_and_extend(&e2b, &id, req.timeout).await?;
    let status = if resumed { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(sandbox_reply(&e2b, &rec))).into_response())
}

/// The old `POST /sandboxes/{id}/resume`: 201 once resumed, 409 when it was running.
async fn resume(
    State(e2b): State<E2b>,
    Path(id): Path<String>,
    E2bJson(req): E2bJson<ConnectSandbox>,
) -> Result<Response, E2bError> {
    if record(&e2b, &id)?.1 != Seen::Paused {
        return Err(E2bError::conflict(format!("sandbox \"{id}\" is already running")));
    }
    let (rec, _) = resume_and_extend(&e2b, &id, req.timeout).await?;
    Ok((StatusCode::CREATED, Json(sandbox_reply(&e2b, &rec))).into_response())
}

/// Stops sandbox `id` and forgets its record.
pub async fn kill_sandbox(e2b: &E2b, id: &str) -> Result<(), E2bError> {
    let deleted = crate::routes::sandboxes::delete(
        State(e2b.app.clone()),
        Param(id.to_string()),
        QueryArgs(DeleteArgs::default()),
    )
    .await;
    records::delete(&e2b.app.db(), id).map_err(|e| E2bError::internal(e.to_string()))?;
    match deleted {
        Ok(_) => Ok(()),
        Err(e) if e.status() == StatusCode::NOT_FOUND => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// `DELETE /sandboxes/{id}`: 204, or 404 when there is no such sandbox (any more).
async fn kill(State(e2b): State<E2b>, Path(id): Path<String>) -> Result<StatusCode, E2bError> {
    let known = records::get(&e2b.app.db(), &id).map_err(|e| E2bError::internal(e.to_string()))?.is_some();
    if !known || seen(&e2b, &id) == Seen::Gone {
        if known {
            records::delete(&e2b.app.db(), &id).ok();
        }
        return Err(E2bError::not_found(format!("sandbox \"{id}\" not found")));
    }
    kill_sandbox(&e2b, &id).await?;
    tracing::info!(sandbox_id = %id, "E2B kill");
    Ok(StatusCode::NO_CONTENT)
}

fn detail(e2b: &E2b, rec: &E2bSandbox, seen: Seen, full: bool) -> SandboxDetail {
    SandboxDetail {
        template_id: rec.template_id.clone(),
        sandbox_id: rec.id.clone(),
        client_id: CLIENT_ID,
        envd_version: ENVD_VERSION,
        started_at: rfc3339(rec.started_at_ms),
        end_at: rfc3339(rec.end_at_ms),
        cpu_count: rec.cpu_count,
        memory_mb: rec.memory_mb,
        disk_size_mb: rec.disk_mb,
        state: if seen == Seen::Paused { "paused" } else { "running" },
        metadata: rec.metadata.clone(),
        envd_access_token: full.then(|| rec.access_token.clone()),
        domain: if full { e2b.config.domain.clone() } else { None },
        lifecycle: full
            .then_some(Lifecycle { on_timeout: if rec.auto_pause { "pause" } else { "kill" }, auto_resume: false }),
    }
}

/// `GET /sandboxes/{id}`.
async fn info(State(e2b): State<E2b>, Path(id): Path<String>) -> Result<Json<SandboxDetail>, E2bError> {
    let (rec, seen) = record(&e2b, &id)?;
    Ok(Json(detail(&e2b, &rec, seen, true)))
}

/// `POST /sandboxes/{id}/timeout`: its lifetime ends `timeout` seconds from now (it may
/// shorten it). A paused sandbox is 404 here, as on E2B (an old SDK resumes on that).
async fn set_timeout(
    State(e2b): State<E2b>,
    Path(id): Path<String>,
    E2bJson(req): E2bJson<SetTimeout>,
) -> Result<StatusCode, E2bError> {
    let timeout = timeout_secs(Some(req.timeout))?;
    let (rec, seen) = record(&e2b, &id)?;
    if seen == Seen::Paused {
        return Err(E2bError::not_found(format!("sandbox \"{id}\" is paused")));
    }
    records::set_end(&e2b.app.db(), &rec.id, now_unix_ms() + timeout * 1000)
        .map_err(|e| E2bError::internal(e.to_string()))?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /sandboxes/{id}/pause` body.
#[derive(Debug, Default, serde::Deserialize)]
struct PauseRequest {
    /// `false`: a filesystem-only pause (resumed by a reboot), which forkvm does not do.
    memory: Option<bool>,
}

/// `POST /sandboxes/{id}/pause`: 204, or 409 when it is paused already. Memory is kept.
async fn pause(
    State(e2b): State<E2b>,
    Path(id): Path<String>,
    E2bJson(req): E2bJson<PauseRequest>,
) -> Result<StatusCode, E2bError> {
    if req.memory == Some(false) {
        return Err(E2bError::bad_request(
            "a filesystem-only pause (memory: false) is not served: forkvm pauses keep memory (docs/e2b.md)",
        ));
    }
    let (_rec, seen) = record(&e2b, &id)?;
    if seen == Seen::Paused {
        return Err(E2bError::conflict(format!("sandbox \"{id}\" is already paused")));
    }
    let id2 = id.clone();
    if !e2b.app.blocking(move |s| crate::lifecycle::pause_requested(&s, &id2)).await? {
        return Err(E2bError::conflict(format!("sandbox \"{id}\" is already paused")));
    }
    tracing::info!(sandbox_id = %id, "E2B pause");
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /sandboxes/{id}/metrics` query: unix seconds, both optional.
#[derive(Debug, Default, serde::Deserialize)]
struct MetricsQuery {
    start: Option<u64>,
    end: Option<u64>,
}

/// `GET /sandboxes/{id}/metrics`: its samples in the range (every 5 s, the last hour;
/// [`super::metrics_history`]). A sandbox not sampled yet, asked without a range that
/// excludes now, gets one sample taken now (its CPU rate unknown: 0).
async fn metrics(
    State(e2b): State<E2b>,
    Path(id): Path<String>,
    Query(q): Query<MetricsQuery>,
) -> Result<Json<Vec<SandboxMetric>>, E2bError> {
    let (rec, _seen) = record(&e2b, &id)?;
    if let (Some(start), Some(end)) = (q.start, q.end) {
        if start > end {
            return Err(E2bError::bad_request(format!("start {start} is after end {end}")));
        }
    }
    let sizes = Sizes { cpu_count: rec.cpu_count, mem_total: rec.memory_mb << 20, disk_total: rec.disk_mb << 20 };
    let now_s = now_unix_ms() / 1000;
    let covers_now = q.start.is_none_or(|s| s <= now_s) && q.end.is_none_or(|e| e >= now_s);
    if e2b.metrics_history.has(&id) || !covers_now {
        return Ok(Json(e2b.metrics_history.series(&id, q.start, q.end, sizes)));
    }
    let now = e2b.app.registry.lookup(&id).ok().map(|(r, _)| crate::routes::usage::sample(&r));
    Ok(Json(now.map_or_else(Vec::new, |u| vec![metric(&Sample::of(&u), None, sizes)])))
}

/// `GET /v2/sandboxes` query.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListQuery {
    /// Comma-joined `running`/`paused`; absent: both.
    state: Option<String>,
    /// `k=v&k2=v2` with keys and values percent-encoded once more (decoded twice).
    metadata: Option<String>,
    limit: Option<usize>,
    next_token: Option<String>,
    /// `asc` or `desc` (default) by start time.
    order: Option<String>,
    template: Option<String>,
}

/// The E2B sandboxes that exist, newest first, with how E2B sees each.
fn listed(e2b: &E2b) -> Result<Vec<(E2bSandbox, Seen)>, E2bError> {
    let all = records::all(&e2b.app.db()).map_err(|e| E2bError::internal(e.to_string()))?;
    let mut out: Vec<(E2bSandbox, Seen)> =
        all.into_iter().map(|r| (seen(e2b, &r.id), r)).filter(|(s, _)| *s != Seen::Gone).map(|(s, r)| (r, s)).collect();
    out.sort_by(|a, b| (b.0.started_at_ms, &b.0.id).cmp(&(a.0.started_at_ms, &a.0.id)));
    Ok(out)
}

fn metadata_filter(q: Option<&str>) -> Result<BTreeMap<String, String>, E2bError> {
    let Some(q) = q else { return Ok(BTreeMap::new()) };
    let pairs: Vec<(String, String)> =
        serde_urlencoded::from_str(q).map_err(|e| E2bError::bad_request(format!("metadata filter {q:?}: {e}")))?;
    let once_more = |s: &str| -> Result<String, E2bError> {
        let v: Vec<(String, String)> = serde_urlencoded::from_str(&format!("v={s}"))
            .map_err(|e| E2bError::bad_request(format!("metadata filter {q:?}: {e}")))?;
        Ok(v.into_iter().next().map(|(_, v)| v).unwrap_or_default())
    };
    pairs.iter().map(|(k, v)| Ok((once_more(k)?, once_more(v)?))).collect()
}

/// `GET /v2/sandboxes`: filtered, ordered, one page; the next page's token in
/// `x-next-token` (`<started ms>.<id>` of the last item shown).
async fn list_v2(State(e2b): State<E2b>, Query(q): Query<ListQuery>) -> Result<Response, E2bError> {
    let states: Vec<&str> =
        q.state.as_deref().map_or(vec!["running", "paused"], |s| s.split(',').map(str::trim).collect());
    if let Some(bad) = states.iter().find(|s| !["running", "paused"].contains(s)) {
        return Err(E2bError::bad_request(format!("state {bad:?}: running or paused")));
    }
    let wanted_meta = metadata_filter(q.metadata.as_deref())?;
    let limit = q.limit.unwrap_or(DEFAULT_PAGE);
    if limit == 0 || limit > MAX_PAGE {
        return Err(E2bError::bad_request(format!("limit {limit}: 1 to {MAX_PAGE}")));
    }
    let mut items = listed(&e2b)?;
    if q.order.as_deref() == Some("asc") {
        items.reverse();
    } else if q.order.as_deref().is_some_and(|o| o != "desc") {
        return Err(E2bError::bad_request("order: asc or desc"));
    }
    let key = |r: &E2bSandbox| format!("{}.{}", r.started_at_ms, r.id);
    let matching: Vec<&(E2bSandbox, Seen)> = items
        .iter()
        .filter(|(_, s)| states.contains(&if *s == Seen::Paused { "paused" } else { "running" }))
        .filter(|(r, _)| wanted_meta.iter().all(|(k, v)| r.metadata.get(k) == Some(v)))
        .filter(|(r, _)| q.template.as_deref().is_none_or(|t| r.template_id == t))
        .collect();
    let start = match q.next_token.as_deref().filter(|t| !t.is_empty()) {
        Some(t) => matching.iter().position(|(r, _)| key(r) == t).map(|i| i + 1).ok_or_else(|| {
            E2bError::bad_request(format!("nextToken {t:?} is not one this daemon gave (or its sandbox is gone)"))
        })?,
        None => 0,
    };
    let page: Vec<&(E2bSandbox, Seen)> = matching.iter().skip(start).take(limit).copied().collect();
    let more = start + page.len() < matching.len();
    let body: Vec<SandboxDetail> = page.iter().map(|(r, s)| detail(&e2b, r, *s, false)).collect();
    let mut resp = Json(body).into_response();
    if let (true, Some((last, _))) = (more, page.last()) {
        if let Ok(v) = HeaderValue::from_str(&key(last)) {
            resp.headers_mut().insert("x-next-token", v);
        }
    }
    Ok(resp)
}

/// v1 `GET /sandboxes`: the running ones, all at once.
async fn list_v1(State(e2b): State<E2b>, _headers: HeaderMap) -> Result<Json<Vec<SandboxDetail>>, E2bError> {
    let items = listed(&e2b)?;
    Ok(Json(items.iter().filter(|(_, s)| *s == Seen::Running).map(|(r, s)| detail(&e2b, r, *s, false)).collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_filters_are_decoded_twice() {
        let f = metadata_filter(Some("user%3Aid=a%2526b&k=v")).unwrap();
        assert_eq!(f, [("user:id".to_string(), "a&b".to_string()), ("k".to_string(), "v".to_string())].into());
        assert!(metadata_filter(None).unwrap().is_empty());
    }

    #[test]
    fn timeouts_default_and_are_capped() {
        assert_eq!(timeout_secs(None).unwrap(), DEFAULT_TIMEOUT_SECS);
        assert_eq!(timeout_secs(Some(5)).unwrap(), 5);
        assert_eq!(timeout_secs(Some(MAX_TIMEOUT_SECS + 1)).unwrap_err().status, StatusCode::BAD_REQUEST);
    }
}
