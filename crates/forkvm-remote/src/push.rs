//! `forkvm push`: a chain's entries into a remote as sealed blocks, only those it lacks.
//!
//! The store walks the chain ([`write_chain`]) into a [`RemoteSink`], which cuts each
//! entry into blocks and hands the ones the remote lacks to a few upload threads
//! (bounded: [`JOBS_ENV`], default 8) through a bounded queue. The manifest goes up
//! once every block has: it is the commit point (see the crate's doc). The whole push
//! holds a shared lock on the remote ([`crate::lock`]).

use crate::lock::{LockKind, RemoteLock};
use crate::manifest::{RemoteEntry, RemoteManifest, MANIFEST_FORMAT, MANIFEST_VERSION};
use crate::remote::{chunk_object, tag_object};
use crate::{Remote, RemoteError, RemoteKey, BLOCK_BYTES};
pub use forkvm_api::remote::PushReport;
use forkvm_snapshot::chain::{write_chain, AssembledCache, ChainError, ChainSink};
use forkvm_snapshot::pack_archive::SparseExtents;
use forkvm_snapshot::{ChunkId, Store};
use std::collections::HashSet;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Mutex;
use std::time::Instant;

/// Environment variable bounding the parallel uploads and downloads.
pub const JOBS_ENV: &str = "FORKVM_REMOTE_JOBS";
/// zstd level of blocks.
const ZSTD_LEVEL: i32 = 3;

/// Parallel transfers: `$FORKVM_REMOTE_JOBS` (1 to 64), else 8.
pub fn jobs() -> usize {
    std::env::var(JOBS_ENV).ok().and_then(|v| v.trim().parse().ok()).filter(|n| (1..=64).contains(n)).unwrap_or(8)
}

/// Live counts of a transfer, for a progress bar.
#[derive(Debug, Default)]
pub struct Progress {
    /// Blocks found so far (push) or to fetch (pull).
    pub blocks: AtomicU64,
    /// Blocks uploaded or fetched so far.
    pub moved: AtomicU64,
    /// Bytes uploaded or fetched so far (sealed, as on the wire).
    pub bytes: AtomicU64,
}

/// Pushes `tag`'s chain to `remote`, sealed with `key`.
pub fn push(
    store: &Store,
    assembled: &AssembledCache,
    tag: &str,
    remote: &Remote,
    key: &RemoteKey,
    progress: &Progress,
) -> Result<PushReport, RemoteError> {
    let started = Instant::now();
    // Before listing what the remote holds: a collection must not delete a block we
    // skip because it is there, until our manifest names it.
    let lock = RemoteLock::acquire(remote, LockKind::Shared, &format!("push {tag}"))?;
    let present = remote.chunks()?;
    let failure: Mutex<Option<RemoteError>> = Mutex::new(None);
    let (tx, rx) = sync_channel::<(ChunkId, Vec<u8>)>(jobs() * 2);
    let rx = Mutex::new(rx);
    let (walk, sink) = std::thread::scope(|s| {
        for _ in 0..jobs() {
            s.spawn(|| upload_worker(&rx, remote, key, progress, &failure));
        }
        let mut sink = RemoteSink::new(key, tx, &present, progress, &failure);
        let walk = write_chain(store, assembled, tag, &mut sink);
        (walk, sink.finish())
    });
    if let Some(e) = failure.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    let walk = walk?;
    let manifest = RemoteManifest {
        format: MANIFEST_FORMAT.into(),
        version: MANIFEST_VERSION,
        tag: tag.into(),
        generation: next_generation(remote, key, tag)?,
        links: walk.links.clone(),
        description: walk.description,
        entries: sink.entries,
    };
    let sealed = manifest.seal(key.seal()).map_err(|reason| RemoteError::Refused {
        url: remote.url().into(),
        object: tag_object(tag),
        reason: format!("sealing the manifest: {reason}"),
    })?;
    let manifest_bytes = sealed.len() as u64;
    lock.check_held()?;
    remote.put(&tag_object(tag), sealed)?;
    drop(lock);
    Ok(PushReport {
        tag: tag.into(),
        remote: remote.url().into(),
        links: walk.links,
        entries: manifest.entries.len() as u64,
        blocks: sink.blocks,
        blocks_uploaded: progress.moved.load(Ordering::Relaxed),
        blocks_present: sink.present_hits,
        blocks_repeated: sink.repeated,
        bytes_uploaded: progress.bytes.load(Ordering::Relaxed) + manifest_bytes,
        logical_bytes: sink.logical,
        ms: started.elapsed().as_secs_f64() * 1e3,
    })
}

/// The generation of `tag`'s next manifest: past the one on the remote (if it opens),
/// and at least the time in ms, so it grows even over a manifest that does not open.
fn next_generation(remote: &Remote, key: &RemoteKey, tag: &str) -> Result<u64, RemoteError> {
    let previous = match remote.get(&tag_object(tag))? {
        Some(sealed) => RemoteManifest::open(key.seal(), tag, &sealed, remote.url()).map_or(0, |m| m.generation),
        None => 0,
    };
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    Ok(previous.saturating_add(1).max(now_ms))
}

fn upload_worker(
    rx: &Mutex<Receiver<(ChunkId, Vec<u8>)>>,
    remote: &Remote,
    key: &RemoteKey,
    progress: &Progress,
    failure: &Mutex<Option<RemoteError>>,
) {
    loop {
        let job = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
        let Ok((id, plain)) = job else { return };
        if failure.lock().unwrap_or_else(|p| p.into_inner()).is_some() {
            continue; // drain the queue so the walk is not blocked; it stops at its next block
        }
        let sealed = zstd::bulk::compress(&plain, ZSTD_LEVEL)
            .map_err(|e| e.to_string())
            .and_then(|packed| key.seal().seal(&id, &packed).map_err(|e| e.to_string()));
        let result = match sealed {
            Ok(sealed) => {
                let len = sealed.len() as u64;
                remote.put(&chunk_object(&id), sealed).map(|()| len)
            }
            Err(reason) => Err(RemoteError::Refused {
                url: remote.url().into(),
                object: chunk_object(&id),
                reason: format!("sealing: {reason}"),
            }),
        };
        match result {
            Ok(len) => {
                progress.moved.fetch_add(1, Ordering::Relaxed);
                progress.bytes.fetch_add(len, Ordering::Relaxed);
            }
            Err(e) => {
                failure.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
            }
        }
    }
}

/// What a [`RemoteSink`] wrote.
struct SinkTotals {
    entries: Vec<RemoteEntry>,
    blocks: u64,
    present_hits: u64,
    repeated: u64,
    logical: u64,
}

/// Cuts entries into blocks and queues the ones the remote lacks.
struct RemoteSink<'a> {
    key: &'a RemoteKey,
    tx: Option<SyncSender<(ChunkId, Vec<u8>)>>,
    present: &'a HashSet<ChunkId>,
    queued: HashSet<ChunkId>,
    progress: &'a Progress,
    failure: &'a Mutex<Option<RemoteError>>,
    entries: Vec<RemoteEntry>,
    blocks: u64,
    present_hits: u64,
    repeated: u64,
    logical: u64,
}

impl<'a> RemoteSink<'a> {
    fn new(
        key: &'a RemoteKey,
        tx: SyncSender<(ChunkId, Vec<u8>)>,
        present: &'a HashSet<ChunkId>,
        progress: &'a Progress,
        failure: &'a Mutex<Option<RemoteError>>,
    ) -> RemoteSink<'a> {
        RemoteSink {
            key,
            tx: Some(tx),
            present,
            queued: HashSet::new(),
            progress,
            failure,
            entries: Vec::new(),
            blocks: 0,
            present_hits: 0,
            repeated: 0,
            logical: 0,
        }
    }

    /// What it wrote; the queue closes, so the upload threads end once it is empty.
    fn finish(self) -> SinkTotals {
        SinkTotals {
            entries: self.entries,
            blocks: self.blocks,
            present_hits: self.present_hits,
            repeated: self.repeated,
            logical: self.logical,
        }
    }

    /// Stops the walk once an upload has failed (the failure itself is reported by push).
    fn check(&self) -> Result<(), ChainError> {
        if self.failure.lock().unwrap_or_else(|p| p.into_inner()).is_some() {
            return Err(ChainError::BadPack { path: "remote".into(), reason: "an upload failed".into() });
        }
        Ok(())
    }

    /// One block at `offset` of `entry`: recorded, and queued unless the remote has it.
    fn block(&mut self, entry: &mut RemoteEntry, offset: u64, data: Vec<u8>) -> Result<(), ChainError> {
        if data.iter().all(|&b| b == 0) {
            return Ok(()); // a hole
        }
        self.check()?;
        let id = self.key.seal().name_of(&data);
        entry.blocks.push((offset, data.len() as u32, id.to_hex()));
        self.blocks += 1;
        self.logical += data.len() as u64;
        self.progress.blocks.fetch_add(1, Ordering::Relaxed);
        if self.present.contains(&id) {
            self.present_hits += 1;
        } else if !self.queued.insert(id) {
            self.repeated += 1;
        } else if let Some(tx) = &self.tx {
            tx.send((id, data))
                .map_err(|_| ChainError::BadPack { path: "remote".into(), reason: "the uploads stopped".into() })?;
        }
        Ok(())
    }

    /// The data of `file` (length `size`) in `extents`, as blocks.
    fn add_extents(
        &mut self,
        name: &str,
        file: &std::fs::File,
        path: &Path,
        size: u64,
        extents: &[(u64, u64)],
    ) -> Result<(), ChainError> {
        let mut extents = extents.to_vec();
        extents.sort();
        let mut entry = RemoteEntry { name: name.into(), size, blocks: Vec::new() };
        let mut window: Option<(u64, Vec<u8>)> = None;
        for (off, len) in extents {
            let end = off.saturating_add(len).min(size);
            let mut pos = off;
            while pos < end {
                let start = pos / BLOCK_BYTES * BLOCK_BYTES;
                if window.as_ref().map(|w| w.0) != Some(start) {
                    if let Some((at, data)) = window.take() {
                        self.block(&mut entry, at, data)?;
                    }
                    window = Some((start, vec![0; (size - start).min(BLOCK_BYTES) as usize]));
                }
                let upto = end.min(start + BLOCK_BYTES);
                let buf = &mut window.as_mut().expect("set above").1;
                file.read_exact_at(&mut buf[(pos - start) as usize..(upto - start) as usize], pos)
                    .map_err(ChainError::io("reading an entry to push", path))?;
                pos = upto;
            }
        }
        if let Some((at, data)) = window.take() {
            self.block(&mut entry, at, data)?;
        }
        self.entries.push(entry);
        Ok(())
    }
}

impl ChainSink for RemoteSink<'_> {
    fn add_file(&mut self, name: &str, path: &Path) -> Result<(), ChainError> {
        let file = std::fs::File::open(path).map_err(ChainError::io("opening an entry to push", path))?;
        let size = file.metadata().map_err(ChainError::io("reading an entry to push", path))?.len();
        self.add_extents(name, &file, path, size, &[(0, size)])
    }

    fn add_sparse_file(&mut self, name: &str, path: &Path, extents: &SparseExtents) -> Result<(), ChainError> {
        let file = std::fs::File::open(path).map_err(ChainError::io("opening an entry to push", path))?;
        self.add_extents(name, &file, path, extents.size(), extents.extents())
    }

    fn add_bytes(&mut self, name: &str, data: &[u8]) -> Result<(), ChainError> {
        let mut entry = RemoteEntry { name: name.into(), size: data.len() as u64, blocks: Vec::new() };
        for (i, piece) in data.chunks(BLOCK_BYTES as usize).enumerate() {
            self.block(&mut entry, i as u64 * BLOCK_BYTES, piece.to_vec())?;
        }
        self.entries.push(entry);
        Ok(())
    }
}
