//! Fork a running VM straight into N children, without a disk round trip.
//!
//! The same mechanism as a live branch: pause the vCPUs, capture vCPU and device state,
//! `fork()` this VMM once, and resume. That one copy (the fan-out process) holds guest
//! memory frozen at the pause point, copy-on-write, and forks one VMM per child from it
//! while the source already runs again: the source pauses for one `fork()` whatever the
//! number of children (each `fork()` copies the page tables of guest memory, so forking
//! N children in the pause kept the source still N times as long). The fan-out process
//! reports the children's pids through a pipe and exits; the source is a child
//! subreaper, so they become its children, and it reaps them.
//!
//! Each child closes this VM's KVM descriptors (a KVM VM belongs to the process that
//! created it), builds its own VM around the inherited memory from the captured state —
//! its own vsock socket, control socket and console — and serves until it stops. The
//! source runs on unchanged.

use super::fork_fan_out as fan_out;
use super::{GuestInfo, Vmm, VmmError, VmmLabels};
use crate::builder::restore_state;
use crate::devices::attach::TapSource;
use crate::devices::console_log::ConsoleLog;
use crate::devices::serial::ConsoleOut;
use crate::host::open_kvm;
use crate::host::process::{close_fds_except, detach_stdio, fork_and_run};
use crate::host::seccomp::Seccomp;
use crate::phase_timer::PhaseTimer;
use crate::zygote::{Owned, EXIT_RESTORE_FAILED};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

/// One child of a fork of the running VM.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForkChild {
    /// Control socket the child serves.
    pub socket: PathBuf,
    /// File the child's serial output is appended to.
    #[serde(default)]
    pub console_log: Option<PathBuf>,
    /// The child's vsock socket (required when the VM has a vsock device).
    #[serde(default)]
    pub vsock_uds: Option<PathBuf>,
    /// Labels of the child's VMM (its sandbox id).
    #[serde(default)]
    pub labels: VmmLabels,
    /// Run directory the child removes when it stops.
    #[serde(default)]
    pub run_dir: Option<PathBuf>,
    /// The caps of the child's devices (absent: its source's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limits: Option<crate::devices::attach::RateLimits>,
    /// Where the child keeps its layered disks' writable tops (`disk<i>/` inside);
    /// required when the VM has a layered disk.
    #[serde(default)]
    pub disk_dir: Option<PathBuf>,
    /// The child's own tap (required when the VM has a network device): a descriptor,
    /// so never in the JSON; the control socket takes it as `SCM_RIGHTS` with the request.
    /// The child keeps it and closes every other child's and the source's.
    #[serde(skip)]
    pub tap: Option<TapSource>,
}

/// What a fork of the running VM did.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ForkReport {
    pub pids: Vec<i32>,
    /// From the pause request until the source ran again.
    pub pause_ms: f64,
    /// From the pause request until every child's VMM process had been forked.
    #[serde(default)]
    pub forked_ms: f64,
}

#[derive(Debug, thiserror::Error)]
pub enum ForkRunningError {
    #[error("fork: at least one child is needed")]
    NoChildren,
    #[error("fork: child {index} needs a vsock socket path (the VM has a vsock device)")]
    MissingVsock { index: usize },
    #[error("fork: child {index} needs a tap of its own (the VM has a network device)")]
    MissingTap { index: usize },
    #[error("fork: child {index} needs a disk directory (the VM has a layered disk)")]
    MissingDiskDir { index: usize },
    #[error("fork: sealing the source VM's disks failed (it was resumed): {0}")]
    Seal(VmmError),
    #[error("fork: pausing the source VM failed; it keeps running unchanged: {0}")]
    Pause(VmmError),
    #[error("fork: capturing the source VM's state failed (it was resumed): {0}")]
    Save(VmmError),
    #[error("fork: fork() of child {index} failed after {done} children started (the source was resumed): {source}")]
    Fork { index: usize, done: usize, source: std::io::Error },
    #[error("fork: becoming the children's subreaper failed; the source runs on unchanged: {0}")]
    Subreaper(std::io::Error),
    #[error("fork: starting the fan-out process failed (the source was resumed): {0}")]
    FanOut(std::io::Error),
    #[error("fork: the fan-out process ended after {done} of {wanted} children started")]
    FanOutLost { done: usize, wanted: usize },
    #[error("fork: the children started, but resuming the source VM failed: {0}")]
    Resume(VmmError),
    #[error("fork: the children copy the source's memory with fork(), and {0}; try again once it is in")]
    MemoryArriving(String),
}

impl Vmm {
    /// Forks this running VM into one child VMM process per entry of `children`.
    pub fn fork_running(&mut self, children: &[ForkChild]) -> Result<ForkReport, ForkRunningError> {
        if children.is_empty() {
            return Err(ForkRunningError::NoChildren);
        }
        self.await_memory().map_err(ForkRunningError::MemoryArriving)?;
        if self.device_config.vsock.is_some() {
            if let Some(index) = children.iter().position(|c| c.vsock_uds.is_none()) {
                return Err(ForkRunningError::MissingVsock { index });
            }
        }
        if self.device_config.net.is_some() {
            if let Some(index) = children.iter().position(|c| c.tap.is_none()) {
                return Err(ForkRunningError::MissingTap { index });
            }
        }
        if self.device_config.blocks.iter().any(|b| b.layers.is_some()) {
            if let Some(index) = children.iter().position(|c| c.disk_dir.is_none()) {
                return Err(ForkRunningError::MissingDiskDir { index });
            }
        }
        // The children the fan-out process forks become ours when it exits.
        // SAFETY: prctl with integer arguments.
        if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
            return Err(ForkRunningError::Subreaper(std::io::Error::last_os_error()));
        }
        let started = Instant::now();
        let was_running = self.state() == super::RunState::Running;
        self.pause().map_err(ForkRunningError::Pause)?;
        // The children share the disks as of now: seal, so each gets its own top over
        // the same layers and the source writes to a new top of its own.
        if let Err(e) = self.seal_disks() {
            let _ = if was_running { self.resume() } else { Ok(()) };
            return Err(ForkRunningError::Seal(e));
        }
        let state = match self.save_state() {
            Ok(s) => s,
            Err(e) => {
                let _ = if was_running { self.resume() } else { Ok(()) };
                return Err(ForkRunningError::Save(e));
            }
        };
        let fanned = fan_out::start(|report| self.fan_out(&state, children, report));
        let resumed = if was_running { self.resume() } else { Ok(()) };
        let pause_ms = started.elapsed().as_secs_f64() * 1e3;
        let (pids, forked) = match fanned {
            Ok(fan_out) => fan_out.collect(children.len()),
            Err(e) => (Vec::new(), Err(ForkRunningError::FanOut(e))),
        };
        let forked_ms = started.elapsed().as_secs_f64() * 1e3;
        for &pid in &pids {
            reap_in_background(pid);
        }
        forked?;
        resumed.map_err(ForkRunningError::Resume)?;
        Ok(ForkReport { pids, pause_ms, forked_ms })
    }

    /// In the fan-out process: forks one VMM per child, reporting each pid (or the
    /// failure that stopped the loop) as it goes. Returns its exit code.
    fn fan_out(&self, state: &crate::persist::VmState, children: &[ForkChild], report: &mut fan_out::Reporter) -> i32 {
        for child in children {
            match fork_and_run(true, || self.child_main(state, child)) {
                Ok(pid) => report.started(pid),
                Err(e) => {
                    report.failed(&e);
                    return 1;
                }
            }
        }
        0
    }

    /// In a forked child: builds its own VM around the inherited memory and serves it.
    fn child_main(&self, state: &crate::persist::VmState, child: &ForkChild) -> i32 {
        // Nothing the source process has open belongs to this child: its KVM VM, device
        // backends' sockets and files, control connections. Keep only stdio and what the
        // source opened before it left uid 0 (`host::preopen`), which the child reads too.
        let mut keep = vec![0, 1, 2];
        keep.extend(forkvm_snapshot::preopened::fds());
        if let Some(TapSource::Fd(fd)) = &child.tap {
            keep.push(std::os::fd::AsRawFd::as_raw_fd(&**fd));
        }
        close_fds_except(&keep);
        let log = child.console_log.as_deref().and_then(|p| ConsoleLog::open(p).ok());
        detach_stdio(log.as_ref().map(ConsoleLog::file));
        let mut error_log = log.as_ref().and_then(|f| f.file().try_clone().ok());
        let fail = |msg: String, error_log: &mut Option<std::fs::File>| {
            if let Some(f) = error_log.as_mut() {
                let _ = writeln!(f, "\n[forkvm] {msg}");
            }
            EXIT_RESTORE_FAILED
        };
        // The child inherits this process's seccomp filters, if any.
        let seccomp = if crate::host::seccomp::enforced() { Seccomp::Enforce } else { Seccomp::Off };
        // Its cgroup is the caller's to move it into (it knows the child's pid from the
        // report): a VMM writes no cgroup file (`zygote::owned`).
        let owned = Owned { run_dir: child.run_dir.clone(), cgroup: None, seccomp, jail: None, ids: None };
        if let Err(e) = owned.enter() {
            let code = fail(format!("confining the VMM: {e}"), &mut error_log);
            owned.release(true);
            return code;
        }
        let code = self.serve_child(state, child, log, &mut error_log, fail);
        owned.release(code == EXIT_RESTORE_FAILED);
        code
    }

    fn serve_child(
        &self,
        state: &crate::persist::VmState,
        child: &ForkChild,
        log: Option<ConsoleLog>,
        error_log: &mut Option<std::fs::File>,
        fail: impl Fn(String, &mut Option<std::fs::File>) -> i32,
    ) -> i32 {
        let kvm = match open_kvm() {
            Ok(k) => k,
            Err(e) => return fail(e.to_string(), error_log),
        };
        let mut devices = self.device_config.clone();
        if let Some(limits) = child.rate_limits {
            devices.rate_limits = limits;
        }
        if let (Some(v), Some(uds)) = (devices.vsock.as_mut(), &child.vsock_uds) {
            v.uds_path = uds.clone();
        }
        if let (Some(n), Some(tap)) = (devices.net.as_mut(), &child.tap) {
            n.tap = tap.clone();
        }
        for (i, b) in devices.blocks.iter_mut().enumerate() {
            if let (Some(l), Some(dir)) = (b.layers.as_mut(), &child.disk_dir) {
                let own = dir.join(format!("disk{i}"));
                // The source's own layers live in its directory, which goes when it
                // stops or compacts them: the child keeps its own hard links.
                if let Err(e) = super::disks::inherit_layers(&l.dir, &mut l.sealed, &own) {
                    return fail(format!("linking the source's layers of disk {i}: {e}"), error_log);
                }
                l.dir = own;
            }
        }
        let guest = GuestInfo { kind: self.guest.kind.clone(), name: self.guest.name.clone() };
        let console = ConsoleOut::new(log, None);
        let restored =
            restore_state(&kvm, state, self.memory.clone(), guest, console, &devices, false, PhaseTimer::new());
        let mut vmm = match restored {
            Ok(v) => v,
            Err(e) => return fail(format!("restoring the forked VM: {e}"), error_log),
        };
        let mut labels = child.labels.clone();
        if labels.template.is_none() {
            labels.template = self.labels.template.clone();
        }
        vmm.set_labels(labels);
        crate::zygote::serve_to_exit_code(vmm, Some(&child.socket), error_log, fail)
    }
}

/// Reaps a child VMM when it exits, so it does not linger as a zombie of the source.
fn reap_in_background(pid: libc::pid_t) {
    let spawned = std::thread::Builder::new().name("reap-child".into()).stack_size(64 << 10).spawn(move || {
        let mut status = 0;
        // SAFETY: waits for our own child; `status` is a valid out pointer.
        unsafe { libc::waitpid(pid, &mut status, 0) };
    });
    if let Err(e) = spawned {
        tracing::warn!(pid, error = %e, "cannot start a reaper thread; the child will be reaped by init");
    }
}
