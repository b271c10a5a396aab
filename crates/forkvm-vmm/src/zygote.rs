//! Fan-out: many child VMM processes from one snapshot, with the per-snapshot work done
//! once.
//!
//! A `Zygote` opens `/dev/kvm`, reads and checks `snapshot.json` and `vmstate.bin`,
//! decodes the state and opens `memory.img` — once. Each [`Zygote::spawn`] then
//! `fork()`s: the child inherits all of that for free and only does what must be per VM
//! (a KVM VM belongs to the process that created it): create the VM with a split
//! irqchip (0.17 ms here, vs ~16 ms for the full in-kernel one), map `memory.img`
//! `MAP_PRIVATE` (shared page cache, private on write), create and load the vCPUs, start
//! them and serve its control socket.
//!
//! The zygote holds no guest memory, so `fork()` copies almost no page tables. It must be
//! single-threaded when it forks (only the calling thread survives in the child).

use crate::builder::{prepare_with_memory, restore, BuildError, PreparedSnapshot};
use crate::control::serve_until_exit;
use crate::devices::attach::DeviceConfig;
use crate::devices::console_log::ConsoleLog;
use crate::devices::serial::ConsoleOut;
use crate::host::process::{close_fds_except, detach_stdio, fork_and_run};
use crate::host::{open_kvm, KvmUnavailable};
use crate::vstate::memory_playbook::MemoryPrefetch;
use crate::vstate::vcpu::VcpuExitReason;
use kvm_ioctls::Kvm;
use std::fs::File;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

/// Opens a child's console log for appending (created if missing, bounded: see
/// `devices::console_log`), before the fork.
pub(crate) fn open_console_log(path: Option<&Path>) -> Result<Option<ConsoleLog>, ZygoteError> {
    path.map(|p| ConsoleLog::open(p).map_err(|source| ZygoteError::ConsoleLog { path: p.to_path_buf(), source }))
        .transpose()
}

/// Exit status of a child that could not restore its VM.
pub const EXIT_RESTORE_FAILED: i32 = 70;

#[derive(Debug, thiserror::Error)]
pub enum ZygoteError {
    #[error(transparent)]
    Kvm(#[from] KvmUnavailable),
    #[error(transparent)]
    Prepare(#[from] BuildError),
    #[error("opening the console log {path}: {source}")]
    ConsoleLog { path: PathBuf, source: std::io::Error },
    #[error("fork() of the zygote: {0}")]
    Fork(std::io::Error),
    #[error(transparent)]
    Seccomp(#[from] crate::host::seccomp::SeccompError),
    #[error("the child's cgroup: {0}")]
    Cgroup(crate::host::cgroup::CgroupError),
    #[error("the pipe a child waits on for its cgroup: {0}")]
    Gate(std::io::Error),
    #[error(transparent)]
    Jail(crate::host::jail::JailError),
}

/// A pipe a forked child waits on until its parent has moved it into its cgroup.
struct Gate {
    read: std::os::fd::OwnedFd,
    write: std::os::fd::OwnedFd,
}

impl Gate {
    fn new() -> std::io::Result<Gate> {
        use std::os::fd::FromRawFd;
        let mut fds = [0; 2];
        // SAFETY: pipe2 writes two descriptors into the array.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: both descriptors were just made and are owned by nothing else.
        Ok(unsafe {
            Gate { read: std::os::fd::OwnedFd::from_raw_fd(fds[0]), write: std::os::fd::OwnedFd::from_raw_fd(fds[1]) }
        })
    }

    /// In the child: whether the parent moved it (a byte) or not (end of file).
    fn wait(&self) -> bool {
        use std::os::fd::AsRawFd;
        // SAFETY: the child's copy of the write end, closed once here (its OwnedFd in
        // this copy of the process is never dropped: the child leaves through _exit).
        unsafe { libc::close(self.write.as_raw_fd()) };
        let mut byte = 0u8;
        loop {
            // SAFETY: reads at most one byte into a local.
            let n = unsafe { libc::read(self.read.as_raw_fd(), (&mut byte as *mut u8).cast(), 1) };
            if n >= 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                return n == 1;
            }
        }
    }

    /// In the parent: lets the child go, saying whether it was moved.
    fn open_if(self, moved: bool) {
        use std::os::fd::AsRawFd;
        if moved {
            // SAFETY: writes one byte from a local to the pipe.
            unsafe { libc::write(self.write.as_raw_fd(), b"1".as_ptr().cast(), 1) };
        }
    }
}

/// One child to start.
#[derive(Debug, Default)]
pub struct ChildSpec {
    /// Control socket the child serves.
    pub socket: Option<PathBuf>,
    /// File the guest's serial output is appended to.
    pub console_log: Option<PathBuf>,
    /// Stream the guest's serial output is also written to, and whose input is fed to
    /// the guest's serial port.
    pub console_stream: Option<UnixStream>,
    /// Start a new session so the child outlives the caller's terminal.
    pub detach: bool,
    /// The child's virtio devices: the snapshot's kinds, with this child's paths.
    pub devices: DeviceConfig,
    /// Labels (sandbox id, template) of the child's VMM.
    pub labels: crate::vmm::VmmLabels,
    /// What the child owns and removes when its VM stops.
    pub owned: Owned,
}

/// Whether this VMM process's VM stopped because it was asked to (`Owned::release`).
static STOP_REQUESTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// What a sandbox's VMM process owns: it joins the cgroup before it builds the VM (so
/// the VM's memory is charged there) and removes the cgroup and the run directory when
/// the VM stops — nothing of a sandbox outlives it.
#[derive(Debug, Default)]
pub struct Owned {
    /// Run directory (control and vsock sockets, console log), removed at exit.
    pub run_dir: Option<PathBuf>,
    /// Memory cgroup (name under the forkvm cgroup root) the process runs in.
    pub cgroup: Option<String>,
    /// Whether the process runs under its seccomp filters (`host::seccomp`).
    pub seccomp: crate::host::seccomp::Seccomp,
    /// The jail the process enters (`host::jail`); None: it stays where it was forked
    /// (a fork of a running VMM is born in its parent's).
    pub jail: Option<std::sync::Arc<crate::host::jail::JailNamespaces>>,
}

/// Why a VMM process could not be confined ([`Owned::enter`]).
#[derive(Debug, thiserror::Error)]
pub enum EnterError {
    #[error("joining the sandbox cgroup: {0}")]
    Cgroup(#[from] crate::host::cgroup::CgroupError),
    #[error(transparent)]
    Privileges(#[from] crate::host::privileges::PrivilegeError),
    #[error(transparent)]
    Seccomp(#[from] crate::host::seccomp::SeccompError),
    #[error(transparent)]
    Rlimits(#[from] crate::host::rlimits::RlimitError),
    #[error(transparent)]
    Jail(#[from] crate::host::jail::JailError),
}

impl Owned {
    /// Confines the calling VMM process before it runs guest code: joins the cgroup, if
    /// any, enters its jail ([`crate::host::jail`]), if any, drops every privilege
    /// ([`crate::host::privileges`]), sets its resource limits ([`crate::host::rlimits`]),
    /// then puts the process under its seccomp filters ([`crate::host::seccomp`]) unless they are off. Call it
    /// while the process has one thread. Errors name the step.
    /// `joined`: the group whoever forked the process already moved it into.
    pub fn enter(
        &self,
        joined: Option<crate::host::cgroup::SandboxCgroup>,
    ) -> Result<Option<crate::host::cgroup::SandboxCgroup>, EnterError> {
        let group = match joined {
            Some(group) => Some(group),
            None => {
                let group = self.open_cgroup(None)?;
                if let Some(g) = &group {
                    g.join(0)?;
                }
                group
            }
        };
        if let Some(jail) = &self.jail {
            // What the VMM reads of /proc later, opened while it can.
            crate::vstate::memory_playbook::open_pagemap_early();
            jail.enter()?;
        }
        crate::host::privileges::drop_privileges()?;
        crate::host::rlimits::apply_vmm_rlimits()?;
        if self.seccomp == crate::host::seccomp::Seccomp::Enforce {
            crate::host::seccomp::enforce()?;
        }
        Ok(group)
    }

    /// Descriptors a forked VMM keeps until it has entered its jail (none without one).
    pub fn jail_fds(&self) -> Vec<std::os::fd::RawFd> {
        self.jail.iter().flat_map(|j| j.fds()).collect()
    }

    /// The process's cgroup, if it has one (it must exist: the starter made it), under
    /// `root` (detected when not given).
    pub fn open_cgroup(
        &self,
        root: Option<&crate::host::cgroup::CgroupRoot>,
    ) -> Result<Option<crate::host::cgroup::SandboxCgroup>, crate::host::cgroup::CgroupError> {
        use crate::host::cgroup::{CgroupError, CgroupRoot};
        let Some(name) = &self.cgroup else { return Ok(None) };
        let root = match root {
            Some(r) => r,
            None => CgroupRoot::detected()?,
        };
        root.open(name)
            .map(Some)
            .ok_or_else(|| CgroupError::Missing { name: name.clone(), root: root.dir().to_path_buf() })
    }

    /// Leaves and removes the cgroup, and removes the run directory — unless the VMM
    /// failed: then its console log (which says why) stays for whoever waits for the
    /// sandbox, and registry sweeps remove it once they see the VMM is gone. It also
    /// stays when the VM stopped without being asked (the guest powered off) and its
    /// disks were written: the registry salvages those writes into the sandbox's vault
    /// before removing it.
    pub fn release(&self, group: Option<crate::host::cgroup::SandboxCgroup>, failed: bool) {
        let unasked_with_writes = || {
            !STOP_REQUESTED.load(std::sync::atomic::Ordering::SeqCst)
                && self.run_dir.as_ref().is_some_and(|d| {
                    std::fs::read_dir(d.join("disks")).is_ok_and(|mut entries| entries.next().is_some())
                })
        };
        if let (Some(dir), false) = (&self.run_dir, failed || unasked_with_writes()) {
            let _ = std::fs::remove_dir_all(dir);
        }
        if let Some(g) = group {
            if let Err(e) = g.leave_and_remove() {
                eprintln!("forkvm child {}: {e}", std::process::id());
            }
        }
    }
}

#[derive(Debug)]
pub struct Zygote {
    kvm: Kvm,
    snapshot: PreparedSnapshot,
    /// Memory pages every child faults in ahead of its guest (a memory playbook).
    memory_prefetch: Option<MemoryPrefetch>,
}

impl Zygote {
    pub fn new(snapshot_dir: &Path) -> Result<Zygote, ZygoteError> {
        Zygote::with_memory(snapshot_dir, None)
    }

    /// A zygote whose memory image is `memory` rather than the directory's `memory.img`
    /// (a chunked snapshot's assembled image).
    pub fn with_memory(snapshot_dir: &Path, memory: Option<&Path>) -> Result<Zygote, ZygoteError> {
        let kvm = open_kvm()?;
        let snapshot = prepare_with_memory(snapshot_dir, memory)?;
        // Once here rather than in every child.
        crate::host::seccomp::prepare()?;
        Ok(Zygote { kvm, snapshot, memory_prefetch: None })
    }

    pub fn snapshot(&self) -> &PreparedSnapshot {
        &self.snapshot
    }

    /// Replays a memory playbook (`vstate::memory_playbook`): asks the kernel now to read
    /// its pages of the image ahead, and has every child spawned from here on map them on
    /// a background thread as its vCPUs start.
    pub fn prefetch_memory(&mut self, prefetch: MemoryPrefetch) {
        prefetch.advise(&self.snapshot.memory);
        self.memory_prefetch = Some(prefetch).filter(|p| !p.is_empty());
    }

    /// Forks one child VMM; returns its pid. The child never returns from this call.
    ///
    /// The child's cgroup is joined from here, one child after another, and the child
    /// waits for that before it builds anything (so its memory is charged there). Moves
    /// into cgroups are cheap made in a row by one process (~0.1 ms for the three v1
    /// hierarchies here) and slow made by a hundred fresh children at once, each its own
    /// (~120 ms each in `bench spawn -n 100`: they contend for the cgroup locks and wait
    /// out RCU grace periods). If the move fails here the child makes it itself.
    pub fn spawn(&self, spec: ChildSpec) -> Result<libc::pid_t, ZygoteError> {
        let log = open_console_log(spec.console_log.as_deref())?;
        let detach = spec.detach;
        let group = spec.owned.open_cgroup(None).map_err(ZygoteError::Cgroup)?;
        let gate = group.as_ref().map(|_| Gate::new()).transpose().map_err(ZygoteError::Gate)?;
        let jail = spec.owned.jail.clone();
        let fork = || {
            fork_and_run(detach, || {
                let joined = group.clone().filter(|_| gate.as_ref().is_some_and(Gate::wait));
                self.child_main(spec, log, joined)
            })
        };
        let pid = crate::host::jail::fork_into(jail.as_deref(), fork)
            .map_err(ZygoteError::Jail)?
            .map_err(ZygoteError::Fork)?;
        if let (Some(group), Some(gate)) = (group, gate) {
            gate.open_if(group.join(pid as u32).is_ok());
        }
        Ok(pid)
    }

    fn child_main(
        &self,
        mut spec: ChildSpec,
        log: Option<ConsoleLog>,
        joined: Option<crate::host::cgroup::SandboxCgroup>,
    ) -> i32 {
        if spec.detach {
            detach_stdio(log.as_ref().map(ConsoleLog::file));
        }
        let mut error_log = log.as_ref().and_then(|f| f.file().try_clone().ok());
        let input = spec.console_stream.as_ref().and_then(|s| s.try_clone().ok());
        if spec.detach {
            // A detached VMM outlives its caller: it must not keep the caller's files,
            // sockets or locks open (a daemon's state lock, its spawner's socket).
            use std::os::fd::AsRawFd;
            let mut keep = vec![0, 1, 2, self.kvm.as_raw_fd(), self.snapshot.memory.as_raw_fd()];
            keep.extend(spec.owned.jail_fds());
            keep.extend(log.as_ref().map(|f| f.file().as_raw_fd()));
            keep.extend(error_log.as_ref().map(|f| f.as_raw_fd()));
            keep.extend(input.as_ref().map(|f| f.as_raw_fd()));
            keep.extend(spec.console_stream.as_ref().map(|f| f.as_raw_fd()));
            close_fds_except(&keep);
        }
        let console = ConsoleOut::new(log, spec.console_stream.take());
        let detached = spec.detach;
        let fail = move |msg: String, error_log: &mut Option<File>| {
            if let Some(f) = error_log.as_mut() {
                let _ = writeln!(f, "\n[forkvm] {msg}");
            }
            if !detached {
                // A detached child's stderr is the console log, which already has it.
                eprintln!("forkvm child {}: {msg}", std::process::id());
            }
            EXIT_RESTORE_FAILED
        };
        let (started, cpu_before) = (std::time::Instant::now(), crate::phase_timer::thread_cpu_time());
        let group = match spec.owned.enter(joined) {
            Ok(g) => g,
            Err(e) => {
                let code = fail(format!("confining the VMM: {e}"), &mut error_log);
                spec.owned.release(None, true);
                return code;
            }
        };
        let confine_us = (
            started.elapsed().as_secs_f64() * 1e6,
            (crate::phase_timer::thread_cpu_time().saturating_sub(cpu_before)).as_secs_f64() * 1e6,
        );
        let code = self.run_child(&spec, console, input, &mut error_log, confine_us, fail);
        spec.owned.release(group, code == EXIT_RESTORE_FAILED);
        code
    }

    fn run_child(
        &self,
        spec: &ChildSpec,
        console: ConsoleOut,
        input: Option<UnixStream>,
        error_log: &mut Option<File>,
        confine_us: (f64, f64),
        fail: impl Fn(String, &mut Option<File>) -> i32,
    ) -> i32 {
        let mut vmm = match restore(&self.kvm, &self.snapshot, console, &spec.devices, false) {
            Ok(v) => v,
            Err(e) => return fail(format!("restore failed: {e}"), error_log),
        };
        vmm.note_confinement(confine_us.0, confine_us.1);
        vmm.set_labels(spec.labels.clone());
        if let Some(p) = &self.memory_prefetch {
            // Best effort: without the thread the guest faults its pages in itself.
            let _ = p.populate_in_background(vmm.memory());
        }
        if let Some(input) = input {
            if let Err(e) = vmm.forward_input(input) {
                return fail(format!("starting the serial input thread: {e}"), error_log);
            }
        }
        serve_to_exit_code(vmm, spec.socket.as_deref(), error_log, fail)
    }
}

/// Serves `vmm`'s control socket until its VM stops, notes why in the console log, and
/// turns that into the VMM process's exit status: the guest's own code, 0 when asked to
/// stop, else `fail`'s (a failure keeps the run directory, so the log says what happened).
pub(crate) fn serve_to_exit_code(
    vmm: crate::Vmm,
    socket: Option<&Path>,
    error_log: &mut Option<File>,
    fail: impl Fn(String, &mut Option<File>) -> i32,
) -> i32 {
    let outcome = serve_until_exit(vmm, socket);
    if matches!(outcome, Ok(VcpuExitReason::Stopped)) {
        STOP_REQUESTED.store(true, std::sync::atomic::Ordering::SeqCst);
    }
    if let (Ok(reason), Some(f)) = (&outcome, error_log.as_mut()) {
        let _ = writeln!(f, "[forkvm] VMM stopping: {reason:?}");
    }
    match outcome {
        Ok(VcpuExitReason::GuestExit(code)) => i32::from(code),
        Ok(VcpuExitReason::Stopped) => 0,
        // Nobody asked for it: a reboot or kernel panic in the guest.
        Ok(VcpuExitReason::Reset) => fail("the guest reset itself (reboot or kernel panic)".into(), error_log),
        Ok(other) => fail(format!("guest stopped: {other:?}"), error_log),
        Err(e) => fail(e.to_string(), error_log),
    }
}
