//! Memory-page playbooks: which pages of a snapshot's `memory.img` a restore touches
//! before its sandbox answers, learned from earlier restores and faulted in ahead of the
//! guest on the next ones (issue 7: "record the block (and memory page) access order").
//!
//! Why this exists: a restore maps `memory.img` copy-on-write and the guest faults its
//! pages in one at a time as it runs. When the image is not in the host's page cache
//! (after a reboot, an archive, memory pressure) each fault is a small synchronous disk
//! read on the vCPU's critical path; when it is, each is still a host page fault taken
//! in the middle of guest execution. A playbook lists the pages earlier restores of the
//! same image touched; the zygote asks the kernel to read them ahead
//! (`posix_fadvise(WILLNEED)`, once for all children), and each child maps them on a
//! background thread (`madvise(MADV_POPULATE_READ)`) while its vCPU starts. Populating
//! read-only keeps copy-on-write intact: a page the guest later writes is still copied.
//!
//! Recording reads the VMM's own page table (`/proc/self/pagemap`): a guest page that is
//! mapped in the VMM was touched since the restore (or prefetched, which is why the
//! playbook's merge rule drops pages no run touched lately). The page table keeps no
//! order, so the playbook is in image order, which is also the order readahead likes.
//! The file format is the disk playbook's ([`Playbook`], one entry per 4 KiB page).

use super::memory::{image_offsets, total_size};
use forkvm_snapshot::vault::lazy::{Recording, Touch};
use forkvm_snapshot::vault::Playbook;
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use vm_memory::{GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

const PAGE: u64 = 4096;
/// Pagemap entry bit: the page is present in RAM and mapped.
const PM_PRESENT: u64 = 1 << 63;

/// Runs of image pages to fault in: (first page, page count), ascending.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryPrefetch {
    runs: Vec<(u64, u64)>,
}

impl MemoryPrefetch {
    /// The pages of `playbook`, as runs.
    pub fn from_playbook(playbook: &Playbook) -> MemoryPrefetch {
        let mut pages: Vec<u64> = playbook.blocks().collect();
        pages.sort_unstable();
        pages.dedup();
        MemoryPrefetch { runs: runs(&pages) }
    }

    /// Pages listed.
    pub fn pages(&self) -> u64 {
        self.runs.iter().map(|r| r.1).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// Asks the kernel to read the listed pages of `image` into the page cache in the
    /// background (returns at once; errors only lose the head start).
    pub fn advise(&self, image: &File) {
        for &(first, count) in &self.runs {
            // SAFETY: posix_fadvise only acts on the descriptor; no memory is passed.
            unsafe {
                libc::posix_fadvise(
                    image.as_raw_fd(),
                    (first * PAGE) as libc::off_t,
                    (count * PAGE) as libc::off_t,
                    libc::POSIX_FADV_WILLNEED,
                )
            };
        }
    }

    /// Maps the listed pages into `mem` (a private mapping of the image laid out as
    /// [`image_offsets`] says) on a background thread, read-only, ahead of the guest.
    /// The thread ends by itself; pages outside the image are skipped.
    pub fn populate_in_background(&self, mem: &GuestMemoryMmap) -> std::io::Result<std::thread::JoinHandle<u64>> {
        let ranges = self.host_ranges(mem);
        std::thread::Builder::new().name("memory-prefetch".into()).spawn(move || {
            crate::host::seccomp::enter_thread(crate::host::seccomp::ThreadKind::Device);
            // Behind everything else: a head start for the guest, never a competitor of
            // the zygote forking the next children or of a vCPU (nice 10; best effort).
            // SAFETY: gettid and setpriority on the calling thread pass no memory.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 10) };
            let mut done = 0;
            for (addr, len) in ranges {
                // SAFETY: the range lies inside one of the guest memory mappings, which
                // stay mapped for the life of the VMM process; MADV_POPULATE_READ only
                // faults pages in (as a read would) and never changes their content. If
                // the VMM unmaps memory meanwhile the call fails with ENOMEM, harmlessly.
                let rc = unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_POPULATE_READ) };
                if rc == 0 {
                    done += (len as u64) / PAGE;
                }
            }
            done
        })
    }

    /// Host (address, length) of each run, split at region boundaries.
    fn host_ranges(&self, mem: &GuestMemoryMmap) -> Vec<(usize, usize)> {
        let regions: Vec<(u64, u64, usize)> = mem
            .iter()
            .zip(image_offsets(total_size(mem)))
            .map(|(r, off)| (off, r.len(), r.as_ptr() as usize))
            .collect();
        let mut out = Vec::new();
        for &(first, count) in &self.runs {
            let (start, end) = (first * PAGE, (first + count) * PAGE);
            for &(off, len, host) in &regions {
                let (lo, hi) = (start.max(off), end.min(off + len));
                if lo < hi {
                    out.push((host + (lo - off) as usize, (hi - lo) as usize));
                }
            }
        }
        out
    }
}

/// Ascending pages as (first, count) runs.
fn runs(pages: &[u64]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &p in pages {
        match out.last_mut() {
            Some((first, count)) if *first + *count == p => *count += 1,
            _ => out.push((p, 1)),
        }
    }
    out
}

/// This process's `/proc/self/pagemap`, opened before it entered its jail (which has no
/// `/proc`), with the pid it belongs to.
static PAGEMAP: std::sync::OnceLock<(u32, File)> = std::sync::OnceLock::new();

/// Opens this process's pagemap for [`touched_pages`] while `/proc` can still be named
/// (a VMM calls it just before it enters its jail). Best effort: without it, recording
/// a playbook fails with a message that says why.
pub fn open_pagemap_early() {
    if let Ok(f) = File::open("/proc/self/pagemap") {
        let _ = PAGEMAP.set((std::process::id(), f));
    }
}

fn pagemap() -> std::io::Result<File> {
    match PAGEMAP.get() {
        Some((pid, f)) if *pid == std::process::id() => f.try_clone(),
        _ => File::open("/proc/self/pagemap").map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!(
                    "opening /proc/self/pagemap: {e} (a VMM forked from a running sandbox is born in its \
                     parent's jail, which has no /proc, so it cannot record a memory playbook)"
                ),
            )
        }),
    }
}

/// Image pages of `mem` mapped in this process now (see the module doc), ascending.
pub fn touched_pages(mem: &GuestMemoryMmap) -> std::io::Result<Vec<u64>> {
    let pagemap = pagemap()?;
    let mut pages = Vec::new();
    let mut buf = vec![0u8; 8 * 4096];
    for (r, off) in mem.iter().zip(image_offsets(total_size(mem))) {
        let (host, n) = (r.as_ptr() as u64, r.len() / PAGE);
        let mut i = 0;
        while i < n {
            let batch = (n - i).min(4096);
            let bytes = &mut buf[..(batch * 8) as usize];
            pagemap.read_exact_at(bytes, (host / PAGE + i) * 8)?;
            for (k, e) in bytes.chunks_exact(8).enumerate() {
                if u64::from_le_bytes(e.try_into().expect("8 bytes")) & PM_PRESENT != 0 {
                    pages.push(off / PAGE + i + k as u64);
                }
            }
            i += batch;
        }
    }
    Ok(pages)
}

/// What [`record`] did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryRecording {
    /// Pages this restore had touched.
    pub touched_pages: u64,
    /// Pages in the playbook after merging.
    pub playbook_pages: u64,
    /// Restores the playbook has learned from.
    pub runs: u64,
    pub path: PathBuf,
}

/// Why [`record`] failed.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("reading /proc/self/pagemap: {0}")]
    Pagemap(#[source] std::io::Error),
    #[error("saving the memory playbook: {0}")]
    Save(#[source] forkvm_snapshot::vault::lazy::PlaybookError),
}

/// Merges the pages `mem` has touched into the playbook at `path` (made if missing or
/// unreadable, or of another image size) and saves it.
pub fn record(mem: &GuestMemoryMmap, path: &Path) -> Result<MemoryRecording, RecordError> {
    let touched = TouchedMemory::of(mem).map_err(RecordError::Pagemap)?;
    touched.merge_into(path).map_err(RecordError::Save)
}

/// Most runs a [`TouchedMemory`] holds (a few MiB of JSON); a guest that touched its
/// pages more scattered than that has the rest left out of its playbook.
pub const MAX_TOUCHED_RUNS: usize = 1 << 18;

/// The guest pages a VM has touched since its restore, as runs `[first page, pages]`:
/// what the VMM reports (control request `touched_memory`) for the host side to merge
/// into a playbook, since a VMM under its sandbox's uid may not write the cache.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TouchedMemory {
    /// The guest's memory size, bytes (the playbook's image size).
    pub size: u64,
    pub runs: Vec<[u64; 2]>,
}

impl TouchedMemory {
    /// What `mem` has touched (read from this process's pagemap).
    pub fn of(mem: &GuestMemoryMmap) -> std::io::Result<TouchedMemory> {
        let mut runs: Vec<[u64; 2]> = Vec::new();
        for page in touched_pages(mem)? {
            if let Some([_, n]) = runs.last_mut().filter(|[first, n]| *first + *n == page) {
                *n += 1;
            } else if runs.len() == MAX_TOUCHED_RUNS {
                break;
            } else {
                runs.push([page, 1]);
            }
        }
        Ok(TouchedMemory { size: total_size(mem), runs })
    }

    /// Merges these pages into the playbook at `path` (made if missing, unreadable or of
    /// another image size) and saves it. Pages past the memory size are ignored (the
    /// report comes from a VMM).
    pub fn merge_into(&self, path: &Path) -> Result<MemoryRecording, forkvm_snapshot::vault::lazy::PlaybookError> {
        let last = self.size / PAGE;
        let touches: Vec<Touch> = self
            .runs
            .iter()
            .take(MAX_TOUCHED_RUNS)
            .flat_map(|&[first, n]| first..first.saturating_add(n).min(last))
            .map(|block| Touch { block, at_micros: 0 })
            .collect();
        let touched_pages = touches.len() as u64;
        let book = Playbook::merge_into_file(path, self.size, &Recording { touches }, &memory_rule())?;
        Ok(MemoryRecording {
            touched_pages,
            playbook_pages: book.len() as u64,
            runs: book.runs(),
            path: path.to_path_buf(),
        })
    }
}

/// The disk rule's ageing, with room for a whole guest's pages (4 GiB).
fn memory_rule() -> forkvm_snapshot::vault::lazy::MergeRule {
    forkvm_snapshot::vault::lazy::MergeRule { max_entries: 1 << 20, ..Default::default() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vstate::memory::private_file_mapping;
    use std::io::Write;

    const MIB: u64 = 64;

    fn image() -> File {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&vec![0x5a; (MIB << 20) as usize]).unwrap();
        f
    }

    /// Reads (as a guest access would: through the mapping) byte 17 of `page`.
    fn touch(mem: &GuestMemoryMmap, page: u64) -> u8 {
        let r = mem.iter().next().unwrap();
        // SAFETY: the page lies inside the mapping, which `mem` keeps alive.
        unsafe { std::ptr::read_volatile(r.as_ptr().add((page * PAGE + 17) as usize)) }
    }

    fn write(mem: &GuestMemoryMmap, page: u64, v: u8) {
        let r = mem.iter().next().unwrap();
        // SAFETY: as in `touch`; the mapping is private and writable.
        unsafe { std::ptr::write_volatile(r.as_ptr().add((page * PAGE) as usize), v) }
    }

    fn includes(have: &[u64], want: &[u64]) -> bool {
        want.iter().all(|p| have.binary_search(p).is_ok())
    }

    #[test]
    fn runs_join_adjacent_pages() {
        assert_eq!(runs(&[1, 2, 3, 7, 9, 10]), vec![(1, 3), (7, 1), (9, 2)]);
        assert!(runs(&[]).is_empty());
    }

    #[test]
    fn touched_pages_are_those_the_mapping_faulted_in() {
        let file = image();
        let mem = private_file_mapping(&file, MIB << 20).unwrap();
        assert!(touched_pages(&mem).unwrap().is_empty(), "nothing touched yet");
        assert_eq!(touch(&mem, 5), 0x5a);
        write(&mem, 9000, 1);
        let pages = touched_pages(&mem).unwrap();
        // The kernel maps neighbours of a faulting page too (fault-around, large folios):
        // a superset of the two, but far from the whole image.
        assert!(includes(&pages, &[5, 9000]), "{pages:?}");
        assert!((pages.len() as u64) < (MIB << 20) / PAGE / 4, "{} pages", pages.len());
    }

    #[test]
    fn recording_then_prefetching_maps_the_same_pages_in_a_new_mapping_without_writing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m/memory.playbook");
        let file = image();
        let mem = private_file_mapping(&file, MIB << 20).unwrap();
        for p in [3u64, 4, 5, 2000, 16383] {
            touch(&mem, p);
        }
        let seen = touched_pages(&mem).unwrap();
        let rec = record(&mem, &path).unwrap();
        assert_eq!((rec.touched_pages, rec.playbook_pages, rec.runs), (seen.len() as u64, seen.len() as u64, 1));

        let book = Playbook::load(&path).unwrap();
        let prefetch = MemoryPrefetch::from_playbook(&book);
        assert_eq!(prefetch.pages(), seen.len() as u64);
        prefetch.advise(&file);
        let fresh = private_file_mapping(&file, MIB << 20).unwrap();
        assert!(touched_pages(&fresh).unwrap().is_empty());
        assert_eq!(prefetch.populate_in_background(&fresh).unwrap().join().unwrap(), seen.len() as u64);
        let mapped = touched_pages(&fresh).unwrap();
        assert!(includes(&mapped, &seen), "mapped ahead of any access");
        // Still copy-on-write: a write after the prefetch does not reach the image.
        write(&fresh, 4, 7);
        let mut b = [0u8; 1];
        file.read_exact_at(&mut b, 4 * PAGE).unwrap();
        assert_eq!((b[0], touch(&fresh, 4)), (0x5a, 0x5a), "byte 0 written privately, byte 17 as it was");

        // A second run that also touches another page: the playbook keeps both runs'.
        touch(&fresh, 12000);
        let again = record(&fresh, &path).unwrap();
        assert_eq!(again.runs, 2);
        assert!(again.playbook_pages > rec.playbook_pages);
        let pages: Vec<u64> = Playbook::load(&path).unwrap().blocks().collect();
        assert!(pages.contains(&12000) && pages.contains(&2000));
    }
}
