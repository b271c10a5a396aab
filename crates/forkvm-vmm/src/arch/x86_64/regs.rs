//! Initial vCPU register state for a 64-bit entry.
//!
//! Both the Linux boot protocol's 64-bit entry and our flat test guests start the same
//! way: long mode, paging on the identity tables, the boot GDT loaded, RSI pointing at the
//! zero page (Linux) or argument block (test guests).

use super::gdt::{segment_from_entry, BOOT_GDT, CODE_SELECTOR, DATA_SELECTOR, TSS_SELECTOR};
use super::layout::{BOOT_GDT_START, BOOT_IDT_START, BOOT_STACK_POINTER, ZERO_PAGE_START};
use kvm_bindings::{kvm_fpu, kvm_lapic_state, kvm_regs, kvm_sregs};
use vm_memory::{Bytes, GuestAddress, GuestMemory, GuestMemoryError};

const CR0_PE: u64 = 1 << 0;
const CR0_ET: u64 = 1 << 4;
const CR0_PG: u64 = 1 << 31;
const CR4_PAE: u64 = 1 << 5;
const EFER_LME: u64 = 1 << 8;
const EFER_LMA: u64 = 1 << 10;

/// General registers at entry.
pub fn boot_regs(entry: u64, index: u8) -> kvm_regs {
    kvm_regs {
        rip: entry,
        rsp: BOOT_STACK_POINTER,
        rbp: BOOT_STACK_POINTER,
        rsi: ZERO_PAGE_START,
        rdi: u64::from(index),
        rflags: 0x2,
        ..Default::default()
    }
}

/// Writes the boot GDT and an empty IDT into guest memory.
pub fn write_boot_tables<M: GuestMemory>(mem: &M) -> Result<(), GuestMemoryError> {
    for (i, entry) in BOOT_GDT.iter().enumerate() {
        mem.write_obj(*entry, GuestAddress(BOOT_GDT_START + 8 * i as u64))?;
    }
    mem.write_obj(0u64, GuestAddress(BOOT_IDT_START))
}

/// Segment and control registers for long mode; `sregs` comes from the vCPU so fields we
/// do not set (APIC base, ...) keep KVM's reset values.
pub fn long_mode_sregs(mut sregs: kvm_sregs, cr3: u64) -> kvm_sregs {
    let code = segment_from_entry(BOOT_GDT[1], CODE_SELECTOR);
    let data = segment_from_entry(BOOT_GDT[2], DATA_SELECTOR);
    sregs.cs = code;
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.tr = segment_from_entry(BOOT_GDT[3], TSS_SELECTOR);
    sregs.gdt.base = BOOT_GDT_START;
    sregs.gdt.limit = (std::mem::size_of_val(&BOOT_GDT) - 1) as u16;
    sregs.idt.base = BOOT_IDT_START;
    sregs.idt.limit = 7;
    sregs.cr0 = CR0_PE | CR0_ET | CR0_PG;
    sregs.cr3 = cr3;
    sregs.cr4 = CR4_PAE;
    sregs.efer = EFER_LME | EFER_LMA;
    sregs
}

const APIC_LVT0: usize = 0x350;
const APIC_LVT1: usize = 0x360;
const APIC_MODE_EXTINT: u32 = 0x7;
const APIC_MODE_NMI: u32 = 0x4;

fn lapic_reg(lapic: &kvm_lapic_state, offset: usize) -> u32 {
    let b = &lapic.regs[offset..offset + 4];
    u32::from_le_bytes([b[0] as u8, b[1] as u8, b[2] as u8, b[3] as u8])
}

fn set_lapic_reg(lapic: &mut kvm_lapic_state, offset: usize, value: u32) {
    for (i, byte) in value.to_le_bytes().iter().enumerate() {
        lapic.regs[offset + i] = *byte as _;
    }
}

/// LINT0 delivers the PIC's ExtINT and LINT1 NMIs, as a PC's BIOS leaves them.
pub fn set_lint_modes(lapic: &mut kvm_lapic_state) {
    let with_mode = |reg: u32, mode: u32| (reg & !0x700) | (mode << 8);
    let lvt0 = lapic_reg(lapic, APIC_LVT0);
    set_lapic_reg(lapic, APIC_LVT0, with_mode(lvt0, APIC_MODE_EXTINT));
    let lvt1 = lapic_reg(lapic, APIC_LVT1);
    set_lapic_reg(lapic, APIC_LVT1, with_mode(lvt1, APIC_MODE_NMI));
}

/// x87 and SSE control words at reset.
pub fn boot_fpu() -> kvm_fpu {
    kvm_fpu { fcw: 0x37f, mxcsr: 0x1f80, ..Default::default() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_mode_is_paged_and_64_bit() {
        let s = long_mode_sregs(kvm_sregs::default(), 0x9000);
        assert_eq!(s.cr3, 0x9000);
        assert_ne!(s.cr0 & CR0_PG, 0);
        assert_ne!(s.efer & EFER_LMA, 0);
        assert_eq!(s.cs.l, 1);
        assert_eq!(s.cs.selector, CODE_SELECTOR);
    }

    #[test]
    fn lint_modes_are_extint_and_nmi() {
        let mut l = kvm_lapic_state::default();
        set_lint_modes(&mut l);
        assert_eq!((lapic_reg(&l, APIC_LVT0) >> 8) & 7, APIC_MODE_EXTINT);
        assert_eq!((lapic_reg(&l, APIC_LVT1) >> 8) & 7, APIC_MODE_NMI);
    }

    #[test]
    fn regs_point_at_entry_and_zero_page() {
        let r = boot_regs(0x10_0000, 0);
        assert_eq!((r.rip, r.rsi, r.rflags), (0x10_0000, ZERO_PAGE_START, 2));
    }
}
