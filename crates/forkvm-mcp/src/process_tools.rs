//! The MCP tools for background processes: a server, a watcher or a long build started
//! and left running (`start_process`), its output read from an offset while it runs or
//! after (`process_output`, a window at a time, as `read_file` pages a file), input
//! (`send_input`), signals (`stop_process`) and the list (`list_processes`). The agent
//! keeps each process and its output in the sandbox; nothing here holds a connection.

use crate::params::{
    ListProcessesArgs, ProcessOutputArgs, SendInputArgs, StartProcessArgs, StopProcessArgs, MAX_SHOWN,
};
use crate::tools::{invalid, json_reply, tool_error, ForkvmMcp, ToolReply};
use base64::Engine as _;
use forkvm_api::{ProcessInfo, ProcessOutputEvent, StartProcessRequest};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::{tool, tool_router};
use serde_json::json;

macro_rules! try_call {
    ($step:expr, $call:expr) => {
        match $call.await {
            Ok(v) => v,
            Err(e) => return Ok(tool_error($step, &e)),
        }
    };
}

/// What a read of a process's output found.
struct OutputWindow {
    from: u64,
    kept: Vec<u8>,
    /// More output than `max_bytes` was there.
    more: bool,
}

#[tool_router(router = process_router, vis = "pub(crate)")]
impl ForkvmMcp {
    #[tool(
        description = "Start a command in a sandbox and leave it running in the background (a server, a watcher, a long build): returns its `pid` at once. Read what it writes with `process_output`, feed it with `send_input`, stop it with `stop_process`. Its output is kept in the sandbox (the last `ring_bytes`, 1 MiB by default)."
    )]
    async fn start_process(&self, Parameters(a): Parameters<StartProcessArgs>) -> ToolReply {
        let req = StartProcessRequest {
            cmd: Some(a.command),
            env: a.env,
            cwd: a.cwd,
            tag: a.tag,
            ring_bytes: a.ring_bytes,
            timeout_secs: a.timeout_secs,
            ..StartProcessRequest::default()
        };
        let started =
            try_call!("starting the process", self.daemon.call(move |c| c.start_process(&a.sandbox_id, &req)));
        json_reply(&started)
    }

    #[tool(
        description = "Read a background process's output (stdout and stderr together, as written) from `offset`: up to `max_bytes`, with `next_offset` to read on from, whether it still runs, and how it ended. Call again with `next_offset` to follow it.",
        annotations(read_only_hint = true)
    )]
    async fn process_output(&self, Parameters(a): Parameters<ProcessOutputArgs>) -> ToolReply {
        if a.max_bytes == 0 || a.max_bytes > MAX_SHOWN {
            return Ok(invalid(format!("max_bytes must be between 1 and {MAX_SHOWN}, got {}", a.max_bytes)));
        }
        let (id, pid, max) = (a.sandbox_id.clone(), a.pid, a.max_bytes);
        let (window, ended) = try_call!(
            "reading the process's output",
            self.daemon.call(move |c| {
                let mut w = OutputWindow { from: a.offset.unwrap_or(0), kept: Vec::new(), more: false };
                let ended = c.process_output(&id, pid, a.offset, false, |e| take(&mut w, e, max))?;
                Ok((w, ended))
            })
        );
        let info: Option<ProcessInfo> = match ended {
            Some(p) => Some(p),
            None => {
                let id = a.sandbox_id.clone();
                let all = try_call!("reading the process's state", self.daemon.call(move |c| c.list_processes(&id)));
                all.into_iter().find(|p| p.pid == a.pid)
            }
        };
        let next = window.from + window.kept.len() as u64;
        // More is written than was read: the window filled, or output came meanwhile.
        let more = window.more || info.as_ref().is_some_and(|p| p.output_end > next);
        let mut reply = json!({
            "offset": window.from,
            "bytes": window.kept.len(),
            "next_offset": next,
            "more": more,
            "running": info.as_ref().map(|p| p.running),
            "exit_code": info.as_ref().and_then(|p| p.exit.as_ref()).map(|e| e.exit_code),
        });
        match String::from_utf8(window.kept) {
            Ok(text) => reply["text"] = json!(text),
            Err(e) => reply["base64"] = json!(base64::engine::general_purpose::STANDARD.encode(e.into_bytes())),
        }
        json_reply(&reply)
    }

    #[tool(description = "Send text to a background process's standard input (`close` ends its input after).")]
    async fn send_input(&self, Parameters(a): Parameters<SendInputArgs>) -> ToolReply {
        let (id, pid, close) = (a.sandbox_id, a.pid, a.close);
        let data = a.text.into_bytes();
        let bytes =
            try_call!("sending the input", self.daemon.call(move |c| c.process_input(&id, pid, &mut &data[..], close)));
        json_reply(&json!({ "bytes": bytes }))
    }

    #[tool(
        description = "Send a signal to a background process's process group: 15 (TERM, the default) asks it to stop, 9 (KILL) stops it, 2 (INT) is Ctrl-C.",
        annotations(destructive_hint = true)
    )]
    async fn stop_process(&self, Parameters(a): Parameters<StopProcessArgs>) -> ToolReply {
        let signal = a.signal.unwrap_or(15);
        if !(1..=64).contains(&signal) {
            return Ok(invalid(format!("signal must be between 1 and 64, got {signal}")));
        }
        let (id, pid) = (a.sandbox_id, a.pid);
        try_call!("signalling the process", self.daemon.call(move |c| c.signal_process(&id, pid, signal)));
        json_reply(&json!({ "signalled": pid, "signal": signal }))
    }

    #[tool(
        description = "List a sandbox's background processes, running and ended: pid, command, whether it runs, exit code, and `output_end` (the offset after its last byte of output).",
        annotations(read_only_hint = true)
    )]
    async fn list_processes(&self, Parameters(a): Parameters<ListProcessesArgs>) -> ToolReply {
        json_reply(&try_call!("listing the processes", self.daemon.call(move |c| c.list_processes(&a.sandbox_id))))
    }
}

/// Keeps an output event's bytes in the window; `false` (stop reading) once it is full.
fn take(w: &mut OutputWindow, e: &ProcessOutputEvent, max: usize) -> bool {
    match e {
        ProcessOutputEvent::From { offset, .. } => {
            w.from = *offset;
            true
        }
        ProcessOutputEvent::Output { data, .. } => {
            let bytes = base64::engine::general_purpose::STANDARD.decode(data).unwrap_or_default();
            let room = max - w.kept.len();
            if bytes.len() > room {
                w.kept.extend_from_slice(&bytes[..room]);
                w.more = true;
                return false;
            }
            w.kept.extend_from_slice(&bytes);
            w.kept.len() < max
        }
        _ => true,
    }
}
