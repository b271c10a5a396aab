//! What depends on what: `snapshot-info`, `rmi` and garbage collection of chunks.
//!
//! Lineage is read from the snapshots themselves (each child names its parent), so it
//! is always what is on disk. Removing a snapshot that others are built on is refused
//! unless the caller says what to do with them: `Cascade` deletes the subtree, `Force`
//! orphans it (the orphans then report themselves unbootable, naming the missing
//! parent). Chunks no snapshot references any more are collected afterwards.

use std::collections::{BTreeSet, HashSet};
use std::path::PathBuf;

use serde::Serialize;

use super::assemble::AssembledCache;
use super::{resolve, ChainError};
use crate::chunk_store::{ChunkError, ChunkId, ChunkStore, GcReport};
use crate::dir::{MEMORY_IMG, MEMORY_MAP, VMSTATE_BIN};
use crate::metadata::{MemoryFormat, SnapshotStatus};
use crate::page_map::PageMap;
use crate::store::{Store, StoreEntry, StoreError};

/// `snapshot-info`: where a snapshot sits in its chain and what it costs.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ChainInfo {
    pub tag: String,
    pub dir: PathBuf,
    pub status: SnapshotStatus,
    pub created_at_unix_ms: u64,
    pub memory_format: MemoryFormat,
    pub content_hash: Option<String>,
    pub parent_tag: Option<String>,
    pub parent_content_hash: Option<String>,
    /// Links above the base (0 for a snapshot without a parent).
    pub chain_depth: usize,
    /// From the base to the parent, as far as they exist.
    pub ancestors: Vec<String>,
    /// Snapshots made directly on top of this one (`rmi` would orphan them).
    pub dependents: Vec<String>,
    /// Every snapshot built on this one, at any depth (`rmi --cascade` removes them).
    pub descendants: Vec<String>,
    /// Whether sandboxes can be spawned from it now; if not, why.
    pub bootable: bool,
    pub problem: Option<String>,
    /// Guest memory size.
    pub memory_bytes: u64,
    /// Bytes of guest memory this link itself stores (a diff: the pages that differ).
    pub logical_bytes: u64,
    /// Bytes on disk for this link: vmstate, memory image or map, and the compressed
    /// chunks its map references (chunks shared with other snapshots counted here too).
    pub physical_bytes: u64,
    /// Sum of `physical_bytes` over the chain, base to this link.
    pub chain_physical_bytes: u64,
    /// Chunks this link's map references.
    pub chunks: u64,
    /// Bytes allocated on disk to this link's disks: base images and a layered disk's
    /// sealed layers (holes not counted; files shared by hard link with other snapshots
    /// counted here too). Not part of `physical_bytes`.
    pub disk_bytes: u64,
}

/// Links below `tag` in its chain, given each listed snapshot's parent (a tag whose
/// parent is not listed ends the count there; a cycle, which the store never makes, stops
/// it at the number of links given).
pub fn depth_in(parents: &std::collections::HashMap<&str, &str>, tag: &str) -> usize {
    let mut depth = 0;
    let mut at = tag;
    while let Some(p) = parents.get(at) {
        depth += 1;
        if depth > parents.len() {
            break;
        }
        at = p;
    }
    depth
}

/// Reports on `tag`, also when its chain is broken (then `bootable` is false).
pub fn info(store: &Store, tag: &str) -> Result<ChainInfo, ChainError> {
    let dir = store.tag_dir(tag)?;
    let entries = store.list();
    let Some(entry) = entries.iter().find(|e| e.tag == tag) else {
        return Err(StoreError::NotFound { tag: tag.into(), store: store.snapshots_dir() }.into());
    };
    let meta = &entry.meta;
    let (bootable, problem) = match resolve(store, tag) {
        Ok(_) => (true, None),
        Err(e) => (false, Some(e.to_string())),
    };
    let mut ancestors = Vec::new();
    let mut chain_physical = 0;
    let mut parent = meta.parent_tag.clone();
    let mut seen = HashSet::from([tag.to_string()]);
    while let Some(p) = parent {
        let Some(e) = entries.iter().find(|e| e.tag == p) else { break };
        if !seen.insert(p.clone()) || ancestors.len() > super::MAX_CHAIN_DEPTH {
            break;
        }
        chain_physical += sizes(store, e).1;
        ancestors.push(p);
        parent = e.meta.parent_tag.clone();
    }
    ancestors.reverse();
    let (logical, physical, chunks) = sizes(store, entry);
    Ok(ChainInfo {
        tag: tag.into(),
        dir,
        status: meta.status,
        created_at_unix_ms: meta.created_at_unix_ms,
        memory_format: meta.memory_format,
        content_hash: meta.content_hash.clone(),
        parent_tag: meta.parent_tag.clone(),
        parent_content_hash: meta.parent_hash.clone(),
        chain_depth: if meta.parent_tag.is_some() { ancestors.len().max(1) } else { 0 },
        ancestors,
        dependents: children_of(&entries, tag),
        descendants: descendants_of(&entries, tag),
        bootable,
        problem,
        memory_bytes: meta.mem_size_bytes,
        logical_bytes: logical,
        physical_bytes: physical,
        chain_physical_bytes: chain_physical + physical,
        chunks,
        disk_bytes: super::disks::allocated_bytes(&store.snapshots_dir().join(tag), meta),
    })
}

/// (logical, physical, chunks) of one snapshot; unreadable parts count as zero.
fn sizes(store: &Store, e: &StoreEntry) -> (u64, u64, u64) {
    let dir = store.snapshots_dir().join(&e.tag);
    let file_bytes = |name: &str| std::fs::metadata(dir.join(name)).map(|m| m.len()).unwrap_or(0);
    let vmstate = file_bytes(VMSTATE_BIN);
    match e.meta.memory_format {
        MemoryFormat::Image => {
            let image = std::fs::File::open(dir.join(MEMORY_IMG))
                .and_then(|f| crate::memory_image::allocated_bytes(&f))
                .unwrap_or(0);
            (e.meta.mem_size_bytes, vmstate + image, 0)
        }
        MemoryFormat::Chunked => {
            let Ok(map) = PageMap::read_file(&dir.join(MEMORY_MAP)) else { return (0, vmstate, 0) };
            let chunks = ChunkStore::open(store.root());
            let ids: BTreeSet<ChunkId> = map.chunks().collect();
            let stored: u64 = ids.iter().map(|id| chunks.stored_size(id).unwrap_or(0)).sum();
            (map.present_pages() * crate::page_map::PAGE, vmstate + file_bytes(MEMORY_MAP) + stored, ids.len() as u64)
        }
    }
}

/// Tags whose parent is `tag`, sorted.
pub fn dependents(store: &Store, tag: &str) -> Vec<String> {
    children_of(&store.list(), tag)
}

fn children_of(entries: &[StoreEntry], tag: &str) -> Vec<String> {
    entries.iter().filter(|e| e.meta.parent_tag.as_deref() == Some(tag)).map(|e| e.tag.clone()).collect()
}

/// Every snapshot built on `tag`, deepest first (the order they can be removed in).
fn descendants_of(entries: &[StoreEntry], tag: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut seen = HashSet::from([tag.to_string()]);
    fn walk(entries: &[StoreEntry], tag: &str, seen: &mut HashSet<String>, out: &mut Vec<String>) {
        for child in children_of(entries, tag) {
            if seen.insert(child.clone()) {
                walk(entries, &child, seen, out);
                out.push(child);
            }
        }
    }
    walk(entries, tag, &mut seen, &mut out);
    out
}

/// What to do with snapshots built on the one being removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RemoveMode {
    /// Refuse while it has dependents (naming them).
    #[default]
    Refuse,
    /// Remove its whole subtree too.
    Cascade,
    /// Remove it and leave its dependents orphaned (unbootable).
    Force,
}

/// What `rmi` did.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct RemoveReport {
    /// Removed snapshots, dependents first.
    pub removed: Vec<String>,
    /// Dependents left without their parent (`Force`).
    pub orphaned: Vec<String>,
    /// Chunks no snapshot references any more, deleted.
    pub chunks_removed: u64,
    pub chunk_bytes_removed: u64,
}

/// Removes `tag` as `mode` says, then collects unreferenced chunks.
pub fn remove(store: &Store, cache: &AssembledCache, tag: &str, mode: RemoveMode) -> Result<RemoveReport, ChainError> {
    let dir = store.tag_dir(tag)?;
    let entries = store.list();
    if !entries.iter().any(|e| e.tag == tag) && std::fs::symlink_metadata(&dir).is_err() {
        return Err(StoreError::NotFound { tag: tag.into(), store: store.snapshots_dir() }.into());
    }
    let children = children_of(&entries, tag);
    let mut report = RemoveReport::default();
    let mut doomed = Vec::new();
    match mode {
        RemoveMode::Refuse if !children.is_empty() => {
            return Err(ChainError::HasDependents { tag: tag.into(), dependents: children })
        }
        RemoveMode::Refuse => {}
        RemoveMode::Cascade => doomed = descendants_of(&entries, tag),
        RemoveMode::Force => report.orphaned = children,
    }
    doomed.push(tag.to_string());
    for t in doomed {
        let hash = entries.iter().find(|e| e.tag == t).and_then(|e| e.meta.content_hash.clone());
        match store.remove(&t) {
            Ok(()) | Err(StoreError::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        if let Some(h) = hash {
            cache.evict(&h);
        }
        report.removed.push(t);
    }
    let gc = collect_garbage(store)?;
    report.chunks_removed = gc.removed;
    report.chunk_bytes_removed = gc.removed_bytes;
    Ok(report)
}

/// Deletes chunks that no snapshot's `memory.map` references (ready, being written or
/// staged), under the chunk store's exclusive lock; also drops `memory.img` files that an
/// interrupted ingest left in snapshots that are already chunked.
pub fn collect_garbage(store: &Store) -> Result<GcReport, ChainError> {
    let chunks = ChunkStore::open(store.root());
    let snapshots = store.snapshots_dir();
    chunks
        .gc(|| {
            let mut live = HashSet::new();
            let Ok(entries) = std::fs::read_dir(&snapshots) else { return Ok(live) };
            for e in entries.flatten() {
                let dir = e.path();
                let map_path = dir.join(MEMORY_MAP);
                if map_path.exists() {
                    let map = PageMap::read_file(&map_path)
                        .map_err(|err| ChunkError::LiveSet(format!("reading {}: {err}", map_path.display())))?;
                    live.extend(map.chunks());
                }
                let chunked = crate::metadata::read_meta(&dir.join(crate::SNAPSHOT_JSON))
                    .is_ok_and(|m| m.memory_format == MemoryFormat::Chunked && m.status == SnapshotStatus::Ready);
                if chunked {
                    let _ = std::fs::remove_file(dir.join(MEMORY_IMG));
                }
            }
            Ok(live)
        })
        .map_err(ChainError::chunks("collecting unreferenced chunks"))
}
