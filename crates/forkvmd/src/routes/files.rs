//! Files in a sandbox: download, upload, remove, list. Bodies stream in both directions
//! (bounded channels between the HTTP body and the agent's frames), so a large file
//! never sits in the daemon's memory.

use super::checked_body::{expected_sha256, CheckedBody};
use super::run::client;
use crate::error::{agent_error, agent_error_in, ApiError};
use crate::extract::{Param, QueryArgs};
use crate::lifecycle::InUse;
use crate::state::AppState;
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use forkvm_api::{FileEntry, FileWritten};
use forkvm_proto::{AgentClient, ClientError, FileType, WriteFileRequest};
use futures_util::StreamExt;
use serde::Deserialize;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use tokio::sync::mpsc;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PathArg {
    pub(crate) path: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WriteArgs {
    path: String,
    #[serde(default)]
    mode: Option<u32>,
    #[serde(default)]
    create_parents: bool,
    /// The body's SHA-256: a body with another is refused and nothing is written.
    #[serde(default)]
    sha256: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoveArgs {
    path: String,
    #[serde(default)]
    recursive: bool,
}

/// Guest paths are absolute, without NUL bytes.
pub(crate) fn check_path(path: &str) -> Result<(), ApiError> {
    if !path.starts_with('/') {
        return Err(ApiError::bad_request(format!("path {path:?} must be absolute")));
    }
    if path.contains('\0') {
        return Err(ApiError::bad_request("path contains a NUL byte"));
    }
    Ok(())
}

fn type_name(t: FileType) -> &'static str {
    match t {
        FileType::File => "file",
        FileType::Dir => "dir",
        FileType::Symlink => "symlink",
        FileType::Other => "other",
    }
}

/// Sends what the agent writes into a bounded channel (the response body).
struct ChannelWriter(mpsc::Sender<Result<bytes::Bytes, std::io::Error>>);

impl Write for ChannelWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .blocking_send(Ok(bytes::Bytes::copy_from_slice(buf)))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the client went away"))?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

pub async fn read(
    State(s): State<AppState>,
    Param(id): Param,
    QueryArgs(a): QueryArgs<PathArg>,
) -> Result<Response, ApiError> {
    check_path(&a.path)?;
    let (id2, path) = (id.clone(), a.path.clone());
    // Stat first, so that a missing file or a directory is a proper status, not a
    // stream that breaks off.
    let (c, in_use, size) = s
        .blocking(move |s| {
            let (c, in_use) = client(&s, &id2)?;
            let st = c.stat(&path).map_err(|e| agent_error_in(&s.registry, &id2, e))?;
            if st.file_type != FileType::File {
                return Err(ApiError::bad_request(format!("{path:?} is a {}, not a file", type_name(st.file_type))));
            }
            Ok((c, in_use, st.size))
        })
        .await?;
    let path = a.path.clone();
    let body = agent_body(id, c, in_use, move |c, w| c.read_file(&path, w));
    Ok((
        [(header::CONTENT_TYPE, "application/octet-stream".to_string()), (header::CONTENT_LENGTH, size.to_string())],
        body,
    )
        .into_response())
}

/// A response body the agent's `Data` frames feed as they come: `send` runs on a
/// blocking thread, writing into a bounded channel. An agent error once the answer has
/// started breaks the body off with its message. `in_use` keeps the sandbox from idle
/// pause until the body went.
pub(crate) fn agent_body(
    id: String,
    c: AgentClient<UnixStream>,
    in_use: InUse,
    send: impl FnOnce(&AgentClient<UnixStream>, &mut dyn Write) -> Result<u64, ClientError> + Send + 'static,
) -> Body {
    let (tx, rx) = mpsc::channel(16);
    tokio::task::spawn_blocking(move || {
        let _in_use = in_use;
        let mut w = ChannelWriter(tx.clone());
        if let Err(e) = send(&c, &mut w) {
            let _ = tx.blocking_send(Err(std::io::Error::other(agent_error(&id, e).message)));
        }
    });
    Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
}

/// A reader of `body` for a blocking thread, and the task that feeds it (to abort once
/// the reader is done with it).
pub(crate) fn body_reader(body: Body) -> (ChannelReader, tokio::task::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel(16);
    let feeder = tokio::spawn(async move {
        let mut stream = body.into_data_stream();
        while let Some(chunk) = stream.next().await {
            let item = chunk;
            let stop = item.is_err();
            if tx.send(item).await.is_err() || stop {
                break;
            }
        }
    });
    (ChannelReader { rx, pending: bytes::Bytes::new() }, feeder)
}

/// Reads the request body from a bounded channel (fed by the async side).
pub(crate) struct ChannelReader {
    rx: mpsc::Receiver<Result<bytes::Bytes, axum::Error>>,
    pending: bytes::Bytes,
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.pending.is_empty() {
            match self.rx.blocking_recv() {
                Some(Ok(b)) => self.pending = b,
                Some(Err(e)) => return Err(std::io::Error::other(format!("reading the upload: {e}"))),
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.pending.len());
        buf[..n].copy_from_slice(&self.pending[..n]);
        self.pending = self.pending.slice(n..);
        Ok(n)
    }
}

pub async fn write(
    State(s): State<AppState>,
    Param(id): Param,
    QueryArgs(a): QueryArgs<WriteArgs>,
    body: Body,
) -> Result<(StatusCode, Json<FileWritten>), ApiError> {
    check_path(&a.path)?;
    if a.mode.is_some_and(|m| m > 0o7777) {
        return Err(ApiError::bad_request(format!("mode {:o} has bits beyond 0o7777", a.mode.unwrap_or(0))));
    }
    let expected = expected_sha256(a.sha256.as_deref())?;
    let (reader, feeder) = body_reader(body);
    let path = a.path.clone();
    let written = s
        .blocking(move |s| {
            let (c, _in_use) = client(&s, &id)?;
            let req =
                WriteFileRequest { path: a.path.clone(), mode: a.mode, create_parents: a.create_parents, owner: None };
            let mut body = CheckedBody::new(reader, expected, "nothing was written");
            let sent = c.write_file(&req, &mut body);
            checked_upload(&id, sent, &body)
        })
        .await;
    feeder.abort();
    let (bytes, sha256) = written?;
    Ok((StatusCode::CREATED, Json(FileWritten { path, bytes, sha256 })))
}

/// What an upload through `body` came to: its size and digest, the refusal of a body
/// whose digest was not the one asked for, or the agent's error.
pub(crate) fn checked_upload<R>(
    id: &str,
    sent: Result<u64, forkvm_proto::ClientError>,
    body: &CheckedBody<R>,
) -> Result<(u64, String), ApiError> {
    if let Some(refused) = body.mismatch() {
        return Err(refused);
    }
    let bytes = sent.map_err(|e| agent_error(id, e))?;
    let sha256 = body.digest().ok_or_else(|| ApiError::internal("the upload ended before its body did"))?;
    Ok((bytes, sha256.to_string()))
}

pub async fn remove(
    State(s): State<AppState>,
    Param(id): Param,
    QueryArgs(a): QueryArgs<RemoveArgs>,
) -> Result<StatusCode, ApiError> {
    check_path(&a.path)?;
    if a.path.trim_end_matches('/').is_empty() {
        return Err(ApiError::bad_request("refusing to remove /"));
    }
    s.blocking(move |s| {
        let (c, _in_use) = client(&s, &id)?;
        c.remove(&a.path, a.recursive).map_err(|e| agent_error_in(&s.registry, &id, e))?;
        Ok(StatusCode::NO_CONTENT)
    })
    .await
}

pub async fn list(
    State(s): State<AppState>,
    Param(id): Param,
    QueryArgs(a): QueryArgs<PathArg>,
) -> Result<Json<Vec<FileEntry>>, ApiError> {
    check_path(&a.path)?;
    s.blocking(move |s| {
        let (c, _in_use) = client(&s, &id)?;
        let entries = c.list(&a.path).map_err(|e| agent_error_in(&s.registry, &id, e))?;
        Ok(Json(
            entries
                .into_iter()
                .map(|e| FileEntry {
                    name: e.name,
                    file_type: type_name(e.file_type).to_string(),
                    size: e.size,
                    mode: e.mode,
                    mtime_unix_ns: e.mtime_unix_ns,
                })
                .collect(),
        ))
    })
    .await
}
