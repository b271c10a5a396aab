//! Guest memory: private anonymous memory for a fresh boot, or a copy-on-write
//! (`MAP_PRIVATE`) mapping of a snapshot's `memory.img` for a restore.
//!
//! A `MAP_PRIVATE` file mapping is what makes fork cheap: every child maps the same
//! image, shares its pages through the page cache, and gets a private copy of a page only
//! when its guest writes to it. The image itself is never modified.

use crate::arch::x86_64::layout::ram_regions;
use std::fs::File;
use vm_memory::mmap::MmapRegion;
use vm_memory::{FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion, GuestRegionMmap};

#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    #[error("guest memory size {0} bytes is not a positive multiple of 2 MiB")]
    BadSize(u64),
    #[error("mapping {size} bytes of guest memory at {addr:#x}: {source}")]
    Map { addr: u64, size: u64, source: vm_memory::mmap::MmapRegionError },
    #[error("guest memory region at {0:#x} overflows the address space")]
    Overflow(u64),
    #[error("assembling the guest memory map: {0}")]
    Assemble(vm_memory::GuestRegionCollectionError),
}

/// Smallest guest we build: room for the boot structures and a test guest.
pub const MIN_MEM_SIZE: u64 = 2 << 20;
/// Page size guest RAM sizes must be a multiple of (huge-page friendly).
const SIZE_ALIGN: u64 = 2 << 20;

fn check_size(mem_size: u64) -> Result<(), MemoryError> {
    if mem_size < MIN_MEM_SIZE || !mem_size.is_multiple_of(SIZE_ALIGN) {
        return Err(MemoryError::BadSize(mem_size));
    }
    Ok(())
}

fn assemble(regions: Vec<GuestRegionMmap>) -> Result<GuestMemoryMmap, MemoryError> {
    GuestMemoryMmap::from_regions(regions).map_err(MemoryError::Assemble)
}

/// Private anonymous guest memory of `mem_size` bytes, with transparent huge pages
/// requested (they make a later `fork()` of this process, i.e. a live branch, cheap).
pub fn anonymous(mem_size: u64) -> Result<GuestMemoryMmap, MemoryError> {
    check_size(mem_size)?;
    let mut regions = Vec::new();
    for (addr, size) in ram_regions(mem_size) {
        let mapping = anonymous_region(addr, size)?;
        // SAFETY: the range is exactly the mapping just created; madvise only changes
        // how the kernel backs it.
        unsafe { libc::madvise(mapping.as_ptr().cast(), size as usize, libc::MADV_HUGEPAGE) };
        regions.push(GuestRegionMmap::new(mapping, GuestAddress(addr)).ok_or(MemoryError::Overflow(addr))?);
    }
    assemble(regions)
}

/// One region of private anonymous memory for guest RAM at `addr` (for errors).
pub(crate) fn anonymous_region(addr: u64, size: u64) -> Result<MmapRegion, MemoryError> {
    let prot = libc::PROT_READ | libc::PROT_WRITE;
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
    MmapRegion::build(None, size as usize, prot, flags).map_err(|source| MemoryError::Map { addr, size, source })
}

/// Maps `image` (laid out region after region, as [`image_offsets`] says) copy-on-write.
pub fn private_file_mapping(image: &File, mem_size: u64) -> Result<GuestMemoryMmap, MemoryError> {
    check_size(mem_size)?;
    let mut regions = Vec::new();
    for ((addr, size), offset) in ram_regions(mem_size).into_iter().zip(image_offsets(mem_size)) {
        let file = image.try_clone().map_err(|e| MemoryError::Map {
            addr,
            size,
            source: vm_memory::mmap::MmapRegionError::Mmap(e),
        })?;
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        let flags = libc::MAP_PRIVATE | libc::MAP_NORESERVE;
        let mapping = MmapRegion::build(Some(FileOffset::new(file, offset)), size as usize, prot, flags)
            .map_err(|source| MemoryError::Map { addr, size, source })?;
        regions.push(GuestRegionMmap::new(mapping, GuestAddress(addr)).ok_or(MemoryError::Overflow(addr))?);
    }
    assemble(regions)
}

/// Offset in `memory.img` of each RAM region: regions are stored back to back.
pub fn image_offsets(mem_size: u64) -> Vec<u64> {
    let mut offset = 0;
    ram_regions(mem_size)
        .into_iter()
        .map(|(_, size)| {
            let this = offset;
            offset += size;
            this
        })
        .collect()
}

/// Each region as (guest address, host slice), for saving memory.
pub fn region_slices(mem: &GuestMemoryMmap) -> Vec<(u64, &[u8])> {
    mem.iter()
        .map(|r| {
            // SAFETY: the region's mapping is `len()` bytes at `as_ptr()` and lives as
            // long as `mem`. Callers read it only while the vCPUs are paused, so no guest
            // write races the read.
            let slice = unsafe { std::slice::from_raw_parts(r.as_ptr(), r.len() as usize) };
            (r.start_addr().0, slice)
        })
        .collect()
}

/// Total bytes of guest RAM.
pub fn total_size(mem: &GuestMemoryMmap) -> u64 {
    mem.iter().map(|r| r.len()).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use vm_memory::Bytes;

    #[test]
    fn rejects_sizes_that_are_not_2_mib_multiples() {
        assert!(matches!(anonymous(3 << 20), Err(MemoryError::BadSize(_))));
        assert!(matches!(anonymous(0), Err(MemoryError::BadSize(0))));
    }

    #[test]
    fn private_mapping_does_not_write_through_to_the_image() {
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&vec![0xab; 4 << 20]).unwrap();
        let mem = private_file_mapping(&file, 4 << 20).unwrap();
        assert_eq!(mem.read_obj::<u8>(GuestAddress(0x1000)).unwrap(), 0xab);
        mem.write_obj(0x11u8, GuestAddress(0x1000)).unwrap();
        assert_eq!(mem.read_obj::<u8>(GuestAddress(0x1000)).unwrap(), 0x11);
        let again = private_file_mapping(&file, 4 << 20).unwrap();
        assert_eq!(again.read_obj::<u8>(GuestAddress(0x1000)).unwrap(), 0xab);
    }

    #[test]
    fn offsets_follow_regions() {
        assert_eq!(image_offsets(512 << 20), vec![0]);
        assert_eq!(image_offsets(4 << 30), vec![0, 0xc000_0000]);
    }
}
