//! `/v1/snapshots`: list, create from a template, delete, info; and for snapshot chains,
//! compact (flatten a chain into a new base) and pack/unpack (move a chain between hosts
//! as one hash-checked `.tar.zst`).
//!
//! The chain rules live in `forkvm_snapshot::chain`, shared with the CLI, so the daemon
//! and `forkvm rmi`/`snapshot-info` cannot disagree: deleting a snapshot others are built
//! on is refused unless the caller says whether to take them too (`cascade`) or orphan
//! them (`force`), and the daemon's rows follow every tag that went. Packs travel through
//! files in the store's staging directory (same filesystem; a dead daemon's are swept at
//! start): a pack is written whole before it is streamed, since its manifest comes last,
//! and an upload is received whole before it is unpacked, since unpack checks the entire
//! chain before anything enters the store. Neither is ever held in memory.

use super::upload::{io_error, receive, Staged};
use crate::error::ApiError;
use crate::extract::{JsonBody, Param, QueryArgs};
use crate::state::AppState;
use crate::views::{snapshot_detail, snapshot_info, snapshot_row};
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use forkvm_api::{CompactSnapshotRequest, CreateSnapshotRequest, SnapshotInfo, SnapshotInfoDetail, UnpackResponse};
use forkvm_snapshot::chain::{self, RemoveMode};
use forkvm_snapshot::{validate_tag, StoreEntry, StoreError};
use serde::Deserialize;
use tokio::io::AsyncReadExt;

/// Largest pack `POST /v1/snapshots/unpack` accepts.
pub const MAX_PACK_UPLOAD: u64 = 64 << 30;
/// Bytes read from a pack file per body chunk of a download.
const PACK_CHUNK: usize = 256 << 10;

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
        .entry(tag)
        .ok_or_else(|| ApiError::from(StoreError::NotFound { tag: tag.to_string(), store: s.store.snapshots_dir() }))
}

/// Records `tag` (just made) in the database; returns its view.
fn record_new(s: &AppState, tag: &str) -> Result<SnapshotInfo, ApiError> {
    let e = entry(s, tag)?;
    let info = snapshot_info(&s.store, &e, None);
    let _ = s.db().upsert_snapshot(&snapshot_row(&info));
    Ok(info)
}

pub async fn create(
    State(s): State<AppState>,
    JsonBody(req): JsonBody<CreateSnapshotRequest>,
) -> Result<(StatusCode, Json<SnapshotInfo>), ApiError> {
    validate_tag(&req.tag)?;
    let d = req.default_limits.unwrap_or_default();
    let defaults = super::sandboxes::asked_limits(d.memory_limit_mib, d.cpu_limit_millis, d.pids_limit, d.io_limits)?;
    forkvm_sandbox::check_tag_defaults(&defaults, req.default_network.as_ref())
        .map_err(|e| ApiError::new(e.code(), e.to_string()))?;
    s.blocking(move |s| {
        s.store.check_free(&req.tag)?;
        let artifacts = forkvm_sandbox::Artifacts::ensure(&req.template, &mut |event| {
            tracing::info!(template = %req.template, ?event, "building template artefacts");
        })
        .and_then(|a| {
            a.with_vcpus(req.vcpus, &mut |event| {
                tracing::info!(template = %req.template, ?event, "building the SMP kernel");
            })
        })
        .map_err(|e| match e {
            forkvm_sandbox::ArtifactsError::Template(_) | forkvm_sandbox::ArtifactsError::Vcpus(_) => {
                ApiError::bad_request(e.to_string())
            }
            other => ApiError::internal(other.to_string()),
        })?;
        let template =
            forkvm_sandbox::ensure_template_snapshot(artifacts).map_err(|e| ApiError::internal(e.to_string()))?;
        forkvm_sandbox::publish_template(&s.store, &template, &req.tag, &defaults, req.default_network.as_ref())
            .map_err(|e| ApiError::new(e.code(), e.to_string()))?;
        Ok((StatusCode::CREATED, Json(record_new(&s, &req.tag)?)))
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
    let mode = match (args.cascade, args.force) {
        (true, true) => {
            return Err(ApiError::bad_request(
                "cascade and force exclude each other: cascade deletes the dependents, force orphans them",
            ))
        }
        (true, false) => RemoveMode::Cascade,
        (false, true) => RemoveMode::Force,
        (false, false) => RemoveMode::Refuse,
    };
    s.blocking(move |s| {
        entry(&s, &tag)?;
        // A snapshot being written belongs to its writer, in a cascade too.
        let mut doomed = vec![tag.clone()];
        if mode == RemoveMode::Cascade {
            doomed.extend(chain::info(&s.store, &tag)?.descendants);
        }
        for t in &doomed {
            if let Err(StoreError::Writing { .. }) = s.store.lookup(t) {
                return Err(ApiError::conflict(
                    format!("snapshot {t:?} is still being written; delete it once it is ready"),
                    "writing",
                ));
            }
        }
        // Refused for its dependents first (chain::remove says so); then for its users.
        let has_dependents = mode == RemoveMode::Refuse && !chain::info(&s.store, &tag)?.dependents.is_empty();
        if mode != RemoveMode::Force && !has_dependents {
            for t in &doomed {
                let users = s.registry.spawned_from(t);
                if !users.is_empty() {
                    return Err(ApiError::conflict(
                        format!(
                            "snapshot {t:?} is in use by running sandboxes {}: their data disks read its layers, and \
                             their branches and disk snapshots need them; delete them first, or force=true",
                            users.join(", ")
                        ),
                        "in_use",
                    ));
                }
            }
        }
        let report = chain::remove(&s.store, &s.cache, &tag, mode)?;
        for t in &report.removed {
            let _ = s.db().delete_snapshot(t);
        }
        if !report.orphaned.is_empty() {
            tracing::info!(%tag, orphaned = ?report.orphaned, "deleted a snapshot, leaving its dependents unbootable");
        }
        Ok(StatusCode::NO_CONTENT)
    })
    .await
}

pub async fn info(State(s): State<AppState>, Param(tag): Param) -> Result<Json<SnapshotInfoDetail>, ApiError> {
    s.blocking(move |s| {
        let e = entry(&s, &tag)?;
        Ok(Json(snapshot_detail(&s.store, &e)?))
    })
    .await
}

/// forkd answers 200 (not 201) with the new snapshot; so does forkvm.
pub async fn compact(
    State(s): State<AppState>,
    Param(tag): Param,
    JsonBody(req): JsonBody<CompactSnapshotRequest>,
) -> Result<Json<SnapshotInfo>, ApiError> {
    validate_tag(&tag)?;
    validate_tag(&req.to)?;
    if req.to == tag {
        return Err(ApiError::bad_request(format!("compacting {tag:?} onto itself: `to` must name a new snapshot")));
    }
    s.blocking(move |s| {
        entry(&s, &tag)?;
        let to = req.to;
        let _claim = s
            .claim_tag(&to)
            .ok_or_else(|| ApiError::conflict(format!("snapshot {to:?} is being made by another call"), "writing"))?;
        let report = chain::compact(&s.store, &s.cache, &tag, &to)?;
        tracing::info!(from = %tag, %to, ms = report.ms, chunks_new = report.chunks_new, "compacted a chain");
        Ok(Json(record_new(&s, &to)?))
    })
    .await
}

/// `GET /v1/snapshots/{tag}/pack`: the chain of `tag`, base to head, as a `.tar.zst`
/// (what `forkvm snapshot-pack` writes). A whole-image head is moved into the chunk
/// store first, as the CLI does.
pub async fn pack(State(s): State<AppState>, Param(tag): Param) -> Result<Response, ApiError> {
    let t = tag.clone();
    let (file, size) = s
        .blocking(move |s| {
            entry(&s, &t)?;
            let staged = Staged(chain::new_staging_dir(&s.store, "pack")?);
            let out = staged.0.join(format!("{t}.tar.zst"));
            let policy = s.pack_policy();
            let report = chain::pack_signed(&s.store, &s.cache, &t, &out, policy.key.as_ref())?;
            tracing::info!(tag = %t, links = ?report.links, bytes = report.pack_bytes, "packed a chain");
            // The open file outlives its name: nothing is left behind however the download ends.
            let file = std::fs::File::open(&out).map_err(|e| io_error("opening the written pack", &out, e))?;
            let size = file.metadata().map_err(|e| io_error("sizing the written pack", &out, e))?.len();
            drop(staged);
            Ok((file, size))
        })
        .await?;
    let chunks = futures_util::stream::unfold(Some(tokio::fs::File::from_std(file)), |state| async move {
        let mut f = state?;
        let mut buf = vec![0u8; PACK_CHUNK];
        match f.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(bytes::Bytes::from(buf)), Some(f)))
            }
            Err(e) => Some((Err(e), None)),
        }
    });
    Ok((
        [
            (header::CONTENT_TYPE, "application/zstd".to_string()),
            (header::CONTENT_LENGTH, size.to_string()),
            // Tags are letters, digits, `.`, `_` and `-`: nothing to quote.
            (header::CONTENT_DISPOSITION, format!("attachment; filename=\"{tag}.tar.zst\"")),
        ],
        Body::from_stream(chunks),
    )
        .into_response())
}

/// `POST /v1/snapshots/unpack`: imports the chain in the pack sent as the body. Every
/// link is checked against its content hash before the store is touched: a damaged
/// pack is a 400 and imports nothing; a tag that exists with other content is a 409.
pub async fn unpack(State(s): State<AppState>, body: Body) -> Result<(StatusCode, Json<UnpackResponse>), ApiError> {
    let staged = Staged(s.blocking(|s| Ok(chain::new_staging_dir(&s.store, "upload")?)).await?);
    let path = staged.0.join("upload.tar.zst");
    receive(body, &path, MAX_PACK_UPLOAD, "the .tar.zst pack").await?;
    s.blocking(move |s| {
        let r = chain::unpack_trusted(&s.store, &path, &s.pack_policy().trust)?;
        drop(staged);
        for t in &r.imported {
            record_new(&s, t)?;
        }
        tracing::info!(head = %r.head, imported = ?r.imported, reused = ?r.reused, "unpacked a chain");
        Ok((
            StatusCode::CREATED,
            Json(UnpackResponse {
                head: r.head,
                imported: r.imported,
                reused: r.reused,
                chunks_new: r.chunks_new,
                chunks_present: r.chunks_present,
                logical_bytes: r.logical_bytes,
                pack_bytes: r.pack_bytes,
                ms: r.ms,
                signed_by: r.signed_by,
            }),
        ))
    })
    .await
}
