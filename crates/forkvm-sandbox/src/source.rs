//! What sandboxes are spawned from: a ready snapshot directory plus the description of
//! its devices, either a tag in the snapshot store or a template snapshot in the cache.
//!
//! A tagged snapshot is self-contained (its read-only disks live in its `disk/`
//! directory), so each child's devices are the snapshot's, with the child's own vsock
//! socket.

use crate::guest::GUEST_CID;
use crate::template_snapshot::TemplateSnapshot;
use forkvm_snapshot::chain::{self, AssembleStats, AssembledCache, Chain, ChainError};
use forkvm_snapshot::{DevicesMeta, DiskMeta, SnapshotMeta, Store, StoreError, DISK_DIR};
use forkvm_vmm::devices::attach::{BlockConfig, DeviceConfig, LayeredConfig, NetConfig, TapSource, VsockConfig};
use forkvm_vmm::devices::virtio::blk::LazySource;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Chain(#[from] ChainError),
    #[error("snapshot {0} has no device description (it was written by an older forkvm); make it again")]
    NoDevices(PathBuf),
    #[error("snapshot {0} has no vsock device: it is not a Linux sandbox with an agent")]
    NoAgent(PathBuf),
    #[error("snapshot {dir}: disk {file:?} is not a file name inside its disk/ directory")]
    BadDisk { dir: PathBuf, file: String },
    #[error(
        "snapshot {what} has {has} vCPU(s), not {asked}: a sandbox keeps its snapshot's vCPUs (no CPU hotplug); \
         make a tag with {asked} from a template (snapshot create --vcpus {asked})"
    )]
    Vcpus { what: String, has: u8, asked: u8 },
    #[error("snapshot {tag} was pulled lazily, and its memory's remote: {source}")]
    Lazy { tag: String, source: Box<forkvm_remote::RemoteError> },
}

impl SourceError {
    pub fn code(&self) -> forkvm_api::ErrorCode {
        match self {
            SourceError::Store(e) => e.code(),
            SourceError::Chain(e) => e.code(),
            SourceError::Lazy { source, .. } => source.code(),
            _ => forkvm_api::ErrorCode::BadRequest,
        }
    }
}

/// Refuses `asked` vCPUs for a snapshot whose machine has `meta`'s: a restore keeps the
/// vCPUs it was saved with.
pub fn check_vcpus(what: &str, meta: &SnapshotMeta, asked: Option<u8>) -> Result<(), SourceError> {
    match asked {
        Some(asked) if asked != meta.vcpu_count => {
            Err(SourceError::Vcpus { what: what.to_string(), has: meta.vcpu_count, asked })
        }
        _ => Ok(()),
    }
}

/// A ready snapshot to spawn sandboxes from.
#[derive(Debug, Clone)]
pub struct SpawnSource {
    pub dir: PathBuf,
    /// The tag, when the snapshot is in the store.
    pub tag: Option<String>,
    pub meta: SnapshotMeta,
    devices: DevicesMeta,
    /// The memory image to map when it is not the directory's `memory.img`: a chunked
    /// snapshot's assembled image.
    pub memory: Option<PathBuf>,
    /// A tag pulled lazily with memory chunks still on its remote: each child's memory
    /// arrives while it runs, from a memory server ([`forkvm_remote::lazy`]).
    pub lazy_memory: bool,
    /// Links above the chain's base (0 for a snapshot without a parent).
    pub chain_depth: usize,
    /// What assembling the chain cost, when this call assembled it (first spawn).
    pub assembled: Option<AssembleStats>,
    /// Layered disks whose lower layers come from a vault snapshot (an archive), not
    /// from the directory. Only for a single-sandbox restore: each names one cache.
    pub vault_lowers: Vec<VaultLower>,
}

/// A layered disk a restore rebuilds from a vault snapshot instead of reading its
/// sealed layers from the snapshot directory: an archived sandbox's data disk, whose
/// layers went into the vault encrypted.
#[derive(Debug, Clone)]
pub struct VaultLower {
    /// The disk's position among the VM's block devices.
    pub index: usize,
    /// The snapshot, served lazily.
    pub source: LazySource,
    /// The saved sealed layer ids it stands for (the directory's `layers` of the disk).
    pub replaces: Vec<String>,
}

/// Whether `tag` was pulled lazily and some of its memory chunks are still on the
/// remote. A record whose chunks have all arrived is dropped: the tag is ordinary now.
fn lazily_pulled(store: &Store, tag: &str, chain: &Chain) -> Result<bool, SourceError> {
    use forkvm_remote::lazy::{missing_chunks, LazyRecord};
    let lazy = |source| SourceError::Lazy { tag: tag.to_string(), source: Box::new(source) };
    if LazyRecord::load(store, tag).map_err(lazy)?.is_none() {
        return Ok(false);
    }
    if missing_chunks(store, chain).map_err(lazy)? > 0 {
        return Ok(true);
    }
    LazyRecord::remove(store, tag);
    Ok(false)
}

/// The cache of assembled chain images, under the artefact cache.
pub fn assembled_cache() -> AssembledCache {
    AssembledCache::new(&forkvm_image::kernel::cache_dir())
}

impl SpawnSource {
    /// The ready snapshot `tag` (a `writing` one is a conflict), its chain checked and,
    /// for a chunked snapshot, its memory assembled (once: later calls find it cached).
    pub fn from_tag(store: &Store, tag: &str) -> Result<SpawnSource, SourceError> {
        let chain = SpawnSource::check_tag(store, tag)?;
        let lazy_memory = lazily_pulled(store, tag, &chain)?;
        let (memory, assembled) = match lazy_memory {
            true => (None, None),
            false => {
                let (image, assembled) = assembled_cache().memory_for(store, &chain)?;
                (chain.head().is_chunked().then_some(image), assembled)
            }
        };
        let snap = chain.head().clone();
        let devices = snap.meta.devices.clone().ok_or_else(|| SourceError::NoDevices(snap.path.clone()))?;
        Ok(SpawnSource {
            dir: snap.path,
            tag: Some(tag.to_string()),
            meta: snap.meta,
            devices,
            memory,
            lazy_memory,
            chain_depth: chain.depth(),
            assembled,
            vault_lowers: Vec::new(),
        })
    }

    /// A whole-image snapshot directory outside the store's tags (an archive), checked
    /// like a tag: ready, with an agent and well-formed disks.
    pub fn from_dir(dir: &Path) -> Result<SpawnSource, SourceError> {
        let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let snap =
            forkvm_snapshot::SnapshotDir::open(dir).map_err(|source| StoreError::Invalid { tag: name, source })?;
        let devices = snap.meta.devices.clone().ok_or_else(|| SourceError::NoDevices(dir.to_path_buf()))?;
        if devices.vsock_cid.is_none() {
            return Err(SourceError::NoAgent(dir.to_path_buf()));
        }
        if let Some(d) = devices.disks.iter().find(|d| !d.has_plain_name()) {
            return Err(SourceError::BadDisk { dir: dir.to_path_buf(), file: d.file.clone() });
        }
        Ok(SpawnSource {
            dir: dir.to_path_buf(),
            tag: None,
            meta: snap.meta,
            devices,
            memory: None,
            lazy_memory: false,
            chain_depth: 0,
            assembled: None,
            vault_lowers: Vec::new(),
        })
    }

    /// Whether `tag` could be spawned from, without assembling anything: ready, its chain
    /// intact, with an agent and well-formed disks. Returns the resolved chain.
    pub fn check_tag(store: &Store, tag: &str) -> Result<Chain, SourceError> {
        let chain = chain::resolve(store, tag)?;
        let snap = chain.head();
        let devices = snap.meta.devices.clone().ok_or_else(|| SourceError::NoDevices(snap.path.clone()))?;
        if devices.vsock_cid.is_none() {
            return Err(SourceError::NoAgent(snap.path.clone()));
        }
        // snapshot.json is untrusted: a disk is a plain file name inside `disk/`.
        if let Some(d) = devices.disks.iter().find(|d| !d.has_plain_name()) {
            return Err(SourceError::BadDisk { dir: snap.path.clone(), file: d.file.clone() });
        }
        Ok(chain)
    }

    /// A template snapshot; its devices are the template's (rootfs from the cache).
    pub fn from_template(t: &TemplateSnapshot) -> Result<SpawnSource, SourceError> {
        let snap = forkvm_snapshot::SnapshotDir::open(&t.dir)
            .map_err(|source| StoreError::Invalid { tag: t.artifacts.image.name.clone(), source })?;
        let mut meta = snap.meta;
        meta.template = Some(t.artifacts.image.name.clone());
        // The snapshot holds its disks (hard links of the root image and the data disk's
        // base and layers), recorded as the VM had them.
        let devices = meta.devices.clone().ok_or_else(|| SourceError::NoDevices(t.dir.clone()))?;
        Ok(SpawnSource {
            dir: t.dir.clone(),
            tag: None,
            meta,
            devices,
            memory: None,
            lazy_memory: false,
            chain_depth: 0,
            assembled: None,
            vault_lowers: Vec::new(),
        })
    }

    /// The template the snapshot was made from, if known.
    pub fn template(&self) -> Option<&str> {
        self.meta.template.as_deref()
    }

    /// Whether the snapshot's VM has a network device: each child needs a tap of its own
    /// (`network::NetSlot`).
    pub fn has_network(&self) -> bool {
        self.devices.net.is_some()
    }

    /// The devices of one child: the snapshot's, with `vsock_uds` as its vsock socket,
    /// its layered disks' writable tops under `disk_dir` (`disk<i>/`) and `tap` behind its
    /// network device (a snapshot with one restores only with a tap).
    pub fn devices(&self, vsock_uds: &Path, disk_dir: &Path, tap: Option<TapSource>) -> DeviceConfig {
        let disk_files = self.dir.join(DISK_DIR);
        DeviceConfig {
            vsock: self.devices.vsock_cid.map(|guest_cid| VsockConfig { guest_cid, uds_path: vsock_uds.to_path_buf() }),
            rng: self.devices.rng,
            blocks: self
                .devices
                .disks
                .iter()
                .enumerate()
                .map(|(i, d)| BlockConfig {
                    path: self.disk_path(d),
                    read_only: d.read_only,
                    id: d.id.clone(),
                    layers: d.layers.as_ref().map(|_| {
                        let dir = disk_dir.join(format!("disk{i}"));
                        match self.vault_lowers.iter().find(|v| v.index == i) {
                            Some(v) => LayeredConfig {
                                sealed: Vec::new(),
                                dir,
                                lazy: Some(Box::new(v.source.clone())),
                                replaces: v.replaces.clone(),
                            },
                            None => LayeredConfig {
                                sealed: d.layer_dirs(&disk_files),
                                dir,
                                lazy: None,
                                replaces: Vec::new(),
                            },
                        }
                    }),
                })
                .collect(),
            net: self.devices.net.zip(tap).map(|(n, tap)| NetConfig { tap, mac: n.mac }),
            rate_limits: Default::default(),
        }
    }

    fn disk_path(&self, d: &DiskMeta) -> PathBuf {
        let p = Path::new(&d.file);
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.dir.join(DISK_DIR).join(p)
        }
    }
}

/// Serial of the root disk every Linux sandbox has.
pub const ROOT_DISK_ID: &str = "forkvm-root";
/// Serial of every Linux sandbox's own data disk (layered; the agent mounts it under
/// the root overlay as its writable half).
pub const DATA_DISK_ID: &str = "forkvm-data";

/// Empty volume slots every Linux sandbox boots with (block devices of capacity 0 after
/// its data disk): at most this many volumes per sandbox.
pub const VOLUME_SLOTS: usize = 4;
/// Serial prefix of a volume slot (`forkvm-vol0`, ...).
pub const VOLUME_SLOT_PREFIX: &str = "forkvm-vol";

/// The serial of volume slot `slot`.
pub fn volume_slot_id(slot: usize) -> String {
    format!("{VOLUME_SLOT_PREFIX}{slot}")
}

/// Whether a disk serial names a volume slot (kept out of the sandbox's own disk
/// snapshots and salvage: a volume's data is the volume's).
pub fn is_volume_slot(id: &str) -> bool {
    id.strip_prefix(VOLUME_SLOT_PREFIX).is_some_and(|n| n.parse::<usize>().is_ok_and(|n| n < VOLUME_SLOTS))
}

/// The device description of a template's sandboxes (root disk added by the caller).
pub fn template_devices() -> DevicesMeta {
    DevicesMeta { vsock_cid: Some(GUEST_CID), rng: true, disks: Vec::new(), net: None }
}
