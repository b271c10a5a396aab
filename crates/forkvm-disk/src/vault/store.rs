//! [`Vault`]: opening a vault, taking snapshots, listing them.
//!
//! Why this exists: this is the write path the runtime calls every minute, and the
//! one place that orders the crash-safety steps (see [`super`]): stale temps removed,
//! chunks written, `syncfs`, manifest committed by one rename.

use super::chunks::Chunks;
use super::crypto::{self, SubKeys, NONCE_LEN};
use super::fsutil::{self, create_dir, create_no_clobber, is_temp_name};
use super::manifest::{self, DiskMap, Manifest, MAX_BASE_KEY_LEN, MAX_MANIFEST_BYTES, WINDOW_BLOCKS};
use super::{io_err, validate_name, FaultPoint, SandboxKey, VaultError};
use crate::chunk_id::ChunkId;
use crate::layered_disk::{blocks_for, Layer, LayerId, BLOCK_SIZE, DATA_FILE};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// First bytes of the key check file.
const KEYCHECK_MAGIC: [u8; 8] = *b"FKVMVKC1";
const KEYCHECK_FILE: &str = "keycheck";
const LOCK_FILE: &str = "lock";
pub(crate) const SNAPSHOTS_DIR: &str = "snapshots";

/// One sandbox's vault.
#[derive(Debug)]
pub struct Vault {
    pub(crate) root: PathBuf,
    pub(crate) keys: SubKeys,
    pub(crate) chunks: Chunks,
    /// Test hook: a pause after each new chunk, so a crash test can kill a snapshot in
    /// the middle of its writes however fast the disk is.
    stall_per_chunk: Option<std::time::Duration>,
}

/// One disk to snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskInput {
    /// The disk's id, unique within the sandbox (a name: see [`super::validate_name`]).
    pub id: String,
    /// Opaque name of the base image the layers sit on (at most 1024 bytes).
    pub base_key: String,
    /// Every sealed layer of the disk's stack, oldest first (at least one).
    pub layers: Vec<PathBuf>,
}

/// One disk of a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskInfo {
    /// The disk's id.
    pub id: String,
    /// The base image's name, as given.
    pub base_key: String,
    /// Disk size in bytes.
    pub size: u64,
    /// Newest sealed layer covered (hex id).
    pub layer_id: String,
    /// Blocks above the base in the snapshot.
    pub blocks: u64,
    /// Extents (chunks referenced) in its map.
    pub extents: u64,
}

/// A snapshot, as listed or as just taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// Sequence number (newer is larger).
    pub seq: u64,
    /// When it was taken.
    pub created_unix_ms: u64,
    /// True when [`Vault::snapshot`] found nothing new and wrote nothing: this is the
    /// newest existing snapshot.
    pub unchanged: bool,
    /// Its disks.
    pub disks: Vec<DiskInfo>,
    /// Size of the distinct chunk files it references.
    pub stored_bytes: u64,
    /// Chunks this call wrote (0 when listed or unchanged).
    pub written_chunks: u64,
    /// Bytes this call wrote in chunk files (0 when listed or unchanged).
    pub written_bytes: u64,
}

/// A held `flock` on `<root>/lock`.
#[derive(Debug)]
pub(crate) struct VaultLock(#[allow(dead_code)] File);

impl Vault {
    /// Opens (creating) the vault at `root` for the sandbox whose key is `key`. A vault
    /// created with another key is refused with a `key` error.
    pub fn open(root: &Path, key: SandboxKey) -> Result<Vault, VaultError> {
        create_dir(root, 0o700)?;
        create_dir(&root.join("chunks"), 0o700)?;
        create_dir(&root.join(SNAPSHOTS_DIR), 0o700)?;
        let keys = SubKeys::derive(key.bytes());
        let check = root.join(KEYCHECK_FILE);
        if !check.exists() {
            let (nonce, ct) = crypto::seal(&keys.aead, &KEYCHECK_MAGIC, b"", &check)?;
            create_no_clobber(&check, &[&KEYCHECK_MAGIC[..], &nonce, &ct].concat(), 0o600)?;
        }
        let bytes = fsutil::read_capped(&check, 128)?;
        let ok = bytes.len() > 8 + NONCE_LEN
            && bytes[..8] == KEYCHECK_MAGIC
            && crypto::open(&keys.aead, &bytes[8..8 + NONCE_LEN], &KEYCHECK_MAGIC, &bytes[8 + NONCE_LEN..])
                .is_some_and(|p| p.is_empty());
        if !ok {
            return Err(VaultError::Key {
                path: check,
                reason: "the vault was created with another sandbox key (or its key check is damaged)".to_string(),
            });
        }
        let chunks = Chunks::open(root, keys.clone())?;
        Ok(Vault { root: root.to_path_buf(), keys, chunks, stall_per_chunk: None })
    }

    /// Makes every new chunk of later snapshots wait `pause` after it is written (crash
    /// tests; the runtime enables it only under `FORKVM_FAULT_INJECTION=1`).
    pub fn stall_each_chunk(&mut self, pause: std::time::Duration) {
        self.stall_per_chunk = Some(pause);
    }

    /// Chunk files read (decrypted and verified, or refused) through this handle so far:
    /// restores, exports and lazy layers. For tests and benchmarks.
    pub fn chunk_reads(&self) -> u64 {
        self.chunks.reads()
    }

    /// The vault's root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    pub(crate) fn lock(&self, op: libc::c_int) -> Result<VaultLock, VaultError> {
        let path = self.root.join(LOCK_FILE);
        let file = crate::flock::lock_file(&path, op).map_err(io_err("locking", &path))?;
        Ok(VaultLock(file))
    }

    fn snapshots_dir(&self) -> PathBuf {
        self.root.join(SNAPSHOTS_DIR)
    }

    pub(crate) fn manifest_path(&self, seq: u64) -> PathBuf {
        self.snapshots_dir().join(format!("{seq:016}.snap"))
    }

    /// Sequence numbers of the committed manifests, ascending (temps ignored).
    pub(crate) fn seqs(&self) -> Result<Vec<u64>, VaultError> {
        let dir = self.snapshots_dir();
        let mut out = Vec::new();
        for entry in fs::read_dir(&dir).map_err(io_err("listing snapshots", &dir))? {
            let entry = entry.map_err(io_err("listing snapshots", &dir))?;
            let name = entry.file_name();
            let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(".snap")) else { continue };
            if stem.len() == 16 && stem.bytes().all(|c| c.is_ascii_digit()) {
                out.extend(stem.parse::<u64>().ok());
            }
        }
        out.sort_unstable();
        Ok(out)
    }

    /// Reads and decrypts manifest `seq`.
    pub(crate) fn load(&self, seq: u64) -> Result<Manifest, VaultError> {
        let path = self.manifest_path(seq);
        let bytes = match fsutil::read_capped(&path, MAX_MANIFEST_BYTES) {
            Err(VaultError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                return Err(VaultError::NotFound { what: format!("snapshot {seq}"), path });
            }
            other => other?,
        };
        manifest::decode(&bytes, seq, &self.keys.aead, &path)
    }

    /// The newest snapshot's sequence number.
    pub fn latest(&self) -> Result<Option<u64>, VaultError> {
        let _lock = self.lock(libc::LOCK_SH)?;
        Ok(self.seqs()?.last().copied())
    }

    /// Every snapshot, oldest first. A manifest that does not decrypt or parse is an
    /// error, never skipped.
    pub fn list(&self) -> Result<Vec<SnapshotInfo>, VaultError> {
        let _lock = self.lock(libc::LOCK_SH)?;
        self.seqs()?.into_iter().map(|seq| Ok(self.info_of(&self.load(seq)?, false))).collect()
    }

    pub(crate) fn info_of(&self, m: &Manifest, unchanged: bool) -> SnapshotInfo {
        let names: HashSet<ChunkId> = m.disks.iter().flat_map(DiskMap::chunk_names).collect();
        SnapshotInfo {
            seq: m.seq,
            created_unix_ms: m.created_unix_ms,
            unchanged,
            disks: m
                .disks
                .iter()
                .map(|d| DiskInfo {
                    id: d.id.clone(),
                    base_key: d.base_key.clone(),
                    size: d.size,
                    layer_id: d.layer_id.clone(),
                    blocks: d.blocks(),
                    extents: d.extents.len() as u64,
                })
                .collect(),
            stored_bytes: names.iter().map(|n| self.chunks.stored_size(n)).sum(),
            written_chunks: 0,
            written_bytes: 0,
        }
    }

    /// Snapshots `disks`: uploads the blocks of the layers sealed since the newest
    /// snapshot (all layers of a disk whose newest snapshot is of another lineage) and
    /// commits a manifest with every disk's full map. When no disk has a new layer,
    /// writes nothing and returns the newest snapshot with `unchanged: true`.
    pub fn snapshot(&self, disks: &[DiskInput]) -> Result<SnapshotInfo, VaultError> {
        self.snapshot_inner(disks, now_unix_ms(), None)
    }

    /// [`Vault::snapshot`] with a given creation time (retention tests).
    #[cfg(test)]
    pub(crate) fn snapshot_at(&self, disks: &[DiskInput], created_unix_ms: u64) -> Result<SnapshotInfo, VaultError> {
        self.snapshot_inner(disks, created_unix_ms, None)
    }

    pub(crate) fn snapshot_inner(
        &self,
        disks: &[DiskInput],
        created_unix_ms: u64,
        fault: Option<FaultPoint>,
    ) -> Result<SnapshotInfo, VaultError> {
        check_inputs(disks)?;
        let _lock = self.lock(libc::LOCK_EX)?;
        self.remove_temps()?;
        let seqs = self.seqs()?;
        let prev = seqs.last().map(|&s| self.load(s)).transpose()?;
        let plans = disks
            .iter()
            .map(|d| plan(d, prev.as_ref().and_then(|p| p.disks.iter().find(|m| m.id == d.id))))
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(prev) = &prev {
            let same_disks = prev.disks.len() == disks.len();
            if same_disks && plans.iter().all(|p| p.new_from == p.layers.len()) {
                return Ok(self.info_of(prev, true));
            }
        }
        let mut stats = (0u64, 0u64);
        let mut maps = Vec::with_capacity(plans.len());
        for (input, plan) in disks.iter().zip(plans) {
            maps.push(self.upload(input, plan, &mut stats, fault)?);
        }
        self.chunks.sync()?;
        if fault == Some(FaultPoint::BeforeManifest) {
            return Err(VaultError::Fault("killed before writing the manifest"));
        }
        let seq = seqs.last().map_or(1, |s| s + 1);
        let m = Manifest { seq, created_unix_ms, disks: maps };
        let path = self.manifest_path(seq);
        let tmp = fsutil::write_temp(&path, &manifest::encode(&m, &self.keys.aead, &path)?, 0o600)?;
        if fault == Some(FaultPoint::BeforeCommit) {
            return Err(VaultError::Fault("killed before committing the manifest"));
        }
        fsutil::commit(&tmp, &path)?;
        let mut info = self.info_of(&m, false);
        (info.written_chunks, info.written_bytes) = stats;
        Ok(info)
    }

    /// Removes temp files of killed writers (under the exclusive lock only).
    pub(crate) fn remove_temps(&self) -> Result<(), VaultError> {
        self.chunks.remove_temps()?;
        let dir = self.snapshots_dir();
        for entry in fs::read_dir(&dir).map_err(io_err("listing snapshots", &dir))? {
            let entry = entry.map_err(io_err("listing snapshots", &dir))?;
            if entry.file_name().to_str().is_some_and(is_temp_name) {
                fs::remove_file(entry.path()).map_err(io_err("removing stale temp file", &entry.path()))?;
            }
        }
        Ok(())
    }

    /// Computes one disk's new map, writing the chunks of every window a new layer
    /// touched. A touched window is rebuilt from all layers (newest holder of each
    /// block), which equals the old map overlaid with the new layers.
    fn upload(
        &self,
        input: &DiskInput,
        plan: Plan,
        stats: &mut (u64, u64),
        fault: Option<FaultPoint>,
    ) -> Result<DiskMap, VaultError> {
        let Plan { layers, data, new_from, mut map, size } = plan;
        let mut touched = BTreeSet::new();
        for layer in &layers[new_from..] {
            let mut from = 0;
            while let Some(b) = layer.bitmap().next_one(from) {
                touched.insert(b / WINDOW_BLOCKS);
                from = (b / WINDOW_BLOCKS + 1) * WINDOW_BLOCKS;
            }
        }
        let blocks = blocks_for(size);
        for w in touched {
            let (lo, hi) = (w * WINDOW_BLOCKS, ((w + 1) * WINDOW_BLOCKS).min(blocks));
            let stale: Vec<u64> = map.range(lo..hi).map(|(&k, _)| k).collect();
            for k in stale {
                map.remove(&k);
            }
            let mut run: Option<(u64, Vec<u8>)> = None;
            for b in lo..=hi {
                let source = (b < hi).then(|| layers.iter().rposition(|l| l.is_present(b))).flatten();
                let Some(i) = source else {
                    if let Some((first, plain)) = run.take() {
                        let count = b - first;
                        let die = fault == Some(FaultPoint::AfterChunks(stats.0));
                        let put = self.chunks.put(&plain, die)?;
                        if put.new {
                            stats.0 += 1;
                            stats.1 += put.bytes;
                            if let Some(pause) = self.stall_per_chunk {
                                std::thread::sleep(pause);
                            }
                        }
                        map.insert(first, (count, put.name));
                    }
                    continue;
                };
                let (_, plain) = run.get_or_insert_with(|| (b, Vec::with_capacity(64 << 10)));
                let at = plain.len();
                plain.resize(at + layers[i].block_len(b), 0);
                let path = layers[i].dir().join(DATA_FILE);
                data[i].read_exact_at(&mut plain[at..], b * BLOCK_SIZE).map_err(io_err("reading layer data", &path))?;
            }
        }
        let layer_id = layers.last().map_or(LayerId::BASE, Layer::id).to_string();
        let extents = map.into_iter().map(|(first, (count, name))| (first, count, name.to_hex())).collect();
        Ok(DiskMap { id: input.id.clone(), base_key: input.base_key.clone(), size, layer_id, extents })
    }

    /// Removes the whole vault. The only destructive call besides retention.
    pub fn destroy(self) -> Result<(), VaultError> {
        let _lock = self.lock(libc::LOCK_EX)?;
        fs::remove_dir_all(&self.root).map_err(io_err("removing the vault", &self.root))?;
        fsutil::sync_dir(fsutil::parent_of(&self.root))
    }
}

/// What to upload for one disk.
struct Plan {
    /// All its sealed layers, oldest first, with their data files.
    layers: Vec<Layer>,
    data: Vec<File>,
    /// Index of the first layer the previous snapshot does not cover.
    new_from: usize,
    /// The previous snapshot's map (empty if not of this lineage): first block →
    /// (block count, chunk).
    map: BTreeMap<u64, (u64, ChunkId)>,
    size: u64,
}

/// Opens a disk's layers, checks their chain, and finds where the previous map ends.
fn plan(input: &DiskInput, prev: Option<&DiskMap>) -> Result<Plan, VaultError> {
    let mut layers: Vec<Layer> = Vec::with_capacity(input.layers.len());
    let mut data = Vec::with_capacity(input.layers.len());
    for dir in &input.layers {
        let layer =
            Layer::open_sealed(dir).map_err(|source| VaultError::Layer { step: "opening a sealed layer", source })?;
        let parent = layers.last().map_or(LayerId::BASE, Layer::id);
        if layer.parent() != parent {
            return Err(VaultError::Invalid {
                what: "layers",
                reason: format!("{}: parent {} is not the layer before it ({parent})", dir.display(), layer.parent()),
            });
        }
        if layers.first().is_some_and(|l| l.disk_size() != layer.disk_size()) {
            return Err(VaultError::Invalid {
                what: "layers",
                reason: format!("{}: disk size differs from the first layer's", dir.display()),
            });
        }
        let path = dir.join(DATA_FILE);
        data.push(File::open(&path).map_err(io_err("opening layer data", &path))?);
        layers.push(layer);
    }
    let size = layers[0].disk_size();
    let lineage = prev.filter(|p| p.base_key == input.base_key && p.size == size).and_then(|p| {
        let k = layers.iter().position(|l| l.id().to_string() == p.layer_id)?;
        Some((k + 1, p))
    });
    let (new_from, map) = match lineage {
        Some((new_from, p)) => {
            let mut map = BTreeMap::new();
            for (first, count, hex) in &p.extents {
                // Validated when the manifest was decoded.
                let name =
                    ChunkId::from_hex(hex).map_err(|e| VaultError::Invalid { what: "map", reason: e.to_string() })?;
                map.insert(*first, (*count, name));
            }
            (new_from, map)
        }
        None => (0, BTreeMap::new()),
    };
    Ok(Plan { layers, data, new_from, map, size })
}

fn check_inputs(disks: &[DiskInput]) -> Result<(), VaultError> {
    let mut ids = HashSet::new();
    for d in disks {
        validate_name("disk id", &d.id)?;
        if !ids.insert(d.id.as_str()) {
            return Err(VaultError::Invalid { what: "disks", reason: format!("disk {} given twice", d.id) });
        }
        if d.base_key.len() > MAX_BASE_KEY_LEN {
            return Err(VaultError::Invalid {
                what: "base key",
                reason: format!("disk {}: longer than {MAX_BASE_KEY_LEN} bytes", d.id),
            });
        }
        if d.layers.is_empty() {
            return Err(VaultError::Invalid {
                what: "layers",
                reason: format!("disk {}: at least one sealed layer is needed", d.id),
            });
        }
    }
    Ok(())
}

fn now_unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}
