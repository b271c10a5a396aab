//! Assembled memory images: a chunked snapshot's flat `memory.img`, built once.
//!
//! A chunked snapshot cannot be mapped directly: its memory is a chain of page maps over
//! compressed chunks. The first spawn from it verifies every link and writes the flat
//! image to `<cache>/assembled/<content hash>/memory.img`; every later spawn maps that
//! file (copy-on-write, like any `memory.img`). The directory lives in the artefact
//! cache: it is safe to delete and rebuilt on demand. An image under its final name is
//! always complete (written to a temporary name, synced, renamed), and is never written
//! again, so running sandboxes may keep it mapped while it is evicted.
//!
//! The cache is bounded ([`DEFAULT_MAX_BYTES`], `$FORKVM_ASSEMBLED_CACHE_MAX_MIB`): each
//! time an image goes in, the least recently used others go until the images' allocated
//! bytes fit (a spawn that finds its image marks it used). Images of snapshots in stores
//! deleted whole (tests' private stores, say) leave the cache this way too.

use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::{is_hash, verify, Chain, ChainError};
use crate::chunk_store::{ChunkSeal, ChunkStore};
use crate::dir::SnapshotDir;
use crate::memory_windows::{ChunkSource, PageMapWindows};
use crate::metadata::MemoryFormat;
use crate::page_map::{apply_page_map, PageMap};
use crate::store::Store;
use crate::MEMORY_IMG;

/// What assembling a chain cost (the one-time price of a chain head).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AssembleStats {
    /// Links applied (base included).
    pub links: usize,
    /// Chunks read, decompressed and verified.
    pub chunks_read: u64,
    /// Bytes written into the image.
    pub bytes_written: u64,
    /// Wall time of verification plus assembly.
    pub ms: f64,
}

/// Default bound of the cache's allocated bytes (8 GiB).
pub const DEFAULT_MAX_BYTES: u64 = 8 << 30;
/// An image used this recently is never evicted.
const RECENT: std::time::Duration = std::time::Duration::from_secs(60);

/// The cache of assembled images, `<cache>/assembled/`.
#[derive(Debug, Clone)]
pub struct AssembledCache {
    root: PathBuf,
    max_bytes: u64,
    /// Where the keys of sealed links are (`vault::default_keys_dir`).
    keys_dir: PathBuf,
}

impl AssembledCache {
    /// The cache under `cache_root` (the artefact cache, `$FORKVM_CACHE`), bounded by
    /// `$FORKVM_ASSEMBLED_CACHE_MAX_MIB` (else [`DEFAULT_MAX_BYTES`]).
    pub fn new(cache_root: &Path) -> AssembledCache {
        let max_bytes = std::env::var("FORKVM_ASSEMBLED_CACHE_MAX_MIB")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map_or(DEFAULT_MAX_BYTES, |mib| mib.saturating_mul(1 << 20));
        AssembledCache::with_max_bytes(cache_root, max_bytes)
    }

    /// [`AssembledCache::new`] with bound `max_bytes`.
    pub fn with_max_bytes(cache_root: &Path, max_bytes: u64) -> AssembledCache {
        AssembledCache {
            root: cache_root.join("assembled"),
            max_bytes,
            keys_dir: forkvm_disk::vault::default_keys_dir(),
        }
    }

    /// This cache, reading sealed links' keys from `keys_dir`.
    pub fn with_keys_dir(self, keys_dir: &Path) -> AssembledCache {
        AssembledCache { keys_dir: keys_dir.to_path_buf(), ..self }
    }

    /// The chunk store `link`'s own chunks are read through: sealed with its owner's
    /// key when it says so (an error naming the owner when that key is gone).
    pub fn chunks_of(&self, store: &Store, link: &SnapshotDir) -> Result<ChunkStore, ChainError> {
        let chunks = ChunkStore::open(store.root());
        match &link.meta.memory_sealed_by {
            None => Ok(chunks),
            Some(owner) => {
                let seal = ChunkSeal::load(&self.keys_dir, owner).map_err(|e| ChainError::Sealed {
                    tag: link.meta.tag.clone(),
                    owner: owner.clone(),
                    reason: e.to_string(),
                })?;
                Ok(chunks.with_seal(seal))
            }
        }
    }

    /// Evicts the least recently used images but `keep` until the images' allocated
    /// bytes are within the bound. An image used in the last [`RECENT`] is left alone (a
    /// spawn may be about to map it), as is one whose assembly lock is held (being
    /// built); a sandbox mapping an evicted image keeps its mapping.
    fn trim(&self, keep: &str) {
        let recent = std::time::SystemTime::now() - RECENT;
        let mut entries: Vec<(std::time::SystemTime, u64, PathBuf)> = fs::read_dir(&self.root)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_str().is_some_and(|n| is_hash(n) && n != keep))
            .filter_map(|e| {
                let meta = fs::metadata(e.path().join(MEMORY_IMG)).ok()?;
                Some((meta.modified().ok()?, allocated(&meta), e.path()))
            })
            .collect();
        let kept = fs::metadata(self.image_path(keep)).map_or(0, |m| allocated(&m));
        let mut total: u64 = kept + entries.iter().map(|e| e.1).sum::<u64>();
        entries.sort_by_key(|e| e.0);
        for (used, bytes, dir) in entries {
            if total <= self.max_bytes || used > recent {
                break;
            }
            if let Ok(lock) = File::open(dir.join(".lock")) {
                if forkvm_disk::flock::flock(&lock, libc::LOCK_EX | libc::LOCK_NB).is_err() {
                    continue;
                }
            }
            if fs::remove_dir_all(&dir).is_ok() {
                total = total.saturating_sub(bytes);
            }
        }
    }

    /// Where the image of content hash `hash` lives (whether or not it exists).
    /// `hash` must be a well-formed hash ([`is_hash`]); anything else gets a path that
    /// never exists inside the cache.
    pub fn image_path(&self, hash: &str) -> PathBuf {
        let name = if is_hash(hash) { hash } else { "invalid-hash" };
        self.root.join(name).join(MEMORY_IMG)
    }

    /// The memory image to map for `chain`'s head: the head's own `memory.img` for a
    /// whole-image snapshot; for a chunked one the cached assembled image, assembled
    /// first if missing (then the stats say what that cost).
    pub fn memory_for(&self, store: &Store, chain: &Chain) -> Result<(PathBuf, Option<AssembleStats>), ChainError> {
        let head = chain.head();
        if head.meta.memory_format == MemoryFormat::Image {
            return Ok((head.memory_path(), None));
        }
        let hash = head.meta.content_hash.clone().unwrap_or_default();
        let image = self.image_path(&hash);
        if image.is_file() {
            mark_used(&image);
            return Ok((image, None));
        }
        let dir = image.parent().expect("image path has a parent").to_path_buf();
        fs::create_dir_all(&dir).map_err(ChainError::io("creating the assembled-image directory", &dir))?;
        // One assembler per image: a concurrent spawn of the same head waits here and
        // then finds the image.
        let lock_path = dir.join(".lock");
        let lock = File::create(&lock_path).map_err(ChainError::io("opening the assembly lock", &lock_path))?;
        forkvm_disk::flock::flock(&lock, libc::LOCK_EX).map_err(ChainError::io("locking the assembly", &lock_path))?;
        if image.is_file() {
            return Ok((image, None));
        }
        // Under the lock no one else assembles this image: a temporary file here is a
        // crashed assembler's.
        for e in fs::read_dir(&dir).into_iter().flatten().flatten() {
            if e.file_name().to_string_lossy().ends_with(".tmp") {
                let _ = fs::remove_file(e.path());
            }
        }
        let stats = assemble_into(self, store, chain, &image)?;
        drop(lock);
        self.trim(&hash);
        Ok((image, Some(stats)))
    }

    /// `chain`'s head memory as windows read on demand from its links' page maps and
    /// chunks: what a lazy restore maps instead of an assembled image. Verifies the chain
    /// (as an assembly would) but writes nothing.
    pub fn windows_for(&self, store: &Store, chain: &Chain) -> Result<PageMapWindows, ChainError> {
        verify(chain)?;
        let mem_size = chain.head().meta.mem_size_bytes;
        let mut links = Vec::with_capacity(chain.links.len());
        for link in &chain.links {
            let map = read_link_map(link, mem_size)?;
            links.push((map, Box::new(self.chunks_of(store, link)?) as Box<dyn ChunkSource>));
        }
        Ok(PageMapWindows::new(links, mem_size))
    }

    /// Puts `image` (a complete flat image of the snapshot with content hash `hash`)
    /// into the cache by renaming it, so the first spawn does not assemble. Returns
    /// whether it was adopted; an image on another filesystem is left where it is.
    pub fn adopt(&self, hash: &str, image: &Path) -> bool {
        if !is_hash(hash) {
            return false;
        }
        let target = self.image_path(hash);
        if target.is_file() {
            return false;
        }
        let Some(dir) = target.parent() else { return false };
        if fs::create_dir_all(dir).is_err() {
            return false;
        }
        let ok = fs::rename(image, &target).is_ok();
        if ok {
            let _ = File::open(dir).and_then(|d| d.sync_all());
            mark_used(&target);
            self.trim(hash);
        }
        ok
    }

    /// Hard-links `image` into the cache under `hash` (it stays where it is too).
    pub fn share(&self, hash: &str, image: &Path) -> bool {
        let target = self.image_path(hash);
        if !is_hash(hash) || target.is_file() {
            return false;
        }
        let Some(dir) = target.parent() else { return false };
        let ok = fs::create_dir_all(dir).is_ok() && fs::hard_link(image, &target).is_ok();
        if ok {
            self.trim(hash);
        }
        ok
    }

    /// Drops the assembled image of `hash` (sandboxes mapping it keep their mapping).
    pub fn evict(&self, hash: &str) {
        if is_hash(hash) {
            let _ = fs::remove_dir_all(self.root.join(hash));
        }
    }

    /// Whether an assembled image of `hash` is cached.
    pub fn contains(&self, hash: &str) -> bool {
        is_hash(hash) && self.image_path(hash).is_file()
    }
}

/// Bytes a file occupies on disk (an image is sparse).
fn allocated(meta: &fs::Metadata) -> u64 {
    use std::os::unix::fs::MetadataExt;
    meta.blocks() * 512
}

/// Notes that `image` was just used (its mtime: the cache's recency). Best effort.
fn mark_used(image: &Path) {
    if let Ok(f) = OpenOptions::new().append(true).open(image) {
        let _ = f.set_modified(std::time::SystemTime::now());
    }
}

/// Verifies `chain` and writes its head's flat memory to `image` (via a temporary name).
fn assemble_into(
    cache: &AssembledCache,
    store: &Store,
    chain: &Chain,
    image: &Path,
) -> Result<AssembleStats, ChainError> {
    let started = Instant::now();
    verify(chain)?;
    let head = chain.head();
    let mem_size = head.meta.mem_size_bytes;
    let tmp = image.with_file_name(format!(".{MEMORY_IMG}.{}.tmp", std::process::id()));
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)
        .map_err(ChainError::io("creating the assembled image", &tmp))?;
    let cleanup = TempFile(&tmp);
    file.set_len(mem_size).map_err(ChainError::io("sizing the assembled image", &tmp))?;
    let mut stats = AssembleStats { links: chain.links.len(), ..AssembleStats::default() };
    for link in &chain.links {
        let tag = &link.meta.tag;
        let map = read_link_map(link, mem_size)?;
        let chunks = cache.chunks_of(store, link)?;
        let applied =
            apply_page_map(&map, &chunks, &file).map_err(ChainError::page_map(format!("assembling {tag}'s pages")))?;
        stats.chunks_read += applied.chunks_read;
        stats.bytes_written += applied.bytes_written;
    }
    file.sync_all().map_err(ChainError::io("syncing the assembled image", &tmp))?;
    fs::rename(&tmp, image).map_err(ChainError::io("publishing the assembled image", image))?;
    std::mem::forget(cleanup);
    if let Some(dir) = image.parent() {
        let _ = File::open(dir).and_then(|d| d.sync_all());
    }
    stats.ms = started.elapsed().as_secs_f64() * 1e3;
    Ok(stats)
}

/// `link`'s page map, checked to describe `mem_size` bytes (the head's).
fn read_link_map(link: &SnapshotDir, mem_size: u64) -> Result<PageMap, ChainError> {
    let tag = &link.meta.tag;
    if link.meta.mem_size_bytes != mem_size {
        return Err(ChainError::Malformed {
            tag: tag.clone(),
            reason: format!("memory size {} differs from the head's {mem_size}", link.meta.mem_size_bytes),
        });
    }
    let map = PageMap::read_file(&link.memory_map_path())
        .map_err(ChainError::page_map(format!("reading {tag}'s memory.map")))?;
    if map.mem_size != mem_size {
        return Err(ChainError::Malformed {
            tag: tag.clone(),
            reason: format!("memory.map describes {} bytes, snapshot says {mem_size}", map.mem_size),
        });
    }
    Ok(map)
}

/// Removes a temporary file unless forgotten.
struct TempFile<'a>(&'a Path);

impl Drop for TempFile<'_> {
    fn drop(&mut self) {
        let _ = fs::remove_file(self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};

    /// A cached image of `hash` with `kib` KiB of data, last used `ago` before now.
    fn cached(cache: &AssembledCache, hash: &str, kib: usize, ago: Duration) {
        let path = cache.image_path(hash);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, vec![7u8; kib << 10]).unwrap();
        let f = OpenOptions::new().append(true).open(&path).unwrap();
        f.set_modified(SystemTime::now() - ago).unwrap();
    }

    #[test]
    fn the_least_recently_used_images_go_past_the_bound_but_not_recent_ones() {
        let dir = tempfile::tempdir().unwrap();
        // Room for about three 256 KiB images.
        let cache = AssembledCache::with_max_bytes(dir.path(), 800 << 10);
        let h = |c: char| c.to_string().repeat(64);
        cached(&cache, &h('a'), 256, Duration::from_secs(500));
        cached(&cache, &h('b'), 256, Duration::from_secs(400));
        cached(&cache, &h('c'), 256, Duration::from_secs(300));
        assert!(cache.contains(&h('a')) && cache.contains(&h('c')));
        // A fourth goes in: the least recently used one goes.
        let image = dir.path().join("new.img");
        fs::write(&image, vec![1u8; 256 << 10]).unwrap();
        assert!(cache.adopt(&h('d'), &image));
        assert!(!cache.contains(&h('a')), "the least recently used went");
        assert!(cache.contains(&h('b')) && cache.contains(&h('c')) && cache.contains(&h('d')));
        // Using one makes it recent: the next to go is the other.
        mark_used(&cache.image_path(&h('b')));
        let image = dir.path().join("new2.img");
        fs::write(&image, vec![2u8; 256 << 10]).unwrap();
        assert!(cache.adopt(&h('e'), &image));
        assert!(!cache.contains(&h('c')) && cache.contains(&h('b')), "b was used, c was not");
        // Recent images stay even past the bound.
        let image = dir.path().join("new3.img");
        fs::write(&image, vec![3u8; 256 << 10]).unwrap();
        assert!(cache.adopt(&h('f'), &image));
        for c in ['b', 'd', 'e', 'f'] {
            assert!(cache.contains(&h(c)), "{c} was used in the last minute");
        }
    }
}
