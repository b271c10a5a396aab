//! Identity page tables for the 64-bit entry.
//!
//! Long mode needs paging on. We map the low 4 GiB 1:1 with 2 MiB pages (the guest RAM
//! below the MMIO gap and the APIC windows). The entries allow user access so that test
//! guests can run their work in ring 3 on the same tables; a Linux kernel replaces them
//! with its own early on.

use super::layout::{PDE_PAGES, PDE_START, PDPT_START, PML4_START};
use vm_memory::{Bytes, GuestAddress, GuestMemory, GuestMemoryError};

const PRESENT: u64 = 1 << 0;
const WRITABLE: u64 = 1 << 1;
const USER: u64 = 1 << 2;
const HUGE: u64 = 1 << 7;
const TABLE_FLAGS: u64 = PRESENT | WRITABLE | USER;

/// Writes PML4, PDPT and `PDE_PAGES` page directories; returns the CR3 value.
pub fn write_identity_tables<M: GuestMemory>(mem: &M) -> Result<u64, GuestMemoryError> {
    mem.write_obj(PDPT_START | TABLE_FLAGS, GuestAddress(PML4_START))?;
    for gib in 0..PDE_PAGES {
        let pd = PDE_START + gib * 0x1000;
        mem.write_obj(pd | TABLE_FLAGS, GuestAddress(PDPT_START + gib * 8))?;
        let mut entries = [0u8; 4096];
        for (i, slot) in entries.chunks_exact_mut(8).enumerate() {
            let phys = (gib << 30) | ((i as u64) << 21);
            slot.copy_from_slice(&(phys | TABLE_FLAGS | HUGE).to_le_bytes());
        }
        mem.write_slice(&entries, GuestAddress(pd))?;
    }
    Ok(PML4_START)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::GuestMemoryMmap;

    /// Walks the tables the way the MMU would for a 2 MiB mapping.
    fn translate(mem: &GuestMemoryMmap, cr3: u64, va: u64) -> u64 {
        let read = |addr: u64| mem.read_obj::<u64>(GuestAddress(addr)).unwrap();
        let pml4e = read(cr3 + ((va >> 39) & 0x1ff) * 8);
        let pdpte = read((pml4e & !0xfff) + ((va >> 30) & 0x1ff) * 8);
        let pde = read((pdpte & !0xfff) + ((va >> 21) & 0x1ff) * 8);
        assert!(pde & HUGE != 0 && pde & USER != 0);
        (pde & !0x1f_ffff & !(HUGE | TABLE_FLAGS)) | (va & 0x1f_ffff)
    }

    #[test]
    fn maps_the_low_4_gib_one_to_one() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let cr3 = write_identity_tables(&mem).unwrap();
        for va in [0u64, 0x10_0000, 0x1234_5678, 0xfee0_0000, 0xffff_ffff] {
            assert_eq!(translate(&mem, cr3, va), va);
        }
    }
}
