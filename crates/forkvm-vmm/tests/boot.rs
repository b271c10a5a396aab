//! Boots each test guest on real KVM and checks what it says and does.

mod common;
use common::*;
use forkvm_testguest::{count_hash, monitor, TestGuest, COUNT_COUNTER_ADDR};
use forkvm_vmm::vstate::irqchip::IrqchipMode;
use forkvm_vmm::vstate::vcpu::VcpuExitReason;
use vm_memory::{Bytes, GuestAddress};

#[test]
fn hello_prints_from_ring_3_with_either_irqchip() {
    for mode in [IrqchipMode::Split, IrqchipMode::Kernel] {
        let (vmm, mut console) = boot_guest(TestGuest::Hello, &[], 16, mode);
        console.wait_for("hello from ring 3\n", T);
        assert_eq!(vmm.status().irqchip, mode.name());
    }
}

#[test]
fn count_runs_natively_and_exits_with_the_hash() {
    let n = 1_000_000;
    let (vmm, mut console) = boot_guest(TestGuest::Count, &[n], 16, IrqchipMode::Split);
    let line = console.wait_for("\n", T);
    assert_eq!(line, "counting\n");
    let line = console.line(T);
    assert_eq!(line, format!("count={n:016x} hash={:016x}", count_hash(n)));
    assert_eq!(vmm.exit_latch().wait(Some(T)), Some(VcpuExitReason::GuestExit(0)));
    let published: u64 = vmm.memory().read_obj(GuestAddress(COUNT_COUNTER_ADDR)).unwrap();
    assert_eq!(published, n);
}

#[test]
fn echo_returns_input_through_the_serial_interrupt() {
    for mode in [IrqchipMode::Split, IrqchipMode::Kernel] {
        let (vmm, mut console) = boot_guest(TestGuest::Echo, &[], 16, mode);
        console.wait_for("echo ready\n", T);
        // More than the 64-byte FIFO: the guest must drain it while we feed it.
        let input: String = (0..300).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
        vmm.send_serial_input(input.as_bytes()).unwrap();
        console.wait_for(&input, T);
    }
}

#[test]
fn monitor_fills_memory_and_answers_commands() {
    let (base, len, seed) = (4u64 << 20, 1u64 << 20, 0xabcdef);
    let (vmm, mut console) = boot_guest(TestGuest::Monitor, &[base, len, seed], 16, IrqchipMode::Split);
    console.wait_for("ready\n", T);
    let word: u64 = vmm.memory().read_obj(GuestAddress(base + 0x1238)).unwrap();
    assert_eq!(word, monitor::pattern_word(seed, base + 0x1238));
    let below: u64 = vmm.memory().read_obj(GuestAddress(base - 8)).unwrap();
    assert_eq!(below, 0, "fill stays in its range");
    vmm.send_serial_input(&monitor::ping()).unwrap();
    assert_eq!(console.line(T), "pong");
    vmm.send_serial_input(&monitor::write(0x18_0000, 0x1122_3344_5566_7788)).unwrap();
    assert_eq!(console.line(T), "ok");
    vmm.send_serial_input(&monitor::read(0x18_0000)).unwrap();
    assert_eq!(console.line(T), "=1122334455667788");
    let expected: u64 = (0..16).map(|i| monitor::pattern_word(seed, base + 8 * i)).fold(0, u64::wrapping_add);
    vmm.send_serial_input(&monitor::sum(base, 128)).unwrap();
    assert_eq!(console.line(T), format!("={expected:016x}"));
}

#[test]
fn a_fault_in_the_guest_is_reported_not_hung() {
    // `read` of an address beyond guest memory and the MMIO gap raises a page fault
    // the test guest reports on its console and through the exit port.
    let (vmm, mut console) = boot_guest(TestGuest::Monitor, &[0, 0, 0], 16, IrqchipMode::Split);
    console.wait_for("ready\n", T);
    vmm.send_serial_input(&monitor::read(0x10_0000_0000)).unwrap();
    let line = console.wait_for("\n", T);
    assert!(line.starts_with("!F 000000000000000e"), "page fault reported: {line:?}");
    assert_eq!(vmm.exit_latch().wait(Some(T)), Some(VcpuExitReason::GuestExit(forkvm_testguest::EXIT_CODE_FAULT)));
}

#[test]
fn xsave_state_set_and_saved_in_ring_0_is_what_ring_3_finds_in_its_registers() {
    // The xsave guest: xsetbv, xrstor of known xmm0/ymm0 values and xsave in ring 0
    // (completed by the VMM on PVM hosts), checked natively in ring 3.
    let (vmm, mut console) = boot_guest(TestGuest::Xsave, &[], 16, IrqchipMode::Split);
    // (The console may carry the VMM's own notes first: find the guest's verdict.)
    console.wait_for("xsave ", T);
    assert_eq!(console.wait_for("\n", T), "ok\n");
    assert_eq!(vmm.exit_latch().wait(Some(T)), Some(VcpuExitReason::GuestExit(0)));
    if forkvm_vmm::host::HostKind::detect() == forkvm_vmm::host::HostKind::Pvm {
        let fixups = vmm.status().emulation_fixups;
        let count = |k: &str| fixups.iter().find(|(n, _)| n == k).map(|(_, c)| *c).unwrap_or(0);
        // (Counts are per process: tests running beside this one add theirs.)
        assert!(count("xrstor") >= 1 && count("xsave") >= 1, "completed by the VMM: {fixups:?}");
    }
}

#[test]
fn an_xsave_into_unmapped_memory_raises_a_page_fault_at_the_instruction() {
    let image = TestGuest::Xsave.image();
    // `xsave64 [rdi]` right after `mov rdi, 0x10000000000`.
    let mov = [0x48, 0xbf, 0, 0, 0, 0, 0, 0x01, 0, 0];
    let at = image.windows(mov.len()).position(|w| w == mov).expect("the faulting xsave in the image");
    let rip = forkvm_testguest::IMAGE_BASE + (at + mov.len()) as u64;
    let (vmm, mut console) = boot_guest(TestGuest::Xsave, &[1], 16, IrqchipMode::Split);
    console.wait_for("!F ", T);
    assert_eq!(console.wait_for("\n", T), format!("000000000000000e {rip:016x}\n"));
    assert_eq!(vmm.exit_latch().wait(Some(T)), Some(VcpuExitReason::GuestExit(forkvm_testguest::EXIT_CODE_FAULT)));
}

#[test]
fn ring_0_instructions_the_emulator_cannot_run_are_completed() {
    // `fwait; int3; ret` in the traps guest's ring-0 hook.
    let image = TestGuest::Traps.image();
    let at = image.windows(3).position(|w| w == [0x9b, 0xcc, 0xc3]).expect("fwait; int3; ret in the image");
    let after_int3 = forkvm_testguest::IMAGE_BASE + at as u64 + 2;
    for mode in [IrqchipMode::Split, IrqchipMode::Kernel] {
        let (vmm, mut console) = boot_guest(TestGuest::Traps, &[], 16, mode);
        let line = console.wait_for(&format!("!F 0000000000000003 {after_int3:016x}\n"), T);
        assert!(!line.contains("!F 0000000000000006"), "no #UD on the way: {line:?}");
        assert_eq!(vmm.exit_latch().wait(Some(T)), Some(VcpuExitReason::GuestExit(forkvm_testguest::EXIT_CODE_FAULT)));
        if forkvm_vmm::host::HostKind::detect() == forkvm_vmm::host::HostKind::Pvm {
            let fixups = vmm.status().emulation_fixups;
            let count = |k: &str| fixups.iter().find(|(n, _)| n == k).map(|(_, c)| *c).unwrap_or(0);
            assert!(count("int3") >= 1 && count("fwait") >= 1, "PVM completes both through the VMM: {fixups:?}");
        }
    }
}
