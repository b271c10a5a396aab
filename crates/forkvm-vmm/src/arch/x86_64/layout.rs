//! Guest physical memory layout on x86-64.
//!
//! One place names every fixed guest address the VMM writes to or hands the guest, so
//! the boot code, the Linux loader, the test guests and the snapshot checks agree.
//!
//! ```text
//! 0x0000_0500  GDT (boot)                  0x0000_9000  PML4
//! 0x0000_0520  IDT (boot, empty)           0x0000_A000  PDPT
//! 0x0000_7000  zero page / test-guest args 0x0000_B000  4 page directories (2 MiB pages, 4 GiB)
//! 0x0000_8FF0  boot stack top              0x0002_0000  kernel command line
//! 0x0009_FC00  EBDA (end of low RAM)       0x0010_0000  kernel / test-guest image
//! 0xC000_0000 .. 0x1_0000_0000  MMIO gap: virtio-mmio, IOAPIC, LAPIC
//! ```

/// Boot GDT: null, code64, data, tss-free flat layout (see `gdt`).
pub const BOOT_GDT_START: u64 = 0x500;
/// Boot IDT: a single empty descriptor table (the guest installs its own).
pub const BOOT_IDT_START: u64 = 0x520;
/// Linux boot-protocol zero page (`boot_params`); for flat test guests, their argument block.
pub const ZERO_PAGE_START: u64 = 0x7000;
/// Initial stack pointer handed to the guest.
pub const BOOT_STACK_POINTER: u64 = 0x8ff0;
/// Identity page tables: PML4, PDPT, then `PDE_PAGES` page directories.
pub const PML4_START: u64 = 0x9000;
pub const PDPT_START: u64 = 0xa000;
pub const PDE_START: u64 = 0xb000;
/// Number of page directories: each maps 1 GiB with 2 MiB pages, so 4 map the low 4 GiB.
pub const PDE_PAGES: u64 = 4;
/// Kernel command line.
pub const CMDLINE_START: u64 = 0x20000;
/// Largest command line we hand the guest (including the trailing NUL).
pub const CMDLINE_MAX_SIZE: usize = 0x10000;
/// Start of the EBDA; low RAM in the e820 map ends here.
pub const EBDA_START: u64 = 0x9fc00;
/// Where the kernel (or flat test-guest image) is loaded: 1 MiB.
pub const HIMEM_START: u64 = 0x10_0000;
/// The MMIO gap below 4 GiB: guest RAM never lives here.
pub const MMIO_GAP_START: u64 = 0xc000_0000;
pub const MMIO_GAP_END: u64 = 0x1_0000_0000;
/// First virtio-mmio device window; each device takes `VIRTIO_MMIO_SIZE`.
pub const VIRTIO_MMIO_START: u64 = 0xd000_0000;
pub const VIRTIO_MMIO_SIZE: u64 = 0x1000;
/// I/O APIC and local APIC register windows (fixed by the architecture).
pub const IOAPIC_START: u64 = 0xfec0_0000;
pub const IOAPIC_SIZE: u64 = 0x1000;
pub const LAPIC_START: u64 = 0xfee0_0000;

/// Guest RAM regions for `mem_size` bytes: below the MMIO gap, and the rest above 4 GiB.
pub fn ram_regions(mem_size: u64) -> Vec<(u64, u64)> {
    if mem_size <= MMIO_GAP_START {
        vec![(0, mem_size)]
    } else {
        vec![(0, MMIO_GAP_START), (MMIO_GAP_END, mem_size - MMIO_GAP_START)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_memory_is_one_region() {
        assert_eq!(ram_regions(512 << 20), vec![(0, 512 << 20)]);
    }

    #[test]
    fn large_memory_skips_the_mmio_gap() {
        let regions = ram_regions(4 << 30);
        assert_eq!(regions, vec![(0, MMIO_GAP_START), (MMIO_GAP_END, 1 << 30)]);
    }
}
