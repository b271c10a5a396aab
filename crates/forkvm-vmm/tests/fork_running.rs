//! Fork of a running VM into N child VMM processes, without a disk round trip: each
//! child starts from the source's in-flight memory, diverges on its own, and the source
//! runs on unaffected.

mod common;
use common::children::*;
use common::*;
use forkvm_testguest::{count_hash, monitor, TestGuest, COUNT_COUNTER_ADDR};
use forkvm_vmm::control::{ControlClient, Request};
use forkvm_vmm::vmm::{ForkChild, RunState, VmmLabels};
use forkvm_vmm::vstate::irqchip::IrqchipMode;
use std::path::Path;
use std::time::{Duration, Instant};
use vm_memory::{Bytes, GuestAddress};

/// The parent pid of process `pid`.
fn parent_of(pid: i32) -> i32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    stat.rsplit_once(')').unwrap().1.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn children(dir: &Path, n: usize) -> Vec<ForkChild> {
    (0..n)
        .map(|i| ForkChild {
            socket: dir.join(format!("c{i}.sock")),
            console_log: Some(dir.join(format!("c{i}.log"))),
            vsock_uds: None,
            labels: VmmLabels { sandbox_id: Some(format!("child{i}")), template: None },
            run_dir: None,
            rate_limits: None,
            disk_dir: Some(dir.join(format!("c{i}.disks"))),
            tap: None,
        })
        .collect()
}

#[test]
fn children_start_from_the_sources_memory_and_diverge() {
    let dir = tempfile::tempdir().unwrap();
    let (mut vmm, mut console) = boot_guest(TestGuest::Monitor, &[0x40_0000, 8 << 20, 0x5eed], 32, IrqchipMode::Split);
    console.wait_for("ready\n", T);
    let addr = 0x100_0000u64; // outside the filled range
    vmm.send_serial_input(&monitor::write(addr, 0x1111)).unwrap();
    console.wait_for("ok\n", T);
    let specs = children(dir.path(), 3);
    let report = vmm.fork_running(&specs).unwrap();
    assert_eq!(report.pids.len(), 3);
    assert_eq!(vmm.state(), RunState::Running);
    // The source paused for one fork (the fan-out process's), then the fan-out process
    // forked the children and handed them over: they are this process's children now.
    assert!(report.forked_ms >= report.pause_ms, "{report:?}");
    for &pid in &report.pids {
        assert_eq!(parent_of(pid), std::process::id() as i32, "child {pid} was not handed to the source");
    }
    let mut clients: Vec<ControlClient> = specs.iter().map(|c| wait_socket(&c.socket)).collect();
    for (i, c) in clients.iter_mut().enumerate() {
        let status = c.call(&Request::Status {}).unwrap();
        assert_eq!(status["labels"]["sandbox_id"], format!("child{i}"));
        assert_eq!(status["state"], "running");
        assert_ne!(status["pid"], std::process::id(), "child {i} runs in its own process");
    }
    // Child 0 changes the word; the others and the source still see the source's value.
    clients[0].send_input(&monitor::write(addr, 0x2222)).unwrap();
    wait_log(specs[0].console_log.as_ref().unwrap(), "ok\n", 1);
    for (i, c) in clients.iter_mut().enumerate() {
        c.send_input(&monitor::read(addr)).unwrap();
        let want = if i == 0 { 0x2222u64 } else { 0x1111 };
        wait_log(specs[i].console_log.as_ref().unwrap(), &format!("={want:016x}\n"), 1);
    }
    vmm.send_serial_input(&monitor::read(addr)).unwrap();
    console.wait_for(&format!("={:016x}\n", 0x1111), T);
    // The fill the children inherited is intact in each.
    let want_sum = (0..(8u64 << 20) / 8).fold(0u64, |s, k| s.wrapping_add(0x5eed ^ (0x40_0000 + 8 * k)));
    clients[2].send_input(&monitor::sum(0x40_0000, 8 << 20)).unwrap();
    wait_log(specs[2].console_log.as_ref().unwrap(), &format!("={want_sum:016x}\n"), 1);
    for (c, pid) in clients.iter_mut().zip(&report.pids) {
        shutdown(c, *pid);
    }
    for s in &specs {
        assert!(!s.socket.exists(), "{} outlived its VMM", s.socket.display());
    }
}

#[test]
fn children_of_a_counting_guest_finish_its_computation() {
    const STEPS: u64 = 400_000_000;
    let dir = tempfile::tempdir().unwrap();
    let (mut vmm, mut console) = boot_guest(TestGuest::Count, &[STEPS], 16, IrqchipMode::Split);
    console.wait_for("counting\n", T);
    while vmm.memory().read_obj::<u64>(GuestAddress(COUNT_COUNTER_ADDR)).unwrap() < 1000 {}
    let specs = children(dir.path(), 2);
    let report = vmm.fork_running(&specs).unwrap();
    let line = format!("count={STEPS:016x} hash={:016x}\n", count_hash(STEPS));
    console.wait_for(&line, Duration::from_secs(60));
    for s in &specs {
        wait_log(s.console_log.as_ref().unwrap(), &line, 1);
    }
    // The guest exits after printing; the children's VMMs end with it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while report.pids.iter().any(|&p| alive(p)) {
        assert!(Instant::now() < deadline, "children did not exit with their guests");
        std::thread::sleep(Duration::from_millis(5));
    }
}
