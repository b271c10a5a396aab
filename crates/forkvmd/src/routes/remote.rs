//! `/v1/remote*`: the daemon's remote (`--remote URL`, else its `--replicate` one). A
//! tag's chain is pushed there and pulled back (only the blocks a side lacks), its tags
//! listed and removed, its unreferenced blocks collected, and a dead holder's lock broken.
//! No URL or key comes from a request body: the operator chose the remote when starting
//! the daemon, and a request only names tags and locks, which are checked.
//! docs/object-storage.md.

use crate::error::ApiError;
use crate::extract::{JsonBody, Param};
use crate::state::AppState;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use forkvm_api::remote::{
    CollectRequest, GcReport, LockInfo, PullReport, PullRequest, PushReport, PushRequest, RemoteInfo,
};
use forkvm_api::ErrorCode;
use forkvm_remote::push::Progress;
use forkvm_remote::RemoteError;
use forkvm_sandbox::replication::{host_block_cache, Replication};
use std::sync::Arc;
use std::time::Duration;

fn remote_err(e: RemoteError) -> ApiError {
    ApiError::new(e.code(), e.to_string())
}

/// The daemon's remote, or a 409 saying how to give it one.
fn remote(s: &AppState) -> Result<Arc<Replication>, ApiError> {
    s.remote.get().cloned().ok_or_else(|| {
        ApiError::new(
            ErrorCode::Conflict,
            "this daemon has no remote: start it with --remote URL (or --replicate URL), s3://bucket/prefix or file:///dir",
        )
    })
}

/// `GET /v1/remote`: the remote's URL and tags.
pub async fn info(State(s): State<AppState>) -> Result<Json<RemoteInfo>, ApiError> {
    let r = remote(&s)?;
    s.blocking(move |_| {
        let mut tags = r.remote().tags().map_err(remote_err)?;
        tags.sort();
        Ok(Json(RemoteInfo { url: r.url().to_string(), tags }))
    })
    .await
}

/// `POST /v1/remote/push`: the tag's chain, only the blocks the remote lacks.
pub async fn push(
    State(s): State<AppState>,
    JsonBody(req): JsonBody<PushRequest>,
) -> Result<Json<PushReport>, ApiError> {
    let r = remote(&s)?;
    s.blocking(move |s| {
        let report = forkvm_remote::push(&s.store, &s.cache, &req.tag, r.remote(), r.key(), &Progress::default())
            .map_err(remote_err)?;
        s.metrics.add("forkvm_remote_pushed_bytes_total", &[], report.bytes_uploaded);
        tracing::info!(tag = %report.tag, remote = %report.remote, blocks = report.blocks_uploaded,
            bytes = report.bytes_uploaded, ms = report.ms, "tag pushed");
        Ok(Json(report))
    })
    .await
}

/// `POST /v1/remote/pull`: the tag's chain into the store (what it lacks), memory included.
pub async fn pull(
    State(s): State<AppState>,
    JsonBody(req): JsonBody<PullRequest>,
) -> Result<Json<PullReport>, ApiError> {
    let r = remote(&s)?;
    s.blocking(move |s| {
        let report =
            forkvm_remote::pull(&s.store, &req.tag, r.remote(), r.key(), &host_block_cache(), &Progress::default())
                .map_err(remote_err)?;
        s.metrics.add("forkvm_remote_pulled_bytes_total", &[], report.bytes_fetched);
        tracing::info!(tag = %report.tag, remote = %report.remote, imported = ?report.imported,
            blocks = report.blocks_fetched, bytes = report.bytes_fetched, ms = report.ms, "tag pulled");
        Ok(Json(report))
    })
    .await
}

/// `DELETE /v1/remote/tags/{tag}`: the tag's manifest (its blocks go at the next collection).
pub async fn remove_tag(State(s): State<AppState>, Param(tag): Param) -> Result<StatusCode, ApiError> {
    let r = remote(&s)?;
    s.blocking(move |_| {
        forkvm_remote::gc::remove_tag(r.remote(), &tag).map_err(remote_err)?;
        tracing::info!(%tag, remote = %r.url(), "tag removed from the remote");
        Ok(StatusCode::NO_CONTENT)
    })
    .await
}

/// `POST /v1/remote/gc`: deletes the blocks no tag names, under the remote's exclusive lock.
pub async fn collect(
    State(s): State<AppState>,
    JsonBody(req): JsonBody<CollectRequest>,
) -> Result<Json<GcReport>, ApiError> {
    let r = remote(&s)?;
    let min_age = req.min_age_s.map_or(forkvm_remote::gc::DEFAULT_MIN_AGE, Duration::from_secs);
    s.blocking(move |_| {
        let report = forkvm_remote::gc::collect(r.remote(), r.key(), min_age, req.dry_run).map_err(remote_err)?;
        tracing::info!(remote = %report.remote, dry_run = report.dry_run, deleted = report.blocks_deleted,
            bytes = report.bytes_deleted, "remote collected");
        Ok(Json(report))
    })
    .await
}

/// `GET /v1/remote/locks`: who holds the remote's locks, oldest first.
pub async fn locks(State(s): State<AppState>) -> Result<Json<Vec<LockInfo>>, ApiError> {
    let r = remote(&s)?;
    s.blocking(move |_| Ok(Json(forkvm_remote::lock::list_locks(r.remote()).map_err(remote_err)?))).await
}

/// `DELETE /v1/remote/locks/{name}`: removes a lock a dead holder left; answers what it said.
pub async fn break_lock(State(s): State<AppState>, Param(name): Param) -> Result<Json<LockInfo>, ApiError> {
    let r = remote(&s)?;
    s.blocking(move |_| {
        let lock = forkvm_remote::lock::break_lock(r.remote(), &name).map_err(remote_err)?;
        tracing::warn!(lock = %lock.name, purpose = ?lock.purpose, host = ?lock.host, remote = %r.url(), "remote lock broken");
        Ok(Json(lock))
    })
    .await
}
