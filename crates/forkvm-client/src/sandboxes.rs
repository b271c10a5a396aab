//! Running sandboxes: `/v1/sandboxes` (spawn, list, get, kill) and the actions on one
//! (ping, exec, streamed exec, eval, branch, fork, disk snapshots, console).

use crate::client::Client;
use crate::encode::Target;
use crate::error::ClientError;
use crate::transport;
use forkvm_api::{
    ArchiveReport, BranchSandboxRequest, CreateSandboxRequest, DiskForkRequest, DiskSnapshotInfo, DiskSnapshotReport,
    DiskSnapshotRequest, EvalRequest, EvalResponse, ExecEvent, ExecRequest, ExecResponse, ForkSandboxRequest,
    NetworkPolicy, RestoreRequest, SandboxInfo, SetTtlRequest, SnapshotInfo,
};
use hyper::Method;
use serde::{Deserialize, Serialize};

/// How a streamed command ended: the data of its `exit` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecExit {
    /// The process's code, else 128 + signal, else 124 on timeout.
    pub exit_code: i32,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub duration_ms: u64,
}

fn sandbox(id: &str) -> Result<Target, ClientError> {
    Target::new("/v1/sandboxes").segment("sandbox id", id)
}

impl Client {
    /// `GET /v1/sandboxes`.
    pub fn list_sandboxes(&self) -> Result<Vec<SandboxInfo>, ClientError> {
        self.call_json(Method::GET, "/v1/sandboxes", None::<&()>, "sandbox list")
    }

    /// `GET /v1/lineage`: every sandbox and snapshot, and who came from what.
    pub fn lineage(&self) -> Result<forkvm_api::Lineage, ClientError> {
        self.call_json(Method::GET, "/v1/lineage", None::<&()>, "lineage")
    }

    /// `GET /v1/sandboxes/{id}/usage`: what its VMM uses of the host now.
    pub fn sandbox_usage(&self, id: &str) -> Result<forkvm_api::SandboxUsage, ClientError> {
        self.call_json(Method::GET, &sandbox(id)?.push("/usage").build(), None::<&()>, "sandbox usage")
    }

    /// `POST /v1/sandboxes`: `req.n` sandboxes from a tag, all ready, or none.
    pub fn spawn(&self, req: &CreateSandboxRequest) -> Result<Vec<SandboxInfo>, ClientError> {
        self.call_json(Method::POST, "/v1/sandboxes", Some(req), "spawned sandboxes")
    }

    /// `GET /v1/sandboxes/{id}`.
    pub fn get_sandbox(&self, id: &str) -> Result<SandboxInfo, ClientError> {
        self.call_json(Method::GET, &sandbox(id)?.build(), None::<&()>, "sandbox")
    }

    /// `DELETE /v1/sandboxes/{id}`.
    pub fn kill_sandbox(&self, id: &str) -> Result<(), ClientError> {
        self.call_empty(Method::DELETE, &sandbox(id)?.build())
    }

    /// `GET /v1/sandboxes/{id}/console?bytes=`: the end of its console log (the daemon's
    /// default length when `bytes` is `None`).
    pub fn console(&self, id: &str, bytes: Option<u64>) -> Result<String, ClientError> {
        let mut target = sandbox(id)?.push("/console");
        if let Some(n) = bytes {
            target = target.query("bytes", &n.to_string());
        }
        self.call_text(&target.build())
    }

    /// `DELETE /v1/sandboxes/{id}?purge=true`: also destroys its disk snapshots (its key,
    /// then its vault), also for a sandbox already deleted. 409 while something still
    /// reads them.
    pub fn purge_sandbox(&self, id: &str) -> Result<(), ClientError> {
        self.call_empty(Method::DELETE, &sandbox(id)?.query("purge", "true").build())
    }

    /// `POST /v1/sandboxes/{id}/archive`: the sandbox goes to the store, its VMM stops;
    /// it stays listed as `archived`.
    pub fn archive(&self, id: &str) -> Result<ArchiveReport, ClientError> {
        self.call_json(Method::POST, &sandbox(id)?.push("/archive").build(), None::<&()>, "archive report")
    }

    /// `POST /v1/sandboxes/{id}/restore`: an archived sandbox runs again (same id).
    pub fn restore(&self, id: &str, req: &RestoreRequest) -> Result<SandboxInfo, ClientError> {
        self.call_json(Method::POST, &sandbox(id)?.push("/restore").build(), Some(req), "restored sandbox")
    }

    /// `POST /v1/sandboxes/{id}/ttl`: archive it `ttl_seconds` from now (0: never).
    pub fn set_ttl(&self, id: &str, ttl_seconds: u64) -> Result<SandboxInfo, ClientError> {
        let req = SetTtlRequest { ttl_seconds };
        self.call_json(Method::POST, &sandbox(id)?.push("/ttl").build(), Some(&req), "sandbox")
    }

    /// `PUT /v1/sandboxes/{id}/network`: where its guest may connect to from now on.
    pub fn set_network(&self, id: &str, policy: &NetworkPolicy) -> Result<SandboxInfo, ClientError> {
        self.call_json(Method::PUT, &sandbox(id)?.push("/network").build(), Some(policy), "sandbox")
    }

    /// `POST /v1/sandboxes/{id}/disk-fork`: a new sandbox cold-booted on a disk snapshot
    /// of `id` (long: the guest boots).
    pub fn disk_fork(&self, id: &str, req: &DiskForkRequest) -> Result<SandboxInfo, ClientError> {
        self.call_json(Method::POST, &sandbox(id)?.push("/disk-fork").build(), Some(req), "disk-forked sandbox")
    }

    /// `POST /v1/sandboxes/{id}/ping`: the agent's pong, as the daemon relays it.
    pub fn ping(&self, id: &str) -> Result<serde_json::Value, ClientError> {
        self.call_json(Method::POST, &sandbox(id)?.push("/ping").build(), None::<&()>, "ping reply")
    }

    /// `POST /v1/sandboxes/{id}/exec`: runs a command and returns all it printed.
    pub fn exec(&self, id: &str, req: &ExecRequest) -> Result<ExecResponse, ClientError> {
        self.call_json(Method::POST, &sandbox(id)?.push("/exec").build(), Some(req), "exec reply")
    }

    /// `POST /v1/sandboxes/{id}/exec/stream`: runs a command, calling `on_event` with
    /// each `stdout`/`stderr` chunk as it arrives, and returns its `exit` line. An
    /// `error` line becomes [`ClientError::Stream`]; a stream that ends without either,
    /// [`ClientError::Truncated`].
    pub fn exec_stream(
        &self,
        id: &str,
        req: &ExecRequest,
        mut on_event: impl FnMut(ExecEvent),
    ) -> Result<ExecExit, ClientError> {
        let target = sandbox(id)?.push("/exec/stream").build();
        let body = transport::full(crate::client::encode_json(req)?);
        let what = "exec stream line";
        // Anything after the exit line is not read; the connection is dropped.
        self.read_lines(Method::POST, &target, body, Some("application/json"), what, |event| match event {
            ExecEvent::Exit { exit_code, signal, timed_out, duration_ms } => {
                Ok(Some(ExecExit { exit_code, signal, timed_out, duration_ms }))
            }
            ExecEvent::Error { error } => Err(ClientError::Stream { message: error }),
            output => {
                on_event(output);
                Ok(None)
            }
        })
    }

    /// `POST /v1/sandboxes/{id}/eval`: Python in the sandbox's warm interpreter.
    pub fn eval(&self, id: &str, code: &str) -> Result<EvalResponse, ClientError> {
        let req = EvalRequest { code: code.to_string() };
        self.call_json(Method::POST, &sandbox(id)?.push("/eval").build(), Some(&req), "eval reply")
    }

    /// `POST /v1/sandboxes/{id}/branch`: a new snapshot of the running sandbox.
    pub fn branch(&self, id: &str, req: &BranchSandboxRequest) -> Result<SnapshotInfo, ClientError> {
        self.call_json(Method::POST, &sandbox(id)?.push("/branch").build(), Some(req), "branch reply")
    }

    /// `POST /v1/sandboxes/{id}/fork`: `req.n` copies of the running sandbox.
    pub fn fork(&self, id: &str, req: &ForkSandboxRequest) -> Result<Vec<SandboxInfo>, ClientError> {
        self.call_json(Method::POST, &sandbox(id)?.push("/fork").build(), Some(req), "forked sandboxes")
    }

    /// `POST /v1/sandboxes/{id}/disk-snapshots`: an encrypted, incremental snapshot of
    /// the sandbox's layered disks now (`unchanged` when nothing was written since the
    /// last one), then retention (`req`'s fields, else the daemon's).
    pub fn disk_snapshot(&self, id: &str, req: &DiskSnapshotRequest) -> Result<DiskSnapshotReport, ClientError> {
        let target = sandbox(id)?.push("/disk-snapshots").build();
        self.call_json(Method::POST, &target, Some(req), "disk snapshot report")
    }

    /// `GET /v1/sandboxes/{id}/disk-snapshots`: the sandbox's disk snapshots, oldest
    /// first (also for a sandbox that is gone but left them).
    pub fn disk_snapshots(&self, id: &str) -> Result<Vec<DiskSnapshotInfo>, ClientError> {
        let target = sandbox(id)?.push("/disk-snapshots").build();
        self.call_json(Method::GET, &target, None::<&()>, "disk snapshot list")
    }

    /// `GET /v1/sandboxes/{id}/checkpoints`: its checkpoints, oldest first, and its policy.
    pub fn checkpoints(&self, id: &str) -> Result<forkvm_api::CheckpointList, ClientError> {
        let target = sandbox(id)?.push("/checkpoints").build();
        self.call_json(Method::GET, &target, None::<&()>, "checkpoint list")
    }

    /// `POST /v1/sandboxes/{id}/checkpoints`: a checkpoint now (memory and disks).
    pub fn checkpoint(&self, id: &str, note: Option<&str>) -> Result<forkvm_api::CheckpointInfo, ClientError> {
        let req = forkvm_api::CreateCheckpointRequest { note: note.map(String::from) };
        self.call_json(Method::POST, &sandbox(id)?.push("/checkpoints").build(), Some(&req), "checkpoint")
    }

    /// `PUT /v1/sandboxes/{id}/checkpoints`: when it is checkpointed by itself, how many kept.
    pub fn set_checkpoint_policy(
        &self,
        id: &str,
        policy: &forkvm_api::CheckpointPolicy,
    ) -> Result<forkvm_api::CheckpointList, ClientError> {
        self.call_json(Method::PUT, &sandbox(id)?.push("/checkpoints").build(), Some(policy), "checkpoint list")
    }

    /// `POST /v1/sandboxes/{id}/rewind`: the sandbox back at a checkpoint, in place.
    pub fn rewind(&self, id: &str, req: &forkvm_api::RewindRequest) -> Result<forkvm_api::RewindReport, ClientError> {
        self.call_json(Method::POST, &sandbox(id)?.push("/rewind").build(), Some(req), "rewind report")
    }
}
