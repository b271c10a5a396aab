//! A layered disk whose lowest layer is restored lazily from an encrypted vault
//! snapshot (issue 7: lazy restore with prefetch playbooks).
//!
//! Why this exists: a disk-only fork must not wait for the whole snapshot to be
//! decrypted before its VM starts. The VMM opens the snapshot as a
//! [`VaultLayer`] (its blocks are fetched, authenticated and decrypted on first read
//! into a local cache layer), stacks the disk on it, and replays the template's
//! **playbook** — the extents earlier restores read first, in order — on a few
//! background threads, so the guest mostly finds its blocks already local. What this
//! restore reads first is recorded and handed to the VMM's caller when the recording
//! ends, which merges it into the playbook: the playbook improves with use.
//!
//! The lazy layer lives only until the disk is first captured. Everything that seals
//! (a disk snapshot, a branch, a fork of the running VM) first **settles** it: the
//! prefetch stops, the remaining extents are fetched, the cache becomes an ordinary
//! sealed layer directory and replaces the lazy layer in the stack. After that the disk
//! is an ordinary layered disk that snapshots hard-link and forks share, no background
//! thread is left (a VMM fork copies only the forking thread), and the source vault's
//! snapshot is no longer pinned. The cost: the first seal of a lazily restored disk
//! waits for what the prefetch has not fetched yet (about 3 ms per MiB here).
//!
//! The VMM process opens the vault itself (the spawner checks the same open first, so
//! errors reach the caller): a forked VMM closes every inherited descriptor. It does so
//! while still root, before it becomes its sandbox's uid ([`preopen`]): the vault, its
//! manifest and the playbook are root's. After that it reads chunks from the directory
//! descriptor the vault keeps (`forkvm_snapshot::vault`'s chunk sharing rule) and writes
//! only its cache, in its own run directory. It writes nothing of the store: what this
//! restore read first goes back to its caller ([`LazyReport::first_reads`]), which
//! merges it into the playbook, and the pin a settled cache no longer needs is dropped
//! by the vault's retention.

use super::device::{Backend, Block};
use super::BlockError;
use forkvm_snapshot::vault::lazy::{PrefetchReport, Prefetcher, Recording, Touch};
use forkvm_snapshot::vault::{LazyStats, Playbook, SandboxKey, Vault, VaultLayer};
use forkvm_snapshot::LayerStack;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Threads a playbook replay and a settle use to fetch.
pub const FETCH_THREADS: usize = 4;
/// Most first reads one report carries (a playbook keeps at most as many entries).
pub const MAX_FIRST_READS: usize = 1 << 16;

/// Where a lazily restored disk's lowest layer comes from, and what to do with its
/// playbook. Part of a [`crate::devices::attach::LayeredConfig`].
#[derive(Clone)]
pub struct LazySource {
    /// The vault directory holding the snapshot.
    pub vault: PathBuf,
    /// The vault's key (its owner's sandbox key, unwrapped by the caller).
    pub key: SandboxKey,
    /// The snapshot's sequence number.
    pub seq: u64,
    /// The disk's id in the snapshot.
    pub disk_id: String,
    /// The local cache layer directory (created if missing, resumed if present).
    pub cache: PathBuf,
    /// The playbook file: replayed at start when `prefetch` is set and it exists;
    /// this restore's first reads are merged into it when the recording ends.
    pub playbook: Option<PathBuf>,
    /// Replay the playbook right after start.
    pub prefetch: bool,
}

impl fmt::Debug for LazySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LazySource")
            .field("vault", &self.vault)
            .field("seq", &self.seq)
            .field("disk_id", &self.disk_id)
            .field("cache", &self.cache)
            .field("playbook", &self.playbook)
            .field("prefetch", &self.prefetch)
            .finish_non_exhaustive()
    }
}

/// Two sources are the same when they name the same snapshot, cache and playbook (the
/// key is whatever unlocks that vault).
impl PartialEq for LazySource {
    fn eq(&self, other: &Self) -> bool {
        (&self.vault, self.seq, &self.disk_id, &self.cache, &self.playbook, self.prefetch)
            == (&other.vault, other.seq, &other.disk_id, &other.cache, &other.playbook, other.prefetch)
    }
}

impl Eq for LazySource {}

/// Why a lazy disk source could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum LazyOpenError {
    #[error("opening vault {}: {source}", path.display())]
    Vault { path: PathBuf, source: forkvm_snapshot::vault::VaultError },
    #[error("opening disk {disk} of vault snapshot {seq} lazily: {source}")]
    Disk { disk: String, seq: u64, source: forkvm_snapshot::vault::VaultError },
}

impl LazySource {
    /// Opens the snapshot's disk as a lazy layer (pins the snapshot, creates or resumes
    /// the cache). What the spawner calls to check the source before starting a VMM,
    /// and what the VMM calls to build the disk.
    pub fn open(&self) -> Result<VaultLayer, LazyOpenError> {
        let vault = Vault::open(&self.vault, self.key.clone())
            .map_err(|source| LazyOpenError::Vault { path: self.vault.clone(), source })?;
        VaultLayer::open(Arc::new(vault), self.seq, &self.disk_id, &self.cache).map_err(|source| LazyOpenError::Disk {
            disk: self.disk_id.clone(),
            seq: self.seq,
            source,
        })
    }

    /// The playbook to replay, if prefetching and one was saved before (an unreadable
    /// one is reported and ignored: a restore never fails for want of a prefetch).
    pub fn replay(&self) -> Option<Playbook> {
        let path = self.playbook.as_ref().filter(|_| self.prefetch)?;
        match Playbook::load(path) {
            Ok(p) => Some(p),
            Err(e) => {
                if path.exists() {
                    tracing::warn!(path = %path.display(), error = %e, "ignoring an unreadable playbook");
                }
                None
            }
        }
    }
}

/// A lazy source opened ahead of its device: the layer and the playbook to replay.
struct Opened {
    cache: PathBuf,
    layer: Arc<VaultLayer>,
    replay: Option<Playbook>,
}

static PREOPENED: Mutex<Vec<Opened>> = Mutex::new(Vec::new());

/// Opens `source` now (the vault, its manifest, the pin, the cache, the playbook to
/// replay), for the device that [`Block::layered_lazy`] builds later from the same
/// source, once this process may no longer open the store's files (see the module
/// doc). A source that fails here is left to fail there, with its error.
pub fn preopen(source: &LazySource) {
    if let Ok(layer) = source.open() {
        let opened = Opened { cache: source.cache.clone(), layer: Arc::new(layer), replay: source.replay() };
        let mut all = PREOPENED.lock().unwrap_or_else(|p| p.into_inner());
        all.retain(|o| o.cache != source.cache);
        all.push(opened);
    }
}

/// The layer and playbook [`preopen`] opened for `source`'s cache, taken.
fn take_preopened(source: &LazySource) -> Option<(Arc<VaultLayer>, Option<Playbook>)> {
    let mut all = PREOPENED.lock().unwrap_or_else(|p| p.into_inner());
    let at = all.iter().position(|o| o.cache == source.cache)?;
    let o = all.swap_remove(at);
    Some((o.layer, o.replay))
}

/// A block device's lazy layer while it is lazy.
#[derive(Debug)]
pub(super) struct LazyDisk {
    layer: Arc<VaultLayer>,
    prefetcher: Option<Prefetcher>,
    /// Entries of the playbook replayed at start (0: none).
    replayed_entries: usize,
    prefetch_report: Option<PrefetchReport>,
    /// This restore's first reads once the recording ended, until a report hands them
    /// out.
    first_reads: Option<Recording>,
    /// Whether the recording ended.
    recording_ended: bool,
}

/// What merging a restore's first reads into its playbook did (the caller of the VMM
/// does it, see the module doc).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordingSaved {
    /// Extents this restore read first.
    pub touches: usize,
    /// The playbook's path, when it was merged and saved.
    pub saved_to: Option<PathBuf>,
    /// Restores the saved playbook has learned from.
    pub runs: u64,
    /// Why saving failed, if it did (the restore goes on).
    pub error: Option<String>,
}

/// A lazily restored disk's state, for the control socket.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LazyReport {
    /// The snapshot and disk it comes from.
    pub seq: u64,
    pub disk_id: String,
    /// The lazy layer's counters: guest reads that found their extent local (`hits`),
    /// fetched it (`misses`) or waited for a prefetch (`waits`); extents fetched, by
    /// the prefetch too; bytes; fetch time.
    #[serde(flatten)]
    pub stats: LazyStats,
    /// Entries of the playbook replayed at start (0: no playbook).
    pub playbook_entries: usize,
    /// Whether the replay has ended.
    pub prefetch_done: bool,
    /// Set by the VMM's caller once it merged [`LazyReport::first_reads`] into the
    /// playbook.
    pub recording: Option<RecordingSaved>,
    /// The disk's size in bytes (what a playbook is for).
    #[serde(default)]
    pub size: u64,
    /// This restore's first reads as `[extent's first block, µs after the start]`, in
    /// order: in the one report that ended the recording (at most
    /// [`MAX_FIRST_READS`]). A hint, like the guest's reads it comes from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_reads: Option<Vec<(u64, u32)>>,
}

impl LazyReport {
    /// [`LazyReport::first_reads`] as a recording to merge into a playbook.
    pub fn take_recording(&mut self) -> Option<Recording> {
        let reads = self.first_reads.take()?;
        Some(Recording {
            touches: reads
                .into_iter()
                .take(MAX_FIRST_READS)
                .map(|(block, at_micros)| Touch { block, at_micros })
                .collect(),
        })
    }
}

impl LazyDisk {
    /// Opens `source` and starts replaying its playbook.
    /// Opens `source` (or takes what [`preopen`] opened) and starts replaying its
    /// playbook.
    pub(super) fn start(source: &LazySource) -> Result<LazyDisk, BlockError> {
        let (layer, replay) = match take_preopened(source) {
            Some(opened) => opened,
            None => (Arc::new(source.open().map_err(BlockError::LazyOpen)?), source.replay()),
        };
        layer.restart_recording();
        let replayed_entries = replay.as_ref().map_or(0, Playbook::len);
        let prefetcher = replay.filter(|p| !p.is_empty()).map(|p| layer.prefetch(&p, FETCH_THREADS));
        Ok(LazyDisk {
            layer,
            prefetcher,
            replayed_entries,
            prefetch_report: None,
            first_reads: None,
            recording_ended: false,
        })
    }

    pub(super) fn layer(&self) -> Arc<VaultLayer> {
        Arc::clone(&self.layer)
    }

    /// Ends the recording (once), keeping what it recorded for the next report.
    fn finish_recording(&mut self) {
        if !self.recording_ended {
            self.recording_ended = true;
            self.first_reads = Some(self.layer.stop_recording());
        }
    }

    fn report(&mut self) -> LazyReport {
        if self.prefetcher.as_ref().is_some_and(Prefetcher::is_finished) {
            self.prefetch_report = self.prefetcher.take().map(Prefetcher::wait);
        }
        LazyReport {
            seq: self.layer.seq(),
            disk_id: self.layer.disk_id().to_string(),
            stats: self.layer.stats(),
            playbook_entries: self.replayed_entries,
            prefetch_done: self.prefetcher.is_none(),
            recording: None,
            size: self.layer.size(),
            first_reads: self
                .first_reads
                .take()
                .map(|r| r.touches.iter().take(MAX_FIRST_READS).map(|t| (t.block, t.at_micros)).collect()),
        }
    }
}

impl Block {
    /// A writable layered disk whose lowest layer is `source`, restored lazily (see the
    /// module doc); `sealed` (oldest first) stack above it and a fresh top at `top`
    /// (created on the first write). Starts the playbook replay.
    pub fn layered_lazy(
        base: &Path,
        source: &LazySource,
        sealed: &[PathBuf],
        top: &Path,
        id: &str,
    ) -> Result<Block, BlockError> {
        if id.len() > super::BLOCK_ID_BYTES {
            return Err(BlockError::IdTooLong(id.to_string()));
        }
        let lazy = LazyDisk::start(source)?;
        let stack = LayerStack::create_lazy_over(base, lazy.layer(), sealed, top).map_err(BlockError::Layers)?;
        let mut block = Block::with_stack(base, stack, id)?;
        block.lazy = Some(lazy);
        Ok(block)
    }

    /// Whether the disk still has a lazy layer.
    pub fn is_lazy(&self) -> bool {
        self.lazy.is_some()
    }

    /// The lazy layer's counters, ending its recording first when `finish_recording`
    /// (the report then carries its first reads). `None` for a disk that is not (or no
    /// longer) lazy.
    pub fn lazy_report(&mut self, finish_recording: bool) -> Option<LazyReport> {
        let lazy = self.lazy.as_mut()?;
        if finish_recording {
            lazy.finish_recording();
        }
        Some(lazy.report())
    }

    /// Makes a lazy disk ordinary (see the module doc): ends the recording, stops the
    /// replay, fetches every missing extent, seals the cache and puts it in the lazy
    /// layer's place. Returns the cache directory, now the disk's first sealed layer;
    /// `Ok(None)` when the disk was not lazy. On error the disk stays lazy and usable.
    pub fn settle_lazy(&mut self) -> Result<Option<PathBuf>, BlockError> {
        let Some(lazy) = self.lazy.as_mut() else { return Ok(None) };
        lazy.finish_recording();
        if let Some(p) = lazy.prefetcher.take() {
            lazy.prefetch_report = Some(p.stop());
        }
        let layer = lazy.layer();
        let lazy_err = |step: &str, e: String| BlockError::Lazy(format!("settling disk {}: {step}: {e}", self.disk.id));
        layer.materialize_all(FETCH_THREADS).map_err(|e| lazy_err("fetching the rest", e.to_string()))?;
        let sealed = layer.seal_cache().map_err(|e| lazy_err("sealing the cache", e.to_string()))?;
        match &mut self.disk.backend {
            Backend::Layered(stack) => stack.settle_lower(&sealed.dir).map_err(BlockError::Layers)?,
            Backend::Raw(_) => return Err(lazy_err("replacing the layer", "the disk is not layered".into())),
        }
        self.lazy = None;
        Ok(Some(sealed.dir))
    }
}
