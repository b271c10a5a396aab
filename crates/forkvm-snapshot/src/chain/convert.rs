//! Making chunked snapshots: ingest a whole-image snapshot, write a diff over a parent,
//! compact a chain into a flat snapshot.
//!
//! Every conversion follows the chunk store's crash rule: chunks are written and synced
//! (under the store's shared lock, so garbage collection cannot take them away) before the
//! `memory.map` that references them is published, and a snapshot changes form by one
//! atomic step (a directory rename, or a `snapshot.json` replace). The flat image a
//! conversion already has in hand goes into the assembled-image cache, so the first spawn
//! after it does not assemble.

use std::fs::{self, File};
use std::path::Path;
use std::time::Instant;

use super::assemble::AssembledCache;
use super::{content_hash, resolve, Chain, ChainError, MemorySeal};
use crate::chunk_store::ChunkStore;
use crate::dir::{SnapshotDir, SnapshotWriter, MEMORY_MAP, SNAPSHOT_JSON, VMSTATE_BIN};
use crate::metadata::{replace_meta, write_meta, MemoryFormat, SnapshotMeta, SnapshotStatus};
use crate::page_map::{build_page_map, BuildStats, PageMap};
use crate::store::{link_or_copy, Store};

/// What a conversion wrote.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct ConvertReport {
    pub tag: String,
    pub content_hash: String,
    pub parent_tag: Option<String>,
    /// Pages the new `memory.map` describes (for a diff: pages that differ).
    pub pages: u64,
    /// Chunks written that the store did not have yet, and their bytes on disk.
    pub chunks_new: u64,
    pub bytes_stored: u64,
    /// Chunks the store already had (shared with other snapshots).
    pub chunks_reused: u64,
    pub ms: f64,
    /// False when the snapshot was already in the wanted form and nothing was done.
    pub changed: bool,
}

impl ConvertReport {
    /// The report of a conversion that wrote `map` (with `stats`) as `tag`.
    fn written(
        tag: impl Into<String>,
        content_hash: String,
        parent_tag: Option<String>,
        map: &PageMap,
        stats: &BuildStats,
        started: Instant,
    ) -> ConvertReport {
        ConvertReport {
            tag: tag.into(),
            content_hash,
            parent_tag,
            pages: map.present_pages(),
            chunks_new: stats.chunks_new,
            bytes_stored: stats.bytes_stored,
            chunks_reused: stats.chunks_reused,
            ms: started.elapsed().as_secs_f64() * 1e3,
            changed: true,
        }
    }
}

/// Moves a whole-image snapshot's memory into the chunk store (in place: same tag, same
/// vmstate and disks). Its `memory.img` becomes the assembled image of its new content
/// hash (hard-linked; the directory's name for it goes at the next garbage collection).
/// A chunked snapshot is left alone.
pub fn ingest(store: &Store, cache: &AssembledCache, tag: &str) -> Result<ConvertReport, ChainError> {
    let started = Instant::now();
    let snap = store.lookup(tag)?;
    if snap.meta.memory_format == MemoryFormat::Chunked {
        let content_hash = snap.meta.content_hash.clone().unwrap_or_default();
        return Ok(ConvertReport { tag: tag.into(), content_hash, ..ConvertReport::default() });
    }
    if snap.meta.parent_tag.is_some() {
        return Err(ChainError::Malformed {
            tag: tag.into(),
            reason: "it names a parent but its memory is a whole image".into(),
        });
    }
    super::check_disk_names(&snap.meta)?;
    super::disks::check_layers(&snap.path, &snap.meta)?;
    let image_path = snap.memory_path();
    let image = open_image(&image_path, snap.meta.mem_size_bytes)?;
    let chunks = ChunkStore::open(store.root());
    let _lock = chunks.lock_shared().map_err(ChainError::chunks("locking the chunk store"))?;
    let (map, stats) = build_page_map(&image, None, snap.meta.mem_size_bytes, &chunks)
        .map_err(ChainError::page_map(format!("chunking {tag}'s memory.img")))?;
    chunks.sync().map_err(ChainError::chunks("syncing new chunks"))?;
    // memory.map first (ignored while the snapshot says `image`), then the switch.
    let map_tmp = snap.path.join(format!(".{MEMORY_MAP}.tmp"));
    map.write_file(&map_tmp).map_err(ChainError::page_map(format!("writing {tag}'s memory.map")))?;
    let map_path = snap.memory_map_path();
    fs::rename(&map_tmp, &map_path).map_err(ChainError::io("publishing memory.map", &map_path))?;
    let mut meta = snap.meta.clone();
    meta.memory_format = MemoryFormat::Chunked;
    meta.content_hash = None;
    let hash = content_hash(&snap.path, &meta)?;
    meta.content_hash = Some(hash.clone());
    meta.memory_bytes_allocated = stats.bytes_stored;
    replace_meta(&snap.path, &meta).map_err(ChainError::meta(format!("switching {tag} to chunked memory")))?;
    drop(image);
    // The image becomes the assembled image by a hard link, and stays in the directory
    // until the next garbage collection: a spawn that read the metadata just before the
    // switch still finds it.
    cache.share(&hash, &image_path);
    Ok(ConvertReport::written(tag, hash, None, &map, &stats, started))
}

/// Publishes `tag` as a diff over `parent` (a chunked chain head): `staged` is a
/// whole-image snapshot of a sandbox spawned from `parent` (a full branch) whose
/// `memory.map` will hold only the pages that differ from the parent's memory. Its
/// vmstate and disks are taken over; its `memory.img` becomes the new snapshot's
/// assembled image. `staged` is consumed (the caller removes what is left of it).
/// `seal`: its chunks are sealed with that sandbox's key (a checkpoint's).
pub fn write_diff(
    store: &Store,
    cache: &AssembledCache,
    parent: &Chain,
    staged: &SnapshotDir,
    tag: &str,
    seal: Option<&MemorySeal>,
) -> Result<ConvertReport, ChainError> {
    let started = Instant::now();
    let head = parent.head();
    let parent_tag = head.meta.tag.clone();
    if head.meta.memory_format != MemoryFormat::Chunked {
        return Err(ChainError::Malformed {
            tag: parent_tag,
            reason: "a diff parent must be chunked (ingest it first)".into(),
        });
    }
    let mem_size = head.meta.mem_size_bytes;
    if staged.meta.mem_size_bytes != mem_size || staged.meta.memory_format != MemoryFormat::Image {
        return Err(ChainError::Malformed {
            tag: tag.into(),
            reason: format!(
                "the staged snapshot ({} bytes of {:?} memory) is not a whole image of {parent_tag}'s size ({mem_size} bytes)",
                staged.meta.mem_size_bytes, staged.meta.memory_format
            ),
        });
    }
    let dest = store.check_free(tag)?;
    let (parent_image, _) = cache.memory_for(store, parent)?;
    let parent_file = open_image(&parent_image, mem_size)?;
    let image_path = staged.memory_path();
    let image = open_image(&image_path, mem_size)?;
    let chunks = match seal {
        Some(s) => ChunkStore::open(store.root()).with_seal(s.seal.clone()),
        None => ChunkStore::open(store.root()),
    };
    let _lock = chunks.lock_shared().map_err(ChainError::chunks("locking the chunk store"))?;
    let (map, stats) = build_page_map(&image, Some(&parent_file), mem_size, &chunks)
        .map_err(ChainError::page_map(format!("diffing {tag}'s memory against {parent_tag}")))?;
    chunks.sync().map_err(ChainError::chunks("syncing new chunks"))?;
    let mut meta = staged.meta.clone();
    meta.memory_sealed_by = seal.map(|s| s.owner.clone());
    meta.tag = tag.into();
    meta.status = SnapshotStatus::Ready;
    meta.writer_pid = None;
    meta.parent_tag = Some(parent_tag.clone());
    meta.parent_hash = head.meta.content_hash.clone();
    meta.memory_bytes_allocated = stats.bytes_stored;
    let hash = publish_chunked(&dest, &staged.path, &map, meta)?;
    drop(image);
    cache.adopt(&hash, &image_path);
    Ok(ConvertReport::written(tag, hash, Some(parent_tag), &map, &stats, started))
}

/// Writes `to`: the flat equivalent of `from`'s chain (no parent), sharing its chunks.
/// A chain with sealed links (a checkpoint's) compacts to a snapshot sealed with the
/// key of its newest sealed link's owner: what was sealed stays sealed.
pub fn compact(store: &Store, cache: &AssembledCache, from: &str, to: &str) -> Result<ConvertReport, ChainError> {
    let started = Instant::now();
    if from == to {
        return Err(ChainError::Malformed {
            tag: to.into(),
            reason: "compacting a snapshot onto itself: choose another tag".into(),
        });
    }
    let dest = store.check_free(to)?;
    let chain = resolve(store, from)?;
    let head = chain.head().clone();
    let (image_path, _) = cache.memory_for(store, &chain)?;
    let image = open_image(&image_path, head.meta.mem_size_bytes)?;
    let sealed_link = chain.links.iter().rev().find(|l| l.meta.memory_sealed_by.is_some());
    let chunks = match sealed_link {
        Some(link) => cache.chunks_of(store, link)?,
        None => ChunkStore::open(store.root()),
    };
    let _lock = chunks.lock_shared().map_err(ChainError::chunks("locking the chunk store"))?;
    let (map, stats) = build_page_map(&image, None, head.meta.mem_size_bytes, &chunks)
        .map_err(ChainError::page_map(format!("chunking {from}'s assembled memory")))?;
    chunks.sync().map_err(ChainError::chunks("syncing new chunks"))?;
    let mut meta = head.meta.clone();
    meta.tag = to.into();
    meta.parent_tag = None;
    meta.parent_hash = None;
    meta.branched_from = Some(format!("compact:{from}"));
    meta.memory_sealed_by = sealed_link.and_then(|l| l.meta.memory_sealed_by.clone());
    meta.created_at_unix_ms = now_unix_ms();
    meta.memory_bytes_allocated = stats.bytes_stored;
    let hash = publish_chunked(&dest, &head.path, &map, meta)?;
    cache.share(&hash, &image_path);
    Ok(ConvertReport::written(to, hash, None, &map, &stats, started))
}

/// Writes a chunked snapshot at `dest` from `map`, `meta` and the vmstate and disks of
/// `source_dir` (hard-linked, copied across filesystems; a layered disk's sealed layers
/// too, checked before publishing); returns its content hash.
fn publish_chunked(
    dest: &Path,
    source_dir: &Path,
    map: &PageMap,
    mut meta: SnapshotMeta,
) -> Result<String, ChainError> {
    let tag = meta.tag.clone();
    super::check_disk_names(&meta)?;
    let writer = SnapshotWriter::begin(dest).map_err(ChainError::dir(format!("starting snapshot {tag}")))?;
    map.write_file(&writer.path(MEMORY_MAP)).map_err(ChainError::page_map(format!("writing {tag}'s memory.map")))?;
    let vmstate = source_dir.join(VMSTATE_BIN);
    link_or_copy(&vmstate, &writer.path(VMSTATE_BIN)).map_err(ChainError::io("taking over vmstate.bin", &vmstate))?;
    super::disks::take_over(source_dir, writer.staging(), &meta)?;
    super::disks::check_layers(writer.staging(), &meta)?;
    meta.memory_format = MemoryFormat::Chunked;
    meta.status = SnapshotStatus::Ready;
    meta.content_hash = None;
    let hash = content_hash(writer.staging(), &meta)?;
    meta.content_hash = Some(hash.clone());
    write_meta(&writer.path(SNAPSHOT_JSON), &meta)
        .map_err(ChainError::meta(format!("writing {tag}'s snapshot.json")))?;
    writer.commit().map_err(ChainError::dir(format!("publishing snapshot {tag}")))?;
    Ok(hash)
}

pub(super) fn open_image(path: &Path, size: u64) -> Result<File, ChainError> {
    crate::memory_image::open_image(path, size).map_err(|e| ChainError::Io {
        step: "opening a memory image".into(),
        path: path.to_path_buf(),
        source: std::io::Error::other(e.to_string()),
    })
}

fn now_unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}
