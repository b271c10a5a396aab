//! save → restore → save gives the same state, component by component, with the
//! in-kernel irqchip and with the split one; and the restored guest carries on.

mod common;
use common::*;
use forkvm_testguest::TestGuest;
use forkvm_vmm::arch::x86_64::msr::MSR_IA32_TSC;
use forkvm_vmm::persist::VmState;
use forkvm_vmm::vstate::irqchip::IrqchipMode;
use forkvm_vmm::{prepare, restore};
use serde::Serialize;

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

fn assert_same(a: &VmState, b: &VmState, mode: IrqchipMode) {
    let (a, b) = (without_clocks(a.clone()), without_clocks(b.clone()));
    assert_eq!(a.vcpus.len(), b.vcpus.len());
    for (x, y) in a.vcpus.iter().zip(&b.vcpus) {
        assert_eq!(bytes(&x.cpuid), bytes(&y.cpuid), "{mode}: cpuid");
        assert_eq!(bytes(&x.regs), bytes(&y.regs), "{mode}: regs");
        assert_eq!(bytes(&x.sregs), bytes(&y.sregs), "{mode}: sregs");
        assert_eq!(x.fpu, y.fpu, "{mode}: fpu");
        assert_eq!(x.xsave, y.xsave, "{mode}: xsave");
        assert_eq!(bytes(&x.xcrs), bytes(&y.xcrs), "{mode}: xcrs");
        assert_eq!(bytes(&x.lapic), bytes(&y.lapic), "{mode}: lapic");
        assert_eq!(bytes(&x.msrs), bytes(&y.msrs), "{mode}: msrs");
        assert_eq!(bytes(&x.vcpu_events), bytes(&y.vcpu_events), "{mode}: vcpu_events");
        assert_eq!(bytes(&x.mp_state), bytes(&y.mp_state), "{mode}: mp_state");
        assert_eq!(bytes(&x.debugregs), bytes(&y.debugregs), "{mode}: debugregs");
    }
    match (&a.kernel_irqchip, &b.kernel_irqchip) {
        (Some(x), Some(y)) => {
            assert_eq!(bytes(&x.pic_master), bytes(&y.pic_master), "{mode}: PIC master");
            assert_eq!(bytes(&x.pic_slave), bytes(&y.pic_slave), "{mode}: PIC slave");
            assert_eq!(bytes(&x.ioapic), bytes(&y.ioapic), "{mode}: in-kernel IOAPIC");
            assert_eq!(bytes(&x.pit), bytes(&y.pit), "{mode}: PIT");
        }
        (None, None) => {}
        _ => panic!("{mode}: irqchip state present on one side only"),
    }
    assert_eq!(a.devices.serial, b.devices.serial, "{mode}: serial");
    assert_eq!(a.devices.ioapic, b.devices.ioapic, "{mode}: VMM IOAPIC");
    assert_eq!(bytes(&a), bytes(&b), "{mode}: whole VmState");
}

#[test]
fn save_restore_save_is_identical_and_the_guest_continues() {
    for mode in [IrqchipMode::Split, IrqchipMode::Kernel] {
        let dir = tempfile::tempdir().unwrap();
        let (mut vmm, mut console) = boot_guest(TestGuest::Echo, &[], 16, mode);
        console.wait_for("echo ready\n", T);
        vmm.pause().unwrap();
        // Input queued while paused sits in the UART FIFO: part of the saved state.
        vmm.send_serial_input(b"abc").unwrap();
        let first = dir.path().join("first");
        vmm.snapshot(&first).unwrap();
        let saved = vmm.save_state().unwrap();
        drop(vmm);
        assert_eq!(saved.devices.serial.in_buffer, b"abc", "{mode}: FIFO captured");
        assert_eq!(saved.kernel_irqchip.is_some(), mode == IrqchipMode::Kernel);

        let snap = prepare(&first).unwrap();
        let (mut console2, out) = Console::pair();
        let mut restored = restore(&kvm(), &snap, out, true).unwrap();
        let again = restored.save_state().unwrap();
        assert_same(&snap.state, &again, mode);
        assert_same(&saved, &again, mode);

        // A second snapshot of the restored VM: same state, byte-identical memory.
        let second = dir.path().join("second");
        restored.snapshot(&second).unwrap();
        let snap2 = prepare(&second).unwrap();
        assert_same(&snap.state, &snap2.state, mode);
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
