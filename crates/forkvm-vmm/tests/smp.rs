//! Several vCPUs through the VMM's whole life: every vCPU runs at once with its LAPIC
//! timer ticking and IPIs passing between them, and a snapshot, a restore, a fork of the
//! running VM and a live or full branch each stop all of them at one point and start
//! all of them again: in every copy each vCPU's counter goes on from where it was, its
//! timer still ticks and no IPI is lost (a lost one stops its sender's counter).

mod common;
use common::children::*;
use common::*;
use forkvm_testguest::smp::{self, VcpuCounts};
use forkvm_testguest::{TestGuest, SMP_COUNTERS_ADDR};
use forkvm_vmm::control::{ControlClient, Request};
use forkvm_vmm::vmm::{BranchMode, BranchRequest, ForkChild, RunState, VmmLabels};
use forkvm_vmm::vstate::irqchip::IrqchipMode;
use forkvm_vmm::vstate::vcpu::VcpuExitReason;
use forkvm_vmm::{prepare, restore, Vmm};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// Kills a forked child's process when dropped (a test that fails must not leave a VMM
/// spinning on the host's CPUs); after a clean shutdown the pid is gone or a zombie.
struct KillOnDrop(i32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if alive(self.0) {
            // SAFETY: kill(2) with a pid this test forked; no memory is involved.
            unsafe { libc::kill(self.0, libc::SIGKILL) };
        }
    }
}

/// The LAPIC timer's period: 2 ms at KVM's 1 GHz APIC bus.
const TIMER_COUNT: u64 = 2_000_000;
const ROUNDS: usize = 20;

fn boot_smp(vcpus: u8, irqchip: IrqchipMode) -> (Vmm, Console) {
    let (vmm, mut console) = boot_guest_on(TestGuest::Smp, &[u64::from(vcpus), TIMER_COUNT], 16, irqchip, vcpus);
    console.wait_for("smp ready\n", T);
    keeps_going(&vmm, &mut console, &format!("{irqchip} x{vcpus} after boot"));
    (vmm, console)
}

/// Asks vCPU 0 for a report on an in-process VMM.
fn report(vmm: &Vmm, console: &mut Console) -> Vec<VcpuCounts> {
    vmm.send_serial_input(smp::REPORT).unwrap();
    console.wait_for("smp ", T);
    let line = console.line(T);
    smp::parse_report(&format!("smp {line}")).unwrap_or_else(|| panic!("bad report {line:?}"))
}

/// Asks a forked child (its own process) for its `nth` report (1-based).
fn child_report(client: &mut ControlClient, log: &Path, nth: usize) -> Vec<VcpuCounts> {
    client.send_input(smp::REPORT).unwrap();
    let deadline = Instant::now() + T;
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let reports: Vec<_> =
            text.split_inclusive('\n').filter(|l| l.ends_with('\n')).filter_map(smp::parse_report).collect();
        if let Some(r) = reports.get(nth - 1) {
            return r.clone();
        }
        assert!(Instant::now() < deadline, "{} gave no report {nth}: {text:?}", log.display());
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The counters a snapshot's memory image holds.
fn image_counters(dir: &Path, vcpus: usize) -> Vec<u64> {
    let f = std::fs::File::open(dir.join("memory.img")).unwrap();
    (0..vcpus)
        .map(|i| {
            let mut b = [0u8; 8];
            f.read_exact_at(&mut b, SMP_COUNTERS_ADDR + 8 * i as u64).unwrap();
            u64::from_le_bytes(b)
        })
        .collect()
}

/// Whether every vCPU's counter and ticks moved past `before`, and the IPIs of every
/// vCPU that receives them (vCPU i >= 1 sends to i+1 mod n: all but vCPU 1).
fn all_moved(before: &[VcpuCounts], after: &[VcpuCounts]) -> bool {
    before.len() == after.len()
        && before
            .iter()
            .zip(after)
            .enumerate()
            .all(|(i, (b, a))| a.counter > b.counter && a.ticks > b.ticks && (i == 1 || a.ipis > b.ipis))
}

/// Reports until every vCPU moved past `first`, or panics naming the one that did not.
fn wait_all_moved(first: &[VcpuCounts], mut next: impl FnMut() -> Vec<VcpuCounts>, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = next();
        if all_moved(first, &now) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: a vCPU stopped: first {first:?}, now {now:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Checks that every vCPU of an in-process VMM goes on.
fn keeps_going(vmm: &Vmm, console: &mut Console, what: &str) {
    let first = report(vmm, console);
    wait_all_moved(&first, || report(vmm, console), what);
}

/// Restores `dir` in this process and checks that every vCPU goes on from the image.
fn check_restored(dir: &Path, vcpus: usize, what: &str) {
    let saved = image_counters(dir, vcpus);
    assert!(saved.iter().all(|&c| c > 0), "{what}: a vCPU had not started counting: {saved:?}");
    let prepared = prepare(dir).unwrap();
    assert_eq!(usize::from(prepared.meta.vcpu_count), vcpus, "{what}: snapshot.json vcpu_count");
    let (mut console, out) = Console::pair();
    let vmm = restore(&kvm(), &prepared, out, &Default::default(), false).unwrap();
    assert_eq!(vmm.status().vcpus, vcpus, "{what}: the copy's vCPUs");
    let first = report(&vmm, &mut console);
    for (i, (c, s)) in first.iter().zip(&saved).enumerate() {
        assert!(c.counter >= *s, "{what}: vCPU {i} went back from {s} to {}", c.counter);
    }
    wait_all_moved(&first, || report(&vmm, &mut console), what);
}

#[test]
fn every_vcpu_runs_at_once_with_its_timer_and_ipis() {
    for irqchip in [IrqchipMode::Split, IrqchipMode::Kernel] {
        for vcpus in [2u8, 4] {
            let (vmm, mut console) = boot_smp(vcpus, irqchip);
            assert_eq!(vmm.status().vcpus, usize::from(vcpus));
            assert_eq!(report(&vmm, &mut console).len(), usize::from(vcpus));
            keeps_going(&vmm, &mut console, &format!("{irqchip} x{vcpus}"));
        }
    }
}

#[test]
fn snapshot_and_restore_keep_every_vcpu_going() {
    let dir = tempfile::tempdir().unwrap();
    for (vcpus, irqchip, rounds) in
        [(2u8, IrqchipMode::Split, ROUNDS), (2, IrqchipMode::Kernel, 3), (4, IrqchipMode::Split, 3)]
    {
        let (mut vmm, mut console) = boot_smp(vcpus, irqchip);
        for round in 0..rounds {
            let snap = dir.path().join(format!("{irqchip}-{vcpus}-{round}"));
            vmm.snapshot(&snap).unwrap();
            assert_eq!(vmm.state(), RunState::Running);
            check_restored(&snap, usize::from(vcpus), &format!("{irqchip} x{vcpus} round {round}"));
            std::fs::remove_dir_all(&snap).unwrap();
        }
        // The source ran on through every snapshot.
        keeps_going(&vmm, &mut console, "the source");
    }
}

#[test]
fn live_and_full_branches_keep_every_vcpu_going() {
    let store = tempfile::tempdir().unwrap();
    let (mut vmm, mut console) = boot_smp(2, IrqchipMode::Split);
    for round in 0..ROUNDS {
        let mode = if round % 2 == 0 { BranchMode::Live } else { BranchMode::Full };
        let req = BranchRequest {
            store: store.path().to_path_buf(),
            tag: Some(format!("b{round}")),
            mode,
            wait: true,
            disks: Default::default(),
            default_limits: None,
            default_network: None,
        };
        let b = vmm.branch(&req).unwrap();
        check_restored(&b.dir, 2, &format!("{mode:?} branch {round}"));
        std::fs::remove_dir_all(&b.dir).unwrap();
    }
    keeps_going(&vmm, &mut console, "the branched source");
}

#[test]
fn children_of_a_running_smp_vm_keep_every_vcpu_going() {
    let dir = tempfile::tempdir().unwrap();
    let (mut vmm, mut console) = boot_smp(2, IrqchipMode::Split);
    for round in 0..ROUNDS {
        let child = ForkChild {
            socket: dir.path().join(format!("c{round}.sock")),
            console_log: Some(dir.path().join(format!("c{round}.log"))),
            vsock_uds: None,
            labels: VmmLabels { sandbox_id: Some(format!("child{round}")), template: None },
            run_dir: None,
            rate_limits: None,
            disk_dir: Some(dir.path().join(format!("c{round}.disks"))),
            tap: None,
        };
        let fork = vmm.fork_running(std::slice::from_ref(&child)).unwrap();
        // A child is a process of its own: killed if a check below fails.
        let _reaper = KillOnDrop(fork.pids[0]);
        let mut client = wait_socket(&child.socket);
        let status = client.call(&Request::Status {}).unwrap();
        assert_eq!(status["vcpus"], 2, "round {round}: {status}");
        let log = child.console_log.as_ref().unwrap();
        let first = child_report(&mut client, log, 1);
        let mut nth = 1;
        wait_all_moved(
            &first,
            || {
                nth += 1;
                child_report(&mut client, log, nth)
            },
            &format!("child {round}"),
        );
        shutdown(&mut client, fork.pids[0]);
    }
    keeps_going(&vmm, &mut console, "the forked source");
}

#[test]
fn one_vcpus_exit_stops_the_whole_vm() {
    let (vmm, _console) = boot_smp(4, IrqchipMode::Split);
    vmm.send_serial_input(smp::EXIT).unwrap();
    let reason = vmm.exit_latch().wait(Some(T));
    assert_eq!(reason, Some(VcpuExitReason::GuestExit(0)));
    assert_eq!(vmm.state(), RunState::Exited);
    let started = Instant::now();
    drop(vmm);
    assert!(started.elapsed() < Duration::from_secs(5), "the other vCPUs took {:?} to stop", started.elapsed());
}

/// A Linux guest on several vCPUs relies on locked instructions being atomic between
/// vCPUs; on PVM hosts its kernel runs in KVM's instruction emulator. Every vCPU here
/// runs `lock inc` on one word and `lock bts`/`btr` of its own bit in another, in ring 0.
#[test]
fn ring_zero_locked_instructions_are_atomic_across_vcpus() {
    const ROUNDS: u64 = 20_000;
    for vcpus in [2u8, 4] {
        let (vmm, mut console) =
            boot_guest_on(TestGuest::Atomic, &[u64::from(vcpus), ROUNDS], 16, IrqchipMode::Split, vcpus);
        console.wait_for("atomic ", T);
        let line = console.line(T);
        let report = forkvm_testguest::atomic::parse_report(&format!("atomic {line}"))
            .unwrap_or_else(|| panic!("bad report {line:?}"));
        assert_eq!(report.lost.len(), usize::from(vcpus), "{report:?}");
        assert!(report.atomic(ROUNDS), "{vcpus} vCPUs: {report:?} (expected the sum {})", ROUNDS * u64::from(vcpus));
        assert_eq!(vmm.exit_latch().wait(Some(T)), Some(VcpuExitReason::GuestExit(0)));
    }
}
