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

use crate::builder::{prepare_lazy, prepare_with_memory, restore, restore_lazy, BuildError, PreparedSnapshot};
use crate::control::serve_until_exit;
use crate::devices::attach::DeviceConfig;
use crate::devices::console_log::ConsoleLog;
use crate::devices::serial::ConsoleOut;
use crate::host::process::{close_fds_except, detach_stdio};
use crate::host::{open_kvm, KvmUnavailable};
use crate::vstate::lazy_memory::LazyMemory;
use crate::vstate::memory_playbook::MemoryPrefetch;
use crate::vstate::vcpu::VcpuExitReason;
use forkvm_snapshot::memory_windows::SocketWindows;
use kvm_ioctls::Kvm;
use std::fs::File;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

mod owned;

pub(crate) use owned::fork_vmm;
use owned::STOP_REQUESTED;
pub use owned::{EnterError, Owned};

/// Opens a child's console log for appending (created if missing, bounded: see
/// `devices::console_log`), before the fork.
pub(crate) fn open_console_log(path: Option<&Path>) -> Result<Option<ConsoleLog>, ZygoteError> {
    path.map(|p| ConsoleLog::open(p).map_err(|source| ZygoteError::ConsoleLog { path: p.to_path_buf(), source }))
        .transpose()
}

/// Exit status of a child that could not restore its VM.
pub const EXIT_RESTORE_FAILED: i32 = 70;
/// Exit status of a lazily restored VMM whose memory could not be fetched (its console
/// log says which window and why).
pub const EXIT_MEMORY_LOST: i32 = 71;

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
    /// The VMM's end of its memory source (`memory_windows::serve_windows` on the host's):
    /// required by a lazy zygote ([`Zygote::lazy`]), ignored by one with an image.
    pub memory_source: Option<UnixStream>,
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

    /// A zygote whose children restore lazily: each maps empty memory and fills it from
    /// its [`ChildSpec::memory_source`] as its guest runs (`vstate::lazy_memory`).
    pub fn lazy(snapshot_dir: &Path) -> Result<Zygote, ZygoteError> {
        let kvm = open_kvm()?;
        let snapshot = prepare_lazy(snapshot_dir)?;
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
        if let Some(image) = &self.snapshot.memory {
            prefetch.advise(image);
        }
        self.memory_prefetch = Some(prefetch).filter(|p| !p.is_empty());
    }

    /// Forks one child VMM ([`fork_vmm`]: moved into its cgroup before it goes on);
    /// returns its pid. The child never returns from this call.
    pub fn spawn(&self, spec: ChildSpec) -> Result<libc::pid_t, ZygoteError> {
        preload_sealed_layers(&spec.devices);
        let log = open_console_log(spec.console_log.as_deref())?;
        let detach = spec.detach;
        let owned = spec.owned.clone();
        fork_vmm(&owned, detach, || self.child_main(spec, log))
    }

    fn child_main(&self, mut spec: ChildSpec, log: Option<ConsoleLog>) -> i32 {
        if spec.detach {
            detach_stdio(log.as_ref().map(ConsoleLog::file));
        }
        let mut error_log = log.as_ref().and_then(|f| f.file().try_clone().ok());
        let input = spec.console_stream.as_ref().and_then(|s| s.try_clone().ok());
        if spec.detach {
            // A detached VMM outlives its caller: it must not keep the caller's files,
            // sockets or locks open (a daemon's state lock, its spawner's socket).
            use std::os::fd::AsRawFd;
            let mut keep = vec![0, 1, 2, self.kvm.as_raw_fd()];
            keep.extend(self.snapshot.memory.as_ref().map(|f| f.as_raw_fd()));
            keep.extend(spec.memory_source.as_ref().map(|s| s.as_raw_fd()));
            keep.extend(spec.owned.jail_fds());
            keep.extend(spec.devices.tap_fd());
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
        if spec.owned.ids.is_some() {
            // Root's files it reads (its disks' bases and the tag's layers), opened
            // while it still may.
            crate::host::preopen::offer_for(&spec.devices, None, Some(&self.kvm));
        }
        // Lazy memory's userfaultfd needs privilege: made before the VMM gives it up.
        let lazy = match self.snapshot.memory {
            Some(_) => None,
            None => match LazyMemory::map(self.snapshot.state.mem_size) {
                Ok(l) => Some(l),
                Err(e) => {
                    let code = fail(format!("restore failed: {e}"), &mut error_log);
                    spec.owned.release(true);
                    return code;
                }
            },
        };
        if let Err(e) = spec.owned.enter() {
            let code = fail(format!("confining the VMM: {e}"), &mut error_log);
            spec.owned.release(true);
            return code;
        }
        let confine_us = (
            started.elapsed().as_secs_f64() * 1e6,
            (crate::phase_timer::thread_cpu_time().saturating_sub(cpu_before)).as_secs_f64() * 1e6,
        );
        let code = self.run_child(&mut spec, lazy, console, input, &mut error_log, confine_us, fail);
        spec.owned.release(code == EXIT_RESTORE_FAILED);
        code
    }

    #[allow(clippy::too_many_arguments)]
    fn run_child(
        &self,
        spec: &mut ChildSpec,
        lazy: Option<LazyMemory>,
        console: ConsoleOut,
        input: Option<UnixStream>,
        error_log: &mut Option<File>,
        confine_us: (f64, f64),
        fail: impl Fn(String, &mut Option<File>) -> i32,
    ) -> i32 {
        let restored = match lazy {
            None => restore(&self.kvm, &self.snapshot, console, &spec.devices, false),
            Some(lazy) => {
                let Some(stream) = spec.memory_source.take() else {
                    return fail("restore failed: a lazy restore without a memory source".into(), error_log);
                };
                let source = Box::new(SocketWindows::new(stream));
                let log = error_log.as_ref().and_then(|f| f.try_clone().ok());
                restore_lazy(&self.kvm, &self.snapshot, lazy, source, memory_lost(log), console, &spec.devices, false)
            }
        };
        let mut vmm = match restored {
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

/// Decodes the bitmaps of `devices`' sealed disk layers once, in this process, so the VMMs
/// it forks share them instead of each reading and decoding its own
/// (`forkvm_snapshot::layered_disk::sealed_bitmaps`). Best effort: a layer that cannot be read
/// here fails in the child, which says why.
fn preload_sealed_layers(devices: &DeviceConfig) {
    for dir in devices.blocks.iter().filter_map(|b| b.layers.as_ref()).flat_map(|l| l.sealed.iter()) {
        let _ = forkvm_snapshot::layered_disk::sealed_bitmaps::preload(dir);
    }
}

/// The failure action of a lazy VMM's memory: the reason into the console log, then the
/// end of the process ([`EXIT_MEMORY_LOST`]); nothing more of the guest runs.
fn memory_lost(mut log: Option<File>) -> crate::vstate::lazy_memory::FailureAction {
    Box::new(move |reason| {
        let line = format!("[forkvm] guest memory could not be fetched, the VMM stops: {reason}");
        match log.as_mut() {
            Some(f) => {
                let _ = writeln!(f, "\n{line}");
            }
            None => eprintln!("forkvm child {}: {line}", std::process::id()),
        }
        // SAFETY: _exit ends the process at once; nothing of it is used after.
        unsafe { libc::_exit(EXIT_MEMORY_LOST) }
    })
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
