//! The MCP tools: forkvm's sandbox lifecycle as an agent calls it. Each tool is a thin
//! translation to one or two daemon calls; a failed call comes back as a tool error
//! carrying the daemon's message (never as a protocol error or a crashed server), so
//! the agent can read it and try again.

use crate::daemon::{CallError, Daemon};
use crate::output::{clip, Window, WINDOW_FULL};
use crate::params::*;
use base64::Engine as _;
use forkvm_api::{BranchSandboxRequest, CreateSandboxRequest, CreateSnapshotRequest, ExecRequest, ForkSandboxRequest};
use forkvm_client::{ClientError, WriteFileOptions};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock};
use rmcp::{tool, tool_router, ErrorData};
use serde::Serialize;
use serde_json::json;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A tool's reply.
pub type ToolReply = Result<CallToolResult, ErrorData>;

/// Where `exec` saves output too long to show, inside the sandbox.
pub const SAVED_OUTPUT_DIR: &str = "/tmp/forkvm-mcp";

/// The server: the daemon it drives and its tools.
#[derive(Debug, Clone)]
pub struct ForkvmMcp {
    pub(crate) daemon: Daemon,
    pub(crate) tool_router: ToolRouter<ForkvmMcp>,
    exec_seq: Arc<AtomicU64>,
}

/// A reply of JSON text (what agents read best), pretty-printed.
pub(crate) fn json_reply<T: Serialize>(value: &T) -> ToolReply {
    let text = serde_json::to_string_pretty(value).map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
    Ok(CallToolResult::success(vec![ContentBlock::text(text)]))
}

/// A tool error: the message and, for a daemon error, its chain of causes.
pub(crate) fn tool_error(step: &str, e: &CallError) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(format!("{step}: {}", describe(e)))])
}

pub(crate) fn invalid(message: impl Into<String>) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(message.into())])
}

/// `e` and its sources, joined by `: `.
pub(crate) fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        let text = cause.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        next = cause.source();
    }
    out
}

macro_rules! try_call {
    ($step:expr, $call:expr) => {
        match $call.await {
            Ok(v) => v,
            Err(e) => return Ok(tool_error($step, &e)),
        }
    };
}

fn check_count(n: u32) -> Result<(), CallToolResult> {
    if n == 0 || n > MAX_PER_CALL {
        return Err(invalid(format!("n must be between 1 and {MAX_PER_CALL}, got {n}")));
    }
    Ok(())
}

#[tool_router(router = tool_router)]
impl ForkvmMcp {
    pub fn new(daemon: Daemon) -> ForkvmMcp {
        ForkvmMcp {
            daemon,
            tool_router: Self::tool_router() + Self::process_router(),
            exec_seq: Arc::new(AtomicU64::new(0)),
        }
    }

    #[tool(
        description = "List the snapshots sandboxes can be spawned from: tag, template, status, whether bootable, and chain (branched_from).",
        annotations(read_only_hint = true)
    )]
    async fn list_snapshots(&self) -> ToolReply {
        json_reply(&try_call!("listing snapshots", self.daemon.call(|c| c.list_snapshots())))
    }

    #[tool(
        description = "Boot a template (e.g. `python`, `tiny`) once and save it as a snapshot tag to spawn sandboxes from. The first build of a template takes minutes; a cached one seconds."
    )]
    async fn create_snapshot(&self, Parameters(a): Parameters<CreateSnapshotArgs>) -> ToolReply {
        let req = CreateSnapshotRequest {
            tag: a.tag,
            template: a.template,
            default_limits: None,
            default_network: None,
            vcpus: a.vcpus,
        };
        json_reply(&try_call!("creating the snapshot", self.daemon.call(move |c| c.create_snapshot(&req))))
    }

    #[tool(
        description = "A snapshot's details: chain depth, parent, ancestors, dependents, memory and disk sizes.",
        annotations(read_only_hint = true)
    )]
    async fn snapshot_info(&self, Parameters(a): Parameters<TagArgs>) -> ToolReply {
        json_reply(&try_call!("reading the snapshot's info", self.daemon.call(move |c| c.snapshot_info(&a.tag))))
    }

    #[tool(
        description = "Delete a snapshot. Refused while other snapshots are built on it unless `cascade`.",
        annotations(destructive_hint = true)
    )]
    async fn delete_snapshot(&self, Parameters(a): Parameters<DeleteSnapshotArgs>) -> ToolReply {
        let tag = a.tag.clone();
        try_call!("deleting the snapshot", self.daemon.call(move |c| c.delete_snapshot(&a.tag, a.cascade, false)));
        json_reply(&json!({ "deleted": tag }))
    }

    #[tool(
        description = "List the sandboxes: id, the snapshot or sandbox it came from, state (running, paused, archived).",
        annotations(read_only_hint = true)
    )]
    async fn list_sandboxes(&self) -> ToolReply {
        json_reply(&try_call!("listing sandboxes", self.daemon.call(|c| c.list_sandboxes())))
    }

    #[tool(
        description = "The tree of what came from what: every sandbox and snapshot as a node (`sandbox:ID`, `snapshot:TAG`, with state and memory) and the edges between them: spawn (snapshot to a sandbox started from it), fork (sandbox to a child forked while it ran), branch (sandbox to a snapshot it branched into), chain (a diff link's parent to the link), compact.",
        annotations(read_only_hint = true)
    )]
    async fn lineage(&self) -> ToolReply {
        json_reply(&try_call!("reading the lineage", self.daemon.call(|c| c.lineage())))
    }

    #[tool(
        description = "Start `n` sandboxes from a snapshot, each a copy-on-write clone of it (milliseconds each): the snapshot's running processes, loaded modules and files, in its own VM. Returns their ids."
    )]
    async fn spawn(&self, Parameters(a): Parameters<SpawnArgs>) -> ToolReply {
        if let Err(e) = check_count(a.n) {
            return Ok(e);
        }
        let mut req = CreateSandboxRequest::new(a.snapshot_tag, a.n);
        req.memory_limit_mib = a.memory_limit_mib;
        req.ttl_seconds = a.ttl_seconds;
        req.volumes = a.volumes;
        json_reply(&try_call!("spawning sandboxes", self.daemon.call(move |c| c.spawn(&req))))
    }

    #[tool(
        description = "Run a command in a sandbox and wait for it: exit code, stdout, stderr. Long output shows its head and tail; the whole of it is saved in the sandbox and the reply names the file (read it with `read_file` and `offset`)."
    )]
    async fn exec(&self, Parameters(a): Parameters<ExecArgs>) -> ToolReply {
        if a.max_output_bytes == 0 || a.max_output_bytes > MAX_SHOWN {
            return Ok(invalid(format!(
                "max_output_bytes must be between 1 and {MAX_SHOWN}, got {}",
                a.max_output_bytes
            )));
        }
        let req = ExecRequest {
            args: a.args.unwrap_or_default(),
            cmd: a.command,
            timeout_secs: a.timeout_secs,
            env: a.env,
            cwd: a.cwd,
            stdin: a.stdin,
            max_output_bytes: None,
        };
        let id = a.sandbox_id.clone();
        let resp = try_call!("running the command", self.daemon.call(move |c| c.exec(&id, &req)));
        let stdout = clip(&resp.stdout, a.max_output_bytes);
        let stderr = clip(&resp.stderr, a.max_output_bytes);
        let mut reply = json!({
            "exit_code": resp.exit_code,
            "signal": resp.signal,
            "timed_out": resp.timed_out,
            "duration_ms": resp.duration_ms,
            "stdout": stdout.text,
            "stderr": stderr.text,
            "stdout_bytes": resp.stdout_bytes,
            "stderr_bytes": resp.stderr_bytes,
        });
        if stdout.elided_bytes > 0 || stderr.elided_bytes > 0 || resp.truncated {
            let mut hint = self.save_output(&a.sandbox_id, &resp.stdout, &resp.stderr).await;
            if resp.truncated {
                hint.push_str(&format!(
                    "; the daemon kept the first {} bytes of each stream (stdout_bytes and stderr_bytes say how much \
                     the command wrote): redirect its output to a file for all of it",
                    forkvm_api::DEFAULT_MAX_OUTPUT_BYTES
                ));
            }
            reply["hint"] = json!(hint);
        }
        json_reply(&reply)
    }

    #[tool(
        description = "Evaluate Python in a sandbox's warm interpreter (state persists between calls in the same sandbox). Returns `result` (repr of a final expression), `error` (traceback), stdout and stderr."
    )]
    async fn eval(&self, Parameters(a): Parameters<EvalArgs>) -> ToolReply {
        json_reply(&try_call!("evaluating the code", self.daemon.call(move |c| c.eval(&a.sandbox_id, &a.code))))
    }

    #[tool(
        description = "Read a file in a sandbox: up to `max_bytes` from `offset`. Text comes back as text, other bytes as base64; `next_offset` is set when the file goes on.",
        annotations(read_only_hint = true)
    )]
    async fn read_file(&self, Parameters(a): Parameters<ReadFileArgs>) -> ToolReply {
        if a.max_bytes == 0 || a.max_bytes > MAX_SHOWN {
            return Ok(invalid(format!("max_bytes must be between 1 and {MAX_SHOWN}, got {}", a.max_bytes)));
        }
        let (offset, max) = (a.offset, a.max_bytes);
        let window = try_call!(
            "reading the file",
            self.daemon.call(move |c| {
                let mut w = Window::new(offset, max);
                match c.read_file(&a.sandbox_id, &a.path, &mut w) {
                    Ok(_) => Ok(w),
                    Err(ClientError::Sink(e)) if e.to_string() == WINDOW_FULL => Ok(w),
                    Err(e) => Err(e),
                }
            })
        );
        let next_offset = window.more.then_some(offset + window.kept.len() as u64);
        let mut reply = json!({ "offset": offset, "bytes": window.kept.len(), "next_offset": next_offset });
        match String::from_utf8(window.kept) {
            Ok(text) => reply["text"] = json!(text),
            Err(e) => reply["base64"] = json!(base64::engine::general_purpose::STANDARD.encode(e.into_bytes())),
        }
        json_reply(&reply)
    }

    #[tool(description = "Write a file in a sandbox (replacing it), creating parent directories unless told not to.")]
    async fn write_file(&self, Parameters(a): Parameters<WriteFileArgs>) -> ToolReply {
        let data = match a.encoding {
            Encoding::Utf8 => a.content.into_bytes(),
            Encoding::Base64 => match base64::engine::general_purpose::STANDARD.decode(a.content.trim()) {
                Ok(d) => d,
                Err(e) => return Ok(invalid(format!("content is not valid base64: {e}"))),
            },
        };
        let mode = match a.mode.as_deref().map(|m| u32::from_str_radix(m.trim_start_matches("0o"), 8)) {
            None => None,
            Some(Ok(m)) if m <= 0o7777 => Some(m),
            Some(_) => return Ok(invalid(format!("mode {:?} is not octal permission bits such as \"644\"", a.mode))),
        };
        let opts = WriteFileOptions { mode, create_parents: a.create_parents };
        let written = try_call!(
            "writing the file",
            self.daemon.call(move |c| c.write_file(&a.sandbox_id, &a.path, &data, &opts))
        );
        json_reply(&written)
    }

    #[tool(
        description = "List a directory in a sandbox: name, type (file, dir, symlink, other), size, mode, mtime.",
        annotations(read_only_hint = true)
    )]
    async fn list_files(&self, Parameters(a): Parameters<ListFilesArgs>) -> ToolReply {
        json_reply(&try_call!("listing the directory", self.daemon.call(move |c| c.list_files(&a.sandbox_id, &a.path))))
    }

    #[tool(
        description = "Snapshot a running sandbox mid-task under a new tag (it keeps running): spawn from the tag later to go back to this moment, as many times as you like. `live` pauses it for milliseconds."
    )]
    async fn branch(&self, Parameters(a): Parameters<BranchArgs>) -> ToolReply {
        let req = BranchSandboxRequest {
            tag: a.tag,
            mode: Some(a.mode.unwrap_or(BranchMode::Live).as_str().to_string()),
            measure_diff: a.measure_diff,
            ..BranchSandboxRequest::default()
        };
        json_reply(&try_call!("branching the sandbox", self.daemon.call(move |c| c.branch(&a.sandbox_id, &req))))
    }

    #[tool(
        description = "Checkpoint a running sandbox now: its memory, processes and files at this moment, kept so that `rewind` can put it back here (it pauses for milliseconds and keeps running). Take one before anything risky. Returns its `seq` and `tag` (spawn from the tag to start copies there)."
    )]
    async fn checkpoint(&self, Parameters(a): Parameters<CheckpointArgs>) -> ToolReply {
        json_reply(&try_call!(
            "checkpointing the sandbox",
            self.daemon.call(move |c| c.checkpoint(&a.sandbox_id, a.note.as_deref()))
        ))
    }

    #[tool(
        description = "A sandbox's checkpoints, oldest first: `seq`, `tag`, when, what took it (`api`, `interval`, `exec`) and its note (for `exec`, the call that ran just before it), and the sandbox's checkpoint policy.",
        annotations(read_only_hint = true)
    )]
    async fn list_checkpoints(&self, Parameters(a): Parameters<SandboxArgs>) -> ToolReply {
        json_reply(&try_call!("listing checkpoints", self.daemon.call(move |c| c.checkpoints(&a.sandbox_id))))
    }

    #[tool(
        description = "Put a running sandbox back at one of its checkpoints, in place (same id): its processes, variables and files as they were then; everything it did since is gone. Name the checkpoint by `seq`, or by `ago_seconds` (the newest at least that old)."
    )]
    async fn rewind(&self, Parameters(a): Parameters<RewindArgs>) -> ToolReply {
        let req = forkvm_api::RewindRequest { seq: a.seq, ago_seconds: a.ago_seconds };
        json_reply(&try_call!("rewinding the sandbox", self.daemon.call(move |c| c.rewind(&a.sandbox_id, &req))))
    }

    #[tool(
        description = "Copy a running sandbox `n` times: each copy has its memory, processes and files at this moment and goes on on its own (try n approaches at once and keep the best)."
    )]
    async fn fork(&self, Parameters(a): Parameters<ForkArgs>) -> ToolReply {
        if let Err(e) = check_count(a.n) {
            return Ok(e);
        }
        let req = ForkSandboxRequest::new(a.n);
        json_reply(&try_call!("forking the sandbox", self.daemon.call(move |c| c.fork(&a.sandbox_id, &req))))
    }

    #[tool(
        description = "Stop a sandbox and delete it (its processes, memory and files). Snapshots branched from it stay.",
        annotations(destructive_hint = true)
    )]
    async fn kill(&self, Parameters(a): Parameters<SandboxArgs>) -> ToolReply {
        let id = a.sandbox_id.clone();
        try_call!("killing the sandbox", self.daemon.call(move |c| c.kill_sandbox(&a.sandbox_id)));
        json_reply(&json!({ "killed": id }))
    }
}

impl ForkvmMcp {
    /// Saves an exec's whole output in the sandbox; says where, or why it could not.
    async fn save_output(&self, id: &str, stdout: &str, stderr: &str) -> String {
        let unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or_default();
        let dir = format!("{SAVED_OUTPUT_DIR}/exec-{unix_ms}-{}", self.exec_seq.fetch_add(1, Ordering::Relaxed));
        let (id, out, err, d) = (id.to_string(), stdout.to_string(), stderr.to_string(), dir.clone());
        let saved = self
            .daemon
            .call(move |c| {
                let opts = WriteFileOptions { mode: Some(0o644), create_parents: true };
                c.write_file(&id, &format!("{d}/stdout"), out.as_bytes(), &opts)?;
                c.write_file(&id, &format!("{d}/stderr"), err.as_bytes(), &opts)
            })
            .await;
        match saved {
            Ok(_) => format!(
                "output was longer than shown: all of it is in the sandbox at {dir}/stdout and {dir}/stderr \
                 (read_file with offset to page through it)"
            ),
            Err(e) => format!(
                "output was longer than shown, and saving it in the sandbox failed ({}); rerun the command \
                 with its output redirected to a file and page through it with read_file",
                describe(&e)
            ),
        }
    }
}
