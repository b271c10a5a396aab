//! Whole trees and checked downloads: `GET /v1/sandboxes/{id}/files/tar?path=DIR` streams
//! a tar archive of a guest directory (made by the agent as it reads the tree), `PUT`
//! there unpacks one into it (`?sha256=` checked as for a file upload), and `GET
//! .../files/sha256?path=` is a file's size and SHA-256 computed in the guest, to check
//! a download against. Bodies stream both ways through bounded channels: nothing is
//! held whole in the daemon.

use super::checked_body::{expected_sha256, CheckedBody};
use super::files::{agent_body, body_reader, check_path, checked_upload, PathArg};
use super::run::client;
use crate::error::{agent_error_in, ApiError};
use crate::extract::{Param, QueryArgs};
use crate::state::AppState;
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use forkvm_api::{FileChecksum, FileWritten};
use forkvm_proto::{FileType, UntarRequest};
use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TarUploadArgs {
    path: String,
    /// The archive's SHA-256: one with another is refused before the agent finishes.
    #[serde(default)]
    sha256: Option<String>,
}

/// `GET .../files/sha256?path=`.
pub async fn checksum(
    State(s): State<AppState>,
    Param(id): Param,
    QueryArgs(a): QueryArgs<PathArg>,
) -> Result<Json<FileChecksum>, ApiError> {
    check_path(&a.path)?;
    s.blocking(move |s| {
        let (c, _in_use) = client(&s, &id)?;
        let (size, sha256) = c.hash_file(&a.path).map_err(|e| agent_error_in(&s.registry, &id, e))?;
        Ok(Json(FileChecksum { path: a.path, size, sha256 }))
    })
    .await
}

/// `GET .../files/tar?path=DIR`: `application/x-tar`. The directory is checked before
/// the answer starts (a missing one or a file is a proper status); a failure later
/// breaks the body off.
pub async fn read(
    State(s): State<AppState>,
    Param(id): Param,
    QueryArgs(a): QueryArgs<PathArg>,
) -> Result<Response, ApiError> {
    check_path(&a.path)?;
    let (id2, path) = (id.clone(), a.path.clone());
    let (c, in_use) = s
        .blocking(move |s| {
            let (c, in_use) = client(&s, &id2)?;
            let st = c.stat(&path).map_err(|e| agent_error_in(&s.registry, &id2, e))?;
            if st.file_type != FileType::Dir {
                return Err(ApiError::bad_request(format!("{path:?} is not a directory")));
            }
            Ok((c, in_use))
        })
        .await?;
    let body = agent_body(id, c, in_use, move |c, w| c.tar(&a.path, w));
    Ok(([(header::CONTENT_TYPE, "application/x-tar")], body).into_response())
}

/// `PUT .../files/tar?path=DIR`: the body, a tar archive, unpacked into DIR (made if
/// missing) as it comes; entries that would leave it are refused by the agent.
pub async fn write(
    State(s): State<AppState>,
    Param(id): Param,
    QueryArgs(a): QueryArgs<TarUploadArgs>,
    body: Body,
) -> Result<(StatusCode, Json<FileWritten>), ApiError> {
    check_path(&a.path)?;
    let expected = expected_sha256(a.sha256.as_deref())?;
    let (reader, feeder) = body_reader(body);
    let path = a.path.clone();
    let written = s
        .blocking(move |s| {
            let (c, _in_use) = client(&s, &id)?;
            let mut body =
                CheckedBody::new(reader, expected, "entries before the archive's end may have been unpacked");
            let sent = c.untar(&UntarRequest { dir: a.path, owner: None }, &mut body);
            checked_upload(&id, sent, &body)
        })
        .await;
    feeder.abort();
    let (bytes, sha256) = written?;
    Ok((StatusCode::CREATED, Json(FileWritten { path, bytes, sha256 })))
}
