//! `pack` and `unpack`: a whole chain in one hash-checked `.tar.zst`.
//!
//! A pack holds, for each link from the base to the head, its `snapshot.json`,
//! `vmstate.bin` and `memory.map`; each distinct disk image once (`disks/<n>`, a sparse
//! entry: only its data extents); each distinct sealed layer of a layered disk once
//! (`layers/<n>/data`, a sparse entry holding the layer's present blocks, and
//! `layers/<n>/bitmap` as is); and every chunk the maps reference, uncompressed
//! (`chunks/<blake3>`; the archive is compressed as a whole). Files shared by hard link
//! (a disk or layer every link has) are packed once and hard-linked again by unpack. The container ([`crate::pack_archive`]) checks every entry's hash and
//! refuses unsafe names and entry types. On top of that, unpack checks the chain itself
//! (each link's content hash recomputed from its files, parent edges, every referenced
//! chunk present, every layered disk's layers sealed and chained as listed) **in a staging directory before anything enters the store**: a
//! tampered or truncated pack leaves the store as it was. A link whose tag already
//! exists with the same content hash is reused; with different content it is a conflict.

use std::collections::{BTreeSet, HashMap};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::assemble::AssembledCache;
use super::convert::ingest;
use super::disks::{check_layers, disks_of, layer_extents};
use super::{check_disk_names, content_hash, new_staging_dir, resolve, verify, ChainError, MAX_CHAIN_DEPTH};
use crate::chunk_store::{ChunkId, ChunkStore};
use crate::dir::{SnapshotWriter, DISK_DIR, MEMORY_MAP, SNAPSHOT_JSON, VMSTATE_BIN};
use crate::layered_disk::{Layer, BITMAP_FILE, DATA_FILE};
use crate::metadata::{read_meta, MemoryFormat, SnapshotMeta, SnapshotStatus};
use crate::pack_archive::{
    decode_sparse, extract_pack_trusted, PackLimits, PackManifest, PackTrust, PackWriter, SparseExtents,
};
use crate::page_map::PageMap;
use crate::store::{Store, StoreError};
use crate::tag::validate_tag;

/// The chain description a pack carries in its manifest.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
struct PackMeta {
    head: String,
    links: Vec<PackLink>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
struct PackLink {
    tag: String,
    content_hash: String,
    /// Disk file name in the snapshot → pack entry holding it.
    disks: Vec<PackDisk>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
struct PackDisk {
    file: String,
    /// `disks/<n>`: the base image (the whole disk for a plain one), a sparse entry.
    entry: String,
    /// A layered disk's sealed layers, oldest first (empty for a plain image).
    layers: Vec<PackLayer>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
struct PackLayer {
    /// The layer's id, its directory name under `disk/<file>.layers/`.
    name: String,
    /// `layers/<n>`: the pack directory holding its `data` (sparse) and `bitmap`.
    entry: String,
}

/// What `pack` wrote.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PackReport {
    pub path: PathBuf,
    /// Tags from the base to the head.
    pub links: Vec<String>,
    pub chunks: u64,
    pub disks: u64,
    /// Distinct sealed layers of layered disks.
    pub layers: u64,
    /// Bytes of the entries before compression, and of the pack file.
    pub logical_bytes: u64,
    pub pack_bytes: u64,
    pub ms: f64,
}

/// What `unpack` did.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct UnpackReport {
    pub head: String,
    /// Links written into the store, base first.
    pub imported: Vec<String>,
    /// Links already in the store with the same content, reused.
    pub reused: Vec<String>,
    pub chunks_new: u64,
    pub chunks_present: u64,
    pub logical_bytes: u64,
    pub pack_bytes: u64,
    pub ms: f64,
    /// The public key (hex) that signed the pack, if it was signed.
    #[serde(default)]
    pub signed_by: Option<String>,
}

fn chunk_entry(id: &ChunkId) -> String {
    format!("chunks/{}", id.to_hex())
}

fn link_entry(tag: &str, name: &str) -> String {
    format!("snapshots/{tag}/{name}")
}

/// Where [`write_chain`] puts a chain's entries: a pack file ([`PackWriter`]), or an
/// object-storage remote (`forkvm-remote`), which stores them as chunks.
///
/// Entry names are the ones [`accept_entry_name`] accepts; an entry is written once.
pub trait ChainSink {
    /// The whole file at `path`.
    fn add_file(&mut self, name: &str, path: &Path) -> Result<(), ChainError>;
    /// The file at `path`, whose data lies in `extents` (a disk image, a layer's data);
    /// the rest reads as zeros.
    fn add_sparse_file(&mut self, name: &str, path: &Path, extents: &SparseExtents) -> Result<(), ChainError>;
    /// `data` itself (a memory chunk).
    fn add_bytes(&mut self, name: &str, data: &[u8]) -> Result<(), ChainError>;
}

impl ChainSink for PackWriter {
    fn add_file(&mut self, name: &str, path: &Path) -> Result<(), ChainError> {
        Ok(PackWriter::add_file(self, name, path)?)
    }
    fn add_sparse_file(&mut self, name: &str, path: &Path, extents: &SparseExtents) -> Result<(), ChainError> {
        Ok(PackWriter::add_sparse_file(self, name, path, extents)?)
    }
    fn add_bytes(&mut self, name: &str, data: &[u8]) -> Result<(), ChainError> {
        Ok(PackWriter::add_bytes(self, name, data)?)
    }
}

/// What [`write_chain`] wrote into its sink.
#[derive(Debug, Clone, PartialEq)]
pub struct ChainWalk {
    /// Tags from the base to the head.
    pub links: Vec<String>,
    pub chunks: u64,
    pub disks: u64,
    /// Distinct sealed layers of layered disks.
    pub layers: u64,
    /// Bytes of the entries (a sparse entry counts its data and its extent list).
    pub logical_bytes: u64,
    /// The chain's description, which [`install_staged`] takes back: opaque to sinks.
    pub description: serde_json::Value,
}

/// Writes `tag`'s whole chain to `out` (refused if `out` exists). A whole-image
/// snapshot is moved into the chunk store first.
pub fn pack(store: &Store, cache: &AssembledCache, tag: &str, out: &Path) -> Result<PackReport, ChainError> {
    pack_signed(store, cache, tag, out, None)
}

/// [`pack`], signing the pack's manifest with `key` when given (`pack_archive::signature`).
pub fn pack_signed(
    store: &Store,
    cache: &AssembledCache,
    tag: &str,
    out: &Path,
    key: Option<&ed25519_dalek::SigningKey>,
) -> Result<PackReport, ChainError> {
    let started = Instant::now();
    let mut w = PackWriter::create(out)?;
    let walk = write_chain(store, cache, tag, &mut w)?;
    let (pack_bytes, _) = w.finish_signed(walk.description, key)?;
    Ok(PackReport {
        path: out.into(),
        links: walk.links,
        chunks: walk.chunks,
        disks: walk.disks,
        layers: walk.layers,
        logical_bytes: walk.logical_bytes,
        pack_bytes,
        ms: started.elapsed().as_secs_f64() * 1e3,
    })
}

/// Writes every entry of `tag`'s chain into `sink`: each link's `snapshot.json`,
/// `vmstate.bin` and `memory.map`, each distinct disk image and sealed layer once, and
/// every chunk the maps reference. A whole-image snapshot is moved into the chunk store
/// first; a sealed chain (a checkpoint's) is refused.
pub fn write_chain(
    store: &Store,
    cache: &AssembledCache,
    tag: &str,
    sink: &mut dyn ChainSink,
) -> Result<ChainWalk, ChainError> {
    let mut chain = resolve(store, tag)?;
    if chain.head().meta.memory_format == MemoryFormat::Image {
        ingest(store, cache, tag)?;
        chain = resolve(store, tag)?;
    }
    verify(&chain)?;
    // A pack carries plain chunks another store checks by their hashes; a sealed link's
    // are readable only with its sandbox's key, which stays on this host.
    if let Some(link) = chain.links.iter().find(|l| l.meta.memory_sealed_by.is_some()) {
        return Err(ChainError::Sealed {
            tag: link.meta.tag.clone(),
            owner: link.meta.memory_sealed_by.clone().unwrap_or_default(),
            reason: "a sealed snapshot (a checkpoint) is not packed; fork a sandbox from it and branch that".into(),
        });
    }
    let chunks = ChunkStore::open(store.root());
    let mut logical = 0u64;
    let mut disks_by_inode: HashMap<(u64, u64), String> = HashMap::new();
    let mut layers_by_inode: HashMap<[u64; 4], String> = HashMap::new();
    let mut ids: Vec<ChunkId> = Vec::new();
    let mut seen: BTreeSet<ChunkId> = BTreeSet::new();
    let mut links = Vec::new();
    for link in &chain.links {
        let t = &link.meta.tag;
        for name in [SNAPSHOT_JSON, VMSTATE_BIN, MEMORY_MAP] {
            let path = link.path.join(name);
            logical += std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
            sink.add_file(&link_entry(t, name), &path)?;
        }
        let mut disks = Vec::new();
        let disk_dir = link.path.join(DISK_DIR);
        for d in disks_of(&link.meta) {
            let path = disk_dir.join(&d.file);
            let m = std::fs::metadata(&path).map_err(ChainError::io("reading a disk to pack", &path))?;
            let next = format!("disks/{}", disks_by_inode.len());
            let entry = disks_by_inode.entry((m.dev(), m.ino())).or_insert(next.clone()).clone();
            if entry == next {
                let file = std::fs::File::open(&path).map_err(ChainError::io("reading a disk to pack", &path))?;
                let extents = SparseExtents::of_file(&file, m.len())
                    .map_err(ChainError::io("finding a disk's data extents", &path))?;
                logical += extents.encoded_len();
                sink.add_sparse_file(&entry, &path, &extents)?;
            }
            let mut layers = Vec::new();
            for name in d.layers.iter().flatten() {
                let dir = d.layer_dir(&disk_dir, name);
                let (data, bitmap) = (dir.join(DATA_FILE), dir.join(BITMAP_FILE));
                let stat = |p: &Path| std::fs::metadata(p).map_err(ChainError::io("reading a disk layer to pack", p));
                let (md, mb) = (stat(&data)?, stat(&bitmap)?);
                let next = format!("layers/{}", layers_by_inode.len());
                let key = [md.dev(), md.ino(), mb.dev(), mb.ino()];
                let entry = layers_by_inode.entry(key).or_insert(next.clone()).clone();
                if entry == next {
                    let layer = Layer::open_sealed(&dir).map_err(|e| ChainError::DiskLayer {
                        tag: t.clone(),
                        disk: d.file.clone(),
                        layer: name.clone(),
                        reason: e.to_string(),
                    })?;
                    let extents = layer_extents(&layer);
                    logical += extents.encoded_len() + mb.len();
                    sink.add_sparse_file(&format!("{entry}/{DATA_FILE}"), &data, &extents)?;
                    sink.add_file(&format!("{entry}/{BITMAP_FILE}"), &bitmap)?;
                }
                layers.push(PackLayer { name: name.clone(), entry });
            }
            disks.push(PackDisk { file: d.file.clone(), entry, layers });
        }
        let map = PageMap::read_file(&link.memory_map_path())
            .map_err(ChainError::page_map(format!("reading {t}'s memory.map")))?;
        for id in map.chunks() {
            if seen.insert(id) {
                ids.push(id);
            }
        }
        links.push(PackLink {
            tag: t.clone(),
            content_hash: link.meta.content_hash.clone().unwrap_or_default(),
            disks,
        });
    }
    let mut buf = Vec::new();
    for id in &ids {
        chunks.get_into(id, &mut buf).map_err(ChainError::chunks("reading a chunk to pack"))?;
        logical += buf.len() as u64;
        sink.add_bytes(&chunk_entry(id), &buf)?;
    }
    let meta = PackMeta { head: tag.into(), links };
    let description = serde_json::to_value(&meta)
        .map_err(|e| ChainError::BadPack { path: store.root().into(), reason: e.to_string() })?;
    Ok(ChainWalk {
        links: chain.tags(),
        chunks: ids.len() as u64,
        disks: disks_by_inode.len() as u64,
        layers: layers_by_inode.len() as u64,
        logical_bytes: logical,
        description,
    })
}

/// Whether a pack (or a remote's manifest) may hold an entry named `name`: only the
/// names [`write_chain`] writes, each part checked (no other path reaches the disk).
pub fn accept_entry_name(name: &str) -> bool {
    accept_name(name)
}

/// The names a pack may hold (besides its manifest).
fn accept_name(name: &str) -> bool {
    let parts: Vec<&str> = name.split('/').collect();
    match parts.as_slice() {
        ["chunks", hex] => ChunkId::from_hex(hex).is_ok(),
        ["disks", n] => is_index(n),
        ["layers", n, file] => is_index(n) && [DATA_FILE, BITMAP_FILE].contains(file),
        ["snapshots", tag, file] => {
            validate_tag(tag).is_ok() && [SNAPSHOT_JSON, VMSTATE_BIN, MEMORY_MAP].contains(file)
        }
        _ => false,
    }
}

/// `<n>` of `disks/<n>` and `layers/<n>`: a decimal index.
fn is_index(n: &str) -> bool {
    !n.is_empty() && n.len() <= 6 && n.bytes().all(|b| b.is_ascii_digit())
}

/// Whether `entry` names a pack directory of a layer (`layers/<n>`).
fn is_layer_entry(entry: &str) -> bool {
    entry.strip_prefix("layers/").is_some_and(is_index)
}

/// Whether the entry `name` is a sparse entry: a disk image or a layer's data.
fn is_sparse_entry(name: &str) -> bool {
    name.starts_with("disks/") || (name.starts_with("layers/") && name.ends_with(&format!("/{DATA_FILE}")))
}

/// Replaces every staged sparse entry with the file it encodes (holes as holes, synced).
fn decode_sparse_entries(staging: &Path, manifest: &PackManifest) -> Result<(), ChainError> {
    for e in manifest.entries.iter().filter(|e| is_sparse_entry(&e.name)) {
        let encoded = staging.join(&e.name);
        let decoded = staging.join(format!("{}.decoded", e.name));
        decode_sparse(&e.name, &encoded, &decoded)?;
        std::fs::rename(&decoded, &encoded).map_err(ChainError::io("replacing a sparse entry", &encoded))?;
    }
    Ok(())
}

/// A new staging directory in the store, removed however its import ends (unpack, a
/// remote's pull).
#[derive(Debug)]
pub struct StagingDir(PathBuf);

impl StagingDir {
    /// A fresh staging directory for `what` (`unpack`, `pull`, ...).
    pub fn new(store: &Store, what: &str) -> Result<StagingDir, ChainError> {
        Ok(StagingDir(new_staging_dir(store, what)?))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for StagingDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Imports the chain in `pack_path` into `store`. Everything is checked before the
/// store is touched; links already present with the same content are reused.
pub fn unpack(store: &Store, pack_path: &Path) -> Result<UnpackReport, ChainError> {
    unpack_trusted(store, pack_path, &PackTrust::any())
}

/// [`unpack`], refusing (before writing anything) a pack whose signature `trust` does
/// not accept.
pub fn unpack_trusted(store: &Store, pack_path: &Path, trust: &PackTrust) -> Result<UnpackReport, ChainError> {
    let started = Instant::now();
    let pack_bytes = std::fs::metadata(pack_path).map_err(ChainError::io("opening the pack", pack_path))?.len();
    let staging = StagingDir::new(store, "unpack")?;
    let manifest = extract_pack_trusted(pack_path, staging.path(), &accept_name, &PackLimits::configured(), trust)?;
    let signed_by = manifest.signature.as_ref().map(|s| s.key.clone());
    let logical: u64 = manifest.entries.iter().map(|e| e.size).sum();
    decode_sparse_entries(staging.path(), &manifest)?;
    let installed = install_staged(store, staging.path(), &manifest.meta, pack_path)?;
    Ok(UnpackReport {
        head: installed.head,
        imported: installed.imported,
        reused: installed.reused,
        chunks_new: installed.chunks_new,
        chunks_present: installed.chunks_present,
        logical_bytes: logical,
        pack_bytes,
        ms: started.elapsed().as_secs_f64() * 1e3,
        signed_by,
    })
}

/// What [`install_staged`] put into the store.
#[derive(Debug, Clone, PartialEq)]
pub struct Installed {
    pub head: String,
    /// Links written into the store, base first.
    pub imported: Vec<String>,
    /// Links already in the store with the same content, reused.
    pub reused: Vec<String>,
    pub chunks_new: u64,
    pub chunks_present: u64,
    /// Chunks neither staged nor in the store ([`ChunksStaged::Some`] only).
    pub chunks_missing: u64,
}

/// The chain `description` (a [`ChainWalk`]'s) names, when every link of it is in
/// `store` already with the same content: an import of it would only reuse them.
pub fn installed_already(store: &Store, description: &serde_json::Value) -> Option<Vec<String>> {
    let meta: PackMeta = serde_json::from_value(description.clone()).ok()?;
    let present = |l: &PackLink| {
        store.lookup(&l.tag).is_ok_and(|d| d.meta.content_hash.as_deref() == Some(l.content_hash.as_str()))
    };
    (!meta.links.is_empty() && meta.links.iter().all(present))
        .then(|| meta.links.iter().map(|l| l.tag.clone()).collect())
}

/// Imports a chain staged as files in `staging` (the entries [`write_chain`] wrote,
/// sparse ones as the files they encode; a `chunks/<hex>` entry may be missing when
/// the store has that chunk) and described by `description` (the walk's). Everything
/// is checked before the store is touched; links already present with the same
/// content are reused. `source` names where the chain came from in errors.
pub fn install_staged(
    store: &Store,
    staging: &Path,
    description: &serde_json::Value,
    source: &Path,
) -> Result<Installed, ChainError> {
    install_staged_with(store, staging, description, source, ChunksStaged::All)
}

/// Which memory chunks a staged chain must bring (or the store have).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunksStaged {
    /// Every chunk its maps name.
    All,
    /// Those staged; the others stay where they are (a lazy pull's, on a remote).
    Some,
}

/// [`install_staged`], with chunks missing from both the staging directory and the
/// store allowed when `chunks` says so ([`Installed::chunks_missing`] counts them).
pub fn install_staged_with(
    store: &Store,
    staging: &Path,
    description: &serde_json::Value,
    source: &Path,
    chunks_staged: ChunksStaged,
) -> Result<Installed, ChainError> {
    let bad = |reason: String| ChainError::BadPack { path: source.to_path_buf(), reason };
    let meta: PackMeta =
        serde_json::from_value(description.clone()).map_err(|e| bad(format!("chain description: {e}")))?;
    if meta.links.is_empty() || meta.links.len() > MAX_CHAIN_DEPTH + 1 {
        return Err(bad(format!("{} links (1 to {} expected)", meta.links.len(), MAX_CHAIN_DEPTH + 1)));
    }
    if meta.links.last().map(|l| l.tag.as_str()) != Some(meta.head.as_str()) {
        return Err(bad(format!("head {:?} is not the last link", meta.head)));
    }
    let chunks = ChunkStore::open(store.root());
    let mut metas: Vec<SnapshotMeta> = Vec::new();
    let mut needed: BTreeSet<ChunkId> = BTreeSet::new();
    for (i, link) in meta.links.iter().enumerate() {
        let m = check_link(staging, link, i.checked_sub(1).map(|p| &meta.links[p])).map_err(|m| bad(m.0))?;
        let map_path = staging.join("snapshots").join(&link.tag).join(MEMORY_MAP);
        let map = PageMap::read_file(&map_path).map_err(|e| bad(format!("{}: memory.map: {e}", link.tag)))?;
        if map.mem_size != m.mem_size_bytes || metas.first().is_some_and(|b| b.mem_size_bytes != m.mem_size_bytes) {
            return Err(bad(format!("{}: memory sizes of the links disagree", link.tag)));
        }
        needed.extend(map.chunks());
        metas.push(m);
    }
    let mut chunks_missing = 0;
    for id in &needed {
        if !staging.join(chunk_entry(id)).is_file() && !chunks.contains(id) {
            if chunks_staged == ChunksStaged::All {
                return Err(bad(format!("chunk {id} is referenced but not in the pack")));
            }
            chunks_missing += 1;
        }
    }
    // Which links exist already: the same content is reused, different content refused.
    let mut reuse = Vec::new();
    for link in &meta.links {
        match store.lookup(&link.tag) {
            Ok(existing) if existing.meta.content_hash.as_deref() == Some(link.content_hash.as_str()) => {
                reuse.push(true)
            }
            Ok(_)
            | Err(StoreError::Writing { .. })
            | Err(StoreError::Abandoned { .. })
            | Err(StoreError::Invalid { .. }) => {
                return Err(StoreError::Exists { tag: link.tag.clone(), store: store.snapshots_dir() }.into())
            }
            Err(StoreError::NotFound { .. }) => reuse.push(false),
            Err(e) => return Err(e.into()),
        }
    }
    // Import: chunks (synced) before the snapshots that reference them.
    let _lock = chunks.lock_shared().map_err(ChainError::chunks("locking the chunk store"))?;
    let (mut chunks_new, mut chunks_present) = (0, 0);
    for id in &needed {
        let path = staging.join(chunk_entry(id));
        if !path.is_file() {
            chunks_present += u64::from(chunks.contains(id));
            continue;
        }
        let data = std::fs::read(&path).map_err(ChainError::io("reading a staged chunk", &path))?;
        if ChunkId::of(&data) != *id {
            return Err(bad(format!("chunk {id} does not hash to its name")));
        }
        let put = chunks.put(&data).map_err(ChainError::chunks("storing a chunk"))?;
        if put.new {
            chunks_new += 1;
        } else {
            chunks_present += 1;
        }
    }
    chunks.sync().map_err(ChainError::chunks("syncing imported chunks"))?;
    let (mut imported, mut reused) = (Vec::new(), Vec::new());
    for (link, reuse) in meta.links.iter().zip(reuse) {
        if reuse {
            reused.push(link.tag.clone());
            continue;
        }
        let src = staging.join("snapshots").join(&link.tag);
        let writer = SnapshotWriter::begin(&store.tag_dir(&link.tag)?)
            .map_err(ChainError::dir(format!("importing {}", link.tag)))?;
        for name in [SNAPSHOT_JSON, VMSTATE_BIN, MEMORY_MAP, DISK_DIR] {
            let from = src.join(name);
            if from.exists() {
                std::fs::rename(&from, writer.path(name))
                    .map_err(ChainError::io("moving a staged file into place", &from))?;
            }
        }
        writer.commit().map_err(ChainError::dir(format!("publishing {}", link.tag)))?;
        imported.push(link.tag.clone());
    }
    Ok(Installed { head: meta.head, imported, reused, chunks_new, chunks_present, chunks_missing })
}

/// Checks one staged link against the pack's description and its parent link, puts its
/// disks in place (hard links within the staging directory) and returns its metadata.
fn check_link(
    staging: &Path,
    link: &PackLink,
    parent: Option<&PackLink>,
) -> Result<SnapshotMeta, crate::malformed::Malformed> {
    let tag = &link.tag;
    validate_tag(tag).map_err(|e| format!("link tag: {e}"))?;
    let dir = staging.join("snapshots").join(tag);
    let m = read_meta(&dir.join(SNAPSHOT_JSON)).map_err(|e| format!("{tag}: {e}"))?;
    if m.tag != *tag {
        return Err(format!("{tag}: its snapshot.json names {:?}", m.tag).into());
    }
    if m.status != SnapshotStatus::Ready || m.memory_format != MemoryFormat::Chunked {
        return Err(format!("{tag}: not a ready chunked snapshot").into());
    }
    check_disk_names(&m).map_err(|e| e.to_string())?;
    match (parent, &m.parent_tag, &m.parent_hash) {
        (None, None, None) => {}
        (Some(p), Some(pt), Some(ph)) if *pt == p.tag && *ph == p.content_hash => {}
        _ => return Err(format!("{tag}: its parent edge does not match the pack's chain order").into()),
    }
    let disks = m.devices.iter().flat_map(|d| d.disks.iter());
    for d in disks {
        let Some(pd) = link.disks.iter().find(|x| x.file == d.file) else {
            return Err(format!("{tag}: disk {:?} is not in the pack", d.file).into());
        };
        if !accept_name(&pd.entry) || !pd.entry.starts_with("disks/") {
            return Err(format!("{tag}: disk entry {:?} is not a disk", pd.entry).into());
        }
        let from = staging.join(&pd.entry);
        let disk_dir = dir.join(DISK_DIR);
        std::fs::create_dir_all(&disk_dir).map_err(|e| format!("{tag}: staging disk/: {e}"))?;
        std::fs::hard_link(&from, disk_dir.join(&d.file)).map_err(|e| format!("{tag}: disk {:?}: {e}", pd.entry))?;
        let listed: Vec<&String> = d.layers.iter().flatten().collect();
        let packed: Vec<&String> = pd.layers.iter().map(|l| &l.name).collect();
        if listed != packed {
            return Err(format!("{tag}: disk {:?}: the pack's layers differ from its snapshot.json's", d.file).into());
        }
        for l in &pd.layers {
            if !is_layer_entry(&l.entry) {
                return Err(format!("{tag}: layer entry {:?} is not a layer", l.entry).into());
            }
            let to = d.layer_dir(&disk_dir, &l.name);
            std::fs::create_dir_all(&to).map_err(|e| format!("{tag}: staging layer {}: {e}", l.name))?;
            for file in [DATA_FILE, BITMAP_FILE] {
                std::fs::hard_link(staging.join(&l.entry).join(file), to.join(file))
                    .map_err(|e| format!("{tag}: layer {} ({}/{file}): {e}", l.name, l.entry))?;
            }
        }
    }
    let actual = content_hash(&dir, &m).map_err(|e| e.to_string())?;
    if Some(&actual) != m.content_hash.as_ref() || actual != link.content_hash {
        return Err(format!("{tag}: content hash {actual} does not match the recorded {}", link.content_hash).into());
    }
    check_layers(&dir, &m).map_err(|e| e.to_string())?;
    Ok(m)
}
