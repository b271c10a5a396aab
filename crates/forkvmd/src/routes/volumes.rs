//! `/v1/volumes*`: named ext4 disks that outlive sandboxes (`forkvm_sandbox::volumes`,
//! docs/volumes.md). A spawn attaches them through `CreateSandboxRequest::volumes`.

use crate::error::ApiError;
use crate::extract::{JsonBody, Param};
use crate::state::AppState;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use forkvm_api::volumes::{CreateVolumeRequest, SnapshotVolumeRequest, VolumeInfo};
use forkvm_sandbox::volumes::{VolumeError, Volumes, DEFAULT_VOLUME_BYTES};

impl From<VolumeError> for ApiError {
    fn from(e: VolumeError) -> ApiError {
        ApiError::new(e.code(), e.to_string())
    }
}

fn volumes(s: &AppState) -> Volumes {
    Volumes::of(&s.store)
}

/// `GET /v1/volumes`: every volume, by name.
pub async fn list(State(s): State<AppState>) -> Result<Json<Vec<VolumeInfo>>, ApiError> {
    s.blocking(|s| Ok(Json(volumes(&s).list(&s.registry)?))).await
}

/// `POST /v1/volumes`: a blank ext4 volume.
pub async fn create(
    State(s): State<AppState>,
    JsonBody(req): JsonBody<CreateVolumeRequest>,
) -> Result<(StatusCode, Json<VolumeInfo>), ApiError> {
    let bytes = req.size_mib.map_or(DEFAULT_VOLUME_BYTES, |m| m.saturating_mul(1 << 20));
    s.blocking(move |s| {
        let v = volumes(&s).create(&req.name, bytes)?;
        tracing::info!(volume = %v.name, size_bytes = v.size_bytes, "volume created");
        Ok((StatusCode::CREATED, Json(v)))
    })
    .await
}

/// `GET /v1/volumes/{name}`.
pub async fn get(State(s): State<AppState>, Param(name): Param) -> Result<Json<VolumeInfo>, ApiError> {
    s.blocking(move |s| Ok(Json(volumes(&s).get(&s.registry, &name)?))).await
}

/// `DELETE /v1/volumes/{name}`: refused (409) while a live sandbox has it attached.
pub async fn delete(State(s): State<AppState>, Param(name): Param) -> Result<StatusCode, ApiError> {
    s.blocking(move |s| {
        volumes(&s).remove(&s.registry, &name)?;
        tracing::info!(volume = %name, "volume removed");
        Ok(StatusCode::NO_CONTENT)
    })
    .await
}

/// `POST /v1/volumes/{name}/snapshot`: a new volume with its data as of now.
pub async fn snapshot(
    State(s): State<AppState>,
    Param(name): Param,
    JsonBody(req): JsonBody<SnapshotVolumeRequest>,
) -> Result<(StatusCode, Json<VolumeInfo>), ApiError> {
    s.blocking(move |s| Ok((StatusCode::CREATED, Json(volumes(&s).snapshot(&s.registry, &name, &req.to)?)))).await
}
