//! `process.Process`: Start runs a command through the agent (as the call's user, with
//! the sandbox's and the request's environment, `Connect-Timeout-Ms` as its lifetime)
//! and streams envd's events: `start` with the pid first, then `data`, then `end`.
//! Each running process is listed per sandbox with a broadcast of its events, so List,
//! Connect (a second reader of the same events, from when it attaches) and SendSignal
//! (by pid or tag) reach it. A client that goes away does not stop the process (envd's
//! behaviour); its lifetime still ends it.
//!
//! Not yet: stdin (SendInput, StreamInput, CloseStdin) and PTYs (Update): the agent's
//! exec reads its whole stdin before it answers. They answer `unimplemented`.

use super::{open, Call};
use crate::e2b::connect::{self, RpcError};
use crate::e2b::records::E2bSandbox;
use crate::e2b::E2b;
use axum::body::Bytes;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use forkvm_proto::{Command, ExecRequest, ExitStatus};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use tokio::sync::{broadcast, mpsc};

/// Events a process's broadcast keeps for a slow reader before it drops the oldest.
const EVENT_BUFFER: usize = 1024;
/// Largest unary request body.
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

#[derive(Debug, Deserialize)]
struct StartRequest {
    process: ProcessConfig,
    #[serde(default)]
    stdin: Option<bool>,
    #[serde(default)]
    pty: Option<serde_json::Value>,
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

/// A process started through envd and still running.
#[derive(Debug)]
struct Tracked {
    config: ProcessConfig,
    tag: Option<String>,
    events: broadcast::Sender<Bytes>,
}

/// The running processes of every sandbox, by pid.
#[derive(Debug, Default, Clone)]
pub struct Processes(Arc<Mutex<HashMap<String, HashMap<u32, Tracked>>>>);

impl Processes {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, HashMap<u32, Tracked>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn find(&self, sandbox: &str, sel: &Selector) -> Option<u32> {
        let all = self.lock();
        let procs = all.get(sandbox)?;
        match (sel.pid, &sel.tag) {
            (Some(pid), _) => procs.contains_key(&pid).then_some(pid),
            (None, Some(tag)) => procs.iter().find(|(_, t)| t.tag.as_deref() == Some(tag)).map(|(pid, _)| *pid),
            (None, None) => None,
        }
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
fn exec_request(call: &Call, cfg: &ProcessConfig, timeout_ms: Option<u64>) -> Result<ExecRequest, RpcError> {
    if cfg.cmd.is_empty() {
        return Err(RpcError::invalid("process.cmd is empty"));
    }
    let mut argv = vec![cfg.cmd.clone()];
    argv.extend(cfg.args.iter().cloned());
    let mut env: Vec<(String, String)> = call.rec.env_vars.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    env.extend(cfg.envs.iter().map(|(k, v)| (k.clone(), v.clone())));
    let cwd = cfg.cwd.as_deref().filter(|c| !c.is_empty()).map(|c| call.resolve(c)).transpose()?;
    Ok(ExecRequest {
        command: Command::Argv(argv),
        env,
        cwd,
        stdin: false,
        timeout_ms: timeout_ms.filter(|&t| t > 0),
        user: Some(call.user.clone()),
        report_start: true,
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
            Ok(r) => attach(&e2b, &rec, &r.process),
            Err(e) => connect::stream_error(e),
        },
        "List" => list(&e2b, &rec),
        "SendSignal" => match connect::unary_request::<SignalRequest>(&body) {
            Ok(r) => signal(e2b, rec, user, r).await,
            Err(e) => e.into_response(),
        },
        "SendInput" | "StreamInput" | "CloseStdin" | "Update" => RpcError::unimplemented(format!(
            "process.Process/{rpc}: forkvm's envd has no stdin streams or PTYs yet (docs/e2b.md)"
        ))
        .into_response(),
        other => RpcError::unimplemented(format!("process.Process has no {other}")).into_response(),
    }
}

async fn start(e2b: E2b, rec: E2bSandbox, user: String, req: StartRequest, timeout_ms: Option<u64>) -> Response {
    if req.pty.is_some() {
        return connect::stream_error(RpcError::unimplemented("PTYs are not served yet (docs/e2b.md)"));
    }
    if req.stdin == Some(true) {
        return connect::stream_error(RpcError::unimplemented(
            "stdin for a started process is not served yet: start it with stdin=False (docs/e2b.md)",
        ));
    }
    let call = match open(&e2b, &rec, user).await {
        Ok(c) => c,
        Err(e) => return connect::stream_error(e),
    };
    let exec = match exec_request(&call, &req.process, timeout_ms) {
        Ok(x) => x,
        Err(e) => return connect::stream_error(e),
    };
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let processes = e2b.processes.clone();
    let (config, tag, sandbox) = (req.process, req.tag, rec.id.clone());
    tokio::task::spawn_blocking(move || {
        let Call { agent, in_use, .. } = call;
        let _in_use = in_use;
        // The first reader is this call's; Connect adds more. A reader that went away is
        // not an error: the process goes on.
        let (events, _) = broadcast::channel::<Bytes>(EVENT_BUFFER);
        let send = |b: Bytes| {
            let _ = tx.blocking_send(b.clone());
            let _ = events.send(b);
        };
        let mut pid = None;
        let mut on_start = |p: u32| {
            pid = Some(p);
            processes
                .lock()
                .entry(sandbox.clone())
                .or_default()
                .insert(p, Tracked { config: config.clone(), tag: tag.clone(), events: events.clone() });
            send(event(serde_json::json!({ "start": { "pid": p } })));
        };
        let result = agent.exec_reporting_start(
            &exec,
            None,
            Some(&mut on_start),
            &mut |chunk| send(event(serde_json::json!({ "data": { "stdout": b64(chunk) } }))),
            &mut |chunk| send(event(serde_json::json!({ "data": { "stderr": b64(chunk) } }))),
        );
        if let Some(p) = pid {
            let mut all = processes.lock();
            if let Some(procs) = all.get_mut(&sandbox) {
                procs.remove(&p);
                if procs.is_empty() {
                    all.remove(&sandbox);
                }
            }
        }
        match result {
            Ok(st) => {
                send(event(end_event(&st)));
                send(connect::end_stream(None));
            }
            Err(e) => send(connect::end_stream(Some(&RpcError::from(e)))),
        }
    });
    connect::stream_response(rx)
}

/// `Connect`: the events of a running process from now on (its start event first).
fn attach(e2b: &E2b, rec: &E2bSandbox, sel: &Selector) -> Response {
    let found = e2b.processes.find(&rec.id, sel).and_then(|pid| {
        let all = e2b.processes.lock();
        all.get(&rec.id)?.get(&pid).map(|t| (pid, t.events.subscribe()))
    });
    let Some((pid, mut events)) = found else {
        return connect::stream_error(RpcError::not_found(format!("no running process matches {sel:?}")));
    };
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    tokio::spawn(async move {
        if tx.send(event(serde_json::json!({ "start": { "pid": pid } }))).await.is_err() {
            return;
        }
        loop {
            match events.recv().await {
                Ok(b) => {
                    if tx.send(b).await.is_err() {
                        return;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    tracing::debug!(pid, n, "an envd Connect reader fell behind; events dropped");
                }
                // The process ended and its last event (the end of stream) went out.
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    });
    connect::stream_response(rx)
}

fn list(e2b: &E2b, rec: &E2bSandbox) -> Response {
    let all = e2b.processes.lock();
    let processes: Vec<serde_json::Value> = all
        .get(&rec.id)
        .map(|procs| {
            procs
                .iter()
                .map(|(pid, t)| {
                    let mut p = serde_json::json!({ "config": t.config, "pid": pid });
                    if let Some(tag) = &t.tag {
                        p["tag"] = tag.clone().into();
                    }
                    p
                })
                .collect()
        })
        .unwrap_or_default();
    connect::unary(&serde_json::json!({ "processes": processes }))
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

async fn signal(e2b: E2b, rec: E2bSandbox, user: String, req: SignalRequest) -> Response {
    let signal = match signal_number(&req.signal) {
        Ok(s) => s,
        Err(e) => return e.into_response(),
    };
    let Some(pid) = e2b.processes.find(&rec.id, &req.process) else {
        return RpcError::not_found(format!("no running process matches {:?}", req.process)).into_response();
    };
    let call = match open(&e2b, &rec, user).await {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    let sent = tokio::task::spawn_blocking(move || call.agent.signal(pid, signal)).await;
    match sent {
        Ok(Ok(())) => connect::unary(&serde_json::json!({})),
        Ok(Err(e)) => RpcError::from(e).into_response(),
        Err(e) => RpcError::internal(e.to_string()).into_response(),
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
