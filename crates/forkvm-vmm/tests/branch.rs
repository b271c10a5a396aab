//! BRANCH on the test-guest tier: full and live branches of running guests keep their
//! in-flight state, default tags and lineage, and every row of the seed's failure-mode
//! table, produced by fault injection (and a real full disk) on a real VMM.

mod common;
use common::*;
use forkvm_snapshot::{SnapshotDir, SnapshotStatus};
use forkvm_testguest::{count_hash, monitor, TestGuest, COUNT_COUNTER_ADDR};
use forkvm_vmm::vmm::fault::FaultPoint;
use forkvm_vmm::vmm::{BranchError, BranchMode, BranchRequest, RunState, VmmLabels};
use forkvm_vmm::vstate::irqchip::IrqchipMode;
use forkvm_vmm::{prepare, restore, Vmm};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};
use vm_memory::{Bytes, GuestAddress};

/// Steps of the `count` guest: long enough to branch mid-run (~1 s natively).
const STEPS: u64 = 600_000_000;

fn request(store: &Path, tag: Option<&str>, mode: BranchMode) -> BranchRequest {
    BranchRequest {
        store: store.to_path_buf(),
        tag: tag.map(Into::into),
        mode,
        wait: true,
        disks: Default::default(),
        default_limits: None,
        default_network: None,
    }
}

fn counter(vmm: &Vmm) -> u64 {
    vmm.memory().read_obj::<u64>(GuestAddress(COUNT_COUNTER_ADDR)).unwrap()
}

/// The counter as stored in a snapshot's memory image.
fn image_counter(dir: &Path) -> u64 {
    let f = std::fs::File::open(dir.join("memory.img")).unwrap();
    let mut b = [0u8; 8];
    f.read_exact_at(&mut b, COUNT_COUNTER_ADDR).unwrap();
    u64::from_le_bytes(b)
}

/// Restores `dir` and returns the line the count guest finishes with.
fn finish_from(dir: &Path) -> String {
    let prepared = prepare(dir).unwrap();
    let (mut console, out) = Console::pair();
    let _vmm = restore(&kvm(), &prepared, out, &Default::default(), false).unwrap();
    console.wait_for("count=", Duration::from_secs(60));
    format!("count={}", console.line(Duration::from_secs(5)))
}

fn expected_line() -> String {
    format!("count={STEPS:016x} hash={:016x}", count_hash(STEPS))
}

fn wait_counting(vmm: &Vmm, console: &mut Console) {
    console.wait_for("counting\n", T);
    let deadline = Instant::now() + T;
    while counter(vmm) < 1000 {
        assert!(Instant::now() < deadline, "the guest does not count");
    }
}

fn branch_mid_computation(mode: BranchMode) {
    let store = tempfile::tempdir().unwrap();
    let (mut vmm, mut console) = boot_guest(TestGuest::Count, &[STEPS], 16, IrqchipMode::Split);
    wait_counting(&vmm, &mut console);
    let report = vmm.branch(&request(store.path(), Some("mid"), mode)).unwrap();
    assert_eq!(report.status, SnapshotStatus::Ready);
    // Resumed: running, or already finished if the writer took longer than the guest.
    assert_ne!(vmm.state(), RunState::Paused);
    let at_branch = image_counter(&report.dir);
    assert!(at_branch > 0 && at_branch < STEPS, "{mode:?}: branched at step {at_branch}, not mid-run");
    // The source carries on and finishes exactly as an uninterrupted run would.
    console.wait_for("count=", Duration::from_secs(60));
    assert_eq!(format!("count={}", console.line(T)), expected_line());
    // The branch resumes with the in-flight counter and hash, and finishes the same.
    assert_eq!(finish_from(&report.dir), expected_line(), "{mode:?}");
    let meta = SnapshotDir::open(&report.dir).unwrap().meta;
    assert_eq!(meta.status, SnapshotStatus::Ready);
    assert_eq!(meta.writer_pid, None);
}

#[test]
fn full_branch_resumes_in_flight_state_while_source_carries_on() {
    branch_mid_computation(BranchMode::Full);
}

#[test]
fn live_branch_resumes_in_flight_state_while_source_carries_on() {
    branch_mid_computation(BranchMode::Live);
}

#[test]
fn live_branch_without_wait_is_writing_then_ready() {
    let store = tempfile::tempdir().unwrap();
    let (mut vmm, mut console) = boot_guest(TestGuest::Count, &[STEPS], 16, IrqchipMode::Split);
    wait_counting(&vmm, &mut console);
    vmm.arm_fault(FaultPoint::StallWriter);
    let mut req = request(store.path(), Some("lazy"), BranchMode::Live);
    req.wait = false;
    let report = vmm.branch(&req).unwrap();
    assert_eq!(report.status, SnapshotStatus::Writing);
    assert!(report.return_ms < 1000.0, "wait:false returned after {} ms", report.return_ms);
    assert_eq!(vmm.state(), RunState::Running);
    // While writing, the snapshot cannot be restored or forked.
    let err = prepare(&report.dir).unwrap_err().to_string();
    assert!(err.contains("still being written"), "{err}");
    assert_eq!(vmm.status().branches_writing, ["lazy"]);
    let before = counter(&vmm);
    std::thread::sleep(Duration::from_millis(50));
    assert!(counter(&vmm) > before, "the source does not run while its branch is written");
    let deadline = Instant::now() + Duration::from_secs(30);
    while SnapshotDir::open(&report.dir).is_err() {
        assert!(Instant::now() < deadline, "the live branch never became ready");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The writer publishes the snapshot, then leaves the status list: under load the
    // status can lag the directory by a moment.
    while !vmm.status().branches_writing.is_empty() {
        assert!(Instant::now() < deadline, "the branch stayed listed as writing after it was ready");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(finish_from(&report.dir), expected_line());
}

#[test]
fn default_tags_are_per_source_monotonic_and_lineage_is_recorded() {
    let store = tempfile::tempdir().unwrap();
    let (mut vmm, mut console) = boot_guest(TestGuest::Hello, &[], 8, IrqchipMode::Split);
    console.wait_for("hello from ring 3", T);
    vmm.set_labels(VmmLabels { sandbox_id: Some("sb1".into()), template: Some("tiny".into()) });
    let a = vmm.branch(&request(store.path(), None, BranchMode::Full)).unwrap();
    let b = vmm.branch(&request(store.path(), None, BranchMode::Live)).unwrap();
    assert_eq!((a.tag.as_str(), b.tag.as_str()), ("branch-sb1-1", "branch-sb1-2"));
    for r in [&a, &b] {
        let meta = SnapshotDir::open(&r.dir).unwrap().meta;
        assert_eq!(meta.branched_from.as_deref(), Some("sb1"));
        assert_eq!(meta.template.as_deref(), Some("tiny"));
        assert_eq!(r.branched_from.as_deref(), Some("sb1"));
    }
    // A taken default name is skipped, never overwritten.
    std::fs::create_dir(store.path().join("branch-sb1-3")).unwrap();
    let c = vmm.branch(&request(store.path(), None, BranchMode::Full)).unwrap();
    assert_eq!(c.tag, "branch-sb1-4");
}

/// Entries of the store directory, sorted.
fn listing(store: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(store).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

/// A monitor guest with `mib` MiB of filled memory, and a check that it still answers.
fn monitor_guest(mib: u64) -> (Vmm, Console) {
    let (vmm, mut console) =
        boot_guest(TestGuest::Monitor, &[0x40_0000, (mib - 8) << 20, 0x5eed], mib, IrqchipMode::Split);
    console.wait_for("ready\n", T);
    (vmm, console)
}

fn assert_answers(vmm: &Vmm, console: &mut Console) {
    assert_eq!(vmm.state(), RunState::Running);
    vmm.send_serial_input(&monitor::ping()).unwrap();
    console.wait_for("pong\n", T);
}

#[test]
fn tag_collision_is_a_conflict_with_no_side_effect() {
    let store = tempfile::tempdir().unwrap();
    let (mut vmm, mut console) = monitor_guest(16);
    std::fs::create_dir(store.path().join("taken")).unwrap();
    std::fs::write(store.path().join("taken/keep"), b"mine").unwrap();
    for mode in [BranchMode::Full, BranchMode::Live] {
        let err = vmm.branch(&request(store.path(), Some("taken"), mode)).unwrap_err();
        assert!(matches!(err, BranchError::Conflict { .. }) && err.code() == forkvm_api::ErrorCode::Conflict, "{err}");
    }
    assert_eq!(listing(store.path()), ["taken"]);
    assert_eq!(std::fs::read(store.path().join("taken/keep")).unwrap(), b"mine");
    let bad = vmm.branch(&request(store.path(), Some("../escape"), BranchMode::Full)).unwrap_err();
    assert_eq!(bad.code(), forkvm_api::ErrorCode::BadRequest);
    assert_answers(&vmm, &mut console);
}

#[test]
fn pause_failure_leaves_the_source_running_unchanged() {
    let store = tempfile::tempdir().unwrap();
    let (mut vmm, mut console) = boot_guest(TestGuest::Count, &[STEPS], 16, IrqchipMode::Split);
    wait_counting(&vmm, &mut console);
    for mode in [BranchMode::Full, BranchMode::Live] {
        vmm.arm_fault(FaultPoint::Pause);
        let err = vmm.branch(&request(store.path(), Some("p"), mode)).unwrap_err();
        assert!(matches!(err, BranchError::Pause(_)) && err.code() == forkvm_api::ErrorCode::Internal, "{err}");
        assert!(err.to_string().contains("keeps running"), "{err}");
        assert_eq!(vmm.state(), RunState::Running);
        let before = counter(&vmm);
        std::thread::sleep(Duration::from_millis(20));
        assert!(counter(&vmm) > before);
    }
    assert!(listing(store.path()).is_empty());
    console.wait_for("count=", Duration::from_secs(60));
    assert_eq!(format!("count={}", console.line(T)), expected_line());
}

#[test]
fn snapshot_failure_removes_partial_files_and_resumes_the_source() {
    let store = tempfile::tempdir().unwrap();
    let (mut vmm, mut console) = monitor_guest(16);
    for mode in [BranchMode::Full, BranchMode::Live] {
        for fault in [FaultPoint::SaveState, FaultPoint::WriteMemory] {
            vmm.arm_fault(fault);
            let err = vmm.branch(&request(store.path(), Some("s"), mode)).unwrap_err();
            assert!(matches!(err, BranchError::Snapshot { disk_full: false, .. }), "{mode:?} {fault:?}: {err}");
            assert!(err.to_string().contains("partial files removed"), "{err}");
            assert!(listing(store.path()).is_empty(), "{mode:?} {fault:?}: left {:?}", listing(store.path()));
            assert_answers(&vmm, &mut console);
        }
    }
    // The failures consumed their faults: the next branch works.
    vmm.branch(&request(store.path(), Some("s"), BranchMode::Full)).unwrap();
    assert_eq!(listing(store.path()), ["s"]);
}

#[test]
fn injected_disk_full_is_reported_as_disk_full() {
    let store = tempfile::tempdir().unwrap();
    let (mut vmm, mut console) = monitor_guest(16);
    for mode in [BranchMode::Full, BranchMode::Live] {
        vmm.arm_fault(FaultPoint::DiskFull);
        let err = vmm.branch(&request(store.path(), Some("d"), mode)).unwrap_err();
        assert_eq!(err.code(), forkvm_api::ErrorCode::DiskFull, "{mode:?}: {err}");
        assert!(listing(store.path()).is_empty());
        assert_answers(&vmm, &mut console);
    }
}

/// A 4 MiB tmpfs: a real full disk for a 32 MiB guest whose memory is all written.
struct SmallTmpfs(tempfile::TempDir);

impl SmallTmpfs {
    fn mount() -> SmallTmpfs {
        let dir = tempfile::tempdir().unwrap();
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=4m", "forkvm-test", dir.path().to_str().unwrap()])
            .status()
            .expect("running mount");
        assert!(status.success(), "mounting a 4 MiB tmpfs failed (this test needs root): {status}");
        SmallTmpfs(dir)
    }
}

impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(self.0.path()).status();
    }
}

#[test]
fn real_disk_full_removes_partial_files_and_resumes_the_source() {
    let tmpfs = SmallTmpfs::mount();
    let (mut vmm, mut console) = monitor_guest(32);
    for mode in [BranchMode::Full, BranchMode::Live] {
        let err = vmm.branch(&request(tmpfs.0.path(), Some("big"), mode)).unwrap_err();
        assert_eq!(err.code(), forkvm_api::ErrorCode::DiskFull, "{mode:?}: {err}");
        assert!(listing(tmpfs.0.path()).is_empty(), "{mode:?}: left {:?}", listing(tmpfs.0.path()));
        assert_answers(&vmm, &mut console);
    }
}

#[test]
fn resume_failure_after_a_good_snapshot_leaves_a_valid_branch() {
    let store = tempfile::tempdir().unwrap();
    for mode in [BranchMode::Full, BranchMode::Live] {
        let (mut vmm, mut console) = boot_guest(TestGuest::Count, &[STEPS], 16, IrqchipMode::Split);
        wait_counting(&vmm, &mut console);
        vmm.arm_fault(FaultPoint::Resume);
        let tag = format!("r-{mode:?}");
        let err = vmm.branch(&request(store.path(), Some(&tag), mode)).unwrap_err();
        let BranchError::Resume { dir, .. } = &err else { panic!("{mode:?}: {err}") };
        assert!(err.to_string().contains("is valid"), "{err}");
        // The source is left paused ...
        assert_eq!(vmm.state(), RunState::Paused);
        // ... and the branch is a complete snapshot that runs to the right end.
        let deadline = Instant::now() + Duration::from_secs(30);
        while SnapshotDir::open(dir).is_err() {
            assert!(Instant::now() < deadline, "{mode:?}: the branch never became ready");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(finish_from(dir), expected_line(), "{mode:?}");
    }
}
