//! `process.Process` on the agent's background processes (`forkvm_proto::procs`): Start
//! runs a command the agent keeps (as the call's user, with the sandbox's and the
//! request's environment, `Connect-Timeout-Ms` as its lifetime, on a terminal when asked)
//! and streams envd's events from its output: `start` with the pid first, then `data`
//! (`stdout`, `stderr`, or `pty`), keepalives, then `end`. The process is the agent's,
//! so a client that goes away stops only its stream (envd's behaviour); Connect attaches
//! another stream from that moment, List and SendSignal find it by pid or tag, and
//! SendInput, StreamInput, CloseStdin and Update (a terminal's size) reach it.

use super::{open, Call};
use crate::e2b::connect::{self, RpcError};
use crate::e2b::records::E2bSandbox;
use crate::e2b::E2b;
use axum::body::Bytes;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use forkvm_proto::{Command, ExitStatus, ProcAttachRequest, ProcEvent, ProcInfo, ProcStartRequest, PtySize};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

/// Largest unary request body (and a StreamInput's whole body).
const MAX_REQUEST: usize = 1 << 20;

/// `ProcessConfig`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ProcessConfig {
    pub cmd: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub envs: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
}

/// `PTY`: `{"size": {"cols", "rows"}}`.
#[derive(Debug, Clone, Copy, Deserialize)]
struct Pty {
    size: PtySizeMsg,
}

#[derive(Debug, Clone, Copy, Deserialize)]
struct PtySizeMsg {
    cols: u16,
    rows: u16,
}

impl PtySizeMsg {
    fn size(self) -> PtySize {
        PtySize { rows: self.rows, cols: self.cols }
    }
}

#[derive(Debug, Deserialize)]
struct StartRequest {
    process: ProcessConfig,
    #[serde(default)]
    stdin: Option<bool>,
    #[serde(default)]
    pty: Option<Pty>,
    #[serde(default)]
    tag: Option<String>,
}

/// `ProcessSelector`: a pid or a tag.
#[derive(Debug, Deserialize)]
struct Selector {
    #[serde(default)]
    pid: Option<u32>,
    #[serde(default)]
    tag: Option<String>,
}

#[derive(Debug, Deserialize)]
struct SelectorRequest {
    process: Selector,
}

#[derive(Debug, Deserialize)]
struct SignalRequest {
    process: Selector,
    signal: serde_json::Value,
}

/// `ProcessInput`: `{"stdin": b64}` or `{"pty": b64}`.
#[derive(Debug, Deserialize)]
struct Input {
    #[serde(default)]
    stdin: Option<String>,
    #[serde(default)]
    pty: Option<String>,
}

impl Input {
    fn bytes(&self) -> Result<Vec<u8>, RpcError> {
        let text = self.stdin.as_deref().or(self.pty.as_deref()).unwrap_or("");
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(|e| RpcError::invalid(format!("input is not base64: {e}")))
    }
}

#[derive(Debug, Deserialize)]
struct SendInputRequest {
    process: Selector,
    input: Input,
}

#[derive(Debug, Deserialize)]
struct UpdateRequest {
    process: Selector,
    #[serde(default)]
    pty: Option<Pty>,
}

/// One message of a StreamInput: `start` (the process) first, then `data` and
/// `keepalive`.
#[derive(Debug, Deserialize)]
struct StreamInputMessage {
    #[serde(default)]
    start: Option<SelectorRequest>,
    #[serde(default)]
    data: Option<StreamInputData>,
}

#[derive(Debug, Deserialize)]
struct StreamInputData {
    input: Input,
}

/// What envd was asked to start, by sandbox and pid: List reports the configuration as
/// given (the agent keeps only the argv). Entries of processes the agent no longer runs
/// go at the next List.
#[derive(Debug, Default, Clone)]
pub struct Processes(Arc<Mutex<HashMap<String, HashMap<u32, ProcessConfig>>>>);

impl Processes {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, HashMap<u32, ProcessConfig>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The event envelopes of a stream, as envd writes them.
fn event(body: serde_json::Value) -> Bytes {
    connect::message(&serde_json::json!({ "event": body }))
}

fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// Go's `ProcessState.String()` for a signal, as envd reports it.
fn signal_status(signal: i32) -> String {
    let name = match signal {
        1 => "hangup",
        2 => "interrupt",
        3 => "quit",
        6 => "aborted",
        9 => "killed",
        13 => "broken pipe",
        15 => "terminated",
        n => return format!("signal: signal {n}"),
    };
    format!("signal: {name}")
}

/// envd's `end` event for how a process ended.
fn end_event(st: &ExitStatus) -> serde_json::Value {
    let mut end = serde_json::Map::new();
    match (st.code, st.signal) {
        (Some(code), _) => {
            if code != 0 {
                end.insert("exitCode".into(), code.into());
            }
            end.insert("exited".into(), true.into());
            end.insert("status".into(), format!("exit status {code}").into());
        }
        (None, signal) => {
            end.insert("exitCode".into(), (-1).into());
            end.insert("status".into(), signal_status(signal.unwrap_or(9)).into());
        }
    }
    if st.timed_out {
        end.insert("error".into(), "context deadline exceeded".into());
    }
    serde_json::json!({ "end": end })
}

/// The agent's request for a Start.
fn proc_request(call: &Call, req: &StartRequest, timeout_ms: Option<u64>) -> Result<ProcStartRequest, RpcError> {
    let cfg = &req.process;
    if cfg.cmd.is_empty() {
        return Err(RpcError::invalid("process.cmd is empty"));
    }
    let mut argv = vec![cfg.cmd.clone()];
    argv.extend(cfg.args.iter().cloned());
    let mut env: Vec<(String, String)> = call.rec.env_vars.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    env.extend(cfg.envs.iter().map(|(k, v)| (k.clone(), v.clone())));
    let cwd = cfg.cwd.as_deref().filter(|c| !c.is_empty()).map(|c| call.resolve(c)).transpose()?;
    let pty = req.pty.map(|p| p.size.size());
    if let Some(size) = pty.filter(|s| !s.is_valid()) {
        return Err(RpcError::invalid(format!("pty size {}x{}: 1 to 1000 each", size.cols, size.rows)));
    }
    if req.tag.as_ref().is_some_and(|t| t.len() > forkvm_proto::procs::MAX_TAG) {
        return Err(RpcError::invalid("tag is longer than 128 bytes"));
    }
    Ok(ProcStartRequest {
        command: Command::Argv(argv),
        env,
        cwd,
        user: Some(call.user.clone()),
        pty,
        tag: req.tag.clone(),
        // The largest ring: a stream that falls behind the process (a slow client)
        // loses output only past 16 MiB not yet read.
        ring_bytes: Some(forkvm_proto::procs::MAX_RING_BYTES),
        timeout_ms: timeout_ms.filter(|&t| t > 0),
    })
}

pub async fn serve(e2b: E2b, rec: E2bSandbox, user: String, rpc: &str, req: Request) -> Response {
    let timeout_ms = connect::timeout_ms(req.headers());
    let body = match super::body_bytes(req, MAX_REQUEST).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    match rpc {
        "Start" => match connect::stream_request::<StartRequest>(&body) {
            Ok(r) => start(e2b, rec, user, r, timeout_ms).await,
            Err(e) => connect::stream_error(e),
        },
        "Connect" => match connect::stream_request::<SelectorRequest>(&body) {
            Ok(r) => reconnect(e2b, rec, user, r.process).await,
            Err(e) => connect::stream_error(e),
        },
        "List" => list(e2b, rec, user).await.unwrap_or_else(IntoResponse::into_response),
        "SendSignal" => match connect::unary_request::<SignalRequest>(&body) {
            Ok(r) => signal(e2b, rec, user, r).await.unwrap_or_else(IntoResponse::into_response),
            Err(e) => e.into_response(),
        },
        "SendInput" => match connect::unary_request::<SendInputRequest>(&body) {
            Ok(r) => send_input(e2b, rec, user, r).await.unwrap_or_else(IntoResponse::into_response),
            Err(e) => e.into_response(),
        },
        "StreamInput" => stream_input(e2b, rec, user, &body).await.unwrap_or_else(connect::stream_error),
        "CloseStdin" => match connect::unary_request::<SelectorRequest>(&body) {
            Ok(r) => close_stdin(e2b, rec, user, r).await.unwrap_or_else(IntoResponse::into_response),
            Err(e) => e.into_response(),
        },
        "Update" => match connect::unary_request::<UpdateRequest>(&body) {
            Ok(r) => update(e2b, rec, user, r).await.unwrap_or_else(IntoResponse::into_response),
            Err(e) => e.into_response(),
        },
        other => RpcError::unimplemented(format!("process.Process has no {other}")).into_response(),
    }
}

/// Runs `f` with the call's agent on a blocking thread.
async fn blocking<T: Send + 'static>(
    call: Call,
    f: impl FnOnce(&Call) -> Result<T, RpcError> + Send + 'static,
) -> Result<T, RpcError> {
    tokio::task::spawn_blocking(move || f(&call)).await.map_err(|e| RpcError::internal(e.to_string()))?
}

/// The process `sel` names among those the agent keeps (running, unless `ended_too`).
fn find(call: &Call, sel: &Selector, ended_too: bool) -> Result<ProcInfo, RpcError> {
    let procs = call.agent.proc_list().map_err(RpcError::from)?;
    procs
        .into_iter()
        .filter(|p| ended_too || p.exit.is_none())
        .find(|p| match (sel.pid, &sel.tag) {
            (Some(pid), _) => p.pid == pid,
            (None, Some(tag)) => p.tag.as_deref() == Some(tag.as_str()),
            (None, None) => false,
        })
        .ok_or_else(|| RpcError::not_found(format!("no running process matches {sel:?}")))
}

async fn start(e2b: E2b, rec: E2bSandbox, user: String, req: StartRequest, timeout_ms: Option<u64>) -> Response {
    let call = match open(&e2b, &rec, user).await {
        Ok(c) => c,
        Err(e) => return connect::stream_error(e),
    };
    let agent_req = match proc_request(&call, &req, timeout_ms) {
        Ok(x) => x,
        Err(e) => return connect::stream_error(e),
    };
    let processes = e2b.processes.clone();
    let (config, stdin, sandbox) = (req.process, req.stdin == Some(true), rec.id.clone());
    let started = tokio::task::spawn_blocking(move || {
        let info = call.agent.proc_start(&agent_req)?;
        // Without stdin (envd's default), its input is closed at once: a read sees the
        // end, as from /dev/null. A terminal always takes input.
        if !stdin && agent_req.pty.is_none() {
            call.agent.proc_input(info.pid, &mut &[][..], true)?;
        }
        Ok::<_, forkvm_proto::ClientError>((call, info))
    })
    .await;
    let (call, info) = match started {
        Ok(Ok(x)) => x,
        Ok(Err(e)) => return connect::stream_error(RpcError::from(e)),
        Err(e) => return connect::stream_error(RpcError::internal(e.to_string())),
    };
    processes.lock().entry(sandbox).or_default().insert(info.pid, config);
    stream_events(call, info, Some(0))
}

/// `Connect`: a process's events from now on (its start event first; one that already
/// ended answers its end).
async fn reconnect(e2b: E2b, rec: E2bSandbox, user: String, sel: Selector) -> Response {
    let call = match open(&e2b, &rec, user).await {
        Ok(c) => c,
        Err(e) => return connect::stream_error(e),
    };
    let found = tokio::task::spawn_blocking(move || find(&call, &sel, true).map(|p| (call, p))).await;
    match found {
        Ok(Ok((call, info))) => {
            let from = info.output_end;
            stream_events(call, info, Some(from))
        }
        Ok(Err(e)) => connect::stream_error(e),
        Err(e) => connect::stream_error(RpcError::internal(e.to_string())),
    }
}

/// The stream of a process's events from `offset`: `start`, its output as `data`,
/// keepalives, `end`. A reader that goes away ends only the stream.
fn stream_events(call: Call, info: ProcInfo, offset: Option<u64>) -> Response {
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    tokio::task::spawn_blocking(move || {
        let Call { agent, in_use, .. } = call;
        let _in_use = in_use;
        let send = |b: Bytes| tx.blocking_send(b).is_ok();
        if !send(event(serde_json::json!({ "start": { "pid": info.pid } }))) {
            return;
        }
        let on_terminal = info.pty.is_some();
        let req = ProcAttachRequest { pid: info.pid, offset, follow: true };
        let mut attached = match agent.proc_attach(&req) {
            Ok(a) => a,
            Err(e) => {
                send(connect::end_stream(Some(&RpcError::from(e))));
                return;
            }
        };
        loop {
            let line = match attached.recv() {
                Ok(Some(ProcEvent::Stdout(b))) if on_terminal => {
                    event(serde_json::json!({ "data": { "pty": b64(&b) } }))
                }
                Ok(Some(ProcEvent::Stdout(b))) => event(serde_json::json!({ "data": { "stdout": b64(&b) } })),
                Ok(Some(ProcEvent::Stderr(b))) => event(serde_json::json!({ "data": { "stderr": b64(&b) } })),
                Ok(Some(ProcEvent::Keepalive)) => event(serde_json::json!({ "keepalive": {} })),
                Ok(Some(ProcEvent::From { .. })) => continue,
                Ok(Some(ProcEvent::End(p))) => {
                    let st =
                        p.exit.unwrap_or(ExitStatus { code: None, signal: None, timed_out: false, duration_ms: 0 });
                    if send(event(end_event(&st))) {
                        send(connect::end_stream(None));
                    }
                    return;
                }
                Ok(None) => return,
                Err(e) => {
                    send(connect::end_stream(Some(&RpcError::from(e))));
                    return;
                }
            };
            if !send(line) {
                return;
            }
        }
    });
    connect::stream_response(rx)
}

async fn list(e2b: E2b, rec: E2bSandbox, user: String) -> Result<Response, RpcError> {
    let call = open(&e2b, &rec, user).await?;
    let running: Vec<ProcInfo> =
        blocking(call, |c| Ok(c.agent.proc_list()?.into_iter().filter(|p| p.exit.is_none()).collect())).await?;
    let mut all = e2b.processes.lock();
    let asked = all.entry(rec.id.clone()).or_default();
    asked.retain(|pid, _| running.iter().any(|p| p.pid == *pid));
    let processes: Vec<serde_json::Value> = running
        .iter()
        .map(|p| {
            let config = asked.get(&p.pid).cloned().unwrap_or_else(|| ProcessConfig {
                cmd: p.argv.first().cloned().unwrap_or_default(),
                args: p.argv.iter().skip(1).cloned().collect(),
                ..ProcessConfig::default()
            });
            let mut v = serde_json::json!({ "config": config, "pid": p.pid });
            if let Some(tag) = &p.tag {
                v["tag"] = tag.clone().into();
            }
            v
        })
        .collect();
    Ok(connect::unary(&serde_json::json!({ "processes": processes })))
}

async fn signal(e2b: E2b, rec: E2bSandbox, user: String, req: SignalRequest) -> Result<Response, RpcError> {
    let signal = signal_number(&req.signal)?;
    let call = open(&e2b, &rec, user).await?;
    blocking(call, move |c| {
        let p = find(c, &req.process, false)?;
        Ok(c.agent.signal(p.pid, signal)?)
    })
    .await?;
    Ok(connect::unary(&serde_json::json!({})))
}

async fn send_input(e2b: E2b, rec: E2bSandbox, user: String, req: SendInputRequest) -> Result<Response, RpcError> {
    let bytes = req.input.bytes()?;
    let call = open(&e2b, &rec, user).await?;
    blocking(call, move |c| {
        let p = find(c, &req.process, false)?;
        Ok(c.agent.proc_input(p.pid, &mut bytes.as_slice(), false)?)
    })
    .await?;
    Ok(connect::unary(&serde_json::json!({})))
}

/// `StreamInput` (client streaming): the `start` message names the process, each `data`
/// message's input goes to it in order; answered as a stream (one message, then its end).
async fn stream_input(e2b: E2b, rec: E2bSandbox, user: String, body: &[u8]) -> Result<Response, RpcError> {
    let mut rest = body;
    let mut target: Option<Selector> = None;
    let mut chunks: Vec<Vec<u8>> = Vec::new();
    while let Some((flags, msg)) = connect::next_envelope(&mut rest)? {
        if flags & connect::END_STREAM != 0 {
            break; // the end of the client's stream
        }
        let m: StreamInputMessage =
            serde_json::from_slice(msg).map_err(|e| RpcError::invalid(format!("invalid message: {e}")))?;
        if let Some(start) = m.start {
            target = Some(start.process);
        } else if let Some(data) = m.data {
            chunks.push(data.input.bytes()?);
        }
    }
    let sel = target.ok_or_else(|| RpcError::invalid("the stream has no start message naming the process"))?;
    let call = open(&e2b, &rec, user).await?;
    blocking(call, move |c| {
        let p = find(c, &sel, false)?;
        for chunk in &chunks {
            c.agent.proc_input(p.pid, &mut chunk.as_slice(), false)?;
        }
        Ok(())
    })
    .await?;
    Ok(connect::stream_reply(&serde_json::json!({})))
}

async fn close_stdin(e2b: E2b, rec: E2bSandbox, user: String, req: SelectorRequest) -> Result<Response, RpcError> {
    let call = open(&e2b, &rec, user).await?;
    blocking(call, move |c| {
        let p = find(c, &req.process, false)?;
        Ok(c.agent.proc_input(p.pid, &mut &[][..], true)?)
    })
    .await?;
    Ok(connect::unary(&serde_json::json!({})))
}

/// `Update`: a terminal's new size.
async fn update(e2b: E2b, rec: E2bSandbox, user: String, req: UpdateRequest) -> Result<Response, RpcError> {
    let Some(pty) = req.pty else { return Ok(connect::unary(&serde_json::json!({}))) };
    let call = open(&e2b, &rec, user).await?;
    blocking(call, move |c| {
        let p = find(c, &req.process, false)?;
        Ok(c.agent.proc_resize(p.pid, pty.size.size())?)
    })
    .await?;
    Ok(connect::unary(&serde_json::json!({})))
}

/// A `Signal` enum value (name or number) as a signal number.
fn signal_number(v: &serde_json::Value) -> Result<i32, RpcError> {
    match v {
        serde_json::Value::String(s) if s == "SIGNAL_SIGKILL" => Ok(9),
        serde_json::Value::String(s) if s == "SIGNAL_SIGTERM" => Ok(15),
        serde_json::Value::Number(n) if n.as_i64() == Some(9) || n.as_i64() == Some(15) => {
            Ok(n.as_i64().unwrap_or(9) as i32)
        }
        other => Err(RpcError::invalid(format!("signal {other}: SIGNAL_SIGKILL or SIGNAL_SIGTERM"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ends_are_reported_as_envd_does() {
        let st = |code, signal| ExitStatus { code, signal, timed_out: false, duration_ms: 1 };
        assert_eq!(
            end_event(&st(Some(0), None)),
            serde_json::json!({"end": {"exited": true, "status": "exit status 0"}})
        );
        assert_eq!(
            end_event(&st(Some(3), None)),
            serde_json::json!({"end": {"exitCode": 3, "exited": true, "status": "exit status 3"}})
        );
        assert_eq!(
            end_event(&st(None, Some(9))),
            serde_json::json!({"end": {"exitCode": -1, "status": "signal: killed"}})
        );
        assert_eq!(signal_status(15), "signal: terminated");
        assert_eq!(signal_number(&serde_json::json!("SIGNAL_SIGKILL")).unwrap(), 9);
        assert_eq!(signal_number(&serde_json::json!(15)).unwrap(), 15);
        assert!(signal_number(&serde_json::json!("SIGNAL_SIGSTOP")).is_err());
    }
}
