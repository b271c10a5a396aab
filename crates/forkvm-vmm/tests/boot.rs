//! Boots each test guest on real KVM and checks what it says.

mod common;
use common::*;
use forkvm_testguest::TestGuest;
use forkvm_vmm::vstate::irqchip::IrqchipMode;

#[test]
fn hello_prints_from_ring_3_with_either_irqchip() {
    for mode in [IrqchipMode::Split, IrqchipMode::Kernel] {
        let (_vmm, mut console) = boot_guest(TestGuest::Hello, &[], 16, mode);
        console.wait_for("hello from ring 3\n", T);
    }
}
