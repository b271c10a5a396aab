//! `POST /v1/templates/prune`: the build cache's snapshots nothing needs, removed
//! ([`forkvm_sandbox::build::prune`]); 409 while a build runs.

use crate::error::ApiError;
use crate::extract::JsonBody;
use crate::state::AppState;
use axum::extract::State;
use axum::Json;
use forkvm_api::{PruneBuildsReport, PruneBuildsRequest};

pub async fn prune(
    State(s): State<AppState>,
    JsonBody(req): JsonBody<PruneBuildsRequest>,
) -> Result<Json<PruneBuildsReport>, ApiError> {
    s.blocking(move |s| {
        let report = forkvm_sandbox::build::prune::prune(&s.registry, &s.store, &req)
            .map_err(|e| ApiError::new(e.code(), e.to_string()))?;
        tracing::info!(
            removed = report.removed.len(),
            freed_bytes = report.freed_bytes,
            dry_run = report.dry_run,
            "build cache pruned"
        );
        Ok(Json(report))
    })
    .await
}
