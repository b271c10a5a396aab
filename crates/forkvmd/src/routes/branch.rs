//! `POST /v1/sandboxes/{id}/branch`: snapshot a running sandbox under a tag, full, live
//! or diff, within the daemon's concurrency limit. The branch is recorded as in flight
//! before the VMM is asked, so a restarted daemon knows to finish or clean it up; a live
//! branch returned before its memory image is complete is watched until it is `ready`.
//!
//! A diff branch is a full branch into the store's staging directory, published by the
//! daemon as a diff over the tag the sandbox was spawned from (only the pages that
//! differ are stored; see `forkvm_sandbox::branch_diff`). The daemon, not the VMM,
//! names it, so it also picks the default tag, claiming it like a requested one.
//!
//! A daemon with a replication remote pushes each branch there once it is ready
//! ([`crate::replicate_branch`]).

use crate::db::BranchRow;
use crate::error::ApiError;
use crate::extract::{JsonBody, Param};
use crate::lifecycle::use_sandbox;
use crate::state::{now_unix, AppState, TagClaim};
use crate::views::{snapshot_info, snapshot_row};
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use forkvm_api::{BranchSandboxRequest, SnapshotInfo};
use forkvm_sandbox::start::new_sandbox_id;
use forkvm_snapshot::{validate_tag, StoreError};
use forkvm_vmm::vmm::BranchMode;
use std::time::Duration;

/// The branch modes of the API: the VMM's two, and diff (done by the daemon on top of a
/// full branch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Full,
    Live,
    Diff,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Full => "full",
            Mode::Live => "live",
            Mode::Diff => "diff",
        }
    }
}

/// The mode a request asks for, from `mode` or forkd's legacy booleans, with the
/// options that only make sense in some modes checked against it.
pub fn resolve_mode(req: &BranchSandboxRequest) -> Result<Mode, ApiError> {
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
        "full" => Mode::Full,
        "live" => Mode::Live,
        "diff" => Mode::Diff,
        other => return Err(ApiError::bad_request(format!("unknown mode {other:?} (expected full, live or diff)"))),
    };
    if !req.wait && mode != Mode::Live {
        return Err(ApiError::bad_request(format!(
            "wait: false needs mode live (a {} branch is complete when it returns)",
            mode.name()
        )));
    }
    if req.measure_diff && mode != Mode::Full {
        return Err(ApiError::bad_request(format!(
            "measure_diff measures a full branch against the diff it could have been; it does not apply to mode {:?}",
            mode.name()
        )));
    }
    if let Some(p) = &req.parent_tag {
        if mode != Mode::Diff {
            return Err(ApiError::bad_request(format!(
                "parent_tag applies to diff branches only, not to mode {:?}",
                mode.name()
            )));
        }
        validate_tag(p)?;
    }
    Ok(mode)
}

fn in_progress(tag: &str) -> ApiError {
    ApiError::conflict(format!("a branch to tag {tag:?} is in progress"), "writing")
}

/// The first free `branch-<id>-<n>`, claimed (the VMM's default rule, applied to the
/// store since a diff's VMM branch goes to a staging directory).
fn default_diff_tag(s: &AppState, id: &str) -> Result<TagClaim, ApiError> {
    for n in 1u32.. {
        let tag = format!("branch-{id}-{n}");
        if s.store.check_free(&tag).is_err() {
            continue;
        }
        if let Some(claim) = s.claim_tag(&tag) {
            return Ok(claim);
        }
    }
    Err(ApiError::internal(format!("no free default tag for a branch of {id}")))
}

/// Takes the branch (the VMM's, or a diff); returns its tag and pause window.
fn take(
    s: &AppState,
    id: &str,
    req: &BranchSandboxRequest,
    mode: Mode,
    tag: Option<&str>,
) -> Result<(String, f64), ApiError> {
    let vmm_mode = match mode {
        Mode::Full => BranchMode::Full,
        Mode::Live => BranchMode::Live,
        Mode::Diff => {
            let tag =
                tag.ok_or_else(|| ApiError::internal("a diff branch was started without a tag (the daemon names it)"))?;
            let (_, pause_ms) = forkvm_sandbox::branch_diff(&s.registry, &s.store, id, tag, req.parent_tag.as_deref())?;
            return Ok((tag.to_string(), pause_ms));
        }
    };
    let report = forkvm_sandbox::branch(&s.registry, &s.store, id, tag, vmm_mode, req.wait)?;
    Ok((report.tag, report.pause_ms))
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
            let mut claim = match &req.tag {
                Some(t) => Some(s.claim_tag(t).ok_or_else(|| in_progress(t))?),
                None => None,
            };
            let (_, _in_use) = use_sandbox(&s, &id)?;
            // Checked before the branch is taken, so a refusal costs nothing.
            let measure_over = match req.measure_diff {
                true => Some(forkvm_sandbox::chain_ops::diff_parent(&s.registry, &id)?),
                false => None,
            };
            if mode == Mode::Diff && claim.is_none() {
                claim = Some(default_diff_tag(&s, &id)?);
            }
            let tag = claim.as_ref().map(|c| c.tag().to_string());
            let op = format!("branch-{}", new_sandbox_id());
            let row = BranchRow {
                op: op.clone(),
                sandbox_id: id.clone(),
                tag: tag.clone(),
                mode: mode.name().into(),
                wait: req.wait,
                started_at_unix: now_unix(),
            };
            s.db().insert_branch(&row).map_err(|e| ApiError::internal(e.to_string()))?;
            let (tag, pause_ms) = match take(&s, &id, &req, mode, tag.as_deref()) {
                Ok(r) => r,
                Err(e) => {
                    let _ = s.db().delete_branch(&op);
                    s.metrics.inc("forkvm_branches_total", &[("mode", mode.name()), ("outcome", e.code.as_str())]);
                    return Err(e);
                }
            };
            s.metrics.inc("forkvm_branches_total", &[("mode", mode.name()), ("outcome", "ok")]);
            s.metrics.observe("forkvm_branch_pause_seconds", &[("mode", mode.name())], pause_ms / 1e3);
            let _ = s.db().set_branch_tag(&op, &tag);
            let entry = s.store.entry(&tag).ok_or_else(|| {
                ApiError::internal(format!("branch {tag:?} reported success but is not in the store"))
            })?;
            let mut info = snapshot_info(&s.store, &entry, None);
            info.mode = Some(mode.name().into());
            info.set_pause(Some(pause_ms));
            if let Some(parent) = &measure_over {
                let m = forkvm_sandbox::chain_ops::measure_branch_diff(&s.store, parent, &tag)?;
                info.diff_ms = Some(m.ms.ceil() as u64);
                info.diff_physical_bytes = Some(m.bytes);
                info.diff_logical_bytes = Some(m.logical_bytes);
            }
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
    crate::replicate_branch::replicate_branch(&s, info.tag.clone());
    Ok((StatusCode::CREATED, Json(info)))
}

/// Waits for a `writing` snapshot to become ready (or be abandoned), then settles its
/// database rows and replicates a ready one. Also used on restart for branches the
/// previous daemon left in flight.
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
            if s.store.lookup(&tag).is_ok() {
                crate::replicate_branch::replicate_branch(&s, tag);
            }
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
            if let Some(e) = s.store.entry(tag) {
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
        assert_eq!(resolve_mode(&req(None, false, false, true)).unwrap(), Mode::Full);
        assert_eq!(resolve_mode(&req(None, true, false, true)).unwrap(), Mode::Live);
        assert_eq!(resolve_mode(&req(Some("live"), true, false, false)).unwrap(), Mode::Live);
        assert_eq!(resolve_mode(&req(Some("diff"), false, false, true)).unwrap(), Mode::Diff);
        assert_eq!(resolve_mode(&req(None, false, true, true)).unwrap(), Mode::Diff);
        assert!(resolve_mode(&req(Some("full"), true, false, true)).is_err());
        assert!(resolve_mode(&req(Some("full"), false, true, true)).is_err());
        assert!(resolve_mode(&req(None, true, true, true)).is_err());
        assert!(resolve_mode(&req(Some("fast"), false, false, true)).is_err());
        assert!(resolve_mode(&req(Some("full"), false, false, false)).is_err(), "wait:false needs live");
        assert!(resolve_mode(&req(Some("diff"), false, false, false)).is_err(), "wait:false needs live");
    }

    #[test]
    fn parent_tag_is_for_diff_branches() {
        let with_parent = |mode: &str, parent: &str| BranchSandboxRequest {
            mode: Some(mode.into()),
            parent_tag: Some(parent.into()),
            ..Default::default()
        };
        assert_eq!(resolve_mode(&with_parent("diff", "py")).unwrap(), Mode::Diff);
        let e = resolve_mode(&with_parent("full", "py")).unwrap_err();
        assert!(e.message.contains("parent_tag"), "{}", e.message);
        assert!(resolve_mode(&with_parent("live", "py")).is_err());
        assert!(resolve_mode(&with_parent("diff", "../x")).is_err());
    }
}
