//! Guest memory that arrives while the guest runs: a restore that does not wait for its
//! memory image (issue 28's lazy restore from a remote).
//!
//! The memory is private anonymous, registered with a userfaultfd ([`super::uffd`]) for
//! missing pages. A serving thread answers each fault by asking a [`WindowSource`] for the
//! faulting 64 KiB window and copying it in whole (`UFFDIO_COPY`), which wakes the vCPU or
//! device thread that touched it. Between faults it fetches the windows nobody asked for
//! yet, in order, so the image completes in the background; then it unregisters the
//! memory, which is from there on ordinary anonymous memory (a live branch's `fork()` may
//! copy it: until then a fork would see missing pages as zeros, so [`LazyProgress::wait`]
//! holds forks back).
//!
//! **A window that cannot be fetched is never shown to the guest.** The serving thread
//! hands the error to its failure action and stops: in a VMM process that writes the
//! reason into the console log and ends the process, so the sandbox stops with a clear
//! error rather than running on with zeros where its memory should be.
//!
//! The userfaultfd must report kernel-mode faults (KVM touches guest memory from the
//! kernel), which needs privilege here: [`LazyMemory::map`] runs before a VMM gives its
//! privileges up, and the serving thread only copies and wakes.

use super::memory::{anonymous_region, image_offsets, MemoryError};
use super::uffd::Uffd;
use crate::arch::x86_64::layout::ram_regions;
use forkvm_snapshot::memory_windows::{WindowSource, WINDOW_BYTES};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion, GuestRegionMmap};

#[derive(Debug, thiserror::Error)]
pub enum LazyMemoryError {
    #[error(transparent)]
    Memory(#[from] MemoryError),
    #[error("creating the userfaultfd for lazy guest memory: {0}")]
    Create(std::io::Error),
    #[error("registering guest memory at {addr:#x} (+{size:#x}) with the userfaultfd: {source}")]
    Register { addr: u64, size: u64, source: std::io::Error },
    #[error("starting the memory-serving thread: {0}")]
    Thread(std::io::Error),
}

/// One RAM region: where it is in this process and in the image.
#[derive(Debug, Clone, Copy)]
struct Region {
    host: u64,
    len: u64,
    image_offset: u64,
}

/// Guest memory registered for missing-page faults, not yet served.
#[derive(Debug)]
pub struct LazyMemory {
    mem: GuestMemoryMmap,
    uffd: Uffd,
    regions: Vec<Region>,
}

pub use forkvm_snapshot::memory_windows::{ahead_from_env, AHEAD_ENV};

/// What the serving thread does with a window it cannot fetch (the reason).
pub type FailureAction = Box<dyn FnOnce(String) + Send>;

impl LazyMemory {
    /// Maps `mem_size` bytes of empty guest memory and registers it (see the module doc:
    /// call it while privileged).
    pub fn map(mem_size: u64) -> Result<LazyMemory, LazyMemoryError> {
        let uffd = Uffd::new().map_err(LazyMemoryError::Create)?;
        let mut regions = Vec::new();
        let mut guest = Vec::new();
        for ((addr, size), image_offset) in ram_regions(mem_size).into_iter().zip(image_offsets(mem_size)) {
            let mapping = anonymous_region(addr, size)?;
            let host = mapping.as_ptr() as u64;
            uffd.register_missing(host, size).map_err(|source| LazyMemoryError::Register { addr, size, source })?;
            regions.push(Region { host, len: size, image_offset });
            guest.push(GuestRegionMmap::new(mapping, GuestAddress(addr)).ok_or(MemoryError::Overflow(addr))?);
        }
        let mem = GuestMemoryMmap::from_regions(guest).map_err(MemoryError::Assemble)?;
        if mem.iter().map(|r| r.len()).sum::<u64>() != mem_size {
            return Err(MemoryError::BadSize(mem_size).into());
        }
        Ok(LazyMemory { mem, uffd, regions })
    }

    /// Starts the serving thread (see the module doc) and returns the memory to build
    /// the VM around. `failure` runs at most once, on the serving thread. Without
    /// `ahead` only touched windows are fetched: the memory never completes (a
    /// measurement's setting, [`AHEAD_ENV`]).
    pub fn serve(
        self,
        source: Box<dyn WindowSource>,
        failure: FailureAction,
        ahead: bool,
    ) -> Result<(GuestMemoryMmap, Arc<LazyProgress>), LazyMemoryError> {
        let windows = self.regions.iter().map(|r| r.len).sum::<u64>() / WINDOW_BYTES;
        let progress = Arc::new(LazyProgress { windows, ..LazyProgress::default() });
        let server = Server {
            uffd: self.uffd,
            regions: self.regions,
            source,
            present: vec![0u64; windows.div_ceil(64) as usize],
            progress: progress.clone(),
            buf: vec![0u8; WINDOW_BYTES as usize],
            ahead,
        };
        std::thread::Builder::new()
            .name("lazy-memory".into())
            .spawn(move || server.run(failure))
            .map_err(LazyMemoryError::Thread)?;
        Ok((self.mem, progress))
    }
}

/// How far a lazy restore's memory has come; shared with the serving thread.
#[derive(Debug, Default)]
pub struct LazyProgress {
    /// Windows in the image.
    pub windows: u64,
    /// Windows fetched because something touched them.
    pub on_demand: AtomicU64,
    /// Windows fetched ahead, in the background.
    pub ahead: AtomicU64,
    complete: AtomicBool,
    failed: Mutex<Option<String>>,
    changed: Condvar,
    lock: Mutex<()>,
}

impl LazyProgress {
    /// Whether every window is in (the memory is ordinary memory now).
    pub fn is_complete(&self) -> bool {
        self.complete.load(Ordering::Acquire)
    }

    /// Why the memory will never complete, if a fetch failed.
    pub fn failure(&self) -> Option<String> {
        self.failed.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Waits up to `timeout` for the memory to complete; the error says why it did not.
    pub fn wait(&self, timeout: Duration) -> Result<(), String> {
        let deadline = std::time::Instant::now() + timeout;
        let mut guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if self.is_complete() {
                return Ok(());
            }
            if let Some(f) = self.failure() {
                return Err(format!("guest memory will not arrive: {f}"));
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                let have = self.on_demand.load(Ordering::Relaxed) + self.ahead.load(Ordering::Relaxed);
                return Err(format!("guest memory is still arriving ({have} of {} windows)", self.windows));
            }
            guard = self.changed.wait_timeout(guard, left).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    fn finish(&self, failed: Option<String>) {
        let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        match failed {
            None => self.complete.store(true, Ordering::Release),
            Some(f) => *self.failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(f),
        }
        self.changed.notify_all();
    }
}

struct Server {
    uffd: Uffd,
    regions: Vec<Region>,
    source: Box<dyn WindowSource>,
    /// One bit per window copied in.
    present: Vec<u64>,
    progress: Arc<LazyProgress>,
    buf: Vec<u8>,
    /// Whether windows nobody touched are fetched too.
    ahead: bool,
}

impl Server {
    fn run(mut self, failure: FailureAction) {
        crate::host::seccomp::enter_thread(crate::host::seccomp::ThreadKind::Device);
        match self.serve_all() {
            Ok(()) => self.progress.finish(None),
            Err(reason) => {
                self.progress.finish(Some(reason.clone()));
                failure(reason);
                // Closing the userfaultfd would turn the missing windows into zero
                // pages: whoever waits on one goes on waiting.
                std::mem::forget(self);
            }
        }
    }

    /// Faults first, then the next missing window ahead, until every window is in.
    fn serve_all(&mut self) -> Result<(), String> {
        let mut ahead = 0u64;
        // Without fetching ahead: wait for faults, for ever.
        let wait_ms = if self.ahead { 0 } else { -1 };
        loop {
            // Drain the faults waiting now; then do one window ahead.
            while let Some(addr) = self.uffd.next_fault(wait_ms).map_err(|e| format!("reading a memory fault: {e}"))? {
                let window =
                    self.window_of(addr).ok_or_else(|| format!("a fault at {addr:#x} outside guest memory"))?;
                if self.copy_in(window)? {
                    self.progress.on_demand.fetch_add(1, Ordering::Relaxed);
                }
            }
            if !self.ahead {
                continue;
            }
            while ahead < self.progress.windows && self.is_present(ahead) {
                ahead += 1;
            }
            if ahead == self.progress.windows {
                break;
            }
            if self.copy_in(ahead)? {
                self.progress.ahead.fetch_add(1, Ordering::Relaxed);
            }
        }
        for r in &self.regions {
            self.uffd.unregister(r.host, r.len).map_err(|e| format!("unregistering guest memory: {e}"))?;
        }
        self.source.complete();
        Ok(())
    }

    fn is_present(&self, window: u64) -> bool {
        self.present[(window / 64) as usize] & (1 << (window % 64)) != 0
    }

    /// Fetches `window` and copies it in, waking its waiters; false if it was in already.
    fn copy_in(&mut self, window: u64) -> Result<bool, String> {
        let host = self.host_of(window).ok_or_else(|| format!("window {window} outside guest memory"))?;
        if self.is_present(window) {
            // A second fault on a window already in: its thread raced the copy.
            self.uffd.wake(host, WINDOW_BYTES).map_err(|e| format!("waking a fault in window {window}: {e}"))?;
            return Ok(false);
        }
        self.source.fill(window, &mut self.buf).map_err(|e| format!("fetching memory window {window}: {e}"))?;
        self.uffd.copy(host, &self.buf).map_err(|e| format!("copying memory window {window} in: {e}"))?;
        self.present[(window / 64) as usize] |= 1 << (window % 64);
        Ok(true)
    }

    fn window_of(&self, addr: u64) -> Option<u64> {
        let r = self.regions.iter().find(|r| addr >= r.host && addr < r.host + r.len)?;
        Some((r.image_offset + (addr - r.host)) / WINDOW_BYTES)
    }

    fn host_of(&self, window: u64) -> Option<u64> {
        let offset = window * WINDOW_BYTES;
        let r = self.regions.iter().find(|r| offset >= r.image_offset && offset < r.image_offset + r.len)?;
        Some(r.host + (offset - r.image_offset))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::Bytes;

    /// Window `i` holds the byte `i as u8 + 1` everywhere; window `fail` cannot be had.
    struct Pattern {
        fail: Option<u64>,
        asked: Arc<Mutex<Vec<u64>>>,
    }
    impl WindowSource for Pattern {
        fn fill(&mut self, index: u64, out: &mut [u8]) -> Result<(), String> {
            self.asked.lock().unwrap().push(index);
            if Some(index) == self.fail {
                return Err("the bucket is gone".into());
            }
            out.fill(index as u8 + 1);
            Ok(())
        }
    }

    fn root() -> bool {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() == 0 }
    }

    #[test]
    fn memory_arrives_on_touch_and_then_whole() {
        if !root() {
            eprintln!("skipped: kernel-mode userfaultfd needs root here");
            return;
        }
        let lazy = LazyMemory::map(4 << 20).unwrap();
        let asked = Arc::new(Mutex::new(Vec::new()));
        let source = Box::new(Pattern { fail: None, asked: asked.clone() });
        let (mem, progress) = lazy.serve(source, Box::new(|r| panic!("{r}")), true).unwrap();
        let v: u8 = mem.read_obj(GuestAddress(7 * WINDOW_BYTES + 123)).unwrap();
        assert_eq!(v, 8);
        progress.wait(Duration::from_secs(30)).unwrap();
        assert_eq!(progress.windows, 64);
        let fetched = progress.on_demand.load(Ordering::Relaxed) + progress.ahead.load(Ordering::Relaxed);
        assert_eq!(fetched, 64, "each window fetched once");
        for w in [0u64, 7, 63] {
            assert_eq!(mem.read_obj::<u8>(GuestAddress(w * WINDOW_BYTES + 5)).unwrap(), w as u8 + 1);
        }
        // Complete memory is ordinary memory: writes stick.
        mem.write_obj(0xeeu8, GuestAddress(3)).unwrap();
        assert_eq!(mem.read_obj::<u8>(GuestAddress(3)).unwrap(), 0xee);
        let mut asked = asked.lock().unwrap().clone();
        asked.sort();
        asked.dedup();
        assert_eq!(asked.len(), 64);
    }

    #[test]
    fn a_window_that_cannot_be_fetched_fails_instead_of_reading_zeros() {
        if !root() {
            eprintln!("skipped: kernel-mode userfaultfd needs root here");
            return;
        }
        let lazy = LazyMemory::map(2 << 20).unwrap();
        let asked = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let source = Box::new(Pattern { fail: Some(5), asked });
        let (_mem, progress) = lazy
            .serve(
                source,
                Box::new(move |reason| {
                    tx.send(reason).unwrap();
                }),
                true,
            )
            .unwrap();
        // (No touch of window 5 here: its thread would wait for ever, which is what a
        // VMM's failure action ends by ending the process.)
        let reason = rx.recv_timeout(Duration::from_secs(30)).unwrap();
        assert!(reason.contains("window 5") && reason.contains("the bucket is gone"), "{reason}");
        let err = progress.wait(Duration::from_secs(1)).unwrap_err();
        assert!(err.contains("will not arrive"), "{err}");
        assert!(!progress.is_complete());
    }
}
