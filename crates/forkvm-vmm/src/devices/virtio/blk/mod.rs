//! virtio-blk: a disk for the guest, backed by a raw image file (virtio 1.2 §5.2).
//!
//! The root filesystem and volumes reach the guest through this device. `request.rs`
//! turns a descriptor chain into a typed request (pure, unit-tested without KVM),
//! `device.rs` executes requests with positional I/O on the image, `persist.rs` saves
//! and restores, `metrics.rs` counts.

pub mod device;
pub mod lazy;
pub mod metrics;
pub mod persist;
pub mod request;

pub use device::Block;
pub use lazy::{LazyReport, LazySource, RecordingSaved};
pub use metrics::{BlockMetrics, BlockMetricsSnapshot};
pub use persist::BlockState;
pub use request::{Command, Request, RequestError, Segment};

use std::path::PathBuf;

/// Size of the one request queue.
pub const BLOCK_QUEUE_SIZE: u16 = 256;
/// virtio-blk sectors are always 512 bytes, whatever the image's block size.
pub const SECTOR_SIZE: u64 = 512;
/// Length of the GET_ID answer (the serial), not NUL-terminated when full.
pub const BLOCK_ID_BYTES: usize = virtio_bindings::virtio_blk::VIRTIO_BLK_ID_BYTES as usize;

/// Feature: the disk is read-only.
pub const F_RO: u64 = 1 << virtio_bindings::virtio_blk::VIRTIO_BLK_F_RO;
/// Feature: the device understands FLUSH.
pub const F_FLUSH: u64 = 1 << virtio_bindings::virtio_blk::VIRTIO_BLK_F_FLUSH;

/// Request types (the `type` field of the request header).
pub const T_IN: u32 = virtio_bindings::virtio_blk::VIRTIO_BLK_T_IN;
pub const T_OUT: u32 = virtio_bindings::virtio_blk::VIRTIO_BLK_T_OUT;
pub const T_FLUSH: u32 = virtio_bindings::virtio_blk::VIRTIO_BLK_T_FLUSH;
pub const T_GET_ID: u32 = virtio_bindings::virtio_blk::VIRTIO_BLK_T_GET_ID;

/// Request status byte values.
pub const S_OK: u8 = virtio_bindings::virtio_blk::VIRTIO_BLK_S_OK as u8;
pub const S_IOERR: u8 = virtio_bindings::virtio_blk::VIRTIO_BLK_S_IOERR as u8;
pub const S_UNSUPP: u8 = virtio_bindings::virtio_blk::VIRTIO_BLK_S_UNSUPP as u8;

#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    #[error("disk ID {0:?} is longer than {BLOCK_ID_BYTES} bytes")]
    IdTooLong(String),
    #[error("opening disk image {path}: {source}")]
    OpenImage { path: PathBuf, source: std::io::Error },
    #[error("finding the size of disk image {path}: {source}")]
    SizeImage { path: PathBuf, source: std::io::Error },
    #[error("disk image {path} has {actual} sectors, the snapshot expects {saved}")]
    RestoreCapacity { path: PathBuf, saved: u64, actual: u64 },
    #[error("saved acked features {acked:#x} are not a subset of the offered {offered:#x}")]
    RestoreFeatures { acked: u64, offered: u64 },
    #[error("the device is not active")]
    NotActive,
    #[error("sectors {sector}..+{sectors} are beyond the disk's {capacity} sectors")]
    OutOfRange { sector: u64, sectors: u64, capacity: u64 },
    #[error("write to a read-only disk")]
    ReadOnly,
    #[error("reading the disk image at byte {offset}")]
    ReadImage { offset: u64, source: std::io::Error },
    #[error("writing the disk image at byte {offset}")]
    WriteImage { offset: u64, source: std::io::Error },
    #[error("flushing the disk image")]
    FlushImage(#[source] std::io::Error),
    #[error("accessing a guest buffer")]
    GuestMemory(#[source] vm_memory::GuestMemoryError),
    #[error("request type {0} is not supported")]
    Unsupported(u32),
    #[error("malformed request")]
    Malformed(#[source] RequestError),
    #[error("adding to the used ring")]
    AddUsed(#[source] virtio_queue::Error),
    #[error(transparent)]
    Layers(forkvm_snapshot::LayerError),
    #[error("lazy disk: {0}")]
    Lazy(String),
    #[error(transparent)]
    LazyOpen(#[from] lazy::LazyOpenError),
    #[error("disk {id}: the snapshot has layers {saved}, the restore was given {given}")]
    RestoreLayers { id: String, saved: String, given: String },
}

#[cfg(test)]
mod tests;
