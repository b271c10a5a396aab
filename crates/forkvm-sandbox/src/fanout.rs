//! Fan-out: N sandboxes forked from one template snapshot through a zygote, each its own
//! VMM process (control socket, vsock socket, console log under the run directory),
//! re-identified before it is handed out.
//!
//! The caller must be single-threaded when it calls [`fork_children`] (the zygote
//! `fork()`s); the children outlive it until they are shut down.

use crate::sandbox::{apply_identity, new_sandbox_id};
use crate::template_snapshot::{wait_for_agent, TemplateSnapshot, AGENT_PORT};
use forkvm_proto::AgentClient;
use forkvm_vmm::vmm::VmmLabels;
use forkvm_vmm::zygote::{ChildSpec, Zygote, ZygoteError};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const CHILD_READY_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug, thiserror::Error)]
pub enum FanoutError {
    #[error("creating the run directory {path}: {source}")]
    RunDir { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Zygote(#[from] ZygoteError),
    #[error("child {index} (pid {pid}) did not answer within {CHILD_READY_TIMEOUT:?}; see {console}")]
    NotReady { index: usize, pid: i32, console: PathBuf },
    #[error("child {index}: applying its identity: {source}")]
    Identity { index: usize, source: forkvm_proto::ClientError },
}

/// One forked sandbox.
#[derive(Debug)]
pub struct ForkedChild {
    pub index: usize,
    pub pid: i32,
    pub id: String,
    pub control_socket: PathBuf,
    pub vsock: PathBuf,
    pub console: PathBuf,
    pub client: AgentClient<UnixStream>,
    /// From the first fork to this child's identity being applied.
    pub ready_ms: f64,
}

/// Forks `n` sandboxes from `template` into `run_dir` and re-identifies each.
pub fn fork_children(template: &TemplateSnapshot, n: usize, run_dir: &Path) -> Result<Vec<ForkedChild>, FanoutError> {
    std::fs::create_dir_all(run_dir).map_err(|source| FanoutError::RunDir { path: run_dir.into(), source })?;
    let zygote = Zygote::new(&template.dir)?;
    let started = Instant::now();
    let mut spawned = Vec::new();
    for index in 0..n {
        let control_socket = run_dir.join(format!("child-{index}.sock"));
        let vsock = run_dir.join(format!("child-{index}.vsock"));
        let console = run_dir.join(format!("child-{index}.log"));
        let id = new_sandbox_id();
        let spec = ChildSpec {
            socket: Some(control_socket.clone()),
            console_log: Some(console.clone()),
            console_stream: None,
            detach: true,
            devices: template.devices(&vsock),
            labels: VmmLabels { sandbox_id: Some(id.clone()), template: Some(template.artifacts.image.name.clone()) },
        };
        let pid = zygote.spawn(spec)?;
        spawned.push((index, pid, id, control_socket, vsock, console));
    }
    let mut children = Vec::new();
    for (index, pid, id, control_socket, vsock, console) in spawned {
        let client = AgentClient::vsock_uds(&vsock, AGENT_PORT);
        let gone = || forkvm_vmm::zygote::exit_status(pid).map(|s| format!("exited with status {s:#x}"));
        wait_for_agent(&client, CHILD_READY_TIMEOUT, &gone).map_err(|_| FanoutError::NotReady {
            index,
            pid,
            console: console.clone(),
        })?;
        apply_identity(&client, &id).map_err(|source| FanoutError::Identity { index, source })?;
        let ready_ms = started.elapsed().as_secs_f64() * 1e3;
        children.push(ForkedChild { index, pid, id, control_socket, vsock, console, client, ready_ms });
    }
    Ok(children)
}
