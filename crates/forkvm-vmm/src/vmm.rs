//! A running VM in this process: its vCPU threads, devices and memory, and the
//! operations the control socket exposes (status, pause, resume, snapshot, stop).

mod branch;
pub mod compact;
pub mod disks;
pub mod fault;
mod fork_fan_out;
mod fork_running;

pub use branch::{BranchError, BranchMode, BranchReport, BranchRequest, DiskCapture, PendingBranch};
pub use fork_running::{ForkChild, ForkReport, ForkRunningError};

use crate::arch::x86_64::cpuid::CpuTemplate;
use crate::devices::attach::DeviceConfig;
use crate::devices::Devices;
use crate::persist::{StateError, VmState};
pub use crate::vstate::exit::ExitLatch;
use crate::vstate::irqchip::{IrqchipError, KernelIrqchipState};
use crate::vstate::memory::total_size;
use crate::vstate::vcpu::{VcpuEvent, VcpuExitReason, VcpuHandle, VcpuRequest, VcpuRunner};
use crate::vstate::vcpu_state::VcpuStateError;
use crate::vstate::vm::{Vm, VmError};
use fault::{FaultPlan, FaultPoint};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vm_memory::GuestMemoryMmap;

/// How long a vCPU has to acknowledge a pause or resume.
const ACK_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunState {
    Running,
    Paused,
    Exited,
}

/// What the guest is, as recorded in snapshots.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestInfo {
    pub kind: String,
    pub name: String,
}

#[derive(Debug, thiserror::Error)]
pub enum VmmError {
    #[error("the VM has exited ({0:?})")]
    Exited(VcpuExitReason),
    #[error("vCPU {index} did not acknowledge {what} within {ACK_TIMEOUT:?}")]
    AckTimeout { index: u8, what: &'static str },
    #[error("saving vCPU {index}: {source}")]
    SaveVcpu { index: u8, source: VcpuStateError },
    #[error("saving the VM: {0}")]
    SaveVm(#[from] VmError),
    #[error("saving the irqchip: {0}")]
    SaveIrqchip(#[from] IrqchipError),
    #[error("snapshot: {0}")]
    State(#[from] StateError),
    #[error("snapshot: {0}")]
    Dir(#[from] forkvm_snapshot::DirError),
    #[error("snapshot: {0}")]
    Container(#[from] forkvm_snapshot::ContainerError),
    #[error("snapshot: {0}")]
    MemoryImage(#[from] forkvm_snapshot::MemoryImageError),
    #[error("snapshot: {0}")]
    Metadata(#[from] forkvm_snapshot::MetadataError),
    #[error("snapshot tag: {0}")]
    Tag(#[from] forkvm_snapshot::TagError),
    #[error("snapshot: measuring memory.img: {0}")]
    MeasureImage(std::io::Error),
    #[error("{0}")]
    Input(#[from] crate::devices::bus::SerialInputError),
    #[error("injected fault at {0:?}")]
    Injected(FaultPoint),
    #[error("snapshot: {0}")]
    Disk(String),
    #[error("live branch writer: {step}: {source}")]
    LiveWriter { step: String, source: std::io::Error },
}

/// What a snapshot wrote.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SnapshotReport {
    pub dir: PathBuf,
    pub mem_size_bytes: u64,
    pub memory_bytes_allocated: u64,
    pub pause_ms: f64,
    pub total_ms: f64,
}

/// Status, as the control socket reports it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VmmStatus {
    pub state: RunState,
    pub pid: u32,
    pub vcpus: usize,
    pub mem_size_bytes: u64,
    pub irqchip: String,
    pub cpu_template: String,
    pub guest: GuestInfo,
    pub exit: Option<String>,
    /// Instructions the VMM completed for KVM's emulator, per kind (PVM hosts).
    pub emulation_fixups: Vec<(String, u64)>,
    /// Microseconds per restore step, when this VM was restored from a snapshot.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub restore_phases_us: Vec<(String, f64)>,
    /// CPU time the restore took on the host (the phases are wall time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_cpu_us: Option<f64>,
    /// The restoring thread's CPU time per restore step, in microseconds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub restore_phases_cpu_us: Vec<(String, f64)>,
    pub labels: VmmLabels,
    /// Tags of live branches still being written.
    #[serde(default)]
    pub branches_writing: Vec<String>,
    /// Per rate-limited device (its kind, in slot order): how many times its cap held a
    /// request back.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub throttled: Vec<(String, u64)>,
    /// The kinds of its virtio devices, in slot order (`vsock`, `rng`, `block`, `net`).
    #[serde(default)]
    pub devices: Vec<String>,
    /// Set for a VM restored lazily: how much of its memory has arrived.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lazy_memory: Option<LazyMemoryStatus>,
}

/// A VM the builder has finished, before its vCPU threads run.
#[derive(Debug)]
pub(crate) struct VmParts {
    pub vm: Vm,
    pub memory: GuestMemoryMmap,
    pub devices: Arc<Devices>,
    pub runners: Vec<VcpuRunner>,
    pub events: Receiver<VcpuEvent>,
    pub exit: Arc<ExitLatch>,
    pub guest: GuestInfo,
    pub cpu_template: CpuTemplate,
    pub device_config: DeviceConfig,
}

/// What the VMM knows about the sandbox it runs, for the snapshots it writes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmmLabels {
    /// The sandbox's id (default branch tags are `branch-<id>-<seq>`).
    #[serde(default)]
    pub sandbox_id: Option<String>,
    /// The template the sandbox was made from.
    #[serde(default)]
    pub template: Option<String>,
}

#[derive(Debug)]
pub struct Vmm {
    vm: Vm,
    memory: GuestMemoryMmap,
    devices: Arc<Devices>,
    vcpus: Vec<VcpuHandle>,
    events: Receiver<VcpuEvent>,
    exit: Arc<ExitLatch>,
    guest: GuestInfo,
    cpu_template: CpuTemplate,
    state: RunState,
    restore_phases_us: Vec<(String, f64)>,
    restore_phases_cpu_us: Vec<(String, f64)>,
    restore_cpu_us: Option<f64>,
    device_config: DeviceConfig,
    labels: VmmLabels,
    faults: FaultPlan,
    /// Last sequence number used for a default branch tag (per source, monotonic).
    branch_seq: u64,
    /// Live branches whose memory image is still being written.
    live_writes: Vec<branch::LiveWrite>,
    /// How far lazily restored memory has arrived (`vstate::lazy_memory`).
    lazy_memory: Option<Arc<LazyProgress>>,
}

use crate::vstate::lazy_memory::LazyProgress;

/// How long a fork of this process waits for lazily restored memory to complete.
const AWAIT_MEMORY: std::time::Duration = std::time::Duration::from_secs(60);

/// Where lazily restored memory is, in a VMM's status.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LazyMemoryStatus {
    /// 64 KiB windows in the image.
    pub windows: u64,
    /// Windows fetched because the guest or a device touched them.
    pub on_demand: u64,
    /// Windows fetched ahead, in the background.
    pub ahead: u64,
    pub complete: bool,
    /// Why the memory will not complete (the VMM stops on it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
}

impl Vmm {
    /// Starts the vCPU threads of a fully built VM.
    pub(crate) fn start(parts: VmParts, start_paused: bool) -> Result<Vmm, crate::builder::BuildError> {
        let VmParts { vm, memory, devices, runners, events, exit, guest, cpu_template, device_config } = parts;
        let mut vcpus = Vec::new();
        for runner in runners {
            let index = runner.index;
            let handle =
                runner.spawn(start_paused).map_err(|source| crate::builder::BuildError::SpawnVcpu { index, source })?;
            vcpus.push(handle);
        }
        let state = if start_paused { RunState::Paused } else { RunState::Running };
        Ok(Vmm {
            vm,
            memory,
            devices,
            vcpus,
            events,
            exit,
            guest,
            cpu_template,
            state,
            restore_phases_us: Vec::new(),
            restore_phases_cpu_us: Vec::new(),
            restore_cpu_us: None,
            device_config,
            labels: VmmLabels::default(),
            faults: FaultPlan::default(),
            branch_seq: 0,
            live_writes: Vec::new(),
            lazy_memory: None,
        })
    }

    pub(crate) fn set_lazy_memory(&mut self, progress: Arc<LazyProgress>) {
        self.lazy_memory = Some(progress);
    }

    /// Waits (up to [`AWAIT_MEMORY`]) until lazily restored memory is all in: before a
    /// `fork()` of this process, whose child would see missing pages as zeros. The error
    /// says why it is not.
    pub(crate) fn await_memory(&self) -> Result<(), String> {
        match &self.lazy_memory {
            Some(p) => p.wait(AWAIT_MEMORY),
            None => Ok(()),
        }
    }

    pub fn set_labels(&mut self, labels: VmmLabels) {
        self.labels = labels;
    }

    pub fn labels(&self) -> &VmmLabels {
        &self.labels
    }

    /// Arms a fault for the next branch (tests of the failure-mode table).
    pub fn arm_fault(&mut self, point: FaultPoint) {
        self.faults.arm(point);
    }

    /// The devices this VM was built with.
    pub fn device_config(&self) -> &DeviceConfig {
        &self.device_config
    }

    /// Notes a restore's steps from `timer` (wall and CPU time per step, and in all).
    pub(crate) fn set_restore_phases(&mut self, timer: &crate::phase_timer::PhaseTimer) {
        self.restore_phases_us = timer.steps(1e6);
        self.restore_phases_cpu_us = timer.cpu_steps(1e6);
        self.restore_cpu_us = Some(timer.cpu().as_secs_f64() * 1e6);
    }

    /// Counts the confinement of this VMM process (cgroup, privileges, seccomp: done
    /// before the restore) as the restore's first phase, `confine`.
    pub(crate) fn note_confinement(&mut self, wall_us: f64, cpu_us: f64) {
        self.restore_phases_us.insert(0, ("confine".to_string(), wall_us));
        self.restore_phases_cpu_us.insert(0, ("confine".to_string(), cpu_us));
        self.restore_cpu_us = Some(self.restore_cpu_us.unwrap_or(0.0) + cpu_us);
    }

    pub fn exit_latch(&self) -> Arc<ExitLatch> {
        self.exit.clone()
    }

    pub fn devices(&self) -> &Arc<Devices> {
        &self.devices
    }

    pub fn memory(&self) -> &GuestMemoryMmap {
        &self.memory
    }

    pub fn state(&self) -> RunState {
        if self.exit.get().is_some() {
            RunState::Exited
        } else {
            self.state.clone()
        }
    }

    pub fn status(&self) -> VmmStatus {
        VmmStatus {
            state: self.state(),
            pid: std::process::id(),
            vcpus: self.vcpus.len(),
            mem_size_bytes: total_size(&self.memory),
            irqchip: self.vm.irqchip.name().to_string(),
            cpu_template: self.cpu_template.name().to_string(),
            guest: self.guest.clone(),
            exit: self.exit.get().map(|r| format!("{r:?}")),
            emulation_fixups: crate::vstate::emulation::counts().into_iter().map(|(k, n)| (k.to_string(), n)).collect(),
            restore_phases_us: self.restore_phases_us.clone(),
            restore_cpu_us: self.restore_cpu_us,
            restore_phases_cpu_us: self.restore_phases_cpu_us.clone(),
            labels: self.labels.clone(),
            branches_writing: self.live_writes.iter().filter(|w| !w.is_finished()).map(|w| w.tag.clone()).collect(),
            throttled: self.devices.throttled(),
            devices: self.devices.kinds(),
            lazy_memory: self.lazy_memory.as_ref().map(|p| LazyMemoryStatus {
                windows: p.windows,
                on_demand: p.on_demand.load(std::sync::atomic::Ordering::Relaxed),
                ahead: p.ahead.load(std::sync::atomic::Ordering::Relaxed),
                complete: p.is_complete(),
                failed: p.failure(),
            }),
        }
    }

    fn check_alive(&self) -> Result<(), VmmError> {
        match self.exit.get() {
            Some(r) => Err(VmmError::Exited(r)),
            None => Ok(()),
        }
    }

    /// Sends `req` to every vCPU and waits until each acknowledged with `ack`.
    fn broadcast(
        &mut self,
        make: impl Fn() -> VcpuRequest,
        what: &'static str,
        is_ack: fn(&VcpuEvent) -> Option<u8>,
    ) -> Result<(), VmmError> {
        for v in &self.vcpus {
            v.send(make());
        }
        let mut pending: Vec<u8> = self.vcpus.iter().map(|v| v.index).collect();
        let deadline = Instant::now() + ACK_TIMEOUT;
        while !pending.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(left) {
                Ok(VcpuEvent::Exited(_, reason)) => return Err(VmmError::Exited(reason)),
                Ok(ev) => {
                    if let Some(i) = is_ack(&ev) {
                        pending.retain(|&p| p != i);
                    }
                }
                Err(_) => return Err(VmmError::AckTimeout { index: pending[0], what }),
            }
        }
        Ok(())
    }

    pub fn pause(&mut self) -> Result<(), VmmError> {
        self.check_alive()?;
        if self.state == RunState::Paused {
            return Ok(());
        }
        if self.faults.take(FaultPoint::Pause) {
            return Err(VmmError::Injected(FaultPoint::Pause));
        }
        let paused = self.broadcast(
            || VcpuRequest::Pause,
            "pause",
            |e| match e {
                VcpuEvent::Paused(i) => Some(*i),
                _ => None,
            },
        );
        if let Err(e) = paused {
            // Some vCPUs may have paused: let them all run again, as before the call.
            for v in &self.vcpus {
                v.send(VcpuRequest::Resume);
            }
            return Err(e);
        }
        // vCPUs first, then device backends: after this nothing writes guest memory.
        self.devices.set_paused(true);
        self.state = RunState::Paused;
        Ok(())
    }

    pub fn resume(&mut self) -> Result<(), VmmError> {
        self.check_alive()?;
        if self.state == RunState::Running {
            return Ok(());
        }
        if self.faults.take(FaultPoint::Resume) {
            return Err(VmmError::Injected(FaultPoint::Resume));
        }
        self.devices.set_paused(false);
        self.broadcast(
            || VcpuRequest::Resume,
            "resume",
            |e| match e {
                VcpuEvent::Resumed(i) => Some(*i),
                _ => None,
            },
        )?;
        self.state = RunState::Running;
        Ok(())
    }

    /// The whole VM's state; the VM must be paused.
    pub fn save_state(&mut self) -> Result<VmState, VmmError> {
        self.check_alive()?;
        // Every vCPU reads its own state on its own thread, all at once: the pause of a
        // live branch grows by the slowest vCPU's save, not by the sum.
        let replies: Vec<_> = self
            .vcpus
            .iter()
            .map(|v| {
                let (tx, rx) = channel();
                v.send(VcpuRequest::Save(tx));
                (v.index, rx)
            })
            .collect();
        let deadline = Instant::now() + ACK_TIMEOUT;
        let mut vcpus = Vec::with_capacity(replies.len());
        for (index, rx) in replies {
            let state = rx
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .map_err(|_| VmmError::AckTimeout { index, what: "save" })?
                .map_err(|source| VmmError::SaveVcpu { index, source })?;
            vcpus.push(state);
        }
        let kernel_irqchip = match self.vm.irqchip {
            crate::vstate::irqchip::IrqchipMode::Kernel => Some(KernelIrqchipState::save(&self.vm.fd)?),
            crate::vstate::irqchip::IrqchipMode::Split => None,
        };
        Ok(VmState {
            mem_size: total_size(&self.memory),
            cpu_template: self.cpu_template,
            irqchip_mode: self.vm.irqchip,
            vcpus,
            kernel_irqchip,
            clock: self.vm.save_clock()?,
            devices: self.devices.save(),
        })
    }

    /// Writes a snapshot into the directory `dir` (which must not exist), crash-safely.
    /// A running VM is paused for the duration and resumed afterwards.
    pub fn snapshot(&mut self, dir: &Path) -> Result<SnapshotReport, VmmError> {
        let started = Instant::now();
        let tag = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        forkvm_snapshot::validate_tag(&tag)?;
        let was_running = self.state == RunState::Running;
        self.pause()?;
        let result = self.write_full(
            dir,
            &tag,
            &branch::Lineage::default(),
            branch::DiskCapture::Link,
            &mut crate::phase_timer::PhaseTimer::new(),
        );
        let paused_for = started.elapsed();
        if was_running {
            self.resume()?;
        }
        let (allocated, mem_size) = result?;
        Ok(SnapshotReport {
            dir: dir.to_path_buf(),
            mem_size_bytes: mem_size,
            memory_bytes_allocated: allocated,
            pause_ms: paused_for.as_secs_f64() * 1e3,
            total_ms: started.elapsed().as_secs_f64() * 1e3,
        })
    }

    /// Queues bytes on COM1's input.
    pub fn send_serial_input(&self, data: &[u8]) -> Result<(), VmmError> {
        self.check_alive()?;
        self.devices.send_serial_input(data, Duration::from_secs(5)).map_err(VmmError::Input)
    }

    /// Feeds everything read from `stream` to COM1's input, on a thread of its own (the
    /// console stream of a child is both its serial output and input).
    pub fn forward_input(&self, mut stream: std::os::unix::net::UnixStream) -> std::io::Result<()> {
        use std::io::Read;
        let devices = self.devices.clone();
        let latch = self.exit.clone();
        std::thread::Builder::new().name("serial-in".into()).stack_size(64 << 10).spawn(move || {
            crate::host::seccomp::enter_thread(crate::host::seccomp::ThreadKind::Device);
            let mut buf = [0u8; 256];
            while let Ok(n) = stream.read(&mut buf) {
                if n == 0 || latch.get().is_some() {
                    break;
                }
                if let Err(e) = devices.send_serial_input(&buf[..n], Duration::from_secs(60)) {
                    tracing::warn!(error = %e, "dropping serial input");
                }
            }
        })?;
        Ok(())
    }

    /// Stops the vCPU threads and waits for them, after letting live branches finish
    /// writing (their snapshots must not be lost to a shutdown).
    pub fn stop(&mut self) {
        self.finish_live_writes();
        for v in &self.vcpus {
            v.send(VcpuRequest::Stop);
        }
        for v in &mut self.vcpus {
            v.join();
        }
        self.devices.shutdown();
        self.exit.set(VcpuExitReason::Stopped);
        self.state = RunState::Exited;
    }
}

impl Drop for Vmm {
    fn drop(&mut self) {
        self.stop();
    }
}
