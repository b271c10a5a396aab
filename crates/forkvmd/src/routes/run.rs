//! Talking to a sandbox's agent: ping, exec (collected or streamed as NDJSON), eval.

use crate::error::{agent_error, agent_error_in, ApiError};
use crate::extract::{JsonBody, Param};
use crate::lifecycle::{use_sandbox, InUse};
use crate::state::AppState;
use axum::body::Body;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use forkvm_api::{EvalRequest, EvalResponse, ExecEvent, ExecRequest, ExecResponse};
use forkvm_proto::{AgentClient, ExitStatus};
use forkvm_sandbox::exec_view::{self, exit_code, not_started};
use forkvm_sandbox::guest::AGENT_PORT;
use std::os::unix::net::UnixStream;

/// The agent of running sandbox `id` (resumed if the daemon paused it), and the guard
/// that keeps it from being paused while the call runs.
pub(crate) fn client(s: &AppState, id: &str) -> Result<(AgentClient<UnixStream>, InUse), ApiError> {
    let (r, in_use) = use_sandbox(s, id)?;
    Ok((AgentClient::vsock_uds(r.vsock(), AGENT_PORT), in_use))
}

/// The agent's exec request for an API exec request.
fn agent_request(req: &ExecRequest) -> Result<forkvm_proto::ExecRequest, ApiError> {
    exec_view::agent_request(req).map_err(|e| ApiError::new(e.code(), e.to_string()))
}

fn exit_event(st: &ExitStatus) -> ExecEvent {
    ExecEvent::Exit {
        exit_code: exit_code(st),
        signal: st.signal,
        timed_out: st.timed_out,
        duration_ms: st.duration_ms,
    }
}

/// `POST /v1/sandboxes/{id}/ping`: the agent's pong, with forkd's fields added.
pub async fn ping(State(s): State<AppState>, Param(id): Param) -> Result<Json<serde_json::Value>, ApiError> {
    s.blocking(move |s| {
        let (c, _in_use) = client(&s, &id)?;
        let pong = c.ping().map_err(|e| agent_error_in(&s.registry, &id, e))?;
        let warm = pong.eval_available;
        let mut reply = serde_json::to_value(pong).map_err(|e| ApiError::internal(e.to_string()))?;
        // forkd's agent's fields: no forkd client reads them, but they are its documented shape.
        reply["pong"] = true.into();
        reply["warmup_ready"] = warm.into();
        reply["agent_lang"] = if warm { "python".into() } else { serde_json::Value::Null };
        Ok(Json(reply))
    })
    .await
}

/// Teaches the sandbox's spawn's memory playbook what its first call touched, off the
/// reply's path (`memory_playbook::learn_after_first_call`; a no-op after the first).
fn learn_after_first_call(s: &AppState, id: &str) {
    if let Some(r) = forkvm_sandbox::memory_playbook::pending_first_call(&s.registry, id) {
        std::thread::spawn(move || forkvm_sandbox::memory_playbook::learn_after_first_call(&r));
    }
}

pub async fn exec(
    State(s): State<AppState>,
    Param(id): Param,
    JsonBody(req): JsonBody<ExecRequest>,
) -> Result<Json<ExecResponse>, ApiError> {
    let agent_req = agent_request(&req)?;
    let cap = output_cap(&req)?;
    s.blocking(move |s| {
        let (c, _in_use) = client(&s, &id)?;
        let (mut stdout, mut stderr) = (BoundedOutput::new(cap), BoundedOutput::new(cap));
        let stdin = req.stdin.as_deref().unwrap_or("").as_bytes();
        let mut src = stdin;
        let src: Option<&mut dyn std::io::Read> = if stdin.is_empty() { None } else { Some(&mut src) };
        let status = match c.exec(&agent_req, src, &mut |b| stdout.push(b), &mut |b| stderr.push(b)) {
            Ok(status) => status,
            // A program that cannot start ends as in a shell (127/126), as the stream
            // does: a 404 always means the sandbox (forkd's clients read it so).
            Err(e) => match not_started(&e) {
                Some((code, reason)) => {
                    stderr.push(reason.as_bytes());
                    ExitStatus { code: Some(code), signal: None, timed_out: false, duration_ms: 0 }
                }
                None => return Err(agent_error_in(&s.registry, &id, e)),
            },
        };
        learn_after_first_call(&s, &id);
        drop(_in_use);
        let text = req.cmd.clone().unwrap_or_else(|| req.args.join(" "));
        crate::checkpoints::after_call(&s, &id, "exec", &text);
        Ok(Json(ExecResponse {
            truncated: stdout.truncated() || stderr.truncated(),
            stdout_bytes: stdout.seen,
            stderr_bytes: stderr.seen,
            stdout: String::from_utf8_lossy(&stdout.kept).into_owned(),
            stderr: String::from_utf8_lossy(&stderr.kept).into_owned(),
            exit_code: exit_code(&status),
            signal: status.signal,
            timed_out: status.timed_out,
            duration_ms: status.duration_ms,
        }))
    })
    .await
}

/// The per-stream output cap of a collected exec.
fn output_cap(req: &ExecRequest) -> Result<usize, ApiError> {
    match req.max_output_bytes {
        None => Ok(forkvm_api::DEFAULT_MAX_OUTPUT_BYTES as usize),
        Some(n) if (1..=forkvm_api::MAX_OUTPUT_BYTES).contains(&n) => Ok(n as usize),
        Some(n) => Err(ApiError::bad_request(format!(
            "max_output_bytes must be between 1 and {}, got {n}",
            forkvm_api::MAX_OUTPUT_BYTES
        ))),
    }
}

/// One output stream of a collected exec: the first `cap` bytes kept, every byte
/// counted. A guest can print without end; the daemon holds at most `cap`.
#[derive(Debug)]
struct BoundedOutput {
    kept: Vec<u8>,
    seen: u64,
    cap: usize,
}

impl BoundedOutput {
    fn new(cap: usize) -> BoundedOutput {
        BoundedOutput { kept: Vec::new(), seen: 0, cap }
    }
    fn push(&mut self, chunk: &[u8]) {
        self.seen += chunk.len() as u64;
        let room = self.cap.saturating_sub(self.kept.len());
        self.kept.extend_from_slice(&chunk[..chunk.len().min(room)]);
    }
    fn truncated(&self) -> bool {
        self.seen > self.kept.len() as u64
    }
}

/// One NDJSON line of a streamed answer (the exec and watch streams); a value that
/// cannot be encoded becomes an `error` line.
pub(crate) fn ndjson_line<T: serde::Serialize>(e: &T) -> bytes::Bytes {
    let mut v = serde_json::to_vec(e).unwrap_or_else(|_| b"{\"type\":\"error\",\"error\":\"encoding\"}".to_vec());
    v.push(b'\n');
    bytes::Bytes::from(v)
}

/// Output lines are sent as they arrive; the response status is 200 once the sandbox is
/// found, so a failure after that is an `error` line, never a truncated stream.
pub async fn exec_stream(
    State(s): State<AppState>,
    Param(id): Param,
    JsonBody(req): JsonBody<ExecRequest>,
) -> Result<Response, ApiError> {
    let agent_req = agent_request(&req)?;
    let id2 = id.clone();
    let s2 = s.clone();
    let (c, in_use) = s.blocking(move |s| client(&s, &id2)).await?;
    let (tx, rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(64);
    let text = req.cmd.clone().unwrap_or_else(|| req.args.join(" "));
    tokio::task::spawn_blocking(move || {
        let _in_use = in_use;
        let send = |e: ExecEvent| {
            let _ = tx.blocking_send(ndjson_line(&e));
        };
        let stdin = req.stdin.unwrap_or_default();
        let mut src = stdin.as_bytes();
        let src: Option<&mut dyn std::io::Read> = if stdin.is_empty() { None } else { Some(&mut src) };
        let result = c.exec(
            &agent_req,
            src,
            &mut |chunk| send(ExecEvent::Stdout { data: String::from_utf8_lossy(chunk).into_owned() }),
            &mut |chunk| send(ExecEvent::Stderr { data: String::from_utf8_lossy(chunk).into_owned() }),
        );
        match result {
            Ok(st) => {
                // Before the exit line: a client that waits for it finds the checkpoint made.
                crate::checkpoints::after_call(&s2, &id, "exec", &text);
                send(exit_event(&st));
                learn_after_first_call(&s2, &id);
            }
            Err(e) => match not_started(&e) {
                Some((exit_code, stderr)) => {
                    send(ExecEvent::Stderr { data: stderr });
                    send(ExecEvent::Exit { exit_code, signal: None, timed_out: false, duration_ms: 0 });
                }
                None => send(ExecEvent::Error { error: agent_error(&id, e).message }),
            },
        }
    });
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    let body = Body::from_stream(futures_util::StreamExt::map(stream, Ok::<_, std::io::Error>));
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], body).into_response())
}

pub async fn eval(
    State(s): State<AppState>,
    Param(id): Param,
    JsonBody(req): JsonBody<EvalRequest>,
) -> Result<Json<EvalResponse>, ApiError> {
    s.blocking(move |s| {
        let (c, _in_use) = client(&s, &id)?;
        let r = c.eval(&req.code).map_err(|e| agent_error_in(&s.registry, &id, e))?;
        learn_after_first_call(&s, &id);
        drop(_in_use);
        crate::checkpoints::after_call(&s, &id, "eval", &req.code);
        Ok(Json(forkvm_sandbox::info::eval_response(r)))
    })
    .await
}

#[cfg(test)]
mod tests {
    #[test]
    fn output_is_kept_up_to_the_cap_and_counted_beyond() {
        let mut out = super::BoundedOutput::new(5);
        out.push(b"abc");
        assert!(!out.truncated());
        out.push(b"defgh");
        out.push(&[b'x'; 1 << 20]);
        assert_eq!((out.kept.as_slice(), out.seen, out.truncated()), (&b"abcde"[..], 8 + (1 << 20), true));
    }
}
