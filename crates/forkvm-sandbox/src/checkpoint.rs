//! Checkpoints: snapshots of a running sandbox, memory and disks together, cheap enough
//! to take every few seconds or after every call, so the sandbox can be rewound to one
//! in place (`start::rewind`) or forked from one.
//!
//! A checkpoint is a diff snapshot over the sandbox's **base** (the tag it was first
//! spawned from), taken through a live branch: the guest pauses only while its VMM
//! forks and its disks are sealed, and the branch's memory is compared with the base
//! while the sandbox runs on. Every checkpoint is one link above the base, so a rewind
//! or a fork never walks a chain, and any checkpoint can be dropped without touching the
//! others. Consecutive checkpoints still store only what changed between them: memory
//! goes into the content-addressed chunk store in 64 KiB windows, so every window the
//! sandbox did not touch since the previous checkpoint is a chunk the store already has
//! (`chunks_reused`), and the disk's sealed layers hold only the blocks written since.

use crate::chain_ops::{diff_branch, ChainOpError};
use crate::registry::Registry;
use crate::source::assembled_cache;
use forkvm_snapshot::{chain, SnapshotDir, Store};
use serde::Serialize;
use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::time::Instant;

/// What taking a checkpoint did.
#[derive(Debug, Clone, Serialize)]
pub struct Taken {
    pub tag: String,
    /// The guest's pause (the live-branch window).
    pub pause_ms: f64,
    /// Memory pages that differ from the base.
    pub pages: u64,
    /// Bytes of memory chunks the store did not have yet: this checkpoint's own cost in
    /// memory.
    pub bytes_stored: u64,
    /// Bytes of the disks' sealed layers neither the base nor `previous` holds: its own
    /// cost in disk.
    pub disk_bytes_stored: u64,
    pub chunks_new: u64,
    /// Chunks shared with the base's other checkpoints (unchanged since).
    pub chunks_reused: u64,
    /// The whole call, the branch's write and the comparison included.
    pub total_ms: f64,
}

/// Takes a checkpoint of running sandbox `id` as snapshot `tag` (free), a diff over
/// `base` (the tag the sandbox was first spawned from: see the module doc).
///
/// The new checkpoint's flat memory image stays in the assembled-image cache (a rewind
/// to the newest checkpoint maps it at once); `previous`'s is dropped from it, so a
/// sandbox's checkpoints hold one flat image there, not one each (a rewind to an older
/// one assembles it from the chunks first).
///
/// `paused` is called as soon as the sandbox runs again: its state is the checkpoint's
/// from then on, so a caller may answer its client there while the memory is written
/// and compared.
pub fn take(
    registry: &Registry,
    store: &Store,
    id: &str,
    base: &str,
    tag: &str,
    previous: Option<&str>,
    paused: &mut dyn FnMut(),
) -> Result<Taken, ChainOpError> {
    let started = Instant::now();
    let cache = assembled_cache();
    // A diff's parent must be chunked; done once per base.
    chain::ingest(store, &cache, base)?;
    let seal = memory_seal(id)?;
    let (diff, pause_ms, _, _) = diff_branch(registry, store, id, base, tag, Some(paused), Some(&seal))?;
    let open = |tag: &str| SnapshotDir::open(&store.snapshots_dir().join(tag)).ok();
    let previous = previous.and_then(open);
    if let Some(hash) = previous.as_ref().and_then(|p| p.meta.content_hash.clone()) {
        cache.evict(&hash);
    }
    let disk_bytes_stored = match open(tag) {
        Some(taken) => new_layer_bytes(&taken, [open(base), previous].iter().flatten()),
        None => 0,
    };
    Ok(Taken {
        tag: tag.to_string(),
        pause_ms,
        pages: diff.pages,
        bytes_stored: diff.bytes_stored,
        disk_bytes_stored,
        chunks_new: diff.chunks_new,
        chunks_reused: diff.chunks_reused,
        total_ms: started.elapsed().as_secs_f64() * 1e3,
    })
}

/// The seal of sandbox `id`'s checkpoint memory: its vault key's (made if it has none
/// yet), as its disk snapshots and archives use.
fn memory_seal(id: &str) -> Result<chain::MemorySeal, ChainOpError> {
    let key = forkvm_snapshot::vault::KeyStore::open(&crate::disk_snapshots::keys_dir())
        .and_then(|keys| keys.sandbox_key(id))
        .map_err(|e| ChainOpError::Work { step: format!("unlocking sandbox {id}'s key"), detail: e.to_string() })?;
    Ok(chain::MemorySeal { owner: id.to_string(), seal: forkvm_snapshot::ChunkSeal::of_key(&key) })
}

/// The sealed layers of `dir`'s disks: (directory, layer id).
fn layers(dir: &SnapshotDir) -> Vec<(std::path::PathBuf, String)> {
    let disk_dir = dir.path.join(forkvm_snapshot::DISK_DIR);
    let disks = dir.meta.devices.iter().flat_map(|d| d.disks.iter()).filter(|d| d.has_plain_name());
    disks.flat_map(|d| d.layers.iter().flatten().map(|l| (d.layer_dir(&disk_dir, l), l.clone()))).collect()
}

/// Bytes on the host (allocated, so a sparse layer counts what it holds) of the sealed
/// layers of `taken` that none of `others` holds: layer ids are random and never reused.
fn new_layer_bytes<'a>(taken: &SnapshotDir, others: impl Iterator<Item = &'a SnapshotDir>) -> u64 {
    let known: HashSet<String> = others.flat_map(|o| layers(o).into_iter().map(|(_, id)| id)).collect();
    let allocated = |p: std::path::PathBuf| std::fs::symlink_metadata(p).map_or(0, |m| m.blocks() * 512);
    layers(taken)
        .into_iter()
        .filter(|(_, id)| !known.contains(id))
        .map(|(dir, _)| {
            allocated(dir.join(forkvm_snapshot::layered_disk::DATA_FILE))
                + allocated(dir.join(forkvm_snapshot::layered_disk::BITMAP_FILE))
        })
        .sum()
}
