//! Lazy restore from a remote: a tag pulled without its memory, whose sandboxes fetch
//! the memory they touch while they run.
//!
//! `forkvm pull --lazy` installs a chain's metadata, VM state, page maps and disks, and
//! leaves its memory chunks on the remote. It writes a [`LazyRecord`] per link
//! (`<store>/remote-lazy/<tag>.json`): the remote's URL, the key and block cache to use,
//! and, for every memory chunk the chain names, the block holding it. A spawn from such
//! a tag with chunks still missing restores lazily (`forkvm_vmm::vstate::lazy_memory`):
//! its VMM asks a host process for 64 KiB windows ([`serve_lazy_memory`]), which applies
//! the chain's page maps to the window and reads each chunk from the local store, else
//! from the block cache, else from the remote ([`RemoteChunks`]), checks it (it opens
//! under the remote key, and hashes to its name) and keeps it in the store. Once every
//! chunk is local the tag is an ordinary one: later spawns map its assembled image.
//!
//! The VMM never sees the network, the key or the store: only windows on a socket.

use crate::pull::open_block;
use crate::remote::chunk_object;
use crate::workers::parallel;
use crate::{BlockCache, Remote, RemoteError, RemoteKey};
use forkvm_snapshot::chain::{resolve, verify, Chain};
use forkvm_snapshot::memory_windows::{ahead_from_env, serve_windows, ChunkSource, PageMapWindows};
use forkvm_snapshot::page_map::PageMap;
use forkvm_snapshot::{ChunkId, ChunkStore, Store};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Value of [`LazyRecord::format`].
pub const LAZY_FORMAT: &str = "forkvm-lazy-pull";
/// Largest record read (a 64 GiB guest's chunks, named).
const MAX_RECORD_BYTES: u64 = 256 << 20;

/// Where a lazily pulled link's memory chunks are.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LazyRecord {
    pub format: String,
    /// The remote's URL.
    pub remote: String,
    /// The remote key file the pull used.
    pub key_file: PathBuf,
    /// The block cache the pull used.
    pub cache_dir: PathBuf,
    /// Memory chunk (hex) → (block name (hex), its length): one block per chunk.
    pub chunks: BTreeMap<String, (String, u32)>,
}

/// The directory of the records.
fn records_dir(store: &Store) -> PathBuf {
    store.root().join("remote-lazy")
}

/// Where `tag`'s record is (the tag is validated by the caller).
pub fn record_path(store: &Store, tag: &str) -> PathBuf {
    records_dir(store).join(format!("{tag}.json"))
}

impl LazyRecord {
    /// `tag`'s record, if it has one.
    pub fn load(store: &Store, tag: &str) -> Result<Option<LazyRecord>, RemoteError> {
        forkvm_snapshot::validate_tag(tag)
            .map_err(|e| RemoteError::BadUrl { url: tag.into(), reason: e.to_string() })?;
        let path = record_path(store, tag);
        let bytes = match std::fs::metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(RemoteError::Io { step: "reading a lazy-pull record", path, source: e }),
            Ok(m) if m.len() > MAX_RECORD_BYTES => {
                return Err(RemoteError::Io {
                    step: "reading a lazy-pull record",
                    path,
                    source: std::io::Error::other(format!("{} bytes", m.len())),
                })
            }
            Ok(_) => std::fs::read(&path).map_err(RemoteError::io("reading a lazy-pull record", &path))?,
        };
        let bad = |reason: String| RemoteError::Io {
            step: "parsing a lazy-pull record",
            path: path.clone(),
            source: std::io::Error::other(reason),
        };
        let record: LazyRecord = serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?;
        if record.format != LAZY_FORMAT {
            return Err(bad(format!("format {:?}", record.format)));
        }
        Ok(Some(record))
    }

    /// Writes it for `tag` (temporary name, synced, renamed).
    pub fn write(&self, store: &Store, tag: &str) -> Result<(), RemoteError> {
        let dir = records_dir(store);
        std::fs::create_dir_all(&dir).map_err(RemoteError::io("creating the lazy-pull records", &dir))?;
        let path = record_path(store, tag);
        let tmp = dir.join(format!(".{tag}.{}.tmp", std::process::id()));
        let json = serde_json::to_vec(self).expect("a record serializes");
        std::fs::write(&tmp, json).map_err(RemoteError::io("writing a lazy-pull record", &tmp))?;
        std::fs::File::open(&tmp)
            .and_then(|f| f.sync_all())
            .map_err(RemoteError::io("syncing a lazy-pull record", &tmp))?;
        std::fs::rename(&tmp, &path).map_err(RemoteError::io("publishing a lazy-pull record", &path))
    }

    /// Drops `tag`'s record (its memory is all local, or the tag is gone).
    pub fn remove(store: &Store, tag: &str) {
        let _ = std::fs::remove_file(record_path(store, tag));
    }
}

/// How many memory chunks of `chain` the store does not hold.
pub fn missing_chunks(store: &Store, chain: &Chain) -> Result<u64, RemoteError> {
    Ok(chunks_missing(store, chain)?.len() as u64)
}

/// The memory chunks of `chain` the store does not hold, each once.
fn chunks_missing(store: &Store, chain: &Chain) -> Result<std::collections::BTreeSet<ChunkId>, RemoteError> {
    let local = ChunkStore::open(store.root());
    let mut missing = std::collections::BTreeSet::new();
    for link in &chain.links {
        let map = read_map(link)?;
        missing.extend(map.chunks().filter(|id| !local.contains(id)));
    }
    Ok(missing)
}

/// `link`'s page map.
fn read_map(link: &forkvm_snapshot::SnapshotDir) -> Result<PageMap, RemoteError> {
    PageMap::read_file(&link.memory_map_path()).map_err(|e| RemoteError::Io {
        step: "reading a memory map",
        path: link.memory_map_path(),
        source: std::io::Error::other(e),
    })
}

/// What a lazy restore's memory server fetched.
#[derive(Debug, Default)]
pub struct LazyStats {
    /// Chunks read from the store.
    pub local: AtomicU64,
    /// Chunks read from the block cache.
    pub cached: AtomicU64,
    /// Chunks downloaded, and their sealed bytes.
    pub fetched: AtomicU64,
    pub bytes_fetched: AtomicU64,
}

/// A [`ChunkSource`] reading the store first, then the block cache, then the remote;
/// every chunk it brings in goes into the store.
pub struct RemoteChunks {
    record: Arc<LazyRecord>,
    remote: Arc<Remote>,
    key: Arc<RemoteKey>,
    cache: Arc<BlockCache>,
    local: ChunkStore,
    stats: Arc<LazyStats>,
}

impl std::fmt::Debug for RemoteChunks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteChunks").field("remote", &self.record.remote).finish()
    }
}

impl ChunkSource for RemoteChunks {
    fn chunk_into(&mut self, id: &ChunkId, out: &mut Vec<u8>) -> Result<(), String> {
        if self.local.contains(id) {
            self.stats.local.fetch_add(1, Ordering::Relaxed);
            return self.local.get_into(id, out).map_err(|e| e.to_string());
        }
        let hex = id.to_hex();
        let (block_hex, len) = self
            .record
            .chunks
            .get(&hex)
            .ok_or_else(|| format!("chunk {hex} is neither in the store nor on the remote"))?;
        let block = ChunkId::from_hex(block_hex).map_err(|e| format!("chunk {hex}: block name: {}", e.0))?;
        let object = chunk_object(&block);
        let plain = match self.cache.get(&block).and_then(|s| open_block(&self.key, &block, *len, &s).ok()) {
            Some(plain) => {
                self.stats.cached.fetch_add(1, Ordering::Relaxed);
                plain
            }
            None => {
                let sealed = self
                    .remote
                    .get(&object)
                    .map_err(|e| e.to_string())?
                    .ok_or_else(|| format!("{}: {object} is missing", self.record.remote))?;
                let plain = open_block(&self.key, &block, *len, &sealed)
                    .map_err(|r| format!("{}: {object} refused: {r}", self.record.remote))?;
                self.stats.fetched.fetch_add(1, Ordering::Relaxed);
                self.stats.bytes_fetched.fetch_add(sealed.len() as u64, Ordering::Relaxed);
                self.cache.put(&block, &sealed);
                plain
            }
        };
        if ChunkId::of(&plain) != *id {
            return Err(format!("{}: {object} does not hold chunk {hex}", self.record.remote));
        }
        // Kept: the next spawn reads it here (best effort; the window is served anyway).
        if let Ok(_lock) = self.local.lock_shared() {
            let _ = self.local.put(&plain);
        }
        *out = plain;
        Ok(())
    }
}

/// The remote side of a lazy restore, opened: the remote (its client and runtime), key,
/// cache and record that every chunk fetch shares.
#[derive(Clone)]
struct Fetching {
    record: Arc<LazyRecord>,
    remote: Arc<Remote>,
    key: Arc<RemoteKey>,
    cache: Arc<BlockCache>,
    stats: Arc<LazyStats>,
}

impl Fetching {
    fn open(record: LazyRecord) -> Result<Fetching, RemoteError> {
        Ok(Fetching {
            remote: Arc::new(Remote::open(&record.remote)?),
            key: Arc::new(RemoteKey::load(&record.key_file)?),
            cache: Arc::new(BlockCache::configured(&record.cache_dir)),
            stats: Arc::new(LazyStats::default()),
            record: Arc::new(record),
        })
    }

    fn chunks(&self, store: &Store) -> RemoteChunks {
        RemoteChunks {
            record: self.record.clone(),
            remote: self.remote.clone(),
            key: self.key.clone(),
            cache: self.cache.clone(),
            local: ChunkStore::open(store.root()),
            stats: self.stats.clone(),
        }
    }
}

/// One lazily restored VMM's memory server, opened and ready to serve: [`Self::open`]
/// makes everything it needs (the remote's client and runtime included) so that a
/// process forked to serve can close what it inherited before it serves.
pub struct LazyMemoryServer {
    store: Store,
    tag: String,
    chain: Chain,
    fetching: Fetching,
    windows: PageMapWindows,
}

impl std::fmt::Debug for LazyMemoryServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LazyMemoryServer")
            .field("tag", &self.tag)
            .field("remote", &self.fetching.record.remote)
            .finish()
    }
}

impl LazyMemoryServer {
    /// The server of `tag`'s memory: its chain checked (content hashes, map sizes), its
    /// record read and its remote opened.
    pub fn open(store: &Store, tag: &str) -> Result<LazyMemoryServer, RemoteError> {
        let record = LazyRecord::load(store, tag)?.ok_or_else(|| RemoteError::NoTag {
            url: store.root().display().to_string(),
            tag: format!("{tag} (no lazy-pull record)"),
        })?;
        let chain = resolve(store, tag)?;
        if let Some(sealed) = chain.links.iter().find(|l| l.meta.memory_sealed_by.is_some()) {
            return Err(RemoteError::Refused {
                url: record.remote.clone(),
                object: sealed.meta.tag.clone(),
                reason: "its memory is sealed with a sandbox's key: pull it whole".into(),
            });
        }
        // Checked as an assembly checks them: content hashes, then each map's size.
        verify(&chain)?;
        let fetching = Fetching::open(record)?;
        let mem_size = chain.head().meta.mem_size_bytes;
        let mut links = Vec::with_capacity(chain.links.len());
        for link in &chain.links {
            let map = read_map(link)?;
            if map.mem_size != mem_size {
                return Err(RemoteError::Refused {
                    url: fetching.record.remote.clone(),
                    object: link.meta.tag.clone(),
                    reason: format!("its memory map describes {} bytes, the head {mem_size}", map.mem_size),
                });
            }
            links.push((map, Box::new(fetching.chunks(store)) as Box<dyn ChunkSource>));
        }
        let windows = PageMapWindows::new(links, mem_size);
        Ok(LazyMemoryServer { store: store.clone(), tag: tag.into(), chain, fetching, windows })
    }

    /// Serves the memory to a lazily restored VMM on `stream` until it hangs up. When it
    /// said its memory is complete, the chunks no window needed (pages later links
    /// rewrote) are fetched too and the records dropped: the tag is an ordinary local one
    /// from then on. Returns the windows served.
    ///
    /// Unless fetching ahead is off ([`ahead_from_env`]), the chunks the store lacks are
    /// also fetched meanwhile, a few at a time ([`crate::push::jobs`]), so the VMM's own
    /// window-by-window pass finds them local; once they all are, the records go even if
    /// the VMM stopped first.
    pub fn serve(self, stream: UnixStream) -> Result<ServeReport, RemoteError> {
        let LazyMemoryServer { store, tag, chain, fetching, mut windows } = self;
        let (served, ahead) = std::thread::scope(|s| {
            let ahead = ahead_from_env().then(|| s.spawn(|| fetch_missing(&store, &chain, &fetching)));
            let served = serve_windows(stream, &mut windows);
            (served, ahead.map(|t| t.join()))
        });
        let served =
            served.map_err(RemoteError::io("serving memory windows", PathBuf::from(format!("<{tag}'s VMM>"))))?;
        let all_here = matches!(ahead, Some(Ok(Ok(_))));
        if served.complete || all_here {
            complete_locally(&store, &chain, &fetching)?;
        }
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let stats = &fetching.stats;
        Ok(ServeReport {
            windows: served.windows,
            vmm_complete: served.complete,
            chunks_local: n(&stats.local),
            chunks_cached: n(&stats.cached),
            chunks_fetched: n(&stats.fetched),
            bytes_fetched: n(&stats.bytes_fetched),
        })
    }
}

/// What a memory server did, for its line in the sandbox's console log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeReport {
    pub windows: u64,
    /// Whether the VMM said its memory was complete.
    pub vmm_complete: bool,
    pub chunks_local: u64,
    pub chunks_cached: u64,
    pub chunks_fetched: u64,
    /// Sealed bytes downloaded.
    pub bytes_fetched: u64,
}

impl std::fmt::Display for ServeReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} windows served{}; chunks: {} from the store, {} from the block cache, {} downloaded ({} bytes)",
            self.windows,
            if self.vmm_complete { ", the memory complete" } else { "" },
            self.chunks_local,
            self.chunks_cached,
            self.chunks_fetched,
            self.bytes_fetched
        )
    }
}

/// Fetches the chain's chunks the store lacks, in parallel; returns how many.
fn fetch_missing(store: &Store, chain: &Chain, fetching: &Fetching) -> Result<u64, RemoteError> {
    let missing: Vec<ChunkId> = chunks_missing(store, chain)?.into_iter().collect();
    parallel(&missing, |id| {
        let mut buf = Vec::new();
        fetching.chunks(store).chunk_into(id, &mut buf).map_err(|reason| RemoteError::Refused {
            url: fetching.record.remote.clone(),
            object: format!("chunk {}", id.to_hex()),
            reason,
        })?;
        Ok(1)
    })
}

/// Fetches every chunk of the chain the store still lacks, then drops the links'
/// records. Returns the chunks fetched.
fn complete_locally(store: &Store, chain: &Chain, fetching: &Fetching) -> Result<u64, RemoteError> {
    let fetched = fetch_missing(store, chain, fetching)?;
    for link in &chain.links {
        LazyRecord::remove(store, &link.meta.tag);
    }
    Ok(fetched)
}
