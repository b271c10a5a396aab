//! `/v1/workspaces*`: forkd's named, long-lived sandboxes. A workspace is one sandbox
//! under a name: create spawns it from a tag, suspend archives it (memory, processes
//! and disks sealed in the store; its VMM stops), resume restores the same sandbox, and
//! delete deletes it. A workspace whose sandbox was deleted on its own is `stale`; its
//! resume starts a fresh sandbox from the source tag (the state is gone).

use crate::db::DbError;
use crate::error::ApiError;
use crate::extract::{JsonBody, Param, QueryArgs};
use crate::state::{now_unix, AppState};
use crate::workspaces::{self as rows, WorkspaceRow, WorkspaceStatus};
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use forkvm_api::{CreateSandboxRequest, CreateWorkspaceRequest, SuspendWorkspaceRequest, WorkspaceInfo};
use forkvm_snapshot::validate_tag;

fn db_error(e: DbError) -> ApiError {
    ApiError::internal(format!("the workspaces table: {e}"))
}

fn check_name(name: &str) -> Result<(), ApiError> {
    validate_tag(name).map_err(|_| {
        ApiError::bad_request(format!("workspace name {name:?}: use 1 to 64 ASCII letters, digits, '-' or '_'"))
    })
}

/// Workspace `name`'s row, or the API's 404.
fn known(s: &AppState, name: &str) -> Result<WorkspaceRow, ApiError> {
    check_name(name)?;
    rows::get(&s.db(), name)
        .map_err(db_error)?
        .ok_or_else(|| ApiError::not_found(format!("workspace {name:?} not found")))
}

fn view(s: &AppState, row: &WorkspaceRow) -> WorkspaceInfo {
    row.info(s.sandbox_row(&row.sandbox_id).as_ref())
}

/// One sandbox from `tag` (through the spawn route, so it is counted and limited like
/// any other); its id.
async fn spawn_one(s: &AppState, tag: &str, memory_limit_mib: Option<u64>) -> Result<String, ApiError> {
    let mut req = CreateSandboxRequest::new(tag, 1);
    req.memory_limit_mib = memory_limit_mib;
    let (_, Json(spawned)) = super::sandboxes::create(State(s.clone()), JsonBody(req)).await?;
    spawned.into_iter().next().map(|b| b.id).ok_or_else(|| ApiError::internal("the spawn returned no sandbox"))
}

async fn delete_sandbox(s: &AppState, id: &str) -> Result<(), ApiError> {
    let args = QueryArgs(super::sandboxes::DeleteArgs::default());
    match super::sandboxes::delete(State(s.clone()), Param(id.to_string()), args).await {
        Err(e) if e.code == forkvm_api::ErrorCode::NotFound => Ok(()),
        other => other.map(|_| ()),
    }
}

/// `GET /v1/workspaces`: every workspace, by name.
pub async fn list(State(s): State<AppState>) -> Result<Json<Vec<WorkspaceInfo>>, ApiError> {
    s.blocking(|s| {
        let all = rows::all(&s.db()).map_err(db_error)?;
        Ok(Json(all.iter().map(|w| view(&s, w)).collect()))
    })
    .await
}

/// `POST /v1/workspaces`: 201 with the new workspace, its sandbox running.
pub async fn create(
    State(s): State<AppState>,
    JsonBody(req): JsonBody<CreateWorkspaceRequest>,
) -> Result<(StatusCode, Json<WorkspaceInfo>), ApiError> {
    check_name(&req.name)?;
    validate_tag(&req.snapshot_tag)?;
    let taken = |name: &str| ApiError::conflict(format!("workspace {name:?} exists"), "exists");
    if rows::get(&s.db(), &req.name).map_err(db_error)?.is_some() {
        return Err(taken(&req.name));
    }
    let id = spawn_one(&s, &req.snapshot_tag, req.memory_limit_mib).await?;
    let now = now_unix();
    let row = WorkspaceRow {
        name: req.name.clone(),
        source_tag: req.snapshot_tag,
        sandbox_id: id.clone(),
        created_at_unix: now,
        last_active_unix: now,
    };
    let inserted = rows::insert(&s.db(), &row).map_err(db_error);
    if !matches!(inserted, Ok(true)) {
        // Another create took the name meanwhile (or the table failed): this sandbox
        // belongs to no workspace, so it goes.
        delete_sandbox(&s, &id).await?;
        return Err(inserted.err().unwrap_or_else(|| taken(&req.name)));
    }
    tracing::info!(workspace = %row.name, sandbox_id = %id, "workspace created");
    Ok((StatusCode::CREATED, Json(view(&s, &row))))
}

/// `GET /v1/workspaces/{name}`.
pub async fn get(State(s): State<AppState>, Param(name): Param) -> Result<Json<WorkspaceInfo>, ApiError> {
    s.blocking(move |s| known(&s, &name).map(|row| Json(view(&s, &row)))).await
}

/// `DELETE /v1/workspaces/{name}`: its sandbox (running or archived) is deleted, then
/// the workspace; the source tag stays.
pub async fn delete(State(s): State<AppState>, Param(name): Param) -> Result<StatusCode, ApiError> {
    let row = known(&s, &name)?;
    delete_sandbox(&s, &row.sandbox_id).await?;
    rows::delete(&s.db(), &name).map_err(db_error)?;
    tracing::info!(workspace = %name, sandbox_id = %row.sandbox_id, "workspace deleted");
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/workspaces/{name}/suspend`: archives its sandbox.
pub async fn suspend(
    State(s): State<AppState>,
    Param(name): Param,
    JsonBody(_req): JsonBody<SuspendWorkspaceRequest>,
) -> Result<Json<WorkspaceInfo>, ApiError> {
    let row = known(&s, &name)?;
    let status = WorkspaceStatus::of(s.sandbox_row(&row.sandbox_id).as_ref());
    if status != WorkspaceStatus::Running {
        return Err(ApiError::bad_request(format!(
            "workspace {name:?} is {}: only a running one can be suspended",
            status.as_str()
        )));
    }
    crate::lifecycle::archive_sandbox(&s, &row.sandbox_id, forkvm_sandbox::StateReason::Api).await?;
    rows::set_sandbox(&s.db(), &name, &row.sandbox_id, now_unix()).map_err(db_error)?;
    let row = known(&s, &name)?;
    Ok(Json(view(&s, &row)))
}

/// `POST /v1/workspaces/{name}/resume`: restores its sandbox (same id, processes and
/// files), or for a stale one spawns a fresh sandbox from the source tag.
pub async fn resume(State(s): State<AppState>, Param(name): Param) -> Result<Json<WorkspaceInfo>, ApiError> {
    let row = known(&s, &name)?;
    let id = match WorkspaceStatus::of(s.sandbox_row(&row.sandbox_id).as_ref()) {
        WorkspaceStatus::Running => {
            return Err(ApiError::bad_request(format!("workspace {name:?} is running already")));
        }
        WorkspaceStatus::Suspended => {
            crate::lifecycle::restore_sandbox(&s, &row.sandbox_id, None).await?;
            row.sandbox_id.clone()
        }
        WorkspaceStatus::Stale => {
            tracing::warn!(workspace = %name, sandbox_id = %row.sandbox_id, "stale workspace: a fresh sandbox from its source");
            spawn_one(&s, &row.source_tag, None).await?
        }
    };
    rows::set_sandbox(&s.db(), &name, &id, now_unix()).map_err(db_error)?;
    let row = known(&s, &name)?;
    Ok(Json(view(&s, &row)))
}
