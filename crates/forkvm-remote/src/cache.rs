//! A host's cache of sealed blocks fetched from remotes, bounded in size, least
//! recently used first out.
//!
//! Why this exists: pulls of related tags (a template and the branches of it) share most
//! blocks; a block fetched once is read from here the next time. Files are the blocks
//! as the remote holds them (sealed: the cache is no more readable than the bucket),
//! named by block name, written to a temp name and renamed; a hit refreshes the file's
//! mtime, and [`BlockCache::trim`] removes the oldest files until the cache fits. A
//! damaged file is only a miss: what it holds is checked like any remote block.

use crate::RemoteError;
use forkvm_snapshot::ChunkId;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

/// Environment variable setting the cache's size limit in bytes.
pub const CACHE_BYTES_ENV: &str = "FORKVM_REMOTE_CACHE_BYTES";
/// The default size limit: 4 GiB.
pub const DEFAULT_CACHE_BYTES: u64 = 4 << 30;

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A cache directory and its size limit.
#[derive(Debug, Clone)]
pub struct BlockCache {
    dir: PathBuf,
    max_bytes: u64,
}

impl BlockCache {
    /// The cache at `dir`, holding at most `max_bytes` (0: caches nothing).
    pub fn new(dir: &Path, max_bytes: u64) -> BlockCache {
        BlockCache { dir: dir.into(), max_bytes }
    }

    /// The cache at `dir` with the limit `$FORKVM_REMOTE_CACHE_BYTES` or the default.
    pub fn configured(dir: &Path) -> BlockCache {
        let max =
            std::env::var(CACHE_BYTES_ENV).ok().and_then(|v| v.trim().parse().ok()).unwrap_or(DEFAULT_CACHE_BYTES);
        BlockCache::new(dir, max)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path_of(&self, id: &ChunkId) -> PathBuf {
        let hex = id.to_hex();
        self.dir.join(&hex[..2]).join(hex)
    }

    /// The sealed block `id`, if cached (its use recorded).
    pub fn get(&self, id: &ChunkId) -> Option<Vec<u8>> {
        let path = self.path_of(id);
        let bytes = std::fs::read(&path).ok()?;
        if let Ok(f) = std::fs::File::options().write(true).open(&path) {
            let _ = f.set_modified(SystemTime::now());
        }
        Some(bytes)
    }

    /// Keeps the sealed block `id` (a failure to cache is not an error: it stays a miss).
    pub fn put(&self, id: &ChunkId, sealed: &[u8]) {
        if self.max_bytes == 0 || sealed.len() as u64 > self.max_bytes {
            return;
        }
        let path = self.path_of(id);
        let Some(dir) = path.parent() else { return };
        let tmp = dir.join(format!(
            ".{}.{}.{}.tmp",
            id.to_hex(),
            std::process::id(),
            TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let ok = std::fs::create_dir_all(dir).is_ok()
            && std::fs::write(&tmp, sealed).is_ok()
            && std::fs::rename(&tmp, &path).is_ok();
        if !ok {
            let _ = std::fs::remove_file(&tmp);
        }
    }

    /// Removes the least recently used blocks until the cache holds at most its limit;
    /// returns (files removed, bytes left).
    pub fn trim(&self) -> Result<(u64, u64), RemoteError> {
        let mut files = Vec::new();
        let read = |d: &Path| std::fs::read_dir(d).map_err(RemoteError::io("listing the block cache", d));
        let top = match read(&self.dir) {
            Ok(t) => t,
            Err(_) if !self.dir.exists() => return Ok((0, 0)),
            Err(e) => return Err(e),
        };
        for sub in top.flatten() {
            if !sub.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            for f in read(&sub.path())?.flatten() {
                if let Some(m) = f.metadata().ok().filter(|m| m.is_file()) {
                    files.push((m.modified().unwrap_or(SystemTime::UNIX_EPOCH), m.len(), f.path()));
                }
            }
        }
        files.sort();
        let mut total: u64 = files.iter().map(|f| f.1).sum();
        let mut removed = 0;
        for (_, len, path) in files {
            if total <= self.max_bytes {
                break;
            }
            if std::fs::remove_file(&path).is_ok() {
                total -= len;
                removed += 1;
            }
        }
        Ok((removed, total))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_recently_used_blocks_go_first() {
        let dir = tempfile::tempdir().unwrap();
        let cache = BlockCache::new(dir.path(), 2500);
        let ids: Vec<ChunkId> = (0..3u8).map(|i| ChunkId::of(&[i])).collect();
        for (i, id) in ids.iter().enumerate() {
            cache.put(id, &vec![i as u8; 1000]);
            let f = std::fs::File::options().write(true).open(cache.path_of(id)).unwrap();
            f.set_modified(SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(100 + i as u64)).unwrap();
        }
        assert_eq!(cache.get(&ids[0]).unwrap(), vec![0u8; 1000], "a hit makes block 0 the newest");
        assert_eq!(cache.trim().unwrap(), (1, 2000));
        assert!(cache.get(&ids[1]).is_none(), "the oldest went");
        assert!(cache.get(&ids[0]).is_some() && cache.get(&ids[2]).is_some());
        BlockCache::new(dir.path(), 0).put(&ChunkId::of(b"x"), b"x");
        assert!(cache.get(&ChunkId::of(b"x")).is_none(), "a zero limit caches nothing");
    }
}
