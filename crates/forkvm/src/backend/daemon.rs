//! The sandbox verbs through forkvmd's REST API.

use super::{Backend, NewFrom, Output, Started};
use crate::remote_cmd::Spinner;
use anyhow::{bail, Result};
use forkvm_client::api::{
    ArchiveReport, BranchSandboxRequest, CreateSandboxRequest, EvalResponse, ExecEvent, ExecRequest,
    ForkSandboxRequest, NetworkPolicy, RestoreRequest, SandboxInfo, SnapshotInfo, WatchEvent, MAX_SANDBOXES_PER_CALL,
};
use forkvm_client::{Client, ExecExit};

pub struct Daemon {
    client: Client,
}

impl Daemon {
    pub fn new(client: Client) -> Daemon {
        Daemon { client }
    }
}

impl Backend for Daemon {
    fn list(&self) -> Result<Vec<SandboxInfo>> {
        Ok(self.client.list_sandboxes()?)
    }

    fn delete(&self, id: &str, purge: bool) -> Result<()> {
        Ok(if purge { self.client.purge_sandbox(id) } else { self.client.kill_sandbox(id) }?)
    }

    fn eval(&self, id: &str, code: &str) -> Result<EvalResponse> {
        Ok(self.client.eval(id, code)?)
    }

    fn branch(&self, id: &str, req: &BranchSandboxRequest) -> Result<SnapshotInfo> {
        let _spinner = Spinner::start(format!("branching {id}"));
        Ok(self.client.branch(id, req)?)
    }

    fn archive(&self, id: &str) -> Result<ArchiveReport> {
        let _spinner = Spinner::start(format!("archiving {id}"));
        Ok(self.client.archive(id)?)
    }

    fn restore(&self, id: &str, ttl_seconds: Option<u64>) -> Result<SandboxInfo> {
        let _spinner = Spinner::start(format!("restoring {id}"));
        Ok(self.client.restore(id, &RestoreRequest { ttl_seconds })?)
    }

    fn set_ttl(&self, id: &str, seconds: u64) -> Result<SandboxInfo> {
        Ok(self.client.set_ttl(id, seconds)?)
    }

    fn set_network(&self, id: &str, policy: &NetworkPolicy) -> Result<SandboxInfo> {
        Ok(self.client.set_network(id, policy)?)
    }

    fn start(
        &self,
        from: NewFrom<'_>,
        n: usize,
        limits: &crate::limit_args::LimitArgs,
        network: Option<&NetworkPolicy>,
        volumes: &[forkvm_sandbox::volumes::VolumeMount],
    ) -> Result<Started> {
        let count = u32::try_from(n).ok().filter(|n| (1..=MAX_SANDBOXES_PER_CALL).contains(n));
        let Some(n) = count else {
            bail!("-n must be between 1 and {MAX_SANDBOXES_PER_CALL} through the daemon, got {n}")
        };
        let sandboxes = match from {
            NewFrom::Tag(tag) => {
                let _spinner = Spinner::start(format!("{n} sandboxes from tag {tag}"));
                self.client.spawn(&CreateSandboxRequest {
                    snapshot_tag: tag.to_string(),
                    n,
                    memory_limit_mib: limits.mem_limit_mib,
                    cpu_limit_millis: limits.cpu_limit_millis,
                    pids_limit: limits.pids_limit,
                    io_limits: limits.io_limits(),
                    vcpus: None,
                    per_child_netns: false,
                    prewarm: false,
                    live_fork: false,
                    hugepages: false,
                    ttl_seconds: None,
                    network: network.cloned(),
                    volumes: volumes.to_vec(),
                    checkpoints: None,
                })?
            }
            NewFrom::Sandbox(id) => {
                if !volumes.is_empty() {
                    bail!("--volume is for spawns from a tag: a fork of a running sandbox keeps its volumes");
                }
                let _spinner = Spinner::start(format!("{n} forks of {id}"));
                self.client.fork(
                    id,
                    &ForkSandboxRequest {
                        n,
                        memory_limit_mib: limits.mem_limit_mib,
                        cpu_limit_millis: limits.cpu_limit_millis,
                        pids_limit: limits.pids_limit,
                        io_limits: limits.io_limits(),
                        ttl_seconds: None,
                        network: network.cloned(),
                    },
                )?
            }
            NewFrom::Image(_) => bail!(
                "fork --image has no daemon API: make a tag with `forkvm snapshot create --image T --tag X`, then \
                 `forkvm fork --tag X`"
            ),
        };
        Ok(Started { sandboxes, host: None })
    }

    fn exec(&self, id: &str, req: &ExecRequest, out: &mut dyn FnMut(Output, &[u8])) -> Result<ExecExit> {
        // An `error` line ends the call as `ClientError::Stream`.
        Ok(self.client.exec_stream(id, req, |event| match event {
            ExecEvent::Stdout { data } => out(Output::Stdout, data.as_bytes()),
            ExecEvent::Stderr { data } => out(Output::Stderr, data.as_bytes()),
            _ => {}
        })?)
    }

    fn watch(
        &self,
        id: &str,
        path: &str,
        recursive: bool,
        on_event: &mut dyn FnMut(WatchEvent) -> bool,
    ) -> Result<Option<String>> {
        Ok(self.client.watch_files(id, path, recursive, on_event)?)
    }

    fn endpoint(&self) -> Option<String> {
        Some(self.client.endpoint().to_string())
    }
}
