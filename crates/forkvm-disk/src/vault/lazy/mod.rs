//! Lazy restore: a vault snapshot's disk map as a lower layer that fills in on demand.
//!
//! Why this exists: an eager restore ([`Vault::restore_layer`]) decrypts every chunk of
//! the snapshot before the guest boots, although a boot reads a small fraction of its
//! disk. A [`VaultLayer`] serves the snapshot straight away: a read of a block that is
//! not local yet fetches the chunk of its extent (authenticated, decompressed and
//! re-hashed like any vault read), writes it into a local **cache layer** and returns
//! it; later reads are local. [`VaultLayer::prefetch`] replays a [`Playbook`] (the
//! extents earlier restores needed first, in order) on a few background threads so
//! the guest mostly finds its blocks already local.
//!
//! # Stacking
//!
//! A `VaultLayer` implements [`LazyLower`]: `LayerStack::create_lazy_over(base,
//! Arc::new(layer), &[], new_top)` gives the usual stack (reads fall through top →
//! sealed → vault layer → base; writes go to the top; seal works). Its layer id
//! ([`VaultLayer::id`]) is the snapshot's `layer_id` (the id of the newest layer the
//! snapshot covered), parsed: the disk as of that layer, which is what the vault layer
//! holds. Per the layered-disk rule that a merge of layers `a..=b` keeps `b`'s id and
//! `a`'s parent, the vault layer is the merge of all the source's layers: id `b`,
//! parent the base. (A map whose `layer_id` is `base` gets an id derived from the
//! snapshot: BLAKE3 of `seq` and the disk id.) The first layer sealed above it names
//! that id as its parent.
//!
//! # The cache directory
//!
//! Exactly a layer directory (`data` + `bitmap`, format in [`crate::layered_disk`]),
//! id as above, parent the base, **unsealed** while it fills in (so nothing can
//! mistake it for a complete sealed layer) and sealed by [`VaultLayer::seal_cache`]
//! once every extent is local, after which it is an ordinary sealed layer directory
//! that `LayerStack::open(base, &[cache_dir, …], top)` opens and branches hard-link.
//!
//! Crash rule: **a bit is never durable before its data.** Fetched extents are written
//! to `data` and marked filled in memory only; [`VaultLayer::persist`] (called by
//! `LayerStack::flush`, at the end of a prefetch and every
//! [`PERSIST_EVERY_EXTENTS`] prefetched extents) takes the in-memory set, `fdatasync`s
//! `data`, then replaces `bitmap` atomically. After a kill, reopening trusts only
//! whole extents in the last persisted bitmap; anything else in `data` is ignored and
//! refetched (a refetch rewrites the whole extent, zeros included). A bitmap that sets
//! a block outside the snapshot's map, or a different id or size, is refused.
//!
//! # Concurrency
//!
//! Every method takes `&self`. Each extent is `Empty`, `Fetching` or `Filled` under one
//! mutex held only to change that state, never during I/O. A foreground read of an
//! extent another thread is fetching waits for that fetch (one condvar) instead of
//! fetching twice; a prefetch thread skips it. A failed fetch (missing or corrupt
//! chunk, I/O error) sets the extent back to `Empty`, marks nothing, and the read
//! fails with the vault's error.
//!
//! # Retention
//!
//! Fetching takes no vault lock (it would stall the source sandbox's snapshots).
//! Instead [`VaultLayer::open`] pins the snapshot ([`Vault::pin`]) with a holder name
//! derived from the cache directory's absolute path ([`VaultLayer::pin_holder`]), and
//! retention keeps pinned snapshots. [`VaultLayer::seal_cache`] and
//! [`VaultLayer::discard`] remove the pin (or, for a process that may not, retention
//! drops it once the cache is sealed: see [`super::pins`]).

mod bench;
mod cache;
mod playbook;
mod prefetch;

pub use bench::{bench_first_reads, BenchReport, BenchRun};
pub use playbook::{
    MergeRule, Playbook, PlaybookEntry, PlaybookError, Recording, Touch, MAX_PLAYBOOK_ENTRIES, PLAYBOOK_MAGIC,
    PLAYBOOK_VERSION,
};
pub use prefetch::{PrefetchReport, Prefetcher};

use super::{Vault, VaultError};
use crate::chunk_id::ChunkId;
use crate::layered_disk::{Bitmap, LayerError, LayerId, LazyLower, BLOCK_SIZE};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// A prefetch persists the cache's bitmap after this many newly filled extents
/// (at most 64 MiB of fetched data is refetched after a crash).
pub const PERSIST_EVERY_EXTENTS: u64 = 1024;

/// One extent of the snapshot's map.
#[derive(Debug, Clone, Copy)]
struct Extent {
    first: u64,
    count: u64,
    name: ChunkId,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fill {
    Empty,
    Fetching,
    Filled,
}

/// Who asks for an extent: decides waiting, skipping and recording.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Caller {
    /// A read: waits for an in-flight fetch, is recorded.
    Foreground,
    /// A prefetch thread: skips an in-flight fetch, not recorded.
    Prefetch,
    /// `materialize_all`: waits, not recorded.
    Materialize,
}

/// What [`VaultLayer::ensure`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Got {
    /// Already local.
    Hit,
    /// Fetched by this call.
    Fetched,
    /// Another thread's fetch was awaited.
    Waited,
    /// In flight elsewhere and the caller does not wait.
    Skipped,
}

#[derive(Debug)]
struct State {
    fill: Vec<Fill>,
    filled_extents: u64,
    /// Blocks of filled extents: what [`VaultLayer::persist`] writes.
    filled: Bitmap,
    /// Extents filled since the last persist.
    unpersisted: u64,
    /// [`VaultLayer::seal_cache`] ran: the bitmap on disk is final.
    sealed: bool,
    recording: Option<Recorder>,
}

/// First foreground touches since the recording started.
#[derive(Debug)]
struct Recorder {
    start: Instant,
    seen: Bitmap,
    touches: Vec<Touch>,
}

#[derive(Debug, Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    waits: AtomicU64,
    fetched_extents: AtomicU64,
    fetched_bytes: AtomicU64,
    prefetched_extents: AtomicU64,
    fetch_errors: AtomicU64,
    fetch_nanos: AtomicU64,
    persists: AtomicU64,
}

/// Counters of a [`VaultLayer`] since it was opened (in JSON, `fetch_time` is
/// `fetch_ms`, milliseconds).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LazyStats {
    /// Extents in the snapshot's map.
    pub extents: u64,
    /// Extents local in the cache.
    pub filled_extents: u64,
    /// Blocks in the map.
    pub blocks: u64,
    /// Blocks local in the cache.
    pub filled_blocks: u64,
    /// Foreground extent accesses that found the extent local.
    pub hits: u64,
    /// Foreground extent accesses that fetched it themselves.
    pub misses: u64,
    /// Foreground extent accesses that waited for another thread's fetch.
    pub waits: u64,
    /// Extents fetched (foreground, prefetch and materialize).
    pub fetched_extents: u64,
    /// Plaintext bytes of the extents fetched.
    pub fetched_bytes: u64,
    /// Of `fetched_extents`, those fetched by a prefetch.
    pub prefetched_extents: u64,
    /// Fetches that failed (nothing was marked).
    pub fetch_errors: u64,
    /// Time spent fetching (reading, decrypting, writing the cache), summed over threads.
    #[serde(rename = "fetch_ms", with = "millis")]
    pub fetch_time: Duration,
    /// Bitmap persists.
    pub persists: u64,
}

/// A duration as fractional milliseconds.
mod millis {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64() * 1e3)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let ms = f64::deserialize(d)?;
        Duration::try_from_secs_f64(ms / 1e3).map_err(serde::de::Error::custom)
    }
}

/// What [`VaultLayer::seal_cache`] produced: an ordinary sealed layer directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SealedCache {
    /// The cache directory, now a sealed layer.
    pub dir: PathBuf,
    /// Its id ([`VaultLayer::id`]); its parent is the base.
    pub id: LayerId,
    /// Blocks present in it.
    pub blocks: u64,
}

/// A vault snapshot's disk, served lazily through a local cache layer.
#[derive(Debug)]
pub struct VaultLayer {
    vault: Arc<Vault>,
    seq: u64,
    disk_id: String,
    base_key: String,
    size: u64,
    id: LayerId,
    holder: String,
    extents: Vec<Extent>,
    /// Blocks of the map.
    present: Bitmap,
    dir: PathBuf,
    data: File,
    state: Mutex<State>,
    changed: Condvar,
    /// Serialises persists (and the seal), so bitmaps are written in order.
    persist_lock: Mutex<()>,
    counters: Counters,
}

impl VaultLayer {
    /// Opens disk `disk_id` of snapshot `seq` of `vault` lazily, with its cache at
    /// `cache_dir`: created if missing, else resumed (whole extents its persisted
    /// bitmap marks are trusted) after checking it is this snapshot's. Reads the
    /// manifest once, pins the snapshot, and starts recording first touches.
    pub fn open(vault: Arc<Vault>, seq: u64, disk_id: &str, cache_dir: &Path) -> Result<VaultLayer, VaultError> {
        let holder = Self::pin_holder(cache_dir)?;
        // The cache (the pin's anchor) exists before the pin does, so a pin whose cache
        // is gone is stale at once (`super::pins`); both under the shared lock, so
        // retention cannot remove the snapshot in between.
        let lock = vault.lock(libc::LOCK_SH)?;
        let map = vault.disk_map(seq, disk_id)?;
        let mut extents = Vec::with_capacity(map.extents.len());
        let mut present = Bitmap::new(crate::layered_disk::blocks_for(map.size));
        for (first, count, hex) in &map.extents {
            // Checked when the manifest was decoded.
            let name =
                ChunkId::from_hex(hex).map_err(|e| VaultError::Invalid { what: "map", reason: e.to_string() })?;
            present.set_range(*first, first + count);
            extents.push(Extent { first: *first, count: *count, name });
        }
        let id = layer_id_of(&map.layer_id, seq, disk_id);
        let files = cache::open_or_create(cache_dir, map.size, id, &present)?;
        vault.pin_locked(seq, &holder, Some(cache_dir))?;
        drop(lock);
        let mut fill = vec![Fill::Empty; extents.len()];
        let mut filled = Bitmap::new(present.len());
        let mut filled_extents = 0;
        for (i, e) in extents.iter().enumerate() {
            if (e.first..e.first + e.count).all(|b| files.bits.get(b)) {
                fill[i] = Fill::Filled;
                filled.set_range(e.first, e.first + e.count);
                filled_extents += 1;
            }
        }
        let recording =
            Some(Recorder { start: Instant::now(), seen: Bitmap::new(extents.len() as u64), touches: vec![] });
        let state = State { fill, filled_extents, filled, unpersisted: 0, sealed: files.sealed, recording };
        Ok(VaultLayer {
            vault,
            seq,
            disk_id: disk_id.to_string(),
            base_key: map.base_key,
            size: map.size,
            id,
            holder,
            extents,
            present,
            dir: cache_dir.to_path_buf(),
            data: files.data,
            state: Mutex::new(state),
            changed: Condvar::new(),
            persist_lock: Mutex::new(()),
            counters: Counters::default(),
        })
    }

    /// The pin holder name [`VaultLayer::open`] uses for `cache_dir`: `lazy-` and 32
    /// hex digits of the BLAKE3 hash of its absolute path (so a reopen finds the same
    /// pin).
    pub fn pin_holder(cache_dir: &Path) -> Result<String, VaultError> {
        use std::os::unix::ffi::OsStrExt;
        let abs = std::path::absolute(cache_dir).map_err(super::io_err("resolving the cache path", cache_dir))?;
        let hash = blake3::hash(abs.as_os_str().as_bytes());
        Ok(format!("{}{}", super::pins::LAZY_HOLDER_PREFIX, &hash.to_hex()[..32]))
    }

    /// Removes a cache directory (complete or not) and its pin of `seq`: the end of a
    /// lazily restored disk that is deleted rather than sealed.
    pub fn discard(vault: &Vault, seq: u64, cache_dir: &Path) -> Result<(), VaultError> {
        let holder = Self::pin_holder(cache_dir)?;
        cache::remove(cache_dir)?;
        vault.unpin(seq, &holder)
    }

    /// The snapshot's sequence number.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The disk's id in the snapshot.
    pub fn disk_id(&self) -> &str {
        &self.disk_id
    }

    /// The base image name the snapshot was taken over (check it before stacking).
    pub fn base_key(&self) -> &str {
        &self.base_key
    }

    /// Disk size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The layer's id (see the module doc).
    pub fn id(&self) -> LayerId {
        self.id
    }

    /// The cache directory.
    pub fn cache_dir(&self) -> &Path {
        &self.dir
    }

    /// The name this layer's pin has in the vault.
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// Whether block `index` is in the snapshot's map (local or not).
    pub fn is_present(&self, index: u64) -> bool {
        self.present.get(index)
    }

    /// Whether block `index` is in the map and already local.
    pub fn is_filled(&self, index: u64) -> bool {
        self.extent_of(index).is_some_and(|i| self.lock_state().fill[i] == Fill::Filled)
    }

    /// Fraction of the map's blocks that are local (1.0 for an empty map).
    pub fn filled_fraction(&self) -> f64 {
        let total = self.present.count_ones();
        if total == 0 {
            return 1.0;
        }
        self.lock_state().filled.count_ones() as f64 / total as f64
    }

    /// Whether every extent is local.
    pub fn is_complete(&self) -> bool {
        self.lock_state().filled_extents == self.extents.len() as u64
    }

    /// The counters.
    pub fn stats(&self) -> LazyStats {
        let st = self.lock_state();
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        LazyStats {
            extents: self.extents.len() as u64,
            filled_extents: st.filled_extents,
            blocks: self.present.count_ones(),
            filled_blocks: st.filled.count_ones(),
            hits: get(&c.hits),
            misses: get(&c.misses),
            waits: get(&c.waits),
            fetched_extents: get(&c.fetched_extents),
            fetched_bytes: get(&c.fetched_bytes),
            prefetched_extents: get(&c.prefetched_extents),
            fetch_errors: get(&c.fetch_errors),
            fetch_time: Duration::from_nanos(get(&c.fetch_nanos)),
            persists: get(&c.persists),
        }
    }

    /// Reads `buf.len()` bytes at disk offset `offset`, fetching every extent of the
    /// map it overlaps that is not local yet. Blocks outside the map read as zeros (a
    /// stack never asks for them: they fall through to the base).
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), VaultError> {
        let end =
            offset.checked_add(buf.len() as u64).filter(|&e| e <= self.size).ok_or_else(|| VaultError::Invalid {
                what: "read range",
                reason: format!("{} bytes at {offset} reach past the {}-byte disk", buf.len(), self.size),
            })?;
        if buf.is_empty() {
            return Ok(());
        }
        let (first, last) = (offset / BLOCK_SIZE, (end - 1) / BLOCK_SIZE);
        let mut i = self.extents.partition_point(|e| e.first + e.count <= first);
        while i < self.extents.len() && self.extents[i].first <= last {
            self.ensure(i, Caller::Foreground)?;
            i += 1;
        }
        let path = self.dir.join(crate::layered_disk::DATA_FILE);
        self.data.read_exact_at(buf, offset).map_err(super::io_err("reading the lazy cache", &path))
    }

    /// Makes the extent holding block `index` local (as a read would). Returns false
    /// when the block is not in the map (nothing to fetch).
    pub fn fetch_extent_containing(&self, index: u64) -> Result<bool, VaultError> {
        let Some(i) = self.extent_of(index) else { return Ok(false) };
        self.ensure(i, Caller::Foreground)?;
        Ok(true)
    }

    /// The first touches recorded so far (see [`Recording`]), without stopping.
    pub fn recording(&self) -> Recording {
        let st = self.lock_state();
        Recording { touches: st.recording.as_ref().map_or_else(Vec::new, |r| r.touches.clone()) }
    }

    /// Starts recording afresh, timestamps relative to now (call when the guest starts).
    pub fn restart_recording(&self) {
        self.lock_state().recording =
            Some(Recorder { start: Instant::now(), seen: Bitmap::new(self.extents.len() as u64), touches: vec![] });
    }

    /// Stops recording and returns what was recorded.
    pub fn stop_recording(&self) -> Recording {
        Recording { touches: self.lock_state().recording.take().map_or_else(Vec::new, |r| r.touches) }
    }

    /// Makes the fills so far durable: `fdatasync` the cache data, then replace its
    /// bitmap atomically. Does nothing when nothing was filled since the last persist,
    /// or once the cache is sealed.
    pub fn persist(&self) -> Result<(), VaultError> {
        let _p = self.persist_lock.lock().unwrap_or_else(PoisonError::into_inner);
        let bits = {
            let mut st = self.lock_state();
            if st.sealed || st.unpersisted == 0 {
                return Ok(());
            }
            st.unpersisted = 0;
            st.filled.clone()
        };
        // Every extent in `bits` had its data written before it was marked filled.
        let done = cache::persist(&self.dir, &self.data, self.size, self.id, &bits, false);
        if done.is_err() {
            // Make the next persist try again.
            self.lock_state().unpersisted += 1;
        }
        self.counters.persists.fetch_add(1, Ordering::Relaxed);
        done
    }

    /// Turns the complete cache into an ordinary sealed layer directory (sync, sealed
    /// bitmap) and removes the snapshot's pin: from now on the disk no longer needs the
    /// vault. Fails with `invalid` while extents are missing ([`VaultLayer::materialize_all`]
    /// first). The layer keeps serving reads (all local). Idempotent.
    pub fn seal_cache(&self) -> Result<SealedCache, VaultError> {
        let _p = self.persist_lock.lock().unwrap_or_else(PoisonError::into_inner);
        let (bits, already) = {
            let st = self.lock_state();
            if st.filled_extents != self.extents.len() as u64 {
                return Err(VaultError::Invalid {
                    what: "lazy cache",
                    reason: format!(
                        "{}: {} of {} extents are local; fill it before sealing",
                        self.dir.display(),
                        st.filled_extents,
                        self.extents.len()
                    ),
                });
            }
            (st.filled.clone(), st.sealed)
        };
        if !already {
            cache::persist(&self.dir, &self.data, self.size, self.id, &bits, true)?;
            let mut st = self.lock_state();
            st.sealed = true;
            st.unpersisted = 0;
        }
        match self.vault.unpin(self.seq, &self.holder) {
            // A VMM under its sandbox's uid may not touch the vault's pins: retention drops
            // a pin whose anchor is a sealed cache (`super::pins`), so the seal stands.
            Err(VaultError::Io { source, .. }) if is_denied(&source) => {}
            other => other?,
        }
        Ok(SealedCache { dir: self.dir.clone(), id: self.id, blocks: bits.count_ones() })
    }

    /// Removes the snapshot's pin without sealing: for a disk that is going away with
    /// its cache (its VM stops before the cache was completed). Reads keep working
    /// until retention removes the snapshot. Idempotent.
    pub fn release(&self) -> Result<(), VaultError> {
        self.vault.unpin(self.seq, &self.holder)
    }

    fn lock_state(&self) -> MutexGuard<'_, State> {
        // The state is only changed by short, non-panicking updates: a poisoned lock
        // still holds a consistent state.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The index of the extent holding block `index`.
    fn extent_of(&self, index: u64) -> Option<usize> {
        let i = self.extents.partition_point(|e| e.first + e.count <= index);
        self.extents.get(i).filter(|e| e.first <= index).map(|_| i)
    }

    /// Extent indices holding `blocks`, in that order, deduplicated.
    pub(crate) fn extents_for(&self, blocks: impl Iterator<Item = u64>) -> Vec<usize> {
        let mut seen = Bitmap::new(self.extents.len() as u64);
        blocks.filter_map(|b| self.extent_of(b)).filter(|&i| seen.set_range(i as u64, i as u64 + 1) == 1).collect()
    }

    pub(crate) fn extent_count(&self) -> usize {
        self.extents.len()
    }

    pub(crate) fn unpersisted(&self) -> u64 {
        self.lock_state().unpersisted
    }

    /// Makes extent `i` local, fetching it unless it is local or (for a waiting caller)
    /// being fetched by another thread.
    pub(crate) fn ensure(&self, i: usize, who: Caller) -> Result<Got, VaultError> {
        let mut st = self.lock_state();
        if who == Caller::Foreground {
            if let Some(r) = st.recording.as_mut() {
                if r.seen.set_range(i as u64, i as u64 + 1) == 1 && r.touches.len() < MAX_PLAYBOOK_ENTRIES {
                    let at_micros = u32::try_from(r.start.elapsed().as_micros()).unwrap_or(u32::MAX);
                    r.touches.push(Touch { block: self.extents[i].first, at_micros });
                }
            }
        }
        let mut waited = false;
        loop {
            match st.fill[i] {
                Fill::Filled => {
                    drop(st);
                    let got = if waited { Got::Waited } else { Got::Hit };
                    if who == Caller::Foreground {
                        let c = if waited { &self.counters.waits } else { &self.counters.hits };
                        c.fetch_add(1, Ordering::Relaxed);
                    }
                    return Ok(got);
                }
                Fill::Fetching if who == Caller::Prefetch => return Ok(Got::Skipped),
                Fill::Fetching => {
                    waited = true;
                    st = self.changed.wait(st).unwrap_or_else(PoisonError::into_inner);
                }
                Fill::Empty => break,
            }
        }
        st.fill[i] = Fill::Fetching;
        drop(st);
        let mut guard = FetchGuard { layer: self, index: i, done: false };
        let started = Instant::now();
        let fetched = self.fetch(i);
        self.counters.fetch_nanos.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        guard.done = true;
        let mut st = self.lock_state();
        let out = match fetched {
            Ok(bytes) => {
                let e = self.extents[i];
                st.fill[i] = Fill::Filled;
                st.filled_extents += 1;
                st.filled.set_range(e.first, e.first + e.count);
                st.unpersisted += 1;
                let c = &self.counters;
                c.fetched_extents.fetch_add(1, Ordering::Relaxed);
                c.fetched_bytes.fetch_add(bytes, Ordering::Relaxed);
                match who {
                    Caller::Prefetch => c.prefetched_extents.fetch_add(1, Ordering::Relaxed),
                    Caller::Foreground => c.misses.fetch_add(1, Ordering::Relaxed),
                    Caller::Materialize => 0,
                };
                Ok(Got::Fetched)
            }
            Err(e) => {
                st.fill[i] = Fill::Empty;
                self.counters.fetch_errors.fetch_add(1, Ordering::Relaxed);
                Err(e)
            }
        };
        drop(st);
        self.changed.notify_all();
        out
    }

    /// Reads, decrypts and verifies extent `i`'s chunk and writes it into the cache
    /// (all-zero blocks as holes). Returns its plaintext length.
    fn fetch(&self, i: usize) -> Result<u64, VaultError> {
        let e = self.extents[i];
        let start = e.first * BLOCK_SIZE;
        let len = ((e.first + e.count) * BLOCK_SIZE).min(self.size) - start;
        let plain = self.vault.chunks.get(&e.name, len as usize)?;
        let path = self.dir.join(crate::layered_disk::DATA_FILE);
        let bs = BLOCK_SIZE as usize;
        let zero: Vec<bool> = plain.chunks(bs).map(|c| c.iter().all(|&b| b == 0)).collect();
        let mut k = 0;
        while k < zero.len() {
            let mut j = k;
            while j < zero.len() && zero[j] == zero[k] {
                j += 1;
            }
            let (lo, hi) = (k * bs, (j * bs).min(plain.len()));
            let off = start + lo as u64;
            if zero[k] {
                punch_hole(&self.data, off, (hi - lo) as u64)
            } else {
                self.data.write_all_at(&plain[lo..hi], off)
            }
            .map_err(super::io_err("writing the lazy cache", &path))?;
            k = j;
        }
        Ok(len)
    }
}

/// Sets an extent back to `Empty` (and wakes waiters) if its fetch panicked, so
/// waiters never hang on an extent nobody fetches.
struct FetchGuard<'a> {
    layer: &'a VaultLayer,
    index: usize,
    done: bool,
}

impl Drop for FetchGuard<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.layer.lock_state().fill[self.index] = Fill::Empty;
            self.layer.changed.notify_all();
        }
    }
}

/// Makes `len` bytes at `offset` of `file` read as zeros: a hole where the file system
/// supports punching one, written zeros where it does not.
fn punch_hole(file: &File, offset: u64, len: u64) -> std::io::Result<()> {
    let (Ok(off), Ok(l)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "hole out of range"));
    };
    // SAFETY: fallocate only acts on the descriptor, which `file` keeps open for the
    // call; no memory is passed.
    let rc =
        unsafe { libc::fallocate(file.as_raw_fd(), libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, off, l) };
    if rc == 0 {
        return Ok(());
    }
    file.write_all_at(&vec![0u8; len as usize], offset)
}

/// The vault layer's id: the snapshot's `layer_id`, or one derived from the snapshot
/// when it is `base` (or not 32 hex digits, which a validated manifest never has).
fn layer_id_of(layer_id: &str, seq: u64, disk_id: &str) -> LayerId {
    let mut id = [0u8; 16];
    let parsed = layer_id.len() == 32
        && (0..16).all(|k| match u8::from_str_radix(&layer_id[2 * k..2 * k + 2], 16) {
            Ok(v) => {
                id[k] = v;
                true
            }
            Err(_) => false,
        });
    if !parsed || id == [0; 16] {
        let mut h = blake3::Hasher::new_derive_key("forkvm vault lazy layer id v1");
        h.update(&seq.to_le_bytes());
        h.update(disk_id.as_bytes());
        id.copy_from_slice(&h.finalize().as_bytes()[..16]);
        if id == [0; 16] {
            id[0] = 1;
        }
    }
    LayerId(id)
}

impl LazyLower for VaultLayer {
    fn id(&self) -> LayerId {
        self.id
    }

    fn disk_size(&self) -> u64 {
        self.size
    }

    fn is_present(&self, index: u64) -> bool {
        self.present.get(index)
    }

    fn present_count(&self) -> u64 {
        self.present.count_ones()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), LayerError> {
        VaultLayer::read_at(self, buf, offset).map_err(|e| LayerError::LowerRead {
            layer: self.id,
            offset,
            len: buf.len() as u64,
            source: Box::new(e),
        })
    }

    fn flush(&self) -> Result<(), LayerError> {
        self.persist().map_err(|e| LayerError::LowerFlush { layer: self.id, source: Box::new(e) })
    }
}

/// Whether `e` says this process may not change the file (permissions, a read-only view).
fn is_denied(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::PermissionDenied || e.raw_os_error() == Some(libc::EROFS)
}

#[cfg(test)]
mod tests;
