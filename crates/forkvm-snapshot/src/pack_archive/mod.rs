//! Hash-checked `.tar.zst` packs: the container snapshots travel in between hosts.
//!
//! Moving a snapshot to another host means shipping several files (metadata, VM state, a memory image
//! that may be many GiB and mostly holes) as one stream. This module is only that container layer; it does
//! not know what a snapshot is. A pack is:
//!
//! * one zstd frame, always written with its content checksum, holding
//! * a ustar tar stream of regular-file entries with relative `/`-separated UTF-8 names,
//! * whose LAST entry is [`PACK_MANIFEST`], a JSON [`PackManifest`] listing every other entry (in archive
//!   order) with its size and BLAKE3 hash, plus an opaque caller description (`meta`),
//! * followed by the tar end-of-archive marker and nothing else.
//!
//! [`PackWriter`] writes packs crash-safely (into `<out>.partial`, renamed into place once synced).
//!
//! **Packs are untrusted input.** [`extract_pack`] never uses the tar crate's unpacking: it walks the raw
//! headers (no PAX / GNU long-name processing, so such headers are refused rather than interpreted), checks
//! every name itself, accepts only regular files, creates every file and directory itself under the staging
//! directory, caps entry counts and sizes while reading, refuses truncated streams and trailing data, and
//! only returns once every staged file matches the manifest's size and BLAKE3 hash.

mod reader;
pub mod signature;
mod sparse;
mod writer;

pub use reader::{extract_pack, extract_pack_trusted};
pub use signature::{PackSignature, PackTrust};
pub use sparse::{decode_sparse, SparseExtents, MAX_SPARSE_EXTENTS, MAX_SPARSE_SIZE, SPARSE_MAGIC, SPARSE_VERSION};
pub use writer::PackWriter;

use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Name of the manifest entry; always the last entry of a pack.
pub const PACK_MANIFEST: &str = "forkvm-pack.json";
/// Value of [`PackManifest::format`].
pub const PACK_FORMAT: &str = "forkvm-pack";
/// Value of [`PackManifest::version`] written and accepted by this build.
///
/// Compatibility rule: a reader accepts exactly the version it writes. Version 2 added
/// sparse entries ([`SparseExtents`], written by [`PackWriter::add_sparse_file`]) for disk
/// images and layered disks' layers; version 1 packs held disk images byte for byte and
/// are refused (re-pack them with the newer build).
pub const PACK_VERSION: u32 = 2;

/// Tar block size.
const BLOCK: u64 = 512;
/// Copy buffer size for streaming entry data.
const CHUNK: usize = 1 << 20;
/// Longest entry name accepted (the most a ustar prefix + name can hold).
const MAX_NAME_BYTES: usize = 255;

/// The manifest stored as the last entry ([`PACK_MANIFEST`]) of every pack.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PackManifest {
    /// Always [`PACK_FORMAT`].
    pub format: String,
    /// Always [`PACK_VERSION`].
    pub version: u32,
    /// Every entry of the pack in archive order, excluding the manifest itself.
    pub entries: Vec<PackEntry>,
    /// The caller's description of the pack contents; opaque to this module.
    pub meta: serde_json::Value,
    /// The signer's key and signature over everything above ([`signature`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<PackSignature>,
}

/// One entry listed in a [`PackManifest`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PackEntry {
    /// Relative `/`-separated entry name, e.g. `snapshots/a/snapshot.json`.
    pub name: String,
    /// Content length in bytes.
    pub size: u64,
    /// BLAKE3 hash of the content, 64 lowercase hex digits.
    pub blake3: String,
}

/// Errors from writing or extracting a pack. Names taken from a pack are shown quoted and shortened.
#[derive(Debug, thiserror::Error)]
pub enum PackError {
    /// A host filesystem operation (`step`) on `path` failed; not a problem with the pack's contents.
    #[error("pack: cannot {step} {path}: {source}")]
    Io { step: &'static str, path: PathBuf, source: io::Error },
    /// The output (or its `.partial` twin) already exists.
    #[error(
        "pack: {0} already exists; refusing to overwrite it (a leftover `.partial` file means an interrupted \
         or concurrent pack write: remove it if no write is running)"
    )]
    Exists(PathBuf),
    /// An entry name (lossily decoded, shortened) is unsafe, unrepresentable, or refused by the caller.
    #[error("pack entry {name:?}: name refused: {reason}")]
    UnsafeName { name: String, reason: String },
    /// An entry is not a regular file; `kind` describes its tar type.
    #[error("pack entry {name:?}: entry type {kind} is not allowed (packs hold only regular files)")]
    EntryType { name: String, kind: String },
    /// The same name appears twice.
    #[error("pack entry {0:?} appears more than once")]
    Duplicate(String),
    /// The `what` cap (a [`PackLimits`] field, whose value is `limit`) was exceeded at entry `name`.
    #[error("pack entry {name:?}: pack exceeds the {what} limit of {limit}")]
    Limit { name: String, what: &'static str, limit: u64 },
    /// The pack ends early (cut zstd frame, cut tar stream, or missing end-of-archive marker).
    #[error("pack is truncated: {0}")]
    Truncated(String),
    /// The pack's bytes are damaged (zstd or tar level) or carry trailing data.
    #[error("pack is corrupt: {0}")]
    Corrupt(String),
    /// The manifest entry is missing, misplaced, unparsable or inconsistent.
    #[error("pack manifest forkvm-pack.json: {0}")]
    Manifest(String),
    /// An entry's BLAKE3 (`actual`, hex) differs from the manifest's (`expected`).
    #[error("pack entry {name:?}: BLAKE3 {actual} does not match the manifest's {expected}: the pack is corrupt")]
    HashMismatch { name: String, expected: String, actual: String },
    /// An entry's length (`actual`) differs from the manifest's (`expected`).
    #[error("pack entry {name:?}: holds {actual} bytes but the manifest lists {expected}: the pack is corrupt")]
    SizeMismatch { name: String, expected: u64, actual: u64 },
    /// The manifest lists an entry the archive does not contain.
    #[error("pack entry {0:?} is listed in the manifest but absent from the archive")]
    Missing(String),
    /// The archive contains an entry the manifest does not list.
    #[error("pack entry {0:?} is in the archive but not listed in the manifest")]
    Unlisted(String),
    /// Extracting would allocate `needed` bytes where only `free` are available (after a reserve).
    #[error("pack: extracting it needs {needed} bytes but only {free} are free (keeping 5% of the filesystem in reserve); nothing was written")]
    NoSpace { needed: u64, free: u64 },
    /// The pack's signature is missing, invalid or not by a trusted key.
    #[error("pack signature: {0}; nothing was written")]
    Signature(String),
    /// A sparse entry (see [`SparseExtents`]) is malformed.
    #[error("pack entry {name:?}: malformed sparse entry: {reason}")]
    Sparse { name: String, reason: String },
}

/// Caps applied by [`extract_pack`] while reading, before any allocation or write they would bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackLimits {
    /// Most entries, not counting the manifest.
    pub max_entries: u64,
    /// Largest single entry, in bytes (the manifest is capped by `max_manifest_bytes` instead).
    pub max_entry_bytes: u64,
    /// Largest sum of all entry sizes, manifest included.
    pub max_total_bytes: u64,
    /// Largest manifest, in bytes. [`PackWriter::finish`] refuses to write a bigger one than the default.
    pub max_manifest_bytes: u64,
}

/// Environment variable capping the total size of a pack's entries (bytes) accepted by unpack.
pub const UNPACK_MAX_BYTES_ENV: &str = "FORKVM_UNPACK_MAX_BYTES";

impl PackLimits {
    /// The defaults, with `max_total_bytes` (and so `max_entry_bytes`) lowered to
    /// `$FORKVM_UNPACK_MAX_BYTES` when that is set.
    pub fn configured() -> PackLimits {
        let mut l = PackLimits::default();
        if let Some(cap) = std::env::var(UNPACK_MAX_BYTES_ENV).ok().and_then(|v| v.trim().parse::<u64>().ok()) {
            l.max_total_bytes = cap;
            l.max_entry_bytes = l.max_entry_bytes.min(cap);
        }
        l
    }
}

impl Default for PackLimits {
    /// 1 000 000 entries, 1 TiB per entry, 4 TiB in total, 64 MiB of manifest.
    fn default() -> Self {
        PackLimits {
            max_entries: 1_000_000,
            max_entry_bytes: 1 << 40,
            max_total_bytes: 4 << 40,
            max_manifest_bytes: 64 << 20,
        }
    }
}

/// Maps an I/O error at `path` during `step` to [`PackError::Io`].
fn io_err(step: &'static str, path: &Path) -> impl FnOnce(io::Error) -> PackError {
    let path = path.to_path_buf();
    move |source| PackError::Io { step, path, source }
}

/// Zero bytes needed after `size` bytes of data to reach a tar block boundary.
fn padding(size: u64) -> usize {
    ((BLOCK - size % BLOCK) % BLOCK) as usize
}

/// A name for display in errors: at most [`MAX_NAME_BYTES`] bytes of it.
fn shown(name: &str) -> String {
    if name.len() <= MAX_NAME_BYTES {
        return name.to_string();
    }
    let mut end = MAX_NAME_BYTES;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &name[..end])
}

/// Checks an entry name against the pack's name rules (not the caller's grammar).
fn check_name(raw: &[u8]) -> Result<&str, PackError> {
    let refuse =
        |reason: &str| PackError::UnsafeName { name: shown(&String::from_utf8_lossy(raw)), reason: reason.to_string() };
    if raw.is_empty() {
        return Err(refuse("empty name"));
    }
    if raw.len() > MAX_NAME_BYTES {
        return Err(refuse(&format!("{} bytes long (the limit is {MAX_NAME_BYTES})", raw.len())));
    }
    if raw.contains(&0) {
        return Err(refuse("contains a NUL byte"));
    }
    let name = std::str::from_utf8(raw).map_err(|_| refuse("not valid UTF-8"))?;
    if name.starts_with('/') {
        return Err(refuse("absolute path"));
    }
    if name.contains('\\') {
        return Err(refuse("contains a backslash"));
    }
    for component in name.split('/') {
        match component {
            "" => return Err(refuse("empty path component (doubled or trailing '/')")),
            "." => return Err(refuse("contains a '.' component")),
            ".." => return Err(refuse("contains a '..' component")),
            _ => {}
        }
    }
    Ok(name)
}

#[cfg(test)]
mod tests;
