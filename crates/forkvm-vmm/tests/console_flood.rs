//! A guest that prints without end (`flood`, `rep outsb` from ring 3) against the VMM's
//! bounded console log: the log files stay within their limit, the newest output is
//! kept, and the VMM's memory does not grow with what the guest printed.
//!
//! On PVM hosts every byte of port output is its own emulated exit (about 40 KB/s was
//! measured here), so a guest needs hours to print a gibibyte; the test prints 12 times
//! its log limit instead (`FORKVM_TEST_FLOOD_BYTES` sets the amount for longer runs).

mod common;

use common::*;
use forkvm_testguest::{TestGuest, IMAGE_BASE};
use forkvm_vmm::devices::console_log::{older_segment, read_tail, ConsoleLog};
use forkvm_vmm::devices::serial::ConsoleOut;
use forkvm_vmm::vstate::irqchip::IrqchipMode;
use forkvm_vmm::vstate::vcpu::VcpuExitReason;
use forkvm_vmm::{boot, BootConfig, Payload};
use std::time::{Duration, Instant};

/// What the guest prints: 12 log limits unless `FORKVM_TEST_FLOOD_BYTES` says otherwise.
fn flood_bytes() -> u64 {
    std::env::var("FORKVM_TEST_FLOOD_BYTES").ok().and_then(|v| v.parse().ok()).unwrap_or(12 * LIMIT)
}

/// The console log limit of the test.
const LIMIT: u64 = 16 << 10;

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn a_guest_printing_without_end_leaves_the_console_log_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("console.log");
    let log = ConsoleLog::open_with_limit(&path, LIMIT).unwrap();
    let n = flood_bytes();
    let rss_before = rss_kib();
    let started = Instant::now();
    let vmm = boot(
        &kvm(),
        BootConfig {
            mem_size: 16 << 20,
            vcpu_count: 1,
            irqchip: IrqchipMode::Split,
            cpu_template: template(),
            payload: Payload::Flat {
                name: "flood".into(),
                image: TestGuest::Flood.image().to_vec(),
                image_base: IMAGE_BASE,
                args: vec![n],
            },
            console: ConsoleOut::new(Some(log), None),
            devices: Default::default(),
            start_paused: false,
        },
    )
    .expect("boot");
    let exit = vmm.exit_latch().wait(Some(Duration::from_secs(120)));
    let elapsed = started.elapsed();
    assert_eq!(exit, Some(VcpuExitReason::GuestExit(0)), "the flood guest did not finish");
    drop(vmm);
    let size = |p: &std::path::Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let on_disk = size(&path) + size(&older_segment(&path));
    eprintln!(
        "flood: {n} bytes in {elapsed:.2?} ({:.1} KiB/s); console files {on_disk} bytes",
        n as f64 / 1024.0 / elapsed.as_secs_f64()
    );
    assert!(on_disk <= LIMIT, "{on_disk} bytes of console log for a {LIMIT}-byte limit");
    assert!(on_disk >= LIMIT / 2, "the log kept only {on_disk} bytes");
    let tail = read_tail(&path, 4096);
    assert!(tail.ends_with(b"ffff\nflood done\n"), "{:?}", String::from_utf8_lossy(&tail[tail.len() - 40..]));
    let grown = rss_kib().saturating_sub(rss_before);
    assert!(grown < 64 << 10, "the VMM's memory grew by {grown} KiB while the guest printed {n} bytes");
}
