//! A VMM killed (`kill -9`) while a live branch is being written leaves no `ready`
//! snapshot behind: the tag stays `writing`, cannot be forked, and a sweep removes it.
//! Fault injection over the control socket is refused unless the VMM was started with
//! `FORKVM_FAULT_INJECTION=1`.

use forkvm_snapshot::{Store, StoreError};
use forkvm_vmm::control::{ControlClient, Request};
use forkvm_vmm::vmm::fault::FaultPoint;
use forkvm_vmm::vmm::{BranchMode, BranchRequest};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn start_vmm(dir: &Path, faults: bool) -> (Child, ControlClient) {
    let socket = dir.join("vmm.sock");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_forkvm"));
    cmd.args(["boot", "--guest", "dirty", "--arg", "0x400000", "--arg", "0xc00000", "--mem-mib", "16", "--socket"])
        .arg(&socket)
        .arg("--console")
        .arg(dir.join("console.log"))
        .stdin(Stdio::null());
    if faults {
        cmd.env("FORKVM_FAULT_INJECTION", "1");
    }
    let mut child = cmd.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Ok(c) = ControlClient::connect(&socket) {
            return (child, c);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("the VMM never served its socket");
}

#[test]
fn fault_injection_is_refused_without_the_environment_switch() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut vmm, mut ctl) = start_vmm(tmp.path(), false);
    let err = ctl.call(&Request::InjectFault { point: FaultPoint::Pause }).unwrap_err();
    assert_eq!(ControlClient::code(&err), Some(forkvm_client::ErrorCode::Forbidden), "{err}");
    vmm.kill().unwrap();
    vmm.wait().unwrap();
}

#[test]
fn a_crash_while_writing_leaves_no_ready_snapshot() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(tmp.path().join("store"));
    let snapshots = store.ensure().unwrap();
    let (mut vmm, mut ctl) = start_vmm(tmp.path(), true);
    ctl.call(&Request::InjectFault { point: FaultPoint::StallWriter }).unwrap();
    let req = BranchRequest {
        store: snapshots.clone(),
        tag: Some("doomed".into()),
        mode: BranchMode::Live,
        wait: false,
        disks: Default::default(),
        default_limits: None,
        default_network: None,
    };
    let report = ctl.call(&Request::Branch(req)).unwrap();
    assert_eq!(report["status"], "writing");
    // The tag is taken and cannot be forked while it is written.
    assert!(matches!(store.lookup("doomed"), Err(StoreError::Writing { .. })));
    vmm.kill().unwrap(); // SIGKILL, mid-write
    vmm.wait().unwrap();
    // The writer may finish its memory image, but nobody marks the snapshot ready; it
    // names a writer that is gone.
    std::thread::sleep(Duration::from_secs(4));
    assert!(matches!(store.lookup("doomed"), Err(StoreError::Abandoned { .. })));
    assert_eq!(store.sweep(), ["doomed"]);
    assert_eq!(store.lookup("doomed").unwrap_err().code(), forkvm_client::ErrorCode::NotFound);
    assert_eq!(std::fs::read_dir(&snapshots).unwrap().count(), 0);
}

#[test]
fn a_waited_live_branch_does_not_block_other_requests() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(tmp.path().join("store"));
    let snapshots = store.ensure().unwrap();
    let (mut vmm, mut ctl) = start_vmm(tmp.path(), true);
    ctl.call(&Request::InjectFault { point: FaultPoint::StallWriter }).unwrap();
    let socket = tmp.path().join("vmm.sock");
    let waiter = std::thread::spawn(move || {
        let req = BranchRequest {
            store: snapshots,
            tag: Some("slow".into()),
            mode: BranchMode::Live,
            wait: true,
            disks: Default::default(),
            default_limits: None,
            default_network: None,
        };
        let started = Instant::now();
        let report = ctl.call(&Request::Branch(req)).unwrap();
        (report, started.elapsed())
    });
    // While the branch's writer stalls (3 s), the VMM answers another connection at once.
    std::thread::sleep(Duration::from_millis(300));
    let asked = Instant::now();
    let status = ControlClient::connect(&socket).unwrap().call(&Request::Status {}).unwrap();
    assert!(asked.elapsed() < Duration::from_secs(1), "status waited {:?} for the branch", asked.elapsed());
    assert_eq!(status["branches_writing"], serde_json::json!(["slow"]));
    let (report, took) = waiter.join().unwrap();
    assert_eq!(report["status"], "ready");
    assert!(took >= Duration::from_secs(3), "the waited branch returned before its writer finished");
    assert!(store.lookup("slow").is_ok());
    vmm.kill().unwrap();
    vmm.wait().unwrap();
}
