//! `/v1/sandboxes/{id}/disk-snapshots`: take an encrypted, incremental snapshot of a
//! running sandbox's layered disks now (`POST`), and list a sandbox's (`GET`), which also
//! answers for a sandbox that is gone but left a vault. The work and its serialization
//! with the daemon's own schedule are in [`crate::disk`].

use crate::disk::{self, Trigger};
use crate::error::ApiError;
use crate::extract::{JsonBody, Param};
use crate::routes::sandboxes::running;
use crate::state::AppState;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use forkvm_api::{DiskSnapshotInfo, DiskSnapshotReport, DiskSnapshotRequest};
use forkvm_sandbox::disk_snapshots::{self, vault_dir};
use forkvm_sandbox::RegistryError;
use forkvm_snapshot::vault::RetentionPolicy;

/// `POST`: 201 with the report when a snapshot was made, 200 when nothing was written
/// since the last one (`unchanged`, no new snapshot). A sandbox without a layered disk is
/// a 400; an unknown one a 404.
pub async fn take(
    State(s): State<AppState>,
    Param(id): Param,
    JsonBody(req): JsonBody<DiskSnapshotRequest>,
) -> Result<(StatusCode, Json<DiskSnapshotReport>), ApiError> {
    let i = id.clone();
    s.blocking(move |s| {
        running(&s, &i)?;
        s.touch(&i);
        Ok(())
    })
    .await?;
    let d = s.disk.retention();
    let policy = RetentionPolicy {
        keep_last: req.keep_last.unwrap_or(d.keep_last),
        keep_hourly: req.keep_hourly.unwrap_or(d.keep_hourly),
        keep_daily: req.keep_daily.unwrap_or(d.keep_daily),
    };
    let r = disk::take(&s, &id, policy, Trigger::Api).await??;
    let status = if r.unchanged { StatusCode::OK } else { StatusCode::CREATED };
    Ok((status, Json(disk::report_view(&r))))
}

/// `GET`: the sandbox's disk snapshots, oldest first; `[]` for a running sandbox that has
/// none yet. A sandbox that is gone is answered from its vault; 404 only when neither
/// exists.
pub async fn list(State(s): State<AppState>, Param(id): Param) -> Result<Json<Vec<DiskSnapshotInfo>>, ApiError> {
    s.blocking(move |s| {
        let exists = match s.registry.lookup(&id) {
            Ok((_, alive)) => alive,
            Err(RegistryError::NotFound(_)) => false,
            Err(e) => return Err(e.into()),
        };
        // The id is valid (checked by the lookup): a safe directory name.
        if !vault_dir(&s.store, &id).is_dir() {
            if exists {
                return Ok(Json(Vec::new()));
            }
            return Err(ApiError::not_found(format!("sandbox {id:?} not found, and it has no disk snapshots")));
        }
        let all = disk_snapshots::list(&s.store, &id)?;
        Ok(Json(all.iter().map(disk::info_view).collect()))
    })
    .await
}
