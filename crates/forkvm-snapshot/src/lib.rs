//! The forkvm snapshot format.
//!
//! A snapshot is a directory `<store>/snapshots/<tag>/` holding three files:
//!
//! | file            | contents                                                                 | module           |
//! |-----------------|--------------------------------------------------------------------------|------------------|
//! | `snapshot.json` | metadata: tag, status, lineage, guest identity, memory size, vCPU count  | [`metadata`]     |
//! | `vmstate.bin`   | encoded VM state (vCPU, irqchip, devices) in a checksummed container      | [`container`]    |
//! | `memory.img`    | guest memory, byte for byte; sparse — all-zero pages are holes           | [`memory_image`] |
//!
//! `<tag>` follows the single rule in [`tag`]. Directories are written via
//! [`dir::SnapshotWriter`] into `<tag>.partial/` and renamed into place only
//! once every file is synced, so a crash never leaves a half-written snapshot
//! under its real name; [`dir::SnapshotDir::open`] refuses incomplete ones.
//!
//! **Snapshot bytes are untrusted input.** A snapshot directory may have been
//! copied from elsewhere, truncated, or tampered with. Every reader here
//! checks sizes against caps before reading, refuses unknown format versions
//! and unknown fields, and verifies checksums; callers must still treat the
//! decoded VM state as untrusted and validate it before loading it into KVM.

pub mod chain;
pub mod chunk_store;
pub mod container;
pub mod dir;
pub mod disk_references;
pub mod memory_image;
pub mod memory_windows;
pub mod metadata;
pub mod ownership;
pub mod pack_archive;
pub mod page_map;
pub mod store;
pub mod tag;

pub use chunk_store::{ChunkError, ChunkId, ChunkLock, ChunkSeal, ChunkStore, GcReport, PutOutcome, MAX_CHUNK_BYTES};
pub use container::{
    decode_vmstate, encode_vmstate, read_vmstate_file, write_vmstate_file, ContainerError, VMSTATE_FORMAT_VERSION,
    VMSTATE_MAGIC, VMSTATE_MAX_BYTES,
};
pub use dir::{
    rename_noreplace, sync_snapshot_dir, DirError, OpenSnapshotDir, SnapshotDir, SnapshotWriter, DISK_DIR, MEMORY_IMG,
    MEMORY_MAP, SNAPSHOT_JSON, VMSTATE_BIN,
};
pub use disk_references::{DiskReferences, ReferencesError, DISK_REFERENCES};
pub use forkvm_disk::layered_disk::{Layer, LayerError, LayerId, LayerInfo, LayerStack, SealedLayer, StackStats};
/// The disk half, below this crate: `forkvm_snapshot::vault` and `::layered_disk` name
/// `forkvm-disk`'s modules.
pub use forkvm_disk::{flock, layered_disk, malformed, preopened, vault};
pub use memory_image::{
    allocated_bytes, create_image, open_image, write_sparse, MemoryImageError, SparseStats, PAGE_SIZE,
};
pub use metadata::{
    is_layer_name, read_meta, replace_meta, write_meta, write_meta_unsynced, DefaultLimits, DevicesMeta, DiskMeta,
    GuestIdentity, MemoryFormat, MetadataError, NetMeta, SnapshotMeta, SnapshotStatus, METADATA_FORMAT_VERSION,
};
pub use pack_archive::{
    extract_pack, PackEntry, PackError, PackLimits, PackManifest, PackWriter, PACK_FORMAT, PACK_MANIFEST, PACK_VERSION,
};
pub use page_map::{
    apply_page_map, build_page_map, ApplyStats, BuildStats, Extent, ExtentContent, PageMap, PageMapError,
    PAGES_PER_CHUNK,
};
pub use store::{link_layer, link_or_copy, process_alive, writer_pid, Store, StoreEntry, StoreError, WRITER_HOST_PID};
pub use tag::{validate_tag, TagError};
