//! A content-addressed chunk store under `<store_root>/chunks/`.
//!
//! Snapshots of the same guest share most of their memory. Storing memory as
//! chunks addressed by the BLAKE3 hash of their bytes means identical content
//! is stored once, however many snapshots reference it, and a chunk read back
//! can be verified against its own name.
//!
//! Layout: a chunk (at most [`MAX_CHUNK_BYTES`] uncompressed) lives zstd
//! compressed at `chunks/<first 2 hex chars>/<64 hex chars>`.
//!
//! Crash safety and the protocol writers and the garbage collector follow:
//!
//! - A chunk is written to `.<hex>.<pid>.<counter>.tmp` in its final
//!   directory and renamed into place, so a file under a chunk name is
//!   always complete (though not necessarily durable).
//! - A writer takes [`ChunkStore::lock_shared`] before its first
//!   [`ChunkStore::put`], calls [`ChunkStore::sync`] once all its chunks are
//!   written, then publishes the manifest that references them, and only then
//!   drops the lock. A chunk is therefore durable before anything refers to it.
//! - [`ChunkStore::gc`] takes the exclusive lock *before* computing the live
//!   set, so no writer can publish a manifest between the live set being
//!   computed and unreferenced chunks being deleted.
//!
//! Chunk files are untrusted on read: the compressed size and the
//! decompressed size are capped, and the content hash is checked.
//!
//! A handle may carry a sandbox's [`ChunkSeal`] ([`ChunkStore::with_seal`]): its chunks
//! are then named by a hash keyed with that sandbox's key and stored encrypted (the
//! checkpoints' memory). They share the directory, the lock and the garbage collector
//! with the plain chunks; only a handle with the same seal reads them.

use std::cell::RefCell;
use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub use forkvm_disk::vault::ChunkSeal;
use forkvm_disk::vault::SEALED_CHUNK_OVERHEAD;

/// Largest chunk, uncompressed (1 MiB).
pub const MAX_CHUNK_BYTES: usize = 1 << 20;

/// zstd level chunks are compressed with.
const ZSTD_LEVEL: i32 = 3;

/// Temp files younger than this are left alone by [`ChunkStore::gc`] while
/// their writer process is alive.
const TEMP_GRACE: Duration = Duration::from_secs(60);

/// Name of the lock file inside the chunks directory.
const LOCK_FILE: &str = ".lock";

/// Distinguishes temp files written by the same process.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static COMPRESSOR: RefCell<Option<zstd::bulk::Compressor<'static>>> = const { RefCell::new(None) };
    static DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
}

pub use forkvm_disk::chunk_id::{BadChunkId, ChunkId};

/// Why a chunk store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ChunkError {
    /// [`ChunkStore::put`] was given more than [`MAX_CHUNK_BYTES`].
    #[error("chunk store: refusing to store a {len}-byte chunk (at most {MAX_CHUNK_BYTES} bytes)")]
    TooLarge {
        /// Length of the refused data.
        len: usize,
    },
    /// A filesystem operation failed.
    #[error("chunk store: {step} {path}: {source}")]
    Io {
        /// What was being done, e.g. "write chunk temp file".
        step: &'static str,
        /// The file or directory involved.
        path: PathBuf,
        /// Underlying error.
        source: io::Error,
    },
    /// A chunk file does not hold what its name says.
    #[error("chunk store: corrupt chunk {path}: {reason}")]
    Corrupt {
        /// The chunk file.
        path: PathBuf,
        /// Which check failed.
        reason: String,
    },
    /// A referenced chunk is not in the store.
    #[error("chunk store: chunk {id} is missing ({path} does not exist)")]
    Missing {
        /// The chunk asked for.
        id: ChunkId,
        /// Where it should have been.
        path: PathBuf,
    },
    /// The live-set callback given to [`ChunkStore::gc`] failed.
    #[error("chunk store: gc: computing the live chunk set failed: {0}")]
    LiveSet(String),
}

impl ChunkError {
    /// Whether this is [`ChunkError::Missing`].
    pub fn is_missing(&self) -> bool {
        matches!(self, ChunkError::Missing { .. })
    }
}

/// Builds a [`ChunkError::Io`] mapper for `step` on `path`.
fn io_err<'a>(step: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> ChunkError + 'a {
    move |source| ChunkError::Io { step, path: path.to_path_buf(), source }
}

/// What [`ChunkStore::put`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PutOutcome {
    /// The chunk's id.
    pub id: ChunkId,
    /// False when the chunk already existed (deduplicated, nothing written).
    pub new: bool,
    /// Size of the compressed chunk file in bytes.
    pub stored_bytes: u64,
}

/// What [`ChunkStore::gc`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct GcReport {
    /// Chunk files deleted because nothing live referenced them.
    pub removed: u64,
    /// Disk space those files occupied (`st_blocks * 512`).
    pub removed_bytes: u64,
    /// Chunk files kept because they are live.
    pub kept: u64,
    /// Stale temp files of crashed writers deleted.
    pub temp_files_removed: u64,
}

/// A held `flock` on `chunks/.lock`, released on drop.
#[derive(Debug)]
pub struct ChunkLock {
    _file: File,
}

/// Handle on a chunk store directory.
#[derive(Debug, Clone)]
pub struct ChunkStore {
    dir: PathBuf,
    /// Seals what this handle puts and opens what it gets (see the module doc).
    seal: Option<Arc<ChunkSeal>>,
}

impl ChunkStore {
    /// The store at `<store_root>/chunks`. Does no I/O; directories are created on demand.
    pub fn open(store_root: &Path) -> ChunkStore {
        ChunkStore { dir: store_root.join("chunks"), seal: None }
    }

    /// This store through `seal`: chunks put are sealed with it, chunks got must open
    /// under it.
    pub fn with_seal(self, seal: ChunkSeal) -> ChunkStore {
        ChunkStore { seal: Some(Arc::new(seal)), ..self }
    }

    /// The name of a chunk holding `data` through this handle.
    fn name_of(&self, data: &[u8]) -> ChunkId {
        match &self.seal {
            Some(seal) => seal.name_of(data),
            None => ChunkId::of(data),
        }
    }

    /// The chunks directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where chunk `id` is (or would be) stored.
    pub fn path_of(&self, id: &ChunkId) -> PathBuf {
        let hex = id.to_hex();
        self.dir.join(&hex[..2]).join(hex)
    }

    /// Stores `data` (at most [`MAX_CHUNK_BYTES`]) unless a chunk with the same content exists.
    ///
    /// The chunk is complete under its name when this returns but only durable
    /// after [`ChunkStore::sync`].
    pub fn put(&self, data: &[u8]) -> Result<PutOutcome, ChunkError> {
        if data.len() > MAX_CHUNK_BYTES {
            return Err(ChunkError::TooLarge { len: data.len() });
        }
        let id = self.name_of(data);
        let path = self.path_of(&id);
        if let Ok(meta) = fs::symlink_metadata(&path) {
            if meta.is_file() {
                return Ok(PutOutcome { id, new: false, stored_bytes: meta.len() });
            }
        }
        let mut compressed = compress(data).map_err(io_err("compress chunk", &path))?;
        if let Some(seal) = &self.seal {
            compressed = seal.seal(&id, &compressed).map_err(|e| io_err("seal chunk", &path)(io::Error::other(e)))?;
        }
        let fanout = path.parent().unwrap_or(&self.dir);
        let hex = id.to_hex();
        let counter = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let tmp = fanout.join(format!(".{hex}.{}.{counter}.tmp", std::process::id()));
        let mut file = match create_new(&tmp) {
            Ok(f) => f,
            // The fan-out directory does not exist yet (or a gc just removed it as empty).
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                fs::create_dir_all(fanout).map_err(io_err("create chunk directory", fanout))?;
                create_new(&tmp).map_err(io_err("create chunk temp file", &tmp))?
            }
            Err(e) => return Err(io_err("create chunk temp file", &tmp)(e)),
        };
        if let Err(e) = file.write_all(&compressed) {
            let _ = fs::remove_file(&tmp);
            return Err(io_err("write chunk temp file", &tmp)(e));
        }
        drop(file);
        if let Err(e) = fs::rename(&tmp, &path) {
            let _ = fs::remove_file(&tmp);
            return Err(io_err("rename chunk temp file into place", &path)(e));
        }
        Ok(PutOutcome { id, new: true, stored_bytes: compressed.len() as u64 })
    }

    /// Reads chunk `id`, decompressed and verified against its id.
    pub fn get(&self, id: &ChunkId) -> Result<Vec<u8>, ChunkError> {
        let mut out = Vec::new();
        self.get_into(id, &mut out)?;
        Ok(out)
    }

    /// Like [`ChunkStore::get`], into `out` (cleared first) to reuse its allocation.
    pub fn get_into(&self, id: &ChunkId, out: &mut Vec<u8>) -> Result<(), ChunkError> {
        out.clear();
        let path = self.path_of(id);
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(ChunkError::Missing { id: *id, path }),
            Err(e) => return Err(io_err("open chunk", &path)(e)),
        };
        // No valid chunk compresses to more than this; refuse to read more.
        let sealing = if self.seal.is_some() { SEALED_CHUNK_OVERHEAD } else { 0 };
        let cap = (zstd::zstd_safe::compress_bound(MAX_CHUNK_BYTES) + sealing) as u64;
        let mut compressed = Vec::new();
        file.take(cap + 1).read_to_end(&mut compressed).map_err(io_err("read chunk", &path))?;
        if compressed.len() as u64 > cap {
            return Err(ChunkError::Corrupt {
                path,
                reason: format!("compressed size exceeds {cap} bytes, the most a {MAX_CHUNK_BYTES}-byte chunk needs"),
            });
        }
        if let Some(seal) = &self.seal {
            compressed = seal.open(id, &compressed).ok_or_else(|| ChunkError::Corrupt {
                path: path.clone(),
                reason: "does not open under its sandbox's key and name (another key's, renamed or tampered with)"
                    .into(),
            })?;
        }
        decompress_into(&compressed, out).map_err(|e| ChunkError::Corrupt {
            path: path.clone(),
            reason: format!("zstd decompression failed (invalid data or content over {MAX_CHUNK_BYTES} bytes): {e}"),
        })?;
        if out.len() > MAX_CHUNK_BYTES {
            let len = out.len();
            out.clear();
            return Err(ChunkError::Corrupt { path, reason: format!("decompressed to {len} bytes, over the cap") });
        }
        let actual = self.name_of(out);
        if actual != *id {
            out.clear();
            return Err(ChunkError::Corrupt { path, reason: format!("content hashes to {actual}, not its name") });
        }
        Ok(())
    }

    /// Whether chunk `id` is in the store (not verified).
    pub fn contains(&self, id: &ChunkId) -> bool {
        fs::symlink_metadata(self.path_of(id)).is_ok_and(|m| m.is_file())
    }

    /// Size of chunk `id`'s compressed file.
    pub fn stored_size(&self, id: &ChunkId) -> Result<u64, ChunkError> {
        let path = self.path_of(id);
        match fs::symlink_metadata(&path) {
            Ok(m) => Ok(m.len()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Err(ChunkError::Missing { id: *id, path }),
            Err(e) => Err(io_err("stat chunk", &path)(e)),
        }
    }

    /// Makes every chunk written so far durable with one `syncfs` on the
    /// chunks directory's filesystem. Ok if the directory does not exist.
    pub fn sync(&self) -> Result<(), ChunkError> {
        let dir = match OpenOptions::new().read(true).custom_flags(libc::O_DIRECTORY).open(&self.dir) {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io_err("open chunks directory to sync", &self.dir)(e)),
        };
        // SAFETY: syncfs only reads the descriptor, which `dir` keeps open for the call.
        if unsafe { libc::syncfs(dir.as_raw_fd()) } != 0 {
            return Err(io_err("syncfs chunks directory", &self.dir)(io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Takes the shared lock writers hold from their first put until the
    /// manifest referencing their chunks is published. Blocks while a gc runs.
    pub fn lock_shared(&self) -> Result<ChunkLock, ChunkError> {
        self.lock(libc::LOCK_SH)
    }

    /// Opens (creating) `chunks/.lock` and flocks it with `op`, retrying on EINTR.
    fn lock(&self, op: libc::c_int) -> Result<ChunkLock, ChunkError> {
        fs::create_dir_all(&self.dir).map_err(io_err("create chunks directory", &self.dir))?;
        let path = self.dir.join(LOCK_FILE);
        let file = forkvm_disk::flock::lock_file(&path, op).map_err(io_err("lock chunk lock file", &path))?;
        Ok(ChunkLock { _file: file })
    }

    /// Deletes every chunk not in the live set, and stale temp files.
    ///
    /// Takes the exclusive lock (waiting for writers to finish) and only then
    /// calls `live`, so the set it returns cannot miss a chunk of a manifest
    /// published before the deletions. Temp files are removed when older than
    /// 60 s or when the pid in their name is gone; empty fan-out directories are
    /// removed; files whose names are neither chunk nor temp names are left alone.
    pub fn gc(&self, live: impl FnOnce() -> Result<HashSet<ChunkId>, ChunkError>) -> Result<GcReport, ChunkError> {
        let _lock = self.lock(libc::LOCK_EX)?;
        let live = live()?;
        let mut report = GcReport::default();
        for fanout in self.fanout_dirs()? {
            for entry in read_dir(&fanout)? {
                let entry = entry.map_err(io_err("read chunk directory", &fanout))?;
                let path = entry.path();
                match classify(&fanout, &entry.file_name()) {
                    Entry::Chunk(id) if live.contains(&id) => report.kept += 1,
                    Entry::Chunk(_) => {
                        let size = fs::symlink_metadata(&path).map(|m| m.blocks() * 512).unwrap_or(0);
                        match fs::remove_file(&path) {
                            Ok(()) => {
                                report.removed += 1;
                                report.removed_bytes += size;
                            }
                            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                            Err(e) => return Err(io_err("remove dead chunk", &path)(e)),
                        }
                    }
                    Entry::Temp { pid } => {
                        let old = fs::symlink_metadata(&path)
                            .and_then(|m| m.modified())
                            .ok()
                            .and_then(|t| t.elapsed().ok())
                            .is_some_and(|age| age > TEMP_GRACE);
                        if old || !crate::store::process_alive(pid) {
                            match fs::remove_file(&path) {
                                Ok(()) => report.temp_files_removed += 1,
                                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                                Err(e) => return Err(io_err("remove stale chunk temp file", &path)(e)),
                            }
                        }
                    }
                    Entry::Other => {}
                }
            }
            // Fails (harmlessly) unless the directory is now empty.
            let _ = fs::remove_dir(&fanout);
        }
        Ok(report)
    }

    /// Number of chunks and the disk space they occupy (`st_blocks * 512`).
    pub fn usage(&self) -> Result<(u64, u64), ChunkError> {
        let (mut count, mut bytes) = (0, 0);
        self.for_each_chunk(|_, path| {
            let meta = fs::symlink_metadata(path).map_err(io_err("stat chunk", path))?;
            count += 1;
            bytes += meta.blocks() * 512;
            Ok(())
        })?;
        Ok((count, bytes))
    }

    /// Every chunk in the store, sorted.
    pub fn list(&self) -> Result<Vec<ChunkId>, ChunkError> {
        let mut ids = Vec::new();
        self.for_each_chunk(|id, _| {
            ids.push(id);
            Ok(())
        })?;
        ids.sort();
        Ok(ids)
    }

    /// Calls `f` with every chunk file's id and path.
    fn for_each_chunk(&self, mut f: impl FnMut(ChunkId, &Path) -> Result<(), ChunkError>) -> Result<(), ChunkError> {
        for fanout in self.fanout_dirs()? {
            for entry in read_dir(&fanout)? {
                let entry = entry.map_err(io_err("read chunk directory", &fanout))?;
                if let Entry::Chunk(id) = classify(&fanout, &entry.file_name()) {
                    match f(id, &entry.path()) {
                        // Removed by a concurrent gc between listing and stat.
                        Err(ChunkError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {}
                        other => other?,
                    }
                }
            }
        }
        Ok(())
    }

    /// The `chunks/<2 hex>` directories (none if the store does not exist yet).
    fn fanout_dirs(&self) -> Result<Vec<PathBuf>, ChunkError> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_err("list chunks directory", &self.dir)(e)),
        };
        let mut dirs = Vec::new();
        for entry in entries {
            let entry = entry.map_err(io_err("list chunks directory", &self.dir))?;
            let name = entry.file_name();
            let is_fanout = name
                .to_str()
                .is_some_and(|n| n.len() == 2 && n.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')));
            if is_fanout && entry.file_type().is_ok_and(|t| t.is_dir()) {
                dirs.push(entry.path());
            }
        }
        dirs.sort();
        Ok(dirs)
    }
}

/// `fs::read_dir` with the error mapped; a directory that vanished reads as empty.
fn read_dir(dir: &Path) -> Result<Box<dyn Iterator<Item = io::Result<fs::DirEntry>>>, ChunkError> {
    match fs::read_dir(dir) {
        Ok(it) => Ok(Box::new(it)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Box::new(std::iter::empty())),
        Err(e) => Err(io_err("read chunk directory", dir)(e)),
    }
}

/// What a name inside a fan-out directory is.
#[derive(Debug, PartialEq, Eq)]
enum Entry {
    /// A chunk file in its right fan-out directory.
    Chunk(ChunkId),
    /// `.<hex>.<pid>.<counter>.tmp`, written by process `pid`.
    Temp { pid: u32 },
    /// Anything else: not ours, left alone.
    Other,
}

/// Classifies file `name` found in fan-out directory `fanout`.
fn classify(fanout: &Path, name: &std::ffi::OsStr) -> Entry {
    let Some(name) = name.to_str() else { return Entry::Other };
    let prefix = fanout.file_name().and_then(|p| p.to_str()).unwrap_or("");
    if let Ok(id) = ChunkId::from_hex(name) {
        return if name[..2] == *prefix { Entry::Chunk(id) } else { Entry::Other };
    }
    let Some(inner) = name.strip_prefix('.').and_then(|n| n.strip_suffix(".tmp")) else { return Entry::Other };
    let mut parts = inner.split('.');
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(hex), Some(pid), Some(counter), None)
            if ChunkId::from_hex(hex).is_ok() && counter.parse::<u64>().is_ok() =>
        {
            pid.parse().map_or(Entry::Other, |pid| Entry::Temp { pid })
        }
        _ => Entry::Other,
    }
}

/// Creates `path`, failing if it exists, mode 0644.
fn create_new(path: &Path) -> io::Result<File> {
    OpenOptions::new().write(true).create_new(true).mode(0o644).open(path)
}

/// Compresses `data` with this thread's reusable zstd context.
fn compress(data: &[u8]) -> io::Result<Vec<u8>> {
    COMPRESSOR.with(|c| {
        let mut slot = c.borrow_mut();
        let compressor = match slot.as_mut() {
            Some(c) => c,
            None => slot.insert(zstd::bulk::Compressor::new(ZSTD_LEVEL)?),
        };
        let result = compressor.compress(data);
        if result.is_err() {
            // Never reuse a context an operation failed in.
            *slot = None;
        }
        result
    })
}

/// Decompresses `data` into `out` (empty) with this thread's reusable zstd
/// context; fails rather than growing `out` past its capacity, which is
/// reserved to at least [`MAX_CHUNK_BYTES`].
fn decompress_into(data: &[u8], out: &mut Vec<u8>) -> io::Result<()> {
    out.reserve(MAX_CHUNK_BYTES);
    DECOMPRESSOR.with(|d| {
        let mut slot = d.borrow_mut();
        let decompressor = match slot.as_mut() {
            Some(d) => d,
            None => slot.insert(zstd::bulk::Decompressor::new()?),
        };
        let result = decompressor.decompress_to_buffer(data, out).map(|_| ());
        if result.is_err() {
            // Never reuse a context an operation failed in.
            *slot = None;
        }
        result
    })
}

#[cfg(test)]
#[path = "chunk_store_tests.rs"]
mod tests;
