//! Guest linear addresses to guest physical ones, as the CPU would translate them for a
//! data access: 4-level paging, permission checks, accessed and dirty bits.
//!
//! The VMM reads and writes guest memory on the guest's behalf when it completes `XSAVE`
//! or `XRSTOR`; the target can be a user page (a signal frame), which may be
//! write-protected (copy-on-write after `fork`) or not present yet. `KVM_TRANSLATE`
//! answers neither question well (it sets no accessed/dirty bits and mixes "not present"
//! with "not writable"), so the walk is done here, and a failed check becomes the page
//! fault the CPU would raise, with the same error code.
//!
//! Other vCPUs run while one walks: the accessed/dirty bits are set with a
//! compare-and-swap of the entry the walk read, as the CPU's locked update does, and a
//! walk whose entry changed under it starts again (a blind write could undo another
//! vCPU's update, or mark an entry its kernel just cleared).

use std::sync::atomic::{AtomicU64, Ordering};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

const PTE_P: u64 = 1;
const PTE_W: u64 = 1 << 1;
const PTE_U: u64 = 1 << 2;
const PTE_A: u64 = 1 << 5;
const PTE_D: u64 = 1 << 6;
const PTE_PS: u64 = 1 << 7;
const ADDR_MASK: u64 = 0x000f_ffff_ffff_f000;

const CR0_PG: u64 = 1 << 31;
const CR0_WP: u64 = 1 << 16;
const CR4_LA57: u64 = 1 << 12;

/// Page-fault error-code bits.
pub const PF_PRESENT: u32 = 1;
pub const PF_WRITE: u32 = 1 << 1;
pub const PF_USER: u32 = 1 << 2;

/// The paging controls a walk depends on.
#[derive(Debug, Clone, Copy)]
pub struct Paging {
    pub cr0: u64,
    pub cr3: u64,
    pub cr4: u64,
    /// Current privilege level (CS.RPL).
    pub cpl: u8,
}

/// Why an access cannot be made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WalkError {
    /// The CPU would raise #PF with this address (CR2) and error code.
    PageFault { addr: u64, error_code: u32 },
    /// A paging structure lies outside guest memory, or paging is in a mode the VMM does
    /// not walk (5-level, paging off): the VM must stop.
    Unsupported(&'static str),
}

/// How many times a walk starts again when another vCPU changes an entry under it.
const WALK_RETRIES: usize = 64;

/// The physical address of the data byte at `linear`, for a read or a write, setting the
/// accessed bits of every level and the dirty bit of the page on a write.
pub fn translate(mem: &GuestMemoryMmap, paging: Paging, linear: u64, write: bool) -> Result<u64, WalkError> {
    for _ in 0..WALK_RETRIES {
        if let Some(phys) = walk_once(mem, paging, linear, write)? {
            return Ok(phys);
        }
    }
    Err(WalkError::Unsupported("page tables kept changing under the walk"))
}

/// One walk; `None` when another vCPU changed an entry before its bits were set.
fn walk_once(mem: &GuestMemoryMmap, paging: Paging, linear: u64, write: bool) -> Result<Option<u64>, WalkError> {
    if paging.cr0 & CR0_PG == 0 {
        return Err(WalkError::Unsupported("paging is off"));
    }
    if paging.cr4 & CR4_LA57 != 0 {
        return Err(WalkError::Unsupported("5-level paging"));
    }
    let user = paging.cpl == 3;
    let fault = |present: bool| {
        let mut error_code = 0;
        if present {
            error_code |= PF_PRESENT;
        }
        if write {
            error_code |= PF_WRITE;
        }
        if user {
            error_code |= PF_USER;
        }
        WalkError::PageFault { addr: linear, error_code }
    };
    // A non-canonical address raises #GP, not #PF; the guest kernel never gets here with
    // one, so it is reported as a fault on the address rather than modelled.
    let canonical = ((linear as i64) << 16 >> 16) as u64 == linear;
    if !canonical {
        return Err(fault(false));
    }
    let mut table = paging.cr3 & ADDR_MASK;
    let mut writable = true;
    let mut user_ok = true;
    let mut entries: [(u64, u64); 4] = [(0, 0); 4];
    let mut depth = 0;
    let mut level = 4u32;
    let phys = loop {
        let shift = 12 + 9 * (level - 1);
        let slot = table + ((linear >> shift) & 0x1ff) * 8;
        let entry: u64 = mem
            .load(GuestAddress(slot), Ordering::Acquire)
            .map_err(|_| WalkError::Unsupported("page table outside guest memory"))?;
        if entry & PTE_P == 0 {
            return Err(fault(false));
        }
        writable &= entry & PTE_W != 0;
        user_ok &= entry & PTE_U != 0;
        entries[depth] = (slot, entry);
        depth += 1;
        let large = entry & PTE_PS != 0 && (level == 2 || level == 3);
        if level == 1 || large {
            let page_mask = (1u64 << shift) - 1;
            break (entry & ADDR_MASK & !page_mask) | (linear & page_mask);
        }
        table = entry & ADDR_MASK;
        level -= 1;
    };
    if user && !user_ok {
        return Err(fault(true));
    }
    if write && !writable && (user || paging.cr0 & CR0_WP != 0) {
        return Err(fault(true));
    }
    for (i, &(slot, entry)) in entries[..depth].iter().enumerate() {
        let leaf = i + 1 == depth;
        let want = entry | PTE_A | if leaf && write { PTE_D } else { 0 };
        if want != entry && !swap_entry(mem, slot, entry, want)? {
            return Ok(None);
        }
    }
    Ok(Some(phys))
}

/// Replaces the entry at `slot` with `want` if it still holds `entry`.
fn swap_entry(mem: &GuestMemoryMmap, slot: u64, entry: u64, want: u64) -> Result<bool, WalkError> {
    let outside = |_| WalkError::Unsupported("page table outside guest memory");
    // The whole word must lie in one region (a slot is 8-aligned, regions page-aligned).
    mem.get_slice(GuestAddress(slot), 8).map_err(outside)?;
    let ptr = mem.get_host_address(GuestAddress(slot)).map_err(outside)?;
    // SAFETY: `ptr` is the host address of 8 bytes of guest memory (checked above), which
    // stays mapped while `mem` lives; a slot is 8-aligned and the mapping page-aligned,
    // so the word is aligned; guest memory is only ever accessed atomically or through
    // volatile copies, which an atomic read-modify-write does not make unsound.
    let cell = unsafe { AtomicU64::from_ptr(ptr.cast::<u64>()) };
    Ok(cell.compare_exchange(entry, want, Ordering::SeqCst, Ordering::SeqCst).is_ok())
}

/// The physical pieces of `[linear, linear + len)`, one per page, all checked before any
/// byte moves (so an access that faults changes nothing).
pub fn translate_range(
    mem: &GuestMemoryMmap,
    paging: Paging,
    linear: u64,
    len: usize,
    write: bool,
) -> Result<Vec<(u64, usize)>, WalkError> {
    let mut out = Vec::with_capacity(len / 4096 + 2);
    let mut done = 0usize;
    while done < len {
        let va = linear.wrapping_add(done as u64);
        let in_page = (0x1000 - (va & 0xfff)) as usize;
        let n = in_page.min(len - done);
        out.push((translate(mem, paging, va, write)?, n));
        done += n;
    }
    Ok(out)
}

/// Reads `len` bytes at the linear address `linear`.
pub fn read(mem: &GuestMemoryMmap, paging: Paging, linear: u64, len: usize) -> Result<Vec<u8>, WalkError> {
    let mut out = vec![0u8; len];
    let mut at = 0;
    for (phys, n) in translate_range(mem, paging, linear, len, false)? {
        mem.read_slice(&mut out[at..at + n], GuestAddress(phys))
            .map_err(|_| WalkError::Unsupported("data outside guest memory"))?;
        at += n;
    }
    Ok(out)
}

/// Writes `bytes` at the linear address `linear`; nothing is written if any page faults.
pub fn write(mem: &GuestMemoryMmap, paging: Paging, linear: u64, bytes: &[u8]) -> Result<(), WalkError> {
    let mut at = 0;
    for (phys, n) in translate_range(mem, paging, linear, bytes.len(), true)? {
        mem.write_slice(&bytes[at..at + n], GuestAddress(phys))
            .map_err(|_| WalkError::Unsupported("data outside guest memory"))?;
        at += n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CR3: u64 = 0x1000;

    /// Tables at 0x1000 (PML4), 0x2000 (PDPT), 0x3000 (PD), 0x4000 (PT); linear 0 maps
    /// 4 KiB pages at 0x10000.., and linear 0x4000_0000 a 2 MiB page at 0x20_0000.
    fn memory(pte_flags: u64) -> GuestMemoryMmap {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 4 << 20)]).unwrap();
        let dir = PTE_P | PTE_W | PTE_U;
        mem.write_obj(0x2000u64 | dir, GuestAddress(0x1000)).unwrap();
        mem.write_obj(0x3000u64 | dir, GuestAddress(0x2000)).unwrap();
        mem.write_obj(0x4000u64 | dir, GuestAddress(0x3000)).unwrap();
        mem.write_obj(0x10000u64 | pte_flags, GuestAddress(0x4000)).unwrap();
        mem.write_obj(0x11000u64 | PTE_P | PTE_W, GuestAddress(0x4008)).unwrap();
        // PDPT[1] -> PD at 0x5000, whose entry 0 is a 2 MiB page at 0x20_0000.
        mem.write_obj(0x5000u64 | dir, GuestAddress(0x2008)).unwrap();
        mem.write_obj(0x20_0000u64 | PTE_P | PTE_W | PTE_PS, GuestAddress(0x5000)).unwrap();
        mem
    }

    fn kernel() -> Paging {
        Paging { cr0: CR0_PG | CR0_WP, cr3: CR3, cr4: 0, cpl: 0 }
    }

    #[test]
    fn translates_4k_and_2m_pages_and_sets_accessed_and_dirty() {
        let mem = memory(PTE_P | PTE_W | PTE_U);
        assert_eq!(translate(&mem, kernel(), 0x123, false), Ok(0x10123));
        let pte: u64 = mem.read_obj(GuestAddress(0x4000)).unwrap();
        assert_ne!(pte & PTE_A, 0);
        assert_eq!(pte & PTE_D, 0, "a read does not dirty");
        assert_eq!(translate(&mem, kernel(), 0x456, true), Ok(0x10456));
        let pte: u64 = mem.read_obj(GuestAddress(0x4000)).unwrap();
        assert_ne!(pte & PTE_D, 0);
        let pml4: u64 = mem.read_obj(GuestAddress(0x1000)).unwrap();
        assert_eq!(pml4 & PTE_D, 0, "only the leaf gets dirty");
        assert_eq!(translate(&mem, kernel(), 0x4000_0000 + 0x1234, true), Ok(0x20_1234));
    }

    #[test]
    fn faults_like_the_cpu() {
        let mem = memory(PTE_P | PTE_U); // read-only user page
        let pf = |addr, error_code| Err(WalkError::PageFault { addr, error_code });
        assert_eq!(translate(&mem, kernel(), 0x10, true), pf(0x10, PF_PRESENT | PF_WRITE));
        let no_wp = Paging { cr0: CR0_PG, ..kernel() };
        assert!(translate(&mem, no_wp, 0x10, true).is_ok(), "CR0.WP=0: the kernel writes anyway");
        assert_eq!(translate(&mem, kernel(), 0x2000, false), pf(0x2000, 0), "not present");
        let user = Paging { cpl: 3, ..kernel() };
        assert_eq!(translate(&mem, user, 0x1000, false), pf(0x1000, PF_PRESENT | PF_USER), "supervisor page");
        assert_eq!(translate(&mem, kernel(), 0x8000_0000_0000, false), pf(0x8000_0000_0000, 0), "non-canonical");
        let la57 = Paging { cr4: CR4_LA57, ..kernel() };
        assert!(matches!(translate(&mem, la57, 0, false), Err(WalkError::Unsupported(_))));
    }

    #[test]
    fn a_range_is_checked_whole_before_use() {
        let mem = memory(PTE_P | PTE_W);
        let pieces = translate_range(&mem, kernel(), 0xff0, 0x20, true).unwrap();
        assert_eq!(pieces, vec![(0x10ff0, 0x10), (0x11000, 0x10)]);
        // Page 2 (linear 0x2000) is not present: the whole range fails.
        assert!(translate_range(&mem, kernel(), 0x1ff0, 0x20, true).is_err());
        write(&mem, kernel(), 0xffc, &[1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
        assert_eq!(read(&mem, kernel(), 0xffc, 8).unwrap(), vec![1, 2, 3, 4, 5, 6, 7, 8]);
        let before = read(&mem, kernel(), 0x1ff8, 8).unwrap();
        assert!(write(&mem, kernel(), 0x1ff8, &[9; 16]).is_err());
        assert_eq!(read(&mem, kernel(), 0x1ff8, 8).unwrap(), before, "a faulting write changes nothing");
    }

    #[test]
    fn an_entry_changed_by_another_vcpu_is_not_overwritten() {
        let mem = memory(PTE_P | PTE_W | PTE_U);
        let seen = PTE_P | PTE_W | 0x10000;
        // Another vCPU's kernel cleared the entry after this walk read it.
        mem.write_obj(0u64, GuestAddress(0x4000)).unwrap();
        assert_eq!(swap_entry(&mem, 0x4000, seen, seen | PTE_A), Ok(false));
        assert_eq!(mem.read_obj::<u64>(GuestAddress(0x4000)).unwrap(), 0, "the cleared entry stays cleared");
        assert_eq!(translate(&mem, kernel(), 0x10, false), Err(WalkError::PageFault { addr: 0x10, error_code: 0 }));
        assert!(matches!(swap_entry(&mem, 4 << 20, 0, 1), Err(WalkError::Unsupported(_))));
    }

    #[test]
    fn concurrent_walks_keep_every_bit() {
        let mem = memory(PTE_P | PTE_W | PTE_U);
        std::thread::scope(|s| {
            for write in [false, true, false, true] {
                let mem = &mem;
                s.spawn(move || {
                    for _ in 0..1000 {
                        translate(mem, kernel(), 0x10, write).unwrap();
                    }
                });
            }
        });
        let pte: u64 = mem.read_obj(GuestAddress(0x4000)).unwrap();
        assert_eq!(pte & (PTE_A | PTE_D), PTE_A | PTE_D);
    }
}
