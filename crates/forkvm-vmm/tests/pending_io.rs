//! KVM finishes an IN (the value into the register, RIP past the instruction) only on the
//! next `KVM_RUN`. A snapshot taken right after such an exit must not hold the half-done
//! instruction: every copy would run it again, and an IN from COM1's data register would
//! take a second byte from the FIFO, losing one. The `sink` guest does nothing but such
//! INs while a feeder keeps its FIFO full with a known sequence, so nearly every pause
//! lands right after one, and a copy that ran one twice shows a gap in the sequence.

mod common;
use common::*;
use forkvm_testguest::{TestGuest, SINK_GAPS_ADDR, SINK_RECEIVED_ADDR};
use forkvm_vmm::vstate::irqchip::IrqchipMode;
use forkvm_vmm::{prepare, restore, Vmm};
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vm_memory::{Bytes, GuestAddress};

const ROUNDS: usize = 20;

fn counts(vmm: &Vmm) -> (u64, u64) {
    let m = vmm.memory();
    (m.read_obj(GuestAddress(SINK_RECEIVED_ADDR)).unwrap(), m.read_obj(GuestAddress(SINK_GAPS_ADDR)).unwrap())
}

/// Waits until the copy took every byte its FIFO was saved with (its count stays put).
fn drained(vmm: &Vmm) -> (u64, u64) {
    let deadline = Instant::now() + T;
    let mut last = counts(vmm);
    loop {
        std::thread::sleep(Duration::from_millis(30));
        let now = counts(vmm);
        if now == last {
            return now;
        }
        assert!(Instant::now() < deadline, "the copy never drained its FIFO");
        last = now;
    }
}

#[test]
fn a_copy_does_not_run_an_in_a_second_time() {
    for irqchip in [IrqchipMode::Split, IrqchipMode::Kernel] {
        let dir = tempfile::tempdir().unwrap();
        let (mut vmm, mut console) = boot_guest(TestGuest::Sink, &[], 16, irqchip);
        console.wait_for("sinking\n", T);
        let (mut feed, vm_end) = UnixStream::pair().unwrap();
        vmm.forward_input(vm_end).unwrap();
        let closer = feed.try_clone().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let feeding = stop.clone();
        let feeder = std::thread::spawn(move || {
            let mut next = 0u8;
            let mut buf = [0u8; 256];
            while !feeding.load(Ordering::Relaxed) {
                for b in buf.iter_mut() {
                    next = if next == 255 { 1 } else { next + 1 };
                    *b = next;
                }
                if feed.write_all(&buf).is_err() {
                    break;
                }
            }
        });
        while counts(&vmm).0 < 1000 {
            std::thread::sleep(Duration::from_millis(5));
        }
        for round in 0..ROUNDS {
            let snap = dir.path().join(format!("s{round}"));
            vmm.snapshot(&snap).unwrap();
            let prepared = prepare(&snap).unwrap();
            let (_console, out) = Console::pair();
            let copy = restore(&kvm(), &prepared, out, &Default::default(), false).unwrap();
            let (received, gaps) = drained(&copy);
            assert!(received > 0, "{irqchip} round {round}: the copy received nothing");
            assert_eq!(gaps, 0, "{irqchip} round {round}: the copy ran an IN twice ({received} bytes)");
            drop(copy);
            std::fs::remove_dir_all(&snap).unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        closer.shutdown(std::net::Shutdown::Both).unwrap();
        feeder.join().unwrap();
        let (received, gaps) = counts(&vmm);
        assert_eq!(gaps, 0, "{irqchip}: the source lost order ({received} bytes)");
    }
}
