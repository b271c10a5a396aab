//! `GET /v1/sandboxes/{id}/files/watch?path=&recursive=`: a directory's changes as
//! NDJSON lines ([`WatchEvent`]) over the agent's inotify watch. The watch is armed
//! before the response starts, so a missing path or a file is a proper 404 or 400, and a
//! client that sees the `armed` line misses no change after it. The watch ends when the
//! client goes away (noticed at the next change or keepalive), or with an `end` line
//! when the directory does. A watched sandbox is in use: the daemon does not pause it
//! idle, since a paused guest has no changes to report.

use crate::error::{agent_error, ApiError};
use crate::extract::{Param, QueryArgs};
use crate::lifecycle::use_sandbox;
use crate::state::AppState;
use axum::body::Body;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use forkvm_api::WatchEvent;
use forkvm_proto::{AgentClient, ClientError, WatchRequest};
use forkvm_sandbox::guest::AGENT_PORT;
use forkvm_sandbox::watch_view;
use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WatchArgs {
    path: String,
    #[serde(default)]
    recursive: bool,
}

pub async fn watch(
    State(s): State<AppState>,
    Param(id): Param,
    QueryArgs(a): QueryArgs<WatchArgs>,
) -> Result<Response, ApiError> {
    if !a.path.starts_with('/') || a.path.contains('\0') {
        return Err(ApiError::bad_request(format!("path {:?} must be absolute, without NUL bytes", a.path)));
    }
    let id2 = id.clone();
    let (stream, directories, in_use) = s
        .blocking(move |s| {
            let (r, in_use) = use_sandbox(&s, &id2)?;
            let c = AgentClient::vsock_uds(r.vsock(), AGENT_PORT);
            let (stream, directories) =
                c.watch(&WatchRequest { path: a.path.clone(), recursive: a.recursive }).map_err(|e| match e {
                    ClientError::Rejected(p) => ApiError::bad_request(format!(
                        "sandbox {id2}: its agent cannot watch ({}): it predates watching; make the snapshot again",
                        p.message
                    )),
                    e => agent_error(&id2, e),
                })?;
            Ok((stream, directories, in_use))
        })
        .await?;
    let (tx, rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(64);
    tokio::task::spawn_blocking(move || {
        let _in_use = in_use;
        let mut send = |e: WatchEvent| tx.blocking_send(super::run::ndjson_line(&e)).is_ok();
        // A client that went away (a failed send) stops the watch in the guest too.
        let last = match watch_view::relay(stream, directories, &mut send) {
            Ok(None) => return,
            Ok(Some(reason)) => WatchEvent::End { reason },
            Err(e) => WatchEvent::Error { error: agent_error(&id, e).message },
        };
        send(last);
    });
    let body = Body::from_stream(futures_util::StreamExt::map(
        tokio_stream::wrappers::ReceiverStream::new(rx),
        Ok::<_, std::io::Error>,
    ));
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], body).into_response())
}
