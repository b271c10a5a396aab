//! Diff-snapshot chains.
//!
//! Agents cache setup steps as snapshots stacked on each other (`pip install numpy`, then
//! pandas). A *chained* snapshot stores its memory in the store's chunk store as a
//! `memory.map` ([`crate::page_map`]) that holds only the pages differing from its
//! parent, and records `parent_tag` plus the parent's content hash. A chain is paid for
//! once: the first spawn from a head verifies every link against its content hash and
//! assembles the flat memory image into the artefact cache under the head's content hash
//! ([`assemble`]); later spawns walk the small `snapshot.json` files to check the links
//! still hold, then map the cached image. Spawn time does not grow with depth.
//!
//! Around that: [`convert`] turns snapshots into chunked ones (ingest, diff, compact),
//! [`lineage`] answers "what depends on what" (info, rmi, garbage collection), [`measure`]
//! sizes the diff a full branch could have been, and
//! [`mod@pack`] ships a whole chain as one hash-checked `.tar.zst`.
//!
//! A snapshot's **content hash** ([`content_hash`]) covers its `memory.map` (which names
//! every chunk by its BLAKE3 hash), its `vmstate.bin`, its parent's content hash, its
//! memory size and its disks' names and sizes (and a layered disk's layer ids). Disk
//! contents are not hashed: disks are immutable images shared (hard-linked) by every
//! snapshot of a template, and sealed layers are immutable and named by id; [`disks`]
//! checks that the layers a link lists are there and chain up.

pub mod assemble;
pub mod convert;
pub mod disks;
pub mod lineage;
pub mod measure;
pub mod pack;

use std::collections::HashSet;
use std::io;
use std::path::{Path, PathBuf};

use crate::chunk_store::ChunkError;
use crate::dir::{DirError, SnapshotDir, DISK_DIR, MEMORY_MAP, VMSTATE_BIN};
use crate::metadata::{MemoryFormat, MetadataError, SnapshotMeta};
use crate::page_map::PageMapError;
use crate::store::{Store, StoreError};

pub use assemble::{AssembleStats, AssembledCache};
pub use convert::{compact, ingest, write_diff, ConvertReport};
pub use lineage::{collect_garbage, dependents, depth_in, info, remove, ChainInfo, RemoveMode, RemoveReport};
pub use measure::{measure_diff, DiffMeasure};
pub use pack::{
    accept_entry_name, install_staged, install_staged_with, installed_already, pack, pack_signed, unpack,
    unpack_trusted, write_chain, ChainSink, ChainWalk, ChunksStaged, Installed, PackReport, StagingDir, UnpackReport,
};

/// Longest chain accepted (links above the base). Deeper chains should be compacted.
pub const MAX_CHAIN_DEPTH: usize = 64;

/// Why a chain could not be resolved, verified, assembled or changed.
#[derive(Debug, thiserror::Error)]
pub enum ChainError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("snapshot {tag:?} is not bootable: its parent {parent:?} is gone (removed with `rmi --force`?)")]
    ParentMissing { tag: String, parent: String },
    #[error("snapshot {tag:?} is not bootable: parent {parent:?} has content hash {found}, but {tag:?} was made on top of {expected}: the parent was replaced")]
    ParentChanged { tag: String, parent: String, expected: String, found: String },
    #[error("snapshot {tag:?} is not bootable: parent {parent:?} is not usable: {reason}")]
    ParentUnusable { tag: String, parent: String, reason: String },
    #[error("snapshot {tag:?}: {reason}")]
    Malformed { tag: String, reason: String },
    #[error("snapshot {tag:?} is not bootable: disk {disk:?}, layer {layer}: {reason}")]
    DiskLayer { tag: String, disk: String, layer: String, reason: String },
    #[error("snapshot {tag:?}: chain deeper than {max} links; compact it (`forkvm snapshot-compact`)")]
    TooDeep { tag: String, max: usize },
    #[error("snapshot {tag:?}: its chain loops back onto itself")]
    Cycle { tag: String },
    #[error("snapshot {tag:?}: its files do not match its content hash (recorded {recorded}, found {actual}): corrupt or tampered")]
    ContentMismatch { tag: String, recorded: String, actual: String },
    #[error("snapshot {tag:?} has dependents: {} (use --cascade to delete them too, or --force to orphan them)", dependents.join(", "))]
    HasDependents { tag: String, dependents: Vec<String> },
    #[error("{step}: {source}")]
    Chunks { step: String, source: ChunkError },
    #[error("{step}: {source}")]
    PageMap { step: String, source: PageMapError },
    #[error("{step} ({path}): {source}")]
    Io { step: String, path: PathBuf, source: io::Error },
    #[error("{step}: {source}")]
    Meta { step: String, source: MetadataError },
    #[error("{step}: {source}")]
    Dir { step: String, source: DirError },
    #[error("pack {path}: {reason}")]
    BadPack { path: PathBuf, reason: String },
    #[error("{0}")]
    Pack(#[from] crate::pack_archive::PackError),
    #[error("snapshot {tag:?}: its memory is sealed with sandbox {owner}'s key: {reason}")]
    Sealed { tag: String, owner: String, reason: String },
}

/// Whose key seals the memory chunks a diff writes (a checkpoint's: its sandbox's).
#[derive(Debug, Clone)]
pub struct MemorySeal {
    /// The sandbox whose key it is (recorded as the snapshot's `memory_sealed_by`).
    pub owner: String,
    pub seal: crate::chunk_store::ChunkSeal,
}

impl ChainError {
    /// `not_found`, `conflict`, `bad_request` or `internal` (the API's status classes).
    pub fn code(&self) -> forkvm_api::ErrorCode {
        match self {
            ChainError::Store(e) => e.code(),
            ChainError::ParentMissing { .. }
            | ChainError::ParentChanged { .. }
            | ChainError::ParentUnusable { .. }
            | ChainError::DiskLayer { .. }
            | ChainError::Sealed { .. }
            | ChainError::HasDependents { .. } => forkvm_api::ErrorCode::Conflict,
            ChainError::Pack(crate::pack_archive::PackError::NoSpace { .. }) => forkvm_api::ErrorCode::DiskFull,
            ChainError::Pack(crate::pack_archive::PackError::Io { .. }) => forkvm_api::ErrorCode::Internal,
            ChainError::TooDeep { .. } | ChainError::BadPack { .. } | ChainError::Pack(_) => {
                forkvm_api::ErrorCode::BadRequest
            }
            _ => forkvm_api::ErrorCode::Internal,
        }
    }

    /// For a conflict: the state the API reports (`not_bootable`, `has_dependents`).
    pub fn state(&self) -> Option<&'static str> {
        match self {
            ChainError::ParentMissing { .. }
            | ChainError::ParentChanged { .. }
            | ChainError::ParentUnusable { .. }
            | ChainError::Malformed { .. }
            | ChainError::DiskLayer { .. }
            | ChainError::Sealed { .. }
            | ChainError::ContentMismatch { .. } => Some("not_bootable"),
            ChainError::HasDependents { .. } => Some("has_dependents"),
            _ => None,
        }
    }

    /// A host file operation `step` on `path` failed.
    pub fn io(step: impl Into<String>, path: &Path) -> impl FnOnce(io::Error) -> ChainError {
        let (step, path) = (step.into(), path.to_path_buf());
        move |source| ChainError::Io { step, path, source }
    }

    pub(crate) fn chunks(step: impl Into<String>) -> impl FnOnce(ChunkError) -> ChainError {
        let step = step.into();
        move |source| ChainError::Chunks { step, source }
    }

    pub(crate) fn page_map(step: impl Into<String>) -> impl FnOnce(PageMapError) -> ChainError {
        let step = step.into();
        move |source| ChainError::PageMap { step, source }
    }

    pub(crate) fn dir(step: impl Into<String>) -> impl FnOnce(DirError) -> ChainError {
        let step = step.into();
        move |source| ChainError::Dir { step, source }
    }

    pub(crate) fn meta(step: impl Into<String>) -> impl FnOnce(MetadataError) -> ChainError {
        let step = step.into();
        move |source| ChainError::Meta { step, source }
    }
}

/// A resolved chain: every link ready and linked to the next by content hash.
#[derive(Debug, Clone)]
pub struct Chain {
    /// Base first, head last.
    pub links: Vec<SnapshotDir>,
}

impl Chain {
    /// The snapshot the chain was resolved from.
    pub fn head(&self) -> &SnapshotDir {
        self.links.last().expect("a chain has at least one link")
    }

    /// Links above the base: 0 for a snapshot without a parent.
    pub fn depth(&self) -> usize {
        self.links.len() - 1
    }

    /// Tags from the base to the head.
    pub fn tags(&self) -> Vec<String> {
        self.links.iter().map(|l| l.meta.tag.clone()).collect()
    }
}

/// Walks `tag`'s chain down to its base through the metadata only (cheap: one small
/// `snapshot.json` per link), checking each link: the parent exists and is ready, its
/// recorded content hash is the one the child was made on, links are chunked, no loop,
/// no deeper than [`MAX_CHAIN_DEPTH`]. The head's layered disks are checked too (the
/// disks a spawn boots; [`disks::check_layers`], bitmap reads only). File contents are
/// verified at assembly.
pub fn resolve(store: &Store, tag: &str) -> Result<Chain, ChainError> {
    let head = store.lookup(tag)?;
    check_own_meta(&head)?;
    check_disk_names(&head.meta)?;
    disks::check_layers(&head.path, &head.meta)?;
    let mut links = vec![head];
    let mut seen: HashSet<String> = HashSet::from([tag.to_string()]);
    loop {
        let child = links.last().expect("non-empty");
        let Some(parent_tag) = child.meta.parent_tag.clone() else { break };
        let child_tag = child.meta.tag.clone();
        if links.len() > MAX_CHAIN_DEPTH {
            return Err(ChainError::TooDeep { tag: tag.to_string(), max: MAX_CHAIN_DEPTH });
        }
        if !seen.insert(parent_tag.clone()) {
            return Err(ChainError::Cycle { tag: tag.to_string() });
        }
        let expected = child.meta.parent_hash.clone().ok_or_else(|| ChainError::Malformed {
            tag: child_tag.clone(),
            reason: format!("it names parent {parent_tag:?} but no parent content hash"),
        })?;
        let parent = match store.lookup(&parent_tag) {
            Ok(p) => p,
            Err(StoreError::NotFound { .. }) => {
                return Err(ChainError::ParentMissing { tag: child_tag, parent: parent_tag })
            }
            Err(e) => {
                return Err(ChainError::ParentUnusable { tag: child_tag, parent: parent_tag, reason: e.to_string() })
            }
        };
        check_own_meta(&parent).map_err(|e| ChainError::ParentUnusable {
            tag: child_tag.clone(),
            parent: parent_tag.clone(),
            reason: e.to_string(),
        })?;
        let found = parent.meta.content_hash.clone().unwrap_or_default();
        if found != expected {
            return Err(ChainError::ParentChanged { tag: child_tag, parent: parent_tag, expected, found });
        }
        links.push(parent);
    }
    links.reverse();
    Ok(Chain { links })
}

/// Checks what one link's metadata says about itself: a parent only on a chunked
/// snapshot, and a well-formed content hash on every chunked one.
fn check_own_meta(snap: &SnapshotDir) -> Result<(), ChainError> {
    let tag = &snap.meta.tag;
    let malformed = |reason: String| ChainError::Malformed { tag: tag.clone(), reason };
    match snap.meta.memory_format {
        MemoryFormat::Image if snap.meta.parent_tag.is_some() => {
            Err(malformed("it names a parent but its memory is a whole image".into()))
        }
        MemoryFormat::Image => Ok(()),
        MemoryFormat::Chunked => match &snap.meta.content_hash {
            Some(h) if is_hash(h) => Ok(()),
            Some(h) => Err(malformed(format!("content hash {h:?} is not 64 lowercase hex digits"))),
            None => Err(malformed("a chunked snapshot without a content hash".into())),
        },
    }
}

/// Whether `s` is a BLAKE3 hash as this module writes them (64 lowercase hex digits);
/// checked before a hash from untrusted metadata becomes a path component.
pub fn is_hash(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The content hash of the chunked snapshot in `dir` described by `meta`, from its files.
pub fn content_hash(dir: &Path, meta: &SnapshotMeta) -> Result<String, ChainError> {
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read(&path).map_err(ChainError::io(format!("reading {name} to hash it"), &path))
    };
    let map = read(MEMORY_MAP)?;
    let vmstate = read(VMSTATE_BIN)?;
    let mut disks = Vec::new();
    check_disk_names(meta)?;
    if let Some(devices) = &meta.devices {
        for d in &devices.disks {
            let path = dir.join(DISK_DIR).join(&d.file);
            let size = std::fs::metadata(&path).map_err(ChainError::io("sizing a disk to hash it", &path))?.len();
            let mut line = format!("disk {} {} {} {size}", d.id, d.file, d.read_only);
            if let Some(layers) = &d.layers {
                // Layer ids name content: a layer is immutable once sealed.
                line.push_str(&format!(" layers {}", layers.join(",")));
            }
            disks.push(line + "\n");
        }
    }
    Ok(hash_parts(&map, &vmstate, meta, &disks))
}

/// `snapshot.json` is untrusted: each disk must be a plain file name inside `disk/`.
pub(crate) fn check_disk_names(meta: &SnapshotMeta) -> Result<(), ChainError> {
    let disks = meta.devices.iter().flat_map(|d| d.disks.iter());
    for d in disks {
        if !d.has_plain_name() {
            let reason = format!("disk {:?} is not a file name", d.file);
            return Err(ChainError::Malformed { tag: meta.tag.clone(), reason });
        }
    }
    Ok(())
}

fn hash_parts(map: &[u8], vmstate: &[u8], meta: &SnapshotMeta, disks: &[String]) -> String {
    let mut h = blake3::Hasher::new();
    h.update(b"forkvm snapshot content v1\n");
    h.update(format!("memory.map {}\n", blake3::hash(map).to_hex()).as_bytes());
    h.update(format!("vmstate.bin {}\n", blake3::hash(vmstate).to_hex()).as_bytes());
    h.update(format!("parent {}\n", meta.parent_hash.as_deref().unwrap_or("-")).as_bytes());
    h.update(format!("mem_size {}\n", meta.mem_size_bytes).as_bytes());
    for d in disks {
        h.update(d.as_bytes());
    }
    h.finalize().to_hex().to_string()
}

/// Recomputes the content hash of every link and compares it with the recorded one, and
/// checks every link's layered disks ([`disks::check_layers`]).
pub fn verify(chain: &Chain) -> Result<(), ChainError> {
    for link in &chain.links {
        check_disk_names(&link.meta)?;
        disks::check_layers(&link.path, &link.meta)?;
        if link.meta.memory_format != MemoryFormat::Chunked {
            continue;
        }
        let actual = content_hash(&link.path, &link.meta)?;
        let recorded = link.meta.content_hash.clone().unwrap_or_default();
        if actual != recorded {
            return Err(ChainError::ContentMismatch { tag: link.meta.tag.clone(), recorded, actual });
        }
    }
    Ok(())
}

/// Where `store` keeps staging directories of multi-step operations (a diff's full
/// branch, an unpack): on the store's filesystem so results move in with a rename.
pub fn staging_root(store: &Store) -> PathBuf {
    store.root().join("staging")
}

/// A fresh staging directory `<store>/staging/<what>-<pid>-<n>`.
pub fn new_staging_dir(store: &Store, what: &str) -> Result<PathBuf, ChainError> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = staging_root(store).join(format!("{what}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(ChainError::io("creating a staging directory", &dir))?;
    Ok(dir)
}

/// Removes staging directories whose creating process is gone. Returns their names.
pub fn sweep_staging(store: &Store) -> Vec<String> {
    let mut removed = Vec::new();
    let Ok(entries) = std::fs::read_dir(staging_root(store)) else { return removed };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let pid = name.rsplit('-').nth(1).and_then(|p| p.parse::<u32>().ok());
        if pid.is_some_and(|p| !crate::store::process_alive(p)) && std::fs::remove_dir_all(e.path()).is_ok() {
            removed.push(name);
        }
    }
    removed.sort();
    removed
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
