//! BRANCH: snapshot a running VM under a new tag, in one of two modes (DESIGN §2).
//!
//! * `full`: pause the vCPUs → write state and memory → resume. The pause window grows
//!   with memory and disk speed.
//! * `live`: pause → capture vCPU/device state (small) → publish the tag as `writing` →
//!   `fork()` this process → resume at once. The forked copy holds guest memory frozen at
//!   the pause (copy-on-write) and writes the sparse memory image; a background thread
//!   here reaps it, syncs the files and marks the snapshot `ready`. The pause window is
//!   the state capture plus `fork()`, independent of disk speed.
//!
//! Failure modes (seed `000_*`): the tag is checked before anything is touched (collision
//! → conflict, no side effect); pause fails → the VM runs on unchanged; writing fails
//! (disk full included) → the partial files are removed and the VM resumed; resume fails
//! after a good snapshot → the snapshot stays valid and the error says so. A live writer
//! that fails removes its `writing` directory; a VMM that crashes mid-write leaves only a
//! `writing` directory naming a dead writer, which readers refuse and sweeps remove.

use super::{RunState, Vmm, VmmError};
use crate::phase_timer::PhaseTimer;
use crate::vmm::fault::FaultPoint;
use crate::vstate::memory::{image_offsets, region_slices};
use forkvm_snapshot::{
    DevicesMeta, DiskMeta, GuestIdentity, SnapshotMeta, SnapshotStatus, SnapshotWriter, MEMORY_IMG, SNAPSHOT_JSON,
    VMSTATE_BIN,
};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::Instant;

/// How a branch captures memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BranchMode {
    #[default]
    Full,
    Live,
}

impl std::str::FromStr for BranchMode {
    type Err = crate::unknown_name::UnknownName;
    fn from_str(s: &str) -> Result<BranchMode, Self::Err> {
        match s {
            "full" => Ok(BranchMode::Full),
            "live" => Ok(BranchMode::Live),
            other => Err(crate::unknown_name::UnknownName::new("branch mode", other, "full, live")),
        }
    }
}

/// A branch to take.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BranchRequest {
    /// The snapshot store's `snapshots/` directory; the branch is `<store>/<tag>`.
    pub store: PathBuf,
    /// The new tag; default `branch-<sandbox-id>-<seq>`.
    #[serde(default)]
    pub tag: Option<String>,
    #[serde(default)]
    pub mode: BranchMode,
    /// Live mode: wait until the snapshot is `ready` (default) or return once the source
    /// runs again.
    #[serde(default = "yes")]
    pub wait: bool,
    /// How the snapshot holds the VM's disk files.
    #[serde(default)]
    pub disks: DiskCapture,
    /// The limits sandboxes spawned from the branch get unless they ask for others: the
    /// source sandbox's (written in its `snapshot.json`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_limits: Option<forkvm_snapshot::DefaultLimits>,
    /// Where sandboxes spawned from the branch may connect to unless they ask for
    /// another policy: the source sandbox's. The host writes it again when it adopts the
    /// branch (`forkvm_sandbox`'s inbox), so a VMM cannot widen it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_network: Option<forkvm_api::NetworkPolicy>,
}

/// Where a snapshot comes from, as its `snapshot.json` says.
#[derive(Debug, Clone, Default)]
pub(super) struct Lineage {
    /// The sandbox it was branched from.
    pub branched_from: Option<String>,
    pub default_limits: Option<forkvm_snapshot::DefaultLimits>,
    pub default_network: Option<forkvm_api::NetworkPolicy>,
}

/// How a branch puts the VM's disk files (images, bases, sealed layers) in its `disk/`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DiskCapture {
    /// Hard links (copies across filesystems): the snapshot stands alone.
    #[default]
    Link,
    /// Only named, in `disk/references.json` (`forkvm_snapshot::DiskReferences`): where
    /// the VM has each file; nothing is copied or linked, and the capture is only valid
    /// while they exist. For a caller that moves the capture elsewhere at once (an
    /// archive encrypts it into the vault), so a run directory on another filesystem
    /// never receives a copy of a root image. The reader checks every path before it
    /// opens one (VMMs make no symbolic links: their filters deny it).
    Reference,
}

fn yes() -> bool {
    true
}

/// What a branch did.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BranchReport {
    pub tag: String,
    pub dir: PathBuf,
    pub mode: BranchMode,
    /// `writing` when a live branch returned before its memory image was complete.
    pub status: SnapshotStatus,
    /// The source sandbox (its id), recorded in the snapshot.
    pub branched_from: Option<String>,
    pub created_at_unix_ms: u64,
    pub mem_size_bytes: u64,
    /// From the pause request until the vCPUs ran again.
    pub pause_ms: f64,
    /// From the call until it returned.
    pub return_ms: f64,
    /// Allocated bytes of `memory.img`, once it is complete.
    pub memory_bytes_allocated: Option<u64>,
    /// Milliseconds per step of the pause window, in order.
    pub phases_ms: Vec<(String, f64)>,
}

/// Why a branch failed; [`BranchError::code`] maps it onto the API's status.
#[derive(Debug, thiserror::Error)]
pub enum BranchError {
    #[error("branch tag {tag:?}: a snapshot with this tag already exists at {dir}")]
    Conflict { tag: String, dir: PathBuf },
    #[error("branch: {0}")]
    BadTag(#[from] forkvm_snapshot::TagError),
    #[error("branch: the source VM is not running ({0:?})")]
    NotRunning(RunState),
    #[error("branch: pausing the source VM failed; it keeps running unchanged: {0}")]
    Pause(VmmError),
    #[error("branch: writing the snapshot failed{}: {source}; partial files removed; {resumed}", if *disk_full { " (disk full)" } else { "" })]
    Snapshot { source: VmmError, disk_full: bool, resumed: String },
    #[error("branch: the snapshot {} is valid{}, but resuming the source VM failed: {source}", dir.display(), if *writing { " (its memory image is still being written)" } else { "" })]
    Resume { dir: PathBuf, writing: bool, source: VmmError },
    #[error("branch: a live branch copies the source's memory with fork(), and {0}; try again once it is in (or branch with mode full)")]
    MemoryArriving(String),
}

impl BranchError {
    /// `conflict`, `bad_request`, `disk_full` or `internal`.
    pub fn code(&self) -> forkvm_api::ErrorCode {
        match self {
            BranchError::Conflict { .. } | BranchError::NotRunning(_) | BranchError::MemoryArriving(_) => {
                forkvm_api::ErrorCode::Conflict
            }
            BranchError::BadTag(_) => forkvm_api::ErrorCode::BadRequest,
            BranchError::Snapshot { disk_full: true, .. } => forkvm_api::ErrorCode::DiskFull,
            _ => forkvm_api::ErrorCode::Internal,
        }
    }
}

/// A live branch's background writer.
#[derive(Debug)]
pub(crate) struct LiveWrite {
    pub tag: String,
    handle: Option<JoinHandle<()>>,
}

/// Where a live branch's writer thread reports its outcome (allocated bytes or why not).
type LiveOutcome = std::sync::mpsc::Receiver<Result<u64, VmmError>>;

/// A live branch whose caller waits for it to be `ready` — without holding the VMM (the
/// control socket keeps serving other requests meanwhile).
#[derive(Debug)]
pub struct PendingBranch {
    outcome: LiveOutcome,
    started: Instant,
}

impl PendingBranch {
    /// Waits for the memory image; returns the report of a `ready` snapshot.
    pub fn finish(self, mut report: BranchReport) -> Result<BranchReport, BranchError> {
        let resumed = "the source VM was resumed".to_string();
        match self.outcome.recv() {
            Ok(Ok(bytes)) => {
                report.memory_bytes_allocated = Some(bytes);
                report.status = SnapshotStatus::Ready;
                report.return_ms = self.started.elapsed().as_secs_f64() * 1e3;
                Ok(report)
            }
            Ok(Err(source)) => {
                let disk_full = is_disk_full(&source);
                Err(BranchError::Snapshot { source, disk_full, resumed })
            }
            Err(_) => {
                let source = VmmError::Disk("the live branch writer thread ended without a result".into());
                Err(BranchError::Snapshot { source, disk_full: false, resumed })
            }
        }
    }
}

impl LiveWrite {
    pub fn is_finished(&self) -> bool {
        self.handle.as_ref().is_none_or(|h| h.is_finished())
    }
}

/// Whether an error chain holds an ENOSPC (or EDQUOT) from the kernel.
fn is_disk_full(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if matches!(io.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT)) {
                return true;
            }
        }
        cur = e.source();
    }
    false
}

fn now_unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

impl Vmm {
    /// The tag a branch without one gets: `branch-<sandbox-id>-<seq>`, the first free one.
    fn default_branch_tag(&mut self, store: &Path) -> String {
        let id = self.labels.sandbox_id.clone().unwrap_or_else(|| format!("vm{}", std::process::id()));
        loop {
            self.branch_seq += 1;
            let tag = format!("branch-{id}-{}", self.branch_seq);
            if std::fs::symlink_metadata(store.join(&tag)).is_err() {
                return tag;
            }
        }
    }

    /// Snapshots this running VM under a new tag (see the module doc), waiting for a
    /// live branch's memory image when `req.wait` says so.
    pub fn branch(&mut self, req: &BranchRequest) -> Result<BranchReport, BranchError> {
        let (report, pending) = self.start_branch(req)?;
        match pending {
            Some(p) => p.finish(report),
            None => Ok(report),
        }
    }

    /// [`Vmm::branch`] up to the point where the source runs again. A live branch with
    /// `wait` returns a [`PendingBranch`] to wait on after letting go of the VMM.
    pub fn start_branch(&mut self, req: &BranchRequest) -> Result<(BranchReport, Option<PendingBranch>), BranchError> {
        let started = Instant::now();
        let tag = match &req.tag {
            Some(t) => t.clone(),
            None => self.default_branch_tag(&req.store),
        };
        forkvm_snapshot::validate_tag(&tag)?;
        let dir = req.store.join(&tag);
        if std::fs::symlink_metadata(&dir).is_ok() {
            return Err(BranchError::Conflict { tag, dir });
        }
        let state = self.state();
        if state == RunState::Exited {
            return Err(BranchError::NotRunning(state));
        }
        if req.mode == BranchMode::Live {
            self.await_memory().map_err(BranchError::MemoryArriving)?;
        }
        let was_running = state == RunState::Running;
        let mut phases = PhaseTimer::new();
        self.pause().map_err(BranchError::Pause)?;
        phases.mark("pause");
        let branched_from = self.labels.sandbox_id.clone();
        let lineage = Lineage {
            branched_from: branched_from.clone(),
            default_limits: req.default_limits,
            default_network: req.default_network.clone(),
        };
        let written = match req.mode {
            BranchMode::Full => {
                let full = self.write_full(&dir, &tag, &lineage, req.disks, &mut phases);
                full.map(|(a, m)| (Some(a), m, None))
            }
            BranchMode::Live => {
                let live = self.start_live(&dir, &tag, &lineage, req.disks, &mut phases);
                live.map(|(m, w)| (None, m, Some(w)))
            }
        };
        let resumed = if was_running { self.resume() } else { Ok(()) };
        phases.mark("resume");
        let pause_ms = started.elapsed().as_secs_f64() * 1e3;
        let (allocated, mem_size, live) = match written {
            Ok(w) => w,
            Err(source) => {
                let resumed = match resumed {
                    Ok(()) if was_running => "the source VM was resumed".to_string(),
                    Ok(()) => "the source VM stays paused, as it was".to_string(),
                    Err(e) => format!("resuming the source VM also failed: {e}"),
                };
                let disk_full = is_disk_full(&source);
                return Err(BranchError::Snapshot { source, disk_full, resumed });
            }
        };
        let status = if live.is_some() { SnapshotStatus::Writing } else { SnapshotStatus::Ready };
        let pending = live.map(|(w, outcome)| {
            self.live_writes.retain(|w| !w.is_finished());
            self.live_writes.push(w);
            PendingBranch { outcome, started }
        });
        if let Err(source) = resumed {
            return Err(BranchError::Resume { dir, writing: status == SnapshotStatus::Writing, source });
        }
        let report = BranchReport {
            tag,
            dir,
            mode: req.mode,
            status,
            branched_from,
            created_at_unix_ms: now_unix_ms(),
            mem_size_bytes: mem_size,
            pause_ms,
            return_ms: started.elapsed().as_secs_f64() * 1e3,
            memory_bytes_allocated: allocated,
            phases_ms: phases.steps(1e3),
        };
        Ok((report, pending.filter(|_| req.wait)))
    }

    /// Waits for every live branch still being written.
    pub(crate) fn finish_live_writes(&mut self) {
        for mut w in self.live_writes.drain(..) {
            if let Some(h) = w.handle.take() {
                let _ = h.join();
            }
        }
    }

    /// The snapshot's description; `disks` as linked into its directory.
    fn snapshot_meta(
        &self,
        tag: &str,
        state: &crate::persist::VmState,
        status: SnapshotStatus,
        allocated: u64,
        disks: Vec<DiskMeta>,
        lineage: &Lineage,
    ) -> SnapshotMeta {
        SnapshotMeta {
            format_version: forkvm_snapshot::METADATA_FORMAT_VERSION,
            tag: tag.to_string(),
            created_at_unix_ms: now_unix_ms(),
            status,
            mem_size_bytes: state.mem_size,
            vcpu_count: state.vcpus.len() as u8,
            irqchip: state.irqchip_mode.name().to_string(),
            guest: GuestIdentity { kind: self.guest.kind.clone(), name: self.guest.name.clone(), content_hash: None },
            parent_tag: None,
            parent_hash: None,
            branched_from: lineage.branched_from.clone(),
            volumes: Vec::new(),
            memory_bytes_allocated: allocated,
            writer_pid: (status == SnapshotStatus::Writing).then(std::process::id),
            devices: Some(DevicesMeta {
                vsock_cid: self.device_config.vsock.as_ref().map(|v| v.guest_cid),
                rng: self.device_config.rng,
                disks,
                net: self.device_config.net.as_ref().map(|n| forkvm_snapshot::NetMeta { mac: n.mac }),
            }),
            template: self.labels.template.clone(),
            memory_format: forkvm_snapshot::MemoryFormat::Image,
            content_hash: None,
            default_limits: lineage.default_limits,
            default_network: lineage.default_network.clone(),
            memory_sealed_by: None,
        }
    }

    /// Full mode (the VM is paused): writes the whole snapshot and publishes it.
    /// Returns (allocated bytes of memory.img, memory size).
    pub(super) fn write_full(
        &mut self,
        dir: &Path,
        tag: &str,
        lineage: &Lineage,
        capture: DiskCapture,
        phases: &mut PhaseTimer,
    ) -> Result<(u64, u64), VmmError> {
        if self.faults.take(FaultPoint::SaveState) {
            return Err(VmmError::Injected(FaultPoint::SaveState));
        }
        // Layered disks first: the saved device state names the sealed layers.
        let seals = self.seal_disks()?;
        let state = self.save_state()?;
        phases.mark("save_state");
        let writer = SnapshotWriter::begin(dir)?;
        forkvm_snapshot::write_vmstate_file(&writer.path(VMSTATE_BIN), &state.encode_payload()?)?;
        let disks = self.capture_disks(writer.staging(), &seals, false, capture)?;
        let mem_size = state.mem_size;
        let image = forkvm_snapshot::create_image(&writer.path(MEMORY_IMG), mem_size)?;
        if let Some(fault) = self.faults.take_write_fault() {
            return Err(
                forkvm_snapshot::MemoryImageError::WriteData { offset: 0, len: 0, source: fault.io_error() }.into()
            );
        }
        phases.mark("stage_files");
        for ((_, slice), offset) in region_slices(&self.memory).into_iter().zip(image_offsets(mem_size)) {
            forkvm_snapshot::write_sparse(&image, offset, slice)?;
        }
        phases.mark("write_memory");
        let allocated = forkvm_snapshot::allocated_bytes(&image).map_err(VmmError::MeasureImage)?;
        let meta = self.snapshot_meta(tag, &state, SnapshotStatus::Ready, allocated, disks, lineage);
        forkvm_snapshot::write_meta(&writer.path(SNAPSHOT_JSON), &meta)?;
        writer.commit()?;
        phases.mark("commit");
        Ok((allocated, mem_size))
    }

    /// Live mode (the VM is paused): captures state, publishes the tag as `writing`, and
    /// forks the writer of the memory image. Returns (memory size, the writer).
    fn start_live(
        &mut self,
        dir: &Path,
        tag: &str,
        lineage: &Lineage,
        req_disks: DiskCapture,
        phases: &mut PhaseTimer,
    ) -> Result<(u64, (LiveWrite, LiveOutcome)), VmmError> {
        if self.faults.take(FaultPoint::SaveState) {
            return Err(VmmError::Injected(FaultPoint::SaveState));
        }
        // Layered disks first: the saved device state names the sealed layers.
        let seals = self.seal_disks()?;
        let state = self.save_state()?;
        phases.mark("save_state");
        let writer = SnapshotWriter::begin(dir)?;
        std::fs::write(writer.path(VMSTATE_BIN), forkvm_snapshot::encode_vmstate(&state.encode_payload()?))
            .map_err(|e| VmmError::Disk(format!("writing vmstate.bin: {e}")))?;
        let disks = self.capture_disks(writer.staging(), &seals, true, req_disks)?;
        let mem_size = state.mem_size;
        let image = forkvm_snapshot::create_image(&writer.path(MEMORY_IMG), mem_size)?;
        let meta = self.snapshot_meta(tag, &state, SnapshotStatus::Writing, 0, disks, lineage);
        forkvm_snapshot::write_meta_unsynced(&writer.path(SNAPSHOT_JSON), &meta)?;
        let final_dir = writer.publish_unsynced()?;
        // Finished through a descriptor: the host side may move the directory (from
        // this VMM's inbox into the store) while the image is written.
        let opened = match forkvm_snapshot::OpenSnapshotDir::open(&final_dir) {
            Ok(d) => d,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&final_dir);
                return Err(VmmError::Disk(format!("opening {}: {e}", final_dir.display())));
            }
        };
        // Everything the writer needs is computed before fork(): the child only reads
        // guest memory and makes system calls.
        let regions: Vec<(u64, &[u8])> = region_slices(&self.memory)
            .into_iter()
            .zip(image_offsets(mem_size))
            .map(|((_, slice), offset)| (offset, slice))
            .collect();
        let fault = self.faults.take_write_fault();
        let stall = self.faults.take(FaultPoint::StallWriter);
        phases.mark("stage_files");
        // SAFETY: the child runs only `write_image` (positional writes, fsync) and `_exit`;
        // it takes no lock another thread of this process could hold and allocates nothing.
        let pid = unsafe { libc::fork() };

        if pid < 0 {
            let e = std::io::Error::last_os_error();
            opened.unpublish();
            return Err(VmmError::Disk(format!("fork() of the live branch writer: {e}")));
        }
        if pid == 0 {
            // Only writes and exit from here on (async-signal-safe: the program is built).
            crate::host::seccomp::enter_thread(crate::host::seccomp::ThreadKind::Writer);
            // Keep stdio and the image; the source's sockets and KVM descriptors are not ours.
            let keep = image.as_raw_fd() as u32;
            crate::host::process::close_fds(3, keep - 1);
            crate::host::process::close_fds(keep + 1, u32::MAX);
            // The writer uses idle CPU only: the source VM, running again, comes first.
            let param = libc::sched_param { sched_priority: 0 };
            // SAFETY: changes this (single-threaded) process's scheduling class; `param`
            // is a valid pointer for the call.
            unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
            let code = write_image(&image, &regions, fault, stall);
            // SAFETY: leaves the forked copy without running the parent's destructors.
            unsafe { libc::_exit(code) }
        }
        phases.mark("fork");
        let huge_ranges: Vec<(usize, usize)> = regions.iter().map(|(_, s)| (s.as_ptr() as usize, s.len())).collect();
        drop(regions);
        let (outcome_tx, outcome_rx) = std::sync::mpsc::channel();
        let handle = std::thread::Builder::new()
            .name("branch-writer".into())
            .stack_size(256 << 10)
            .spawn(move || {
                let ok = finish_live(pid, &opened, image, meta);
                let recollapse_after = ok.is_ok();
                // Nobody listens for a branch taken with `wait: false`.
                let _ = outcome_tx.send(ok);
                if recollapse_after {
                    recollapse(&huge_ranges);
                }
            })
            .map_err(|e| VmmError::Disk(format!("starting the live branch writer thread: {e}")))?;
        Ok((mem_size, (LiveWrite { tag: tag.to_string(), handle: Some(handle) }, outcome_rx)))
    }
}

/// In the forked writer: writes guest memory (frozen at fork) into the image, sparsely,
/// and syncs it. Returns the exit code: 0, or the errno that stopped it.
fn write_image(image: &File, regions: &[(u64, &[u8])], fault: Option<FaultPoint>, stall: bool) -> i32 {
    if stall {
        std::thread::sleep(std::time::Duration::from_secs(3));
    }
    if let Some(f) = fault {
        return f.io_error().raw_os_error().unwrap_or(libc::EIO);
    }
    for (offset, slice) in regions {
        if let Err(e) = forkvm_snapshot::write_sparse(image, *offset, slice) {
            return std::error::Error::source(&e)
                .and_then(|s| s.downcast_ref::<std::io::Error>())
                .and_then(|io| io.raw_os_error())
                .unwrap_or(libc::EIO);
        }
    }
    match image.sync_all() {
        Ok(()) => 0,
        Err(e) => e.raw_os_error().unwrap_or(libc::EIO),
    }
}

/// After a live branch, gives the running guest its transparent huge pages back.
///
/// While the writer shared guest memory, every page the guest wrote was copied 4 KiB at
/// a time, splitting its huge page; the next branch's `fork()` would then copy 4 KiB page
/// tables (~30 ms at 1.5 GiB instead of ~2 ms). `MADV_COLLAPSE` merges them back, chunk
/// by chunk, at idle priority; chunks that cannot be merged (never touched, in use) are
/// skipped.
fn recollapse(ranges: &[(usize, usize)]) {
    const CHUNK: usize = 8 << 20;
    const HUGE: usize = 2 << 20;
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: changes this thread's scheduling class (pid 0 = the calling thread).
    unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
    for &(addr, len) in ranges {
        let start = addr.next_multiple_of(HUGE);
        let end = (addr + len) / HUGE * HUGE;
        let mut at = start;
        while at < end {
            let n = CHUNK.min(end - at);
            // SAFETY: [at, at + n) lies inside guest memory, which the VMM keeps mapped
            // until it has joined this thread (`Vmm::stop`); MADV_COLLAPSE only changes
            // how the range is backed, never its contents.
            unsafe { libc::madvise(at as *mut libc::c_void, n, libc::MADV_COLLAPSE) };
            at += n;
        }
    }
}

/// In the VMM, on a thread: reaps the writer, then makes the snapshot durable and
/// `ready` — or removes it. Returns the allocated bytes of the memory image.
fn finish_live(
    pid: libc::pid_t,
    dir: &forkvm_snapshot::OpenSnapshotDir,
    image: File,
    mut meta: SnapshotMeta,
) -> Result<u64, VmmError> {
    let step = |step: &str| {
        let step = step.to_string();
        move |source| VmmError::LiveWriter { step, source }
    };
    let outcome = (|| {
        let mut status = 0;
        // SAFETY: waits for our own child; `status` is a valid out pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r != pid {
            return Err(step(&format!("waiting for the writer (pid {pid})"))(std::io::Error::last_os_error()));
        }
        if !libc::WIFEXITED(status) {
            let killed = std::io::Error::other(format!("killed by signal {}", libc::WTERMSIG(status)));
            return Err(step("writing memory.img")(killed));
        }
        if libc::WEXITSTATUS(status) != 0 {
            return Err(step("writing memory.img")(std::io::Error::from_raw_os_error(libc::WEXITSTATUS(status))));
        }
        meta.memory_bytes_allocated = forkvm_snapshot::allocated_bytes(&image).map_err(step("measuring memory.img"))?;
        dir.sync_tree().map_err(step("syncing the snapshot's files"))?;
        meta.status = SnapshotStatus::Ready;
        meta.writer_pid = None;
        dir.replace_meta(&meta)?;
        Ok(meta.memory_bytes_allocated)
    })();
    if let Err(e) = &outcome {
        tracing::warn!(tag = %meta.tag, error = %e, "live branch failed; removing it");
        dir.unpublish();
    }
    outcome
}
