//! `/v1/snapshots`: list, create from a template, delete, info.

use crate::error::ApiError;
use crate::extract::{JsonBody, Param, QueryArgs};
use crate::state::AppState;
use crate::views::{snapshot_detail, snapshot_info, snapshot_row};
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use forkvm_api::{CreateSnapshotRequest, SnapshotInfo, SnapshotInfoDetail};
use forkvm_snapshot::{validate_tag, StoreEntry, StoreError};
use serde::Deserialize;

pub async fn list(State(s): State<AppState>) -> Result<Json<Vec<SnapshotInfo>>, ApiError> {
    s.blocking(|s| {
        let rows = s.snapshot_rows();
        let out =
            s.store.list().iter().map(|e| snapshot_info(&s.store, e, rows.iter().find(|r| r.tag == e.tag))).collect();
        Ok(Json(out))
    })
    .await
}

/// The store entry of `tag` (ready or writing), or 404.
fn entry(s: &AppState, tag: &str) -> Result<StoreEntry, ApiError> {
    validate_tag(tag)?;
    s.store
        .list()
        .into_iter()
        .find(|e| e.tag == tag)
        .ok_or_else(|| ApiError::from(StoreError::NotFound { tag: tag.to_string(), store: s.store.snapshots_dir() }))
}

pub async fn create(
    State(s): State<AppState>,
    JsonBody(req): JsonBody<CreateSnapshotRequest>,
) -> Result<(StatusCode, Json<SnapshotInfo>), ApiError> {
    validate_tag(&req.tag)?;
    s.blocking(move |s| {
        s.store.check_free(&req.tag)?;
        let artifacts = forkvm_sandbox::Artifacts::ensure(&req.template, &mut |event| {
            tracing::info!(template = %req.template, ?event, "building template artefacts");
        })
        .map_err(|e| match e {
            forkvm_sandbox::ArtifactsError::UnknownTemplate { .. } => ApiError::bad_request(e.to_string()),
            other => ApiError::internal(other.to_string()),
        })?;
        let template =
            forkvm_sandbox::ensure_template_snapshot(artifacts).map_err(|e| ApiError::internal(e.to_string()))?;
        forkvm_sandbox::publish_template(&s.store, &template, &req.tag)
            .map_err(|e| ApiError::from_code(e.code(), e.to_string()))?;
        let e = entry(&s, &req.tag)?;
        let info = snapshot_info(&s.store, &e, None);
        let _ = s.db().upsert_snapshot(&snapshot_row(&info));
        Ok((StatusCode::CREATED, Json(info)))
    })
    .await
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeleteArgs {
    #[serde(default)]
    cascade: bool,
    #[serde(default)]
    force: bool,
}

pub async fn delete(
    State(s): State<AppState>,
    Param(tag): Param,
    QueryArgs(args): QueryArgs<DeleteArgs>,
) -> Result<StatusCode, ApiError> {
    if args.cascade && args.force {
        return Err(ApiError::bad_request("cascade and force exclude each other"));
    }
    s.blocking(move |s| {
        let e = entry(&s, &tag)?;
        let detail = snapshot_detail(&s.store, &e);
        if !detail.dependents.is_empty() && !args.cascade && !args.force {
            return Err(ApiError::conflict(
                format!("snapshot {tag:?} has dependents: {}", detail.dependents.join(", ")),
                "has_dependents",
            ));
        }
        if let Err(StoreError::Writing { .. }) = s.store.lookup(&tag) {
            return Err(ApiError::conflict(
                format!("snapshot {tag:?} is still being written; delete it once it is ready"),
                "writing",
            ));
        }
        if args.cascade {
            for d in &detail.dependents {
                s.store.remove(d)?;
                let _ = s.db().delete_snapshot(d);
            }
        }
        s.store.remove(&tag)?;
        let _ = s.db().delete_snapshot(&tag);
        Ok(StatusCode::NO_CONTENT)
    })
    .await
}

pub async fn info(State(s): State<AppState>, Param(tag): Param) -> Result<Json<SnapshotInfoDetail>, ApiError> {
    s.blocking(move |s| Ok(Json(snapshot_detail(&s.store, &entry(&s, &tag)?)))).await
}
