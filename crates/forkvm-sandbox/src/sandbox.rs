//! One sandbox: a VM restored from a template snapshot in this process, re-identified,
//! and an agent client to drive it.
//!
//! The sandbox gets a fresh id, hostname, wall-clock time and host entropy before any
//! user request (clones must never share RNG state or identity). Dropping it stops the
//! VM and removes its run directory.

use crate::template_snapshot::{TemplateSnapshot, AGENT_PORT};
use forkvm_proto::{AgentClient, IdentityRequest};
use forkvm_vmm::devices::serial::ConsoleOut;
use forkvm_vmm::host::{open_kvm, KvmUnavailable};
use forkvm_vmm::Vmm;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// How long a restored agent may take to answer its first request.
const RESTORE_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error(transparent)]
    Kvm(#[from] KvmUnavailable),
    #[error("creating the run directory {path}: {source}")]
    RunDir { path: PathBuf, source: std::io::Error },
    #[error("reading the template snapshot: {0}")]
    Prepare(#[from] crate::template_snapshot::PrepareError),
    #[error("restoring the sandbox: {0}")]
    Restore(forkvm_vmm::BuildError),
    #[error("reading the template snapshot's devices: {0}")]
    Devices(#[from] crate::source::SourceError),
    #[error("the restored agent did not answer within {0:?}; see {1}")]
    AgentTimeout(Duration, PathBuf),
    #[error("the sandbox VM stopped ({0}); see {1}")]
    Stopped(String, PathBuf),
    #[error("applying the sandbox identity: {0}")]
    Identity(forkvm_proto::ClientError),
}

/// A running sandbox.
#[derive(Debug)]
pub struct Sandbox {
    pub id: String,
    pub client: AgentClient<UnixStream>,
    pub run_dir: PathBuf,
    /// Wall time from the start of the restore to the agent's first answer.
    pub ready_ms: f64,
    vmm: Option<Vmm>,
    keep_run_dir: bool,
}

/// Up to `n` bytes from the host's getrandom (fewer only if it fails).
fn host_random(n: usize) -> Vec<u8> {
    let mut b = vec![0u8; n];
    // SAFETY: getrandom writes at most `b.len()` bytes into `b`.
    let got = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    b.truncate(got.max(0) as usize);
    b
}

fn random_hex(bytes: usize) -> String {
    let mut b = host_random(bytes);
    if b.len() != bytes {
        // Fall back to time and pid: ids must differ, not be secret.
        let seed = format!("{:?}{}", Instant::now(), std::process::id());
        b = blake3::hash(seed.as_bytes()).as_bytes()[..bytes].to_vec();
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A fresh sandbox id (16 hex digits).
pub fn new_sandbox_id() -> String {
    random_hex(8)
}

/// Gives a restored guest its own identity: id, hostname `sb-<id>`, the host's wall
/// clock, and fresh host entropy (credited, and the guest CRNG reseeded).
pub fn apply_identity(client: &AgentClient<UnixStream>, id: &str) -> Result<(), forkvm_proto::ClientError> {
    let now_ns =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    client
        .identity(&IdentityRequest {
            sandbox_id: id.to_string(),
            hostname: format!("sb-{id}"),
            wall_clock_unix_ns: now_ns,
            entropy: host_random(64),
        })
        .map(|_| ())
}

impl Sandbox {
    /// Restores a sandbox from `template` and gives it its own identity.
    pub fn start(template: &TemplateSnapshot) -> Result<Sandbox, SandboxError> {
        let started = Instant::now();
        let id = new_sandbox_id();
        let base = std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
        let run_dir = base.join("forkvm").join(&id);
        std::fs::create_dir_all(&run_dir).map_err(|source| SandboxError::RunDir { path: run_dir.clone(), source })?;
        let console_path = run_dir.join("console.log");
        let log = forkvm_vmm::devices::console_log::ConsoleLog::open(&console_path)
            .map_err(|source| SandboxError::RunDir { path: console_path.clone(), source })?;
        let uds = run_dir.join("vsock.sock");
        let kvm = open_kvm()?;
        let prepared = template.prepared()?;
        let devices = template.devices(&uds, &run_dir.join("disks"))?;
        let vmm = forkvm_vmm::restore(&kvm, prepared, ConsoleOut::new(Some(log), None), &devices, false)
            .map_err(SandboxError::Restore)?;
        let client = AgentClient::vsock_uds(&uds, AGENT_PORT);
        let latch = vmm.exit_latch();
        let alive = || latch.get().map(|r| format!("{r:?}"));
        crate::template_snapshot::wait_for_agent(&uds, RESTORE_TIMEOUT, &alive).map_err(|e| match e {
            Some(why) => SandboxError::Stopped(why, console_path.clone()),
            None => SandboxError::AgentTimeout(RESTORE_TIMEOUT, console_path.clone()),
        })?;
        let ready_ms = started.elapsed().as_secs_f64() * 1e3;
        apply_identity(&client, &id).map_err(SandboxError::Identity)?;
        Ok(Sandbox { id, client, run_dir, ready_ms, vmm: Some(vmm), keep_run_dir: false })
    }

    /// Keep the run directory (console log) after the sandbox ends, e.g. after a failure.
    pub fn keep_run_dir(&mut self) {
        self.keep_run_dir = true;
    }

    pub fn vmm(&self) -> Option<&Vmm> {
        self.vmm.as_ref()
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        if let Some(mut vmm) = self.vmm.take() {
            vmm.stop();
        }
        if !self.keep_run_dir {
            let _ = std::fs::remove_dir_all(&self.run_dir);
        }
    }
}
