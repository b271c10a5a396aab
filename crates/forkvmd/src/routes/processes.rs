//! `/v1/sandboxes/{id}/processes*`: background processes kept by the sandbox's agent
//! (docs/processes.md). A start answers once the process runs; its output is read from
//! any offset the ring still holds, following it as NDJSON lines while it runs; input,
//! signals and resizes are calls of their own. Nothing here ends a process when a
//! client goes away.

use super::files::body_reader;
use super::run::{client, ndjson_line};
use crate::error::{agent_error, ApiError};
use crate::extract::{JsonBody, Param, QueryArgs};
use crate::state::AppState;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use forkvm_api::{
    ProcessInfo, ProcessInputQuery, ProcessInputWritten, ProcessOutputEvent, ProcessOutputQuery, SignalProcessRequest,
    StartProcessRequest, TerminalSize,
};
use forkvm_proto::ClientError;
use forkvm_proto::ProcAttachRequest;
use forkvm_sandbox::process_view;

/// The pid of a path, as the agent names processes.
pub(super) fn pid_of(raw: &str) -> Result<u32, ApiError> {
    raw.parse::<u32>()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| ApiError::bad_request(format!("process {raw:?} is not a pid (a positive number)")))
}

/// The API's error for an agent call on sandbox `id`: an agent older than background
/// processes is the caller's to fix (a 400 saying how), anything else as for every call.
pub(super) fn proc_error(id: &str, e: ClientError) -> ApiError {
    match process_view::agent_too_old(id, &e) {
        Some(message) => ApiError::bad_request(message),
        None => agent_error(id, e),
    }
}

/// `GET /v1/sandboxes/{id}/processes`: every process the agent keeps, running or ended.
pub async fn list(State(s): State<AppState>, Param(id): Param) -> Result<Json<Vec<ProcessInfo>>, ApiError> {
    s.blocking(move |s| {
        let (c, _in_use) = client(&s, &id)?;
        let procs = c.proc_list().map_err(|e| proc_error(&id, e))?;
        Ok(Json(procs.into_iter().map(process_view::info).collect()))
    })
    .await
}

/// `POST /v1/sandboxes/{id}/processes`: 201 with the process, once it runs.
pub async fn start(
    State(s): State<AppState>,
    Param(id): Param,
    JsonBody(req): JsonBody<StartProcessRequest>,
) -> Result<(StatusCode, Json<ProcessInfo>), ApiError> {
    let agent_req = process_view::agent_request(&req).map_err(|e| ApiError::new(e.code(), e.to_string()))?;
    s.blocking(move |s| {
        let (c, _in_use) = client(&s, &id)?;
        let started = c.proc_start(&agent_req).map_err(|e| proc_error(&id, e))?;
        Ok((StatusCode::CREATED, Json(process_view::info(started))))
    })
    .await
}

/// `GET /v1/sandboxes/{id}/processes/{pid}/output?offset=&follow=`: NDJSON
/// [`ProcessOutputEvent`] lines. The attachment is made before the response starts (an
/// unknown pid or an offset past the end is a 404 or 400); a follower that goes away is
/// noticed at its next line or keepalive.
pub async fn output(
    State(s): State<AppState>,
    Path((id, pid)): Path<(String, String)>,
    QueryArgs(q): QueryArgs<ProcessOutputQuery>,
) -> Result<Response, ApiError> {
    let pid = pid_of(&pid)?;
    let id2 = id.clone();
    let (attachment, in_use) = s
        .blocking(move |s| {
            let (c, in_use) = client(&s, &id2)?;
            let req = ProcAttachRequest { pid, offset: q.offset, follow: q.follow };
            let attachment = c.proc_attach(&req).map_err(|e| proc_error(&id2, e))?;
            Ok((attachment, in_use))
        })
        .await?;
    let (tx, rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(64);
    tokio::task::spawn_blocking(move || {
        // A follower keeps the sandbox from idle pause, as a watch does.
        let _in_use = in_use;
        let mut send = |e: ProcessOutputEvent| tx.blocking_send(ndjson_line(&e)).is_ok();
        if let Err(e) = process_view::relay(attachment, &mut send) {
            send(ProcessOutputEvent::Error { error: agent_error(&id, e).message });
        }
    });
    let body = Body::from_stream(futures_util::StreamExt::map(
        tokio_stream::wrappers::ReceiverStream::new(rx),
        Ok::<_, std::io::Error>,
    ));
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], body).into_response())
}

/// `POST /v1/sandboxes/{id}/processes/{pid}/input?close=`: the body goes to the
/// process's stdin (streamed), then its stdin is closed when asked.
pub async fn input(
    State(s): State<AppState>,
    Path((id, pid)): Path<(String, String)>,
    QueryArgs(q): QueryArgs<ProcessInputQuery>,
    body: Body,
) -> Result<Json<ProcessInputWritten>, ApiError> {
    let pid = pid_of(&pid)?;
    let (mut reader, feeder) = body_reader(body);
    let written = s
        .blocking(move |s| {
            let (c, _in_use) = client(&s, &id)?;
            c.proc_input(pid, &mut reader, q.close).map_err(|e| proc_error(&id, e))
        })
        .await;
    feeder.abort();
    Ok(Json(ProcessInputWritten { bytes: written? }))
}

/// `POST /v1/sandboxes/{id}/processes/{pid}/signal`: to its process group; 204.
pub async fn signal(
    State(s): State<AppState>,
    Path((id, pid)): Path<(String, String)>,
    JsonBody(req): JsonBody<SignalProcessRequest>,
) -> Result<StatusCode, ApiError> {
    let pid = pid_of(&pid)?;
    if !(1..=64).contains(&req.signal) {
        return Err(ApiError::bad_request(format!("signal {} is not a signal number (1..=64)", req.signal)));
    }
    s.blocking(move |s| {
        let (c, _in_use) = client(&s, &id)?;
        c.signal(pid, req.signal).map_err(|e| proc_error(&id, e))?;
        Ok(StatusCode::NO_CONTENT)
    })
    .await
}

/// `POST /v1/sandboxes/{id}/processes/{pid}/resize`: its terminal's new size; 204.
pub async fn resize(
    State(s): State<AppState>,
    Path((id, pid)): Path<(String, String)>,
    JsonBody(size): JsonBody<TerminalSize>,
) -> Result<StatusCode, ApiError> {
    let pid = pid_of(&pid)?;
    let size = process_view::pty_size(size);
    if !size.is_valid() {
        return Err(ApiError::bad_request(format!(
            "a terminal of {}x{}: rows and cols must be between 1 and 1000",
            size.rows, size.cols
        )));
    }
    s.blocking(move |s| {
        let (c, _in_use) = client(&s, &id)?;
        c.proc_resize(pid, size).map_err(|e| proc_error(&id, e))?;
        Ok(StatusCode::NO_CONTENT)
    })
    .await
}
