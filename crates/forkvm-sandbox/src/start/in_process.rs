//! VMs inside this process, not registered: a [`Sandbox`] restored from a template
//! snapshot (`forkvm run`'s one-shot sandbox, `forkvm doctor`, benchmarks) and a
//! template's cold boot to a ready agent ([`boot_to_agent`]: the template snapshot,
//! benchmarks' cold-boot baseline).
//!
//! A sandbox gets a fresh id, hostname, wall-clock time and host entropy before any
//! user request (clones must never share RNG state or identity). Dropping it stops the
//! VM and removes its run directory.

use super::new_sandbox_id;
use crate::artifacts::Artifacts;
use crate::guest::{boot_devices, machine, AGENT_PORT, BOOT_TIMEOUT};
use crate::network::NetSlot;
use crate::ready::{apply_identity, wait_for_agent};
use crate::run_dir::RunDir;
use crate::template_snapshot::{TemplateSnapshot, TemplateSnapshotError};
use forkvm_proto::AgentClient;
use forkvm_vmm::arch::x86_64::cpuid::CpuTemplate;
use forkvm_vmm::devices::serial::ConsoleOut;
use forkvm_vmm::host::{open_kvm, KvmUnavailable};
use forkvm_vmm::BootConfig;
use forkvm_vmm::Vmm;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
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
    #[error(transparent)]
    Network(#[from] crate::network::NetworkError),
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
    /// Its network namespace, when the template has a network.
    net: Option<NetSlot>,
    /// Its DNS, served while the sandbox lives, and its policy.
    dns: Option<(crate::network::dns::DnsGuard, std::sync::Arc<crate::network::firewall::Firewall>)>,
    keep_run_dir: bool,
}

impl Sandbox {
    /// Restores a sandbox from `template` and gives it its own identity.
    pub fn start(template: &TemplateSnapshot) -> Result<Sandbox, SandboxError> {
        let started = Instant::now();
        let id = new_sandbox_id();
        let base = std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
        let run_dir = base.join("forkvm").join(&id);
        std::fs::create_dir_all(&run_dir).map_err(|source| SandboxError::RunDir { path: run_dir.clone(), source })?;
        let dir = RunDir::at(&run_dir);
        let console_path = dir.console();
        let log = forkvm_vmm::devices::console_log::ConsoleLog::open(&console_path)
            .map_err(|source| SandboxError::RunDir { path: console_path.clone(), source })?;
        let uds = dir.vsock();
        let kvm = open_kvm()?;
        let prepared = template.prepared()?;
        // One read of the snapshot's description for both: its devices, and whether they
        // include a network (then this sandbox gets a namespace of its own).
        let source = crate::source::SpawnSource::from_template(template)?;
        let net = if source.has_network() { Some(crate::network::pool::take()?) } else { None };
        let dns =
            net.as_ref().and_then(|n| crate::network::dns::serve_slot(n, crate::network::dns::Lifetime::WhileHeld));
        let devices = source.devices(&uds, &dir.disks(), net.as_ref().map(NetSlot::tap_source));
        let vmm = forkvm_vmm::restore(&kvm, prepared, ConsoleOut::new(Some(log), None), &devices, false)
            .map_err(SandboxError::Restore)?;
        let client = AgentClient::vsock_uds(&uds, AGENT_PORT);
        wait_in_process(&vmm, &uds, RESTORE_TIMEOUT).map_err(|e| match e {
            Some(why) => SandboxError::Stopped(why, console_path.clone()),
            None => SandboxError::AgentTimeout(RESTORE_TIMEOUT, console_path.clone()),
        })?;
        let ready_ms = started.elapsed().as_secs_f64() * 1e3;
        apply_identity(&client, &id).map_err(SandboxError::Identity)?;
        Ok(Sandbox { id, client, run_dir, ready_ms, vmm: Some(vmm), net, dns, keep_run_dir: false })
    }

    /// Keep the run directory (console log) after the sandbox ends, e.g. after a failure.
    pub fn keep_run_dir(&mut self) {
        self.keep_run_dir = true;
    }

    pub fn vmm(&self) -> Option<&Vmm> {
        self.vmm.as_ref()
    }

    /// The sandbox's network namespace (where its guest's gateway is), if it has one.
    pub fn network(&self) -> Option<&NetSlot> {
        self.net.as_ref()
    }

    /// Puts `policy` in force for where the guest may connect to (`docs/networking.md`),
    /// for connections already open too.
    pub fn set_network_policy(&self, policy: &forkvm_api::NetworkPolicy) -> Result<(), crate::network::NetworkError> {
        let (_, firewall) = self.dns.as_ref().ok_or(crate::network::NetworkError::NoNetwork)?;
        crate::network::set_policy(firewall, policy)
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

/// Cold-boots the template's VM in this process (console log and vsock socket in `work`)
/// and waits until its agent answers; returns the VM, a client and the console log path.
pub fn boot_to_agent(
    artifacts: &Artifacts,
    work: &Path,
) -> Result<(forkvm_vmm::Vmm, AgentClient<std::os::unix::net::UnixStream>, PathBuf), TemplateSnapshotError> {
    boot_to_agent_with(artifacts, work, CpuTemplate::for_this_host())
}

/// [`boot_to_agent`] under a given CPU template.
pub fn boot_to_agent_with(
    artifacts: &Artifacts,
    work: &Path,
    cpu: CpuTemplate,
) -> Result<(forkvm_vmm::Vmm, AgentClient<std::os::unix::net::UnixStream>, PathBuf), TemplateSnapshotError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| TemplateSnapshotError::Io { path, source }
    };
    std::fs::create_dir_all(work).map_err(io(work))?;
    let dir = RunDir::at(work);
    let console_path = dir.console();
    let log = forkvm_vmm::devices::console_log::ConsoleLog::open(&console_path).map_err(io(&console_path))?;
    let uds = dir.vsock();
    let kvm = open_kvm()?;
    let m = machine(artifacts, cpu);
    // A template with a network boots with one (its own namespace, gone with the VM), so
    // that the guest's driver and address are in the snapshot.
    let net = if crate::guest::has_network() { Some(crate::network::pool::take()?) } else { None };
    let vmm = forkvm_vmm::boot(
        &kvm,
        BootConfig {
            mem_size: m.mem_size,
            vcpu_count: m.vcpu_count,
            irqchip: m.irqchip,
            cpu_template: m.cpu_template,
            payload: m.payload,
            console: ConsoleOut::new(Some(log), None),
            devices: boot_devices(artifacts, &uds, &dir.disks(), Vec::new(), None, net.as_ref()),
            start_paused: false,
        },
    )
    .map_err(TemplateSnapshotError::Boot)?;
    let client = AgentClient::vsock_uds(&uds, AGENT_PORT);
    wait_in_process(&vmm, &uds, BOOT_TIMEOUT).map_err(|e| match e {
        Some(why) => TemplateSnapshotError::Stopped(why, console_path.clone()),
        None => TemplateSnapshotError::AgentTimeout(BOOT_TIMEOUT, console_path.clone()),
    })?;
    Ok((vmm, client, console_path))
}

/// Waits for the agent of `vmm`, a VM of this process, behind vsock socket `uds`
/// ([`wait_for_agent`]); `Err(Some(why))` when the VM stopped first.
fn wait_in_process(vmm: &Vmm, uds: &Path, timeout: Duration) -> Result<(), Option<String>> {
    let latch = vmm.exit_latch();
    let alive = || latch.get().map(|r| format!("{r:?}"));
    wait_for_agent(uds, timeout, &alive)
}
