//! save → restore → save gives the same state, one test per component, with the
//! in-kernel irqchip and with the split one; and the restored guest carries on.

mod common;
use common::*;
use forkvm_testguest::TestGuest;
use forkvm_vmm::arch::x86_64::msr::MSR_IA32_TSC;
use forkvm_vmm::persist::VmState;
use forkvm_vmm::vstate::irqchip::IrqchipMode;
use forkvm_vmm::vstate::vcpu_state::VcpuState;
use forkvm_vmm::{prepare, restore};
use serde::Serialize;
use std::sync::OnceLock;

fn bytes<T: Serialize>(v: &T) -> Vec<u8> {
    bincode::serialize(v).unwrap()
}

/// Zeroes what moves with wall time while a VM sits paused (the guest TSC, kvm-clock,
/// the PIT's load timestamps): everything else must match exactly.
fn without_clocks(mut s: VmState) -> VmState {
    for v in &mut s.vcpus {
        for m in v.msrs.iter_mut().filter(|m| m.index == MSR_IA32_TSC) {
            m.data = 0;
        }
    }
    s.clock = Default::default();
    if let Some(k) = s.kernel_irqchip.as_mut() {
        for c in k.pit.channels.iter_mut() {
            c.count_load_time = 0;
        }
    }
    s
}

/// For each irqchip mode: (state saved from the booted VM, state saved right after
/// restoring that snapshot in a new VM). Computed once; each component has its test.
fn pairs() -> &'static [(IrqchipMode, VmState, VmState)] {
    static PAIRS: OnceLock<Vec<(IrqchipMode, VmState, VmState)>> = OnceLock::new();
    PAIRS.get_or_init(|| {
        [IrqchipMode::Split, IrqchipMode::Kernel]
            .into_iter()
            .map(|mode| {
                let dir = tempfile::tempdir().unwrap();
                let (mut vmm, mut console) = boot_guest(TestGuest::Echo, &[], 16, mode);
                console.wait_for("echo ready\n", T);
                vmm.pause().unwrap();
                // Input queued while paused sits in the UART FIFO: part of the saved state.
                vmm.send_serial_input(b"abc").unwrap();
                let snap = dir.path().join("s");
                vmm.snapshot(&snap).unwrap();
                let saved = vmm.save_state().unwrap();
                drop(vmm);
                let prepared = prepare(&snap).unwrap();
                let (_console, out) = Console::pair();
                let mut restored = restore(&kvm(), &prepared, out, &Default::default(), true).unwrap();
                let again = restored.save_state().unwrap();
                assert_eq!(bytes(&without_clocks(prepared.state.clone())), bytes(&without_clocks(saved.clone())));
                (mode, without_clocks(saved), without_clocks(again))
            })
            .collect()
    })
}

fn each_vcpu(check: impl Fn(IrqchipMode, &VcpuState, &VcpuState)) {
    for (mode, a, b) in pairs() {
        assert_eq!(a.vcpus.len(), b.vcpus.len());
        for (x, y) in a.vcpus.iter().zip(&b.vcpus) {
            check(*mode, x, y);
        }
    }
}

macro_rules! vcpu_component_test {
    ($name:ident, $field:ident) => {
        #[test]
        fn $name() {
            each_vcpu(|mode, x, y| {
                assert!(
                    bytes(&x.$field) == bytes(&y.$field),
                    "{mode}: {}: {:?} != {:?}",
                    stringify!($field),
                    x.$field,
                    y.$field
                )
            });
        }
    };
}

vcpu_component_test!(vcpu_cpuid_round_trips, cpuid);
vcpu_component_test!(vcpu_regs_round_trip, regs);
vcpu_component_test!(vcpu_sregs_round_trip, sregs);
vcpu_component_test!(vcpu_fpu_round_trips, fpu);
vcpu_component_test!(vcpu_xsave_round_trips, xsave);
vcpu_component_test!(vcpu_xcrs_round_trip, xcrs);
vcpu_component_test!(vcpu_lapic_round_trips, lapic);
vcpu_component_test!(vcpu_msrs_round_trip, msrs);
vcpu_component_test!(vcpu_events_round_trip, vcpu_events);
vcpu_component_test!(vcpu_mp_state_round_trips, mp_state);
vcpu_component_test!(vcpu_debugregs_round_trip, debugregs);

#[test]
fn kernel_pics_ioapic_and_pit_round_trip() {
    for (mode, a, b) in pairs() {
        match (&a.kernel_irqchip, &b.kernel_irqchip) {
            (Some(x), Some(y)) => {
                assert_eq!(*mode, IrqchipMode::Kernel);
                assert_eq!(bytes(&x.pic_master), bytes(&y.pic_master), "PIC master");
                assert_eq!(bytes(&x.pic_slave), bytes(&y.pic_slave), "PIC slave");
                assert_eq!(bytes(&x.ioapic), bytes(&y.ioapic), "in-kernel IOAPIC");
                assert_eq!(bytes(&x.pit), bytes(&y.pit), "PIT");
            }
            (None, None) => assert_eq!(*mode, IrqchipMode::Split),
            _ => panic!("{mode}: irqchip state present on one side only"),
        }
    }
}

#[test]
fn vmm_ioapic_round_trips() {
    for (mode, a, b) in pairs() {
        assert_eq!(a.devices.ioapic.is_some(), *mode == IrqchipMode::Split);
        assert_eq!(a.devices.ioapic, b.devices.ioapic, "{mode}");
    }
}

#[test]
fn serial_round_trips_with_its_fifo() {
    for (mode, a, b) in pairs() {
        assert_eq!(a.devices.serial.in_buffer, b"abc", "{mode}: FIFO captured");
        assert_eq!(a.devices.serial, b.devices.serial, "{mode}");
    }
}

#[test]
fn clock_round_trips_monotonically() {
    // kvm-clock keeps counting while a VM sits paused, so exact equality is not the
    // contract: a restored guest must never see its clock go backwards.
    let dir = tempfile::tempdir().unwrap();
    let (mut vmm, mut console) = boot_guest(TestGuest::Hello, &[], 16, IrqchipMode::Split);
    console.wait_for("hello from ring 3\n", T);
    let snap = dir.path().join("c");
    vmm.snapshot(&snap).unwrap();
    let prepared = prepare(&snap).unwrap();
    let (_c, out) = Console::pair();
    let mut restored = restore(&kvm(), &prepared, out, &Default::default(), true).unwrap();
    let again = restored.save_state().unwrap();
    assert!(again.clock.clock >= prepared.state.clock.clock);
    assert!(again.clock.clock - prepared.state.clock.clock < 10_000_000_000, "clock jumped by the snapshot's age");
}

#[test]
fn whole_state_and_memory_round_trip_and_the_guest_continues() {
    for mode in [IrqchipMode::Split, IrqchipMode::Kernel] {
        let dir = tempfile::tempdir().unwrap();
        let (mut vmm, mut console) = boot_guest(TestGuest::Echo, &[], 16, mode);
        console.wait_for("echo ready\n", T);
        vmm.pause().unwrap();
        vmm.send_serial_input(b"abc").unwrap();
        let first = dir.path().join("first");
        vmm.snapshot(&first).unwrap();
        drop(vmm);

        let snap = prepare(&first).unwrap();
        let (mut console2, out) = Console::pair();
        let mut restored = restore(&kvm(), &snap, out, &Default::default(), true).unwrap();
        // A second snapshot of the restored VM: same state, byte-identical memory.
        let second = dir.path().join("second");
        restored.snapshot(&second).unwrap();
        let snap2 = prepare(&second).unwrap();
        let (a, b) = (without_clocks(snap.state.clone()), without_clocks(snap2.state.clone()));
        assert!(bytes(&a) == bytes(&b), "{mode}: state differs after a second round trip");
        let mem1 = std::fs::read(first.join("memory.img")).unwrap();
        let mem2 = std::fs::read(second.join("memory.img")).unwrap();
        assert!(mem1 == mem2, "{mode}: memory images differ");

        // Resumed, the guest drains its FIFO and echoes what was queued before the save.
        restored.resume().unwrap();
        console2.wait_for("abc", T);
        restored.send_serial_input(b"xyz").unwrap();
        console2.wait_for("xyz", T);
    }
}

#[test]
fn state_encoding_round_trips() {
    let (mut vmm, mut console) = boot_guest(TestGuest::Hello, &[], 16, IrqchipMode::Kernel);
    console.wait_for("hello from ring 3\n", T);
    vmm.pause().unwrap();
    let state = vmm.save_state().unwrap();
    let decoded = VmState::decode(&state.encode().unwrap()).unwrap();
    assert_eq!(bytes(&state), bytes(&decoded));
}
