//! `POST /v1/sandboxes/{id}/branch`: snapshot a running sandbox under a tag, full or
//! live, within the daemon's concurrency limit. The branch is recorded as in flight
//! before the VMM is asked, so a restarted daemon knows to finish or clean it up; a live
//! branch returned before its memory image is complete is watched until it is `ready`.

use crate::db::BranchRow;
use crate::error::ApiError;
use crate::extract::{JsonBody, Param};
use crate::routes::sandboxes::running;
use crate::state::{now_unix, AppState};
use crate::views::{snapshot_info, snapshot_row};
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use forkvm_api::{BranchSandboxRequest, SnapshotInfo};
use forkvm_sandbox::sandbox::new_sandbox_id;
use forkvm_snapshot::{validate_tag, StoreError};
use forkvm_vmm::vmm::BranchMode;
use std::time::Duration;

/// The mode a request asks for, from `mode` or forkd's legacy booleans.
pub fn resolve_mode(req: &BranchSandboxRequest) -> Result<BranchMode, ApiError> {
    if req.live && req.diff {
        return Err(ApiError::bad_request("live and diff exclude each other: choose one mode"));
    }
    let legacy = if req.live {
        Some("live")
    } else if req.diff {
        Some("diff")
    } else {
        None
    };
    let mode = match (req.mode.as_deref(), legacy) {
        (Some(m), Some(l)) if m != l => {
            return Err(ApiError::bad_request(format!("mode {m:?} contradicts the legacy flag {l}")))
        }
        (Some(m), _) => m,
        (None, Some(l)) => l,
        (None, None) => "full",
    };
    let mode = match mode {
        "full" => BranchMode::Full,
        "live" => BranchMode::Live,
        "diff" => {
            return Err(ApiError::bad_request(
                "diff branches need snapshot chains, which this forkvm does not have yet; use full or live",
            ))
        }
        other => return Err(ApiError::bad_request(format!("unknown mode {other:?} (expected full or live)"))),
    };
    if !req.wait && mode != BranchMode::Live {
        return Err(ApiError::bad_request("wait: false needs mode live (a full branch is complete when it returns)"));
    }
    if req.parent_tag.is_some() {
        return Err(ApiError::bad_request("parent_tag applies to diff branches, which this forkvm does not have yet"));
    }
    Ok(mode)
}

fn mode_name(m: BranchMode) -> &'static str {
    match m {
        BranchMode::Full => "full",
        BranchMode::Live => "live",
    }
}

/// Takes a tag out of the in-flight set when the branch ends, however it ends.
struct TagSlot<'a> {
    s: &'a AppState,
    tag: Option<String>,
}

impl Drop for TagSlot<'_> {
    fn drop(&mut self) {
        if let Some(t) = &self.tag {
            self.s.branch_tags.lock().unwrap_or_else(|p| p.into_inner()).remove(t);
        }
    }
}

pub async fn branch(
    State(s): State<AppState>,
    Param(id): Param,
    JsonBody(req): JsonBody<BranchSandboxRequest>,
) -> Result<(StatusCode, Json<SnapshotInfo>), ApiError> {
    let mode = resolve_mode(&req)?;
    if let Some(t) = &req.tag {
        validate_tag(t)?;
    }
    let Ok(permit) = s.branch_slots.clone().try_acquire_owned() else {
        return Err(ApiError::busy(format!("{} branches are in progress (the limit); retry shortly", s.branch_cap)));
    };
    let result = s
        .blocking(move |s| {
            let _permit = permit;
            let mut slot = TagSlot { s: &s, tag: None };
            if let Some(t) = &req.tag {
                if !s.branch_tags.lock().unwrap_or_else(|p| p.into_inner()).insert(t.clone()) {
                    return Err(ApiError::conflict(format!("a branch to tag {t:?} is in progress"), "writing"));
                }
                slot.tag = Some(t.clone());
            }
            running(&s, &id)?;
            let op = format!("branch-{}", new_sandbox_id());
            let row = BranchRow {
                op: op.clone(),
                sandbox_id: id.clone(),
                tag: req.tag.clone(),
                mode: mode_name(mode).into(),
                wait: req.wait,
                started_at_unix: now_unix(),
            };
            s.db().insert_branch(&row).map_err(|e| ApiError::internal(e.to_string()))?;
            s.touch(&id);
            let outcome = forkvm_sandbox::branch(&s.registry, &s.store, &id, req.tag.as_deref(), mode, req.wait);
            let report = match outcome {
                Ok(r) => r,
                Err(e) => {
                    let _ = s.db().delete_branch(&op);
                    let e = ApiError::from(e);
                    s.metrics.inc("forkvm_branches_total", &[("mode", mode_name(mode)), ("outcome", e.code)]);
                    return Err(e);
                }
            };
            s.metrics.inc("forkvm_branches_total", &[("mode", mode_name(mode)), ("outcome", "ok")]);
            s.metrics.observe("forkvm_branch_pause_seconds", &[("mode", mode_name(mode))], report.pause_ms / 1e3);
            let _ = s.db().set_branch_tag(&op, &report.tag);
            let _ = s.db().record_branch_of(&id, &report.tag);
            let entry = s.store.list().into_iter().find(|e| e.tag == report.tag).ok_or_else(|| {
                ApiError::internal(format!("branch {:?} reported success but is not in the store", report.tag))
            })?;
            let mut info = snapshot_info(&s.store, &entry, None);
            info.mode = Some(mode_name(mode).into());
            info.pause_ms = Some(report.pause_ms);
            let _ = s.db().upsert_snapshot(&snapshot_row(&info));
            let writing = info.status == "writing";
            if !writing {
                let _ = s.db().delete_branch(&op);
            }
            Ok((info, writing.then_some(op)))
        })
        .await?;
    let (info, watch) = result;
    if let Some(op) = watch {
        tokio::spawn(watch_writing(s.clone(), op, info.tag.clone()));
        return Ok((StatusCode::ACCEPTED, Json(info)));
    }
    Ok((StatusCode::CREATED, Json(info)))
}

/// Waits for a `writing` snapshot to become ready (or be abandoned), then settles its
/// database rows. Also used on restart for branches the previous daemon left in flight.
pub async fn watch_writing(s: AppState, op: String, tag: String) {
    loop {
        let done = s
            .blocking({
                let (op, tag) = (op.clone(), tag.clone());
                move |s| Ok(settle_branch(&s, &op, &tag))
            })
            .await
            .unwrap_or(true);
        if done {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Settles branch `op` to `tag` if its snapshot is no longer being written: a ready one
/// is recorded, an abandoned one removed. Returns whether it is settled.
pub fn settle_branch(s: &AppState, op: &str, tag: &str) -> bool {
    match s.store.lookup(tag) {
        Err(StoreError::Writing { .. }) => return false,
        Ok(_) => {
            if let Some(e) = s.store.list().into_iter().find(|e| e.tag == tag) {
                let info = snapshot_info(&s.store, &e, None);
                let _ = s.db().upsert_snapshot(&snapshot_row(&info));
            }
        }
        Err(StoreError::Abandoned { .. }) => {
            tracing::warn!(%tag, "a branch's writer died; removing its snapshot");
            let _ = s.store.remove(tag);
            let _ = s.db().delete_snapshot(tag);
        }
        Err(_) => {
            let _ = s.db().delete_snapshot(tag);
        }
    }
    let _ = s.db().delete_branch(op);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(mode: Option<&str>, live: bool, diff: bool, wait: bool) -> BranchSandboxRequest {
        BranchSandboxRequest { mode: mode.map(String::from), live, diff, wait, ..Default::default() }
    }

    #[test]
    fn modes() {
        assert_eq!(resolve_mode(&req(None, false, false, true)).unwrap(), BranchMode::Full);
        assert_eq!(resolve_mode(&req(None, true, false, true)).unwrap(), BranchMode::Live);
        assert_eq!(resolve_mode(&req(Some("live"), true, false, false)).unwrap(), BranchMode::Live);
        assert!(resolve_mode(&req(Some("full"), true, false, true)).is_err());
        assert!(resolve_mode(&req(None, true, true, true)).is_err());
        assert!(resolve_mode(&req(Some("diff"), false, false, true)).is_err());
        assert!(resolve_mode(&req(Some("fast"), false, false, true)).is_err());
        assert!(resolve_mode(&req(Some("full"), false, false, false)).is_err(), "wait:false needs live");
    }
}
