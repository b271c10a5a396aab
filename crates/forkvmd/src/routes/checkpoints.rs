//! `/v1/sandboxes/{id}/checkpoints` (list, take one, set the policy) and
//! `/v1/sandboxes/{id}/rewind`: thin handlers over [`crate::checkpoints`].

use crate::checkpoints::{self, records, Trigger};
use crate::error::ApiError;
use crate::extract::{JsonBody, Param};
use crate::routes::sandboxes::running;
use crate::state::AppState;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use forkvm_api::{
    CheckpointInfo, CheckpointList, CheckpointPolicy, CreateCheckpointRequest, RewindReport, RewindRequest,
};

/// The list, once a checkpoint being written (one taken after a call, which answered at
/// its pause) is in it: the sandbox's lock is waited for.
pub async fn list(State(s): State<AppState>, Param(id): Param) -> Result<Json<CheckpointList>, ApiError> {
    drop(s.disk.sandbox_lock(&id).lock().await);
    s.blocking(move |s| checkpoints::list(&s, &id).map(Json)).await
}

pub async fn create(
    State(s): State<AppState>,
    Param(id): Param,
    JsonBody(req): JsonBody<CreateCheckpointRequest>,
) -> Result<(StatusCode, Json<CheckpointInfo>), ApiError> {
    if let Some(n) = &req.note {
        checkpoints::check_note(n)?;
    }
    let info = checkpoints::checkpoint(&s, &id, Trigger::Api, req.note).await?;
    Ok((StatusCode::CREATED, Json(info)))
}

pub async fn set_policy(
    State(s): State<AppState>,
    Param(id): Param,
    JsonBody(policy): JsonBody<CheckpointPolicy>,
) -> Result<Json<CheckpointList>, ApiError> {
    policy.validate().map_err(ApiError::bad_request)?;
    // Under the sandbox's lock: a lower bound removes checkpoints now, not beside one
    // being taken.
    let lock = s.disk.sandbox_lock(&id);
    let _held = lock.lock().await;
    s.blocking(move |s| {
        running(&s, &id)?;
        // A sandbox that cannot be checkpointed is told so now, not at every call.
        if policy.every_seconds.is_some() || policy.after_exec {
            let known = records::policy(&s.db(), &id).map_err(|e| ApiError::internal(e.to_string()))?;
            checkpoints::base_of(&s, &id, known.as_ref())?;
        }
        records::set_policy(&s.db(), &id, &policy)
            .map_err(|e| ApiError::internal(format!("setting the policy: {e}")))?;
        checkpoints::thin(&s, &id, &policy);
        checkpoints::list(&s, &id).map(Json)
    })
    .await
}

pub async fn rewind(
    State(s): State<AppState>,
    Param(id): Param,
    JsonBody(req): JsonBody<RewindRequest>,
) -> Result<Json<RewindReport>, ApiError> {
    let target = checkpoints::RewindTarget::of(&req)?;
    checkpoints::rewind(&s, &id, target).await.map(Json)
}
