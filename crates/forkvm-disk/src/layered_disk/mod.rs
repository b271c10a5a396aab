//! Layered disks: an immutable base image, sealed layers, and one writable top (DESIGN §5).
//!
//! Why this exists: every sandbox needs its own writable disk derived from a shared
//! template image, and a branch or snapshot must capture that disk consistently with
//! guest memory without copying it. Copying a multi-GiB image per fork or per snapshot
//! is out of the question; sealing a layer is O(1) in the disk size.
//!
//! A disk is a stack: reads of each 4 KiB block come from the newest layer holding
//! that block (top → sealed layers, newest first → base); writes go to the top.
//! [`LayerStack::seal`] turns the top into a sealed, immutable layer and starts an
//! empty top over it, which is what a branch does during its pause and what continuous
//! snapshots do every minute. A sealed layer holds only the blocks written since the
//! previous seal; [`Layer::present_blocks`] reads them out for the chunk store.
//!
//! The virtio-blk device serves it to the guest (every Linux sandbox's data disk, see
//! `docs/disks.md`); snapshots hard-link its sealed layers, and the vault encrypts them.
//!
//! # On disk
//!
//! The base is any readable file (or block device); its size is the disk's size. A
//! layer is a directory holding two files:
//!
//! | file     | content |
//! |----------|---------|
//! | `data`   | sparse file of the disk's size; block `i` at offset `i * 4096`; holes where the layer has no block |
//! | `bitmap` | header, allocation bitmap (1 bit per block: present in this layer), CRC-32 — see below |
//!
//! A present block that reads back as zeros is present: zeros written by the guest
//! must not fall through to older data. A hole in `data` whose bit is clear means
//! nothing; its bytes are never read.
//!
//! `bitmap`, version 1, little-endian:
//!
//! | offset | size | field |
//! |--------|------|-------|
//! | 0      | 8    | magic `FKVMLAYR` |
//! | 8      | 4    | format version (1) |
//! | 12     | 4    | flags: bit 0 = sealed; other bits must be 0 |
//! | 16     | 4    | block size (4096) |
//! | 20     | 4    | reserved, 0 |
//! | 24     | 8    | disk size in bytes (at most [`MAX_DISK_BYTES`]) |
//! | 32     | 8    | block count = ⌈disk size / 4096⌉ |
//! | 40     | 16   | layer id (never all zero) |
//! | 56     | 16   | parent id: the layer this one sits on, all zero for the base |
//! | 72     | 8·⌈blocks/64⌉ | u64 words: block `i` is bit `i % 64` of word `i / 64`; bits past the end are 0 |
//! | end−4  | 4    | CRC-32 (IEEE, `crc32fast`) of every byte before it |
//!
//! The file is untrusted input when restoring: its length is capped before it is read,
//! its length must be exactly what the header implies, and every field is checked. The
//! ids chain the stack: opening checks each layer's parent id is the id of the layer
//! below it, so a wrong order or another disk's layer is refused rather than read.
//! (A future compaction that merges layers `a..=b` keeps `b`'s id and `a`'s parent:
//! the id names "the disk as of this layer".)
//!
//! # Crash guarantees
//!
//! The durable state of a stack is its files as of the last successful
//! [`LayerStack::flush`] (or seal). After a crash at any point — during a write, a
//! flush or a seal — opening the stack again succeeds and:
//!
//! * **Blocks not present in the top's last flushed bitmap read exactly as at that
//!   flush.** They fall through to sealed layers and the base, which are never
//!   written. Data written into the top for such a block after the flush is ignored
//!   because its bit was never persisted (and is overwritten by the next write to it:
//!   a partial write copies the fall-through block first).
//! * **Blocks present in the top's last flushed bitmap** read as their flushed content
//!   or any content written to them since, possibly torn within a 4 KiB block: the
//!   top is overwritten in place, like a disk without a write cache. That is the
//!   virtio-blk contract: only writes acknowledged before a FLUSH are promised.
//! * **Flush order:** `fdatasync(data)`, then the bitmap is written to `bitmap.tmp`,
//!   fsynced, renamed over `bitmap`, and the directory fsynced. A bit is therefore never
//!   durable before the data it marks.
//! * **Sealed layers are never written.** Their data files are opened read-only, and no
//!   block present in an older bitmap is written in place anywhere but the top.
//! * **Seal is one rename.** [`LayerStack::seal`] syncs the top's data, creates the new
//!   empty top completely (in `<new>.partial/`, renamed into place), and only then
//!   commits by renaming a sealed bitmap over the old top's. A crash before that rename
//!   leaves the old top as the top and an empty, unreferenced new top; after it, the
//!   old top is sealed and the new top exists. [`LayerStack::recover_seal`] opens
//!   either outcome.
//!
//! Dropping a stack does **not** flush: the caller flushes when the guest asks (virtio
//! FLUSH) and on orderly shutdown. Nothing here locks the files: one process owns a
//! top at a time, which the controller guarantees.

mod bitmap;
mod builder;
mod layer;
mod merge;
pub mod sealed_bitmaps;
mod stack;

pub use bitmap::dir_holds_sealed as dir_holds_sealed_layer;
/// The bitmap file's header and its atomic read/write, for layers built elsewhere in
/// the crate (the vault's lazy cache layer).
pub(crate) use bitmap::{read_file as read_bitmap_file, write_file as write_bitmap_file, Header as BitmapHeader};
pub use bitmap::{Bitmap, LAYER_FORMAT_VERSION, LAYER_MAGIC};
pub use builder::SealedLayerBuilder;
pub use layer::{inspect, Layer, LayerInfo, PresentBlocks};
pub use merge::merge_layers;
pub use stack::{LayerStack, LazyLower, SealedLayer, StackStats};

use std::fmt;
use std::io;
use std::path::PathBuf;

/// Layers track the disk in blocks of this many bytes.
pub const BLOCK_SIZE: u64 = 4096;
/// Largest disk a layer may describe (1 TiB: a 32 MiB bitmap per layer).
pub const MAX_DISK_BYTES: u64 = 1 << 40;
/// A layer directory's data file.
pub const DATA_FILE: &str = "data";
/// A layer directory's bitmap file.
pub const BITMAP_FILE: &str = "bitmap";

/// Offers the two files of the sealed layer at `dir` ([`crate::preopened`]), opened
/// read-only now, while this process may: a branch that captures the layer takes its
/// files over (root's, 0600), and this process and the children it forks still reopen
/// them by path (a fork's restore, a merge).
pub fn offer_sealed_layer(dir: &std::path::Path) -> io::Result<()> {
    offer_layer_as(dir, dir)
}

/// Offers the files of the layer at `from` (this process's offers, else opened now) at
/// `to` too: a name a forked child gives its source's layer, which the host side links.
pub fn offer_layer_as(from: &std::path::Path, to: &std::path::Path) -> io::Result<()> {
    for name in [DATA_FILE, BITMAP_FILE] {
        let file = match crate::preopened::offered_file(&from.join(name), false) {
            Some(file) => file?,
            None => std::fs::File::open(from.join(name))?,
        };
        crate::preopened::offer(&to.join(name), file, false);
    }
    Ok(())
}

/// Withdraws the offers [`offer_sealed_layer`] made for the layer at `dir` (removed).
pub fn withdraw_layer(dir: &std::path::Path) {
    for name in [DATA_FILE, BITMAP_FILE] {
        crate::preopened::withdraw(&dir.join(name));
    }
}

/// Number of blocks of a `size`-byte disk (the last may be partial).
pub fn blocks_for(size: u64) -> u64 {
    size.div_ceil(BLOCK_SIZE)
}

/// Identifies a layer, i.e. the disk's content as of that layer. All zero means
/// "no layer": the base image.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct LayerId(pub [u8; 16]);

impl LayerId {
    /// The id a layer directly on the base names as its parent.
    pub const BASE: LayerId = LayerId([0; 16]);

    /// A fresh id, unique in practice (it only has to tell layers apart, not resist
    /// an adversary): a hash of the process id, the time, a counter and the directory.
    pub(crate) fn generate(dir: &std::path::Path) -> LayerId {
        use std::os::unix::ffi::OsStrExt;
        use std::sync::atomic::{AtomicU64, Ordering};
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let mut h = blake3::Hasher::new();
        h.update(&std::process::id().to_le_bytes());
        h.update(&now.to_le_bytes());
        h.update(&COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
        h.update(dir.as_os_str().as_bytes());
        let mut id = [0u8; 16];
        id.copy_from_slice(&h.finalize().as_bytes()[..16]);
        if id == [0; 16] {
            id[0] = 1;
        }
        LayerId(id)
    }
}

impl fmt::Display for LayerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == LayerId::BASE {
            return f.write_str("base");
        }
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Debug for LayerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LayerId({self})")
    }
}

/// Why a layered disk could not be opened, read, written, flushed or sealed.
#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    /// The base image could not be opened or sized.
    #[error("layered disk: opening base image {path}: {source}")]
    OpenBase {
        /// The base image.
        path: PathBuf,
        /// Underlying error.
        source: io::Error,
    },
    /// The base image is larger than a layer may describe.
    #[error("layered disk: base image {path} is {size} bytes, more than the {max}-byte cap")]
    BaseTooLarge {
        /// The base image.
        path: PathBuf,
        /// Its size.
        size: u64,
        /// [`MAX_DISK_BYTES`].
        max: u64,
    },
    /// A step of creating a new layer directory failed.
    #[error("layered disk: creating layer {path}: {step}: {source}")]
    CreateLayer {
        /// The layer directory being created.
        path: PathBuf,
        /// What was being done.
        step: &'static str,
        /// Underlying error.
        source: io::Error,
    },
    /// A new layer's directory already exists.
    #[error("layered disk: cannot create layer {path}: it already exists")]
    LayerExists {
        /// The layer directory.
        path: PathBuf,
    },
    /// A layer's data file could not be opened or stat-ed.
    #[error("layered disk: opening layer data {path}: {source}")]
    OpenData {
        /// The data file.
        path: PathBuf,
        /// Underlying error.
        source: io::Error,
    },
    /// A layer's data file does not have the disk's size.
    #[error("layered disk: layer data {path} is {actual} bytes, its bitmap says {expected}: truncated or replaced")]
    DataSize {
        /// The data file.
        path: PathBuf,
        /// Size recorded in the layer's bitmap.
        expected: u64,
        /// Size of the file.
        actual: u64,
    },
    /// A layer's bitmap file could not be opened or read.
    #[error("layered disk: reading layer bitmap {path}: {source}")]
    ReadBitmap {
        /// The bitmap file.
        path: PathBuf,
        /// Underlying error.
        source: io::Error,
    },
    /// A bitmap file is larger than any valid one.
    #[error("layered disk: layer bitmap {path} is {len} bytes, more than the {max}-byte cap")]
    BitmapTooLarge {
        /// The bitmap file.
        path: PathBuf,
        /// Its length.
        len: u64,
        /// The largest valid bitmap file.
        max: u64,
    },
    /// A bitmap file is shorter than its header.
    #[error("layered disk: layer bitmap {path} is {len} bytes, shorter than a header and checksum ({min}): truncated")]
    BitmapTruncated {
        /// The bitmap file.
        path: PathBuf,
        /// Its length.
        len: usize,
        /// The shortest valid file.
        min: usize,
    },
    /// A bitmap file does not start with [`LAYER_MAGIC`].
    #[error("layered disk: {path} is not a layer bitmap (magic {found:02x?})")]
    BitmapMagic {
        /// The bitmap file.
        path: PathBuf,
        /// Its first eight bytes.
        found: [u8; 8],
    },
    /// A bitmap file has a format version this build does not read.
    #[error("layered disk: layer bitmap {path} has format version {found}; this build reads version {supported}")]
    BitmapVersion {
        /// The bitmap file.
        path: PathBuf,
        /// The version in the file.
        found: u32,
        /// [`LAYER_FORMAT_VERSION`].
        supported: u32,
    },
    /// A bitmap file's length differs from what its header implies.
    #[error("layered disk: bitmap {path} is {actual} bytes, its header says {expected}: truncated or trailing data")]
    BitmapLength {
        /// The bitmap file.
        path: PathBuf,
        /// Its length.
        actual: u64,
        /// Length implied by the header's block count.
        expected: u64,
    },
    /// A bitmap file's checksum does not match its contents.
    #[error("layered disk: layer bitmap {path} is corrupt: checksum {stored:#010x} stored, {computed:#010x} computed")]
    BitmapChecksum {
        /// The bitmap file.
        path: PathBuf,
        /// CRC-32 stored in the file.
        stored: u32,
        /// CRC-32 of the contents.
        computed: u32,
    },
    /// A checksummed bitmap file holds a value this format does not allow.
    #[error("layered disk: layer bitmap {path} is invalid: {reason}")]
    BitmapInvalid {
        /// The bitmap file.
        path: PathBuf,
        /// Which field is wrong and how.
        reason: String,
    },
    /// A step of persisting a bitmap failed.
    #[error("layered disk: writing layer bitmap {path}: {step}: {source}")]
    WriteBitmap {
        /// The bitmap file (or its temporary).
        path: PathBuf,
        /// What was being done.
        step: &'static str,
        /// Underlying error.
        source: io::Error,
    },
    /// A layer was made for a disk of another size.
    #[error("layered disk: layer {path} is for a {layer}-byte disk, the base is {base} bytes")]
    SizeMismatch {
        /// The layer directory.
        path: PathBuf,
        /// Disk size recorded in the layer.
        layer: u64,
        /// Size of the base image.
        base: u64,
    },
    /// A layer below the top is not sealed (it may be some disk's live top).
    #[error("layered disk: layer {path} is not sealed; only sealed layers can sit below the top")]
    NotSealed {
        /// The layer directory.
        path: PathBuf,
    },
    /// The layer given as the writable top is sealed.
    #[error("layered disk: layer {path} is sealed and cannot be the writable top (create a new top over it)")]
    TopSealed {
        /// The layer directory.
        path: PathBuf,
    },
    /// A layer does not sit on the layer given below it.
    #[error(
        "layered disk: layer {path} sits on {found}, the layer below is {expected}: wrong order or another disk's"
    )]
    ChainBroken {
        /// The layer directory.
        path: PathBuf,
        /// Id of the layer given below it.
        expected: LayerId,
        /// Parent id recorded in the layer.
        found: LayerId,
    },
    /// A read or write reaches past the end of the disk.
    #[error("layered disk: {len} bytes at offset {offset} reach past the end of the {size}-byte disk")]
    OutOfRange {
        /// Requested offset.
        offset: u64,
        /// Requested length.
        len: u64,
        /// Disk size.
        size: u64,
    },
    /// A positional read of a base or layer file failed.
    #[error("layered disk: reading {path} at offset {offset}: {source}")]
    Read {
        /// The file read.
        path: PathBuf,
        /// File offset.
        offset: u64,
        /// Underlying error.
        source: io::Error,
    },
    /// The lazy lower layer could not produce blocks (fetching, decrypting or caching
    /// them failed); nothing was read.
    #[error("layered disk: reading {len} bytes at offset {offset} from lazy layer {layer}: {source}")]
    LowerRead {
        /// The lazy layer's id.
        layer: LayerId,
        /// Disk offset.
        offset: u64,
        /// Requested length.
        len: u64,
        /// Underlying error (for a vault layer, a `VaultError`).
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The lazy lower layer could not make what it fetched durable.
    #[error("layered disk: flushing lazy layer {layer}: {source}")]
    LowerFlush {
        /// The lazy layer's id.
        layer: LayerId,
        /// Underlying error (for a vault layer, a `VaultError`).
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A positional write to the top's data file failed.
    #[error("layered disk: writing {path} at offset {offset}: {source}")]
    Write {
        /// The top's data file.
        path: PathBuf,
        /// File offset.
        offset: u64,
        /// Underlying error.
        source: io::Error,
    },
    /// Syncing the top's data file failed.
    #[error("layered disk: syncing layer data {path}: {source}")]
    SyncData {
        /// The top's data file.
        path: PathBuf,
        /// Underlying error.
        source: io::Error,
    },
    /// The layers left by an interrupted seal are not in a state a seal can leave.
    #[error("layered disk: recovering the seal of {path}: {reason}")]
    RecoverSeal {
        /// The layer that was being sealed.
        path: PathBuf,
        /// What does not fit.
        reason: String,
    },
    /// A completed lazy layer could not replace the stack's lazy lower layer.
    #[error("layered disk: settling the lazy layer as {path}: {reason}")]
    SettleLower {
        /// The sealed directory offered in its place.
        path: PathBuf,
        /// What does not fit.
        reason: String,
    },
    /// Sealed layers could not be merged, or the merge could not replace them.
    #[error("layered disk: merging layers into {path}: {reason}")]
    Merge {
        /// The merged layer's directory.
        path: PathBuf,
        /// What does not fit.
        reason: String,
    },
}

#[cfg(test)]
mod tests;
