//! `forkvm pull`: a tag's chain from a remote into the store, fetching only what the
//! host lacks.
//!
//! Memory chunks the store holds already are not fetched; every other block comes from
//! the host's [`BlockCache`] or the remote (a few downloads at a time, [`jobs`]), is
//! opened with the remote key and re-hashed against its name, and is written at its
//! offset into a staging directory. Only once every block is in does the store's
//! install step check the chain (content hashes, parent edges, layers) and move it in:
//! a refused block, a missing object or a cut-off pull leaves the store as it was. A
//! manifest older than one this host pulled before is refused ([`crate::seen`]).

use crate::lazy::{LazyRecord, LAZY_FORMAT};
use crate::manifest::RemoteManifest;
use crate::push::Progress;
use crate::remote::{chunk_object, tag_object};
use crate::workers::parallel;
use crate::{BlockCache, Remote, RemoteError, RemoteKey};
pub use forkvm_api::remote::PullReport;
use forkvm_snapshot::chain::{install_staged_with, installed_already, ChunksStaged, StagingDir};
use forkvm_snapshot::{ChunkId, ChunkStore, Store};
use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// One block to bring in.
struct Job {
    file: Arc<File>,
    offset: u64,
    len: u32,
    id: ChunkId,
}

/// Pulls `tag`'s chain from `remote` into `store`.
pub fn pull(
    store: &Store,
    tag: &str,
    remote: &Remote,
    key: &RemoteKey,
    cache: &BlockCache,
    progress: &Progress,
) -> Result<PullReport, RemoteError> {
    pull_with(store, tag, remote, key, cache, progress, false)
}

/// [`pull`] without the memory chunks the store lacks: they stay on the remote, named by
/// a lazy-pull record per link ([`crate::lazy`]), and sandboxes spawned from the tag
/// fetch the memory they touch as they run.
pub fn pull_lazy(
    store: &Store,
    tag: &str,
    remote: &Remote,
    key: &RemoteKey,
    cache: &BlockCache,
    progress: &Progress,
) -> Result<PullReport, RemoteError> {
    pull_with(store, tag, remote, key, cache, progress, true)
}

fn pull_with(
    store: &Store,
    tag: &str,
    remote: &Remote,
    key: &RemoteKey,
    cache: &BlockCache,
    progress: &Progress,
    lazy: bool,
) -> Result<PullReport, RemoteError> {
    let started = Instant::now();
    forkvm_snapshot::validate_tag(tag)
        .map_err(|e| RemoteError::BadUrl { url: remote.url().into(), reason: e.to_string() })?;
    let sealed = remote
        .get(&tag_object(tag))?
        .ok_or_else(|| RemoteError::NoTag { url: remote.url().into(), tag: tag.into() })?;
    let manifest_bytes = sealed.len() as u64;
    let manifest = RemoteManifest::open(key.seal(), tag, &sealed, remote.url())?;
    crate::seen::check(store, remote.url(), tag, manifest.generation)?;
    // Every link here already: nothing to fetch (not even the cached disk blocks).
    if let Some(reused) = installed_already(store, &manifest.description) {
        crate::seen::record(store, remote.url(), tag, manifest.generation)?;
        let blocks = manifest.entries.iter().map(|e| e.blocks.len() as u64).sum();
        return Ok(PullReport {
            tag: tag.into(),
            remote: remote.url().into(),
            imported: Vec::new(),
            reused,
            blocks,
            blocks_local: blocks,
            blocks_cached: 0,
            blocks_fetched: 0,
            bytes_fetched: manifest_bytes,
            chunks_new: 0,
            chunks_left_remote: 0,
            ms: started.elapsed().as_secs_f64() * 1e3,
        });
    }
    let staging = StagingDir::new(store, "pull")?;
    let local = ChunkStore::open(store.root());
    let (mut jobs_list, mut blocks, mut blocks_local) = (Vec::new(), 0u64, 0u64);
    let mut left_remote = BTreeMap::new();
    for entry in &manifest.entries {
        let checked = entry.checked_blocks().map_err(|reason| refused(remote, &tag_object(tag), reason))?;
        blocks += checked.len() as u64;
        let in_store = entry.name.strip_prefix("chunks/").and_then(|hex| ChunkId::from_hex(hex).ok());
        if in_store.is_some_and(|id| local.contains(&id)) {
            blocks_local += checked.len() as u64;
            continue;
        }
        if let (true, Some(id)) = (lazy, in_store) {
            // A memory chunk is at most one block, holding all of it.
            match checked.as_slice() {
                [(0, len, block)] if u64::from(*len) == entry.size => {
                    left_remote.insert(id.to_hex(), (block.to_hex(), *len));
                    continue;
                }
                _ => return Err(refused(remote, &tag_object(tag), format!("{}: not one whole block", entry.name))),
            }
        }
        let path = staging.path().join(&entry.name);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(RemoteError::io("staging a pulled entry", dir))?;
        }
        let file = File::create_new(&path).map_err(RemoteError::io("staging a pulled entry", &path))?;
        file.set_len(entry.size).map_err(RemoteError::io("sizing a pulled entry", &path))?;
        let file = Arc::new(file);
        for (offset, len, id) in checked {
            jobs_list.push(Job { file: file.clone(), offset, len, id });
        }
    }
    progress.blocks.store(jobs_list.len() as u64, Ordering::Relaxed);
    let blocks_cached = parallel(&jobs_list, |job| fetch(remote, key, cache, job, progress).map(u64::from))?;
    let chunks_left_remote = left_remote.len() as u64;
    // The records go first: a link installed without its chunks is never without them.
    let records = LazyRecords::write(store, &manifest.links, remote, key, cache, left_remote)?;
    let installed = install_staged_with(
        store,
        staging.path(),
        &manifest.description,
        Path::new(remote.url()),
        if lazy { ChunksStaged::Some } else { ChunksStaged::All },
    )?;
    records.keep();
    crate::seen::record(store, remote.url(), tag, manifest.generation)?;
    let _ = cache.trim();
    Ok(PullReport {
        tag: tag.into(),
        remote: remote.url().into(),
        imported: installed.imported,
        reused: installed.reused,
        blocks,
        blocks_local,
        blocks_cached,
        blocks_fetched: progress.moved.load(Ordering::Relaxed) - blocks_cached,
        bytes_fetched: progress.bytes.load(Ordering::Relaxed) + manifest_bytes,
        chunks_new: installed.chunks_new,
        chunks_left_remote,
        ms: started.elapsed().as_secs_f64() * 1e3,
    })
}

/// The lazy-pull records of a pull's links, removed again unless kept (the install
/// failed: nothing of the chain is in the store).
struct LazyRecords<'a> {
    store: &'a Store,
    tags: Vec<String>,
}

impl<'a> LazyRecords<'a> {
    fn write(
        store: &'a Store,
        links: &[String],
        remote: &Remote,
        key: &RemoteKey,
        cache: &BlockCache,
        chunks: BTreeMap<String, (String, u32)>,
    ) -> Result<LazyRecords<'a>, RemoteError> {
        let mut written = LazyRecords { store, tags: Vec::new() };
        if chunks.is_empty() {
            return Ok(written);
        }
        let record = LazyRecord {
            format: LAZY_FORMAT.into(),
            remote: remote.url().into(),
            key_file: key.path().into(),
            cache_dir: cache.dir().into(),
            chunks,
        };
        for tag in links {
            record.write(store, tag)?;
            written.tags.push(tag.clone());
        }
        Ok(written)
    }

    fn keep(mut self) {
        self.tags.clear();
    }
}

impl Drop for LazyRecords<'_> {
    fn drop(&mut self) {
        for tag in &self.tags {
            LazyRecord::remove(self.store, tag);
        }
    }
}

fn refused(remote: &Remote, object: &str, reason: String) -> RemoteError {
    RemoteError::Refused { url: remote.url().into(), object: object.into(), reason }
}

/// Opens sealed block `id`: its content, checked against its name and length.
pub(crate) fn open_block(key: &RemoteKey, id: &ChunkId, len: u32, sealed: &[u8]) -> Result<Vec<u8>, String> {
    let packed = key
        .seal()
        .open(id, sealed)
        .ok_or("it does not open under the remote key (another key, tampered with, or another block's)")?;
    let plain = zstd::bulk::decompress(&packed, len as usize).map_err(|e| format!("zstd: {e}"))?;
    if plain.len() != len as usize || key.seal().name_of(&plain) != *id {
        return Err("its content does not hash to its name".into());
    }
    Ok(plain)
}

/// Brings one block in; whether it came from the cache.
fn fetch(
    remote: &Remote,
    key: &RemoteKey,
    cache: &BlockCache,
    job: &Job,
    progress: &Progress,
) -> Result<bool, RemoteError> {
    let object = chunk_object(&job.id);
    let (plain, from_cache) = match cache.get(&job.id).and_then(|s| open_block(key, &job.id, job.len, &s).ok()) {
        Some(plain) => (plain, true),
        None => {
            let sealed = remote.get(&object)?.ok_or_else(|| {
                refused(
                    remote,
                    &object,
                    "missing: the remote lost a block its manifest names (push the tag again)".into(),
                )
            })?;
            let plain = open_block(key, &job.id, job.len, &sealed).map_err(|r| refused(remote, &object, r))?;
            progress.bytes.fetch_add(sealed.len() as u64, Ordering::Relaxed);
            cache.put(&job.id, &sealed);
            (plain, false)
        }
    };
    job.file
        .write_all_at(&plain, job.offset)
        .map_err(RemoteError::io("writing a pulled block", PathBuf::from(&object)))?;
    progress.moved.fetch_add(1, Ordering::Relaxed);
    Ok(from_cache)
}
