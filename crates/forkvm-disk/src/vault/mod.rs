//! The vault: encrypted, incremental snapshots of one sandbox's layered disks.
//!
//! Why this exists: a sandbox's disk must survive the host losing the sandbox (crash,
//! eviction, migration) without keeping every sealed layer forever and without the
//! store ever holding the guest's data in plaintext. Every minute the runtime seals the
//! disk's top and calls [`Vault::snapshot`], which uploads the blocks of the layers
//! sealed since the previous snapshot as encrypted chunks and commits a manifest
//! holding the disk's full block map. Any snapshot restores on its own, eagerly
//! ([`Vault::restore_layer`]) or lazily ([`VaultLayer`], fetched on first read and
//! prefetched from a [`Playbook`], see [`lazy`]), and any may be deleted
//! ([`Vault::retain`]) unless pinned by a lazy restore.
//!
//! # Keys
//!
//! Keys live in a keys directory **apart from the vault** ([`KeyStore`]): a host key
//! (`host.key`, 32 random bytes, 0600) wraps one random key per sandbox
//! (`sandboxes/<owner>.key`). Deleting a sandbox's key ([`KeyStore::remove_sandbox_key`])
//! makes its vault unreadable (crypto-shredding). From a [`SandboxKey`] two sub-keys are
//! derived with `blake3::derive_key`: one for XChaCha20-Poly1305 (chunks, manifests,
//! the key check), one for the keyed BLAKE3 hash that names chunks.
//!
//! Wrapped sandbox key `sandboxes/<owner>.key` (84 bytes):
//!
//! | offset | size | field |
//! |--------|------|-------|
//! | 0      | 8    | magic `FKVMWKEY` |
//! | 8      | 4    | version (1), u32 LE |
//! | 12     | 24   | random nonce |
//! | 36     | 48   | XChaCha20-Poly1305(host key, sandbox key), AAD = `b"forkvm sandbox key v1\0"` + owner |
//!
//! # Vault layout
//!
//! | path | content |
//! |------|---------|
//! | `lock` | empty; `flock`ed: exclusive for snapshot/retain/gc, shared for reads |
//! | `keycheck` | magic `FKVMVKC1` + nonce + AEAD(empty), AAD = magic: refuses a wrong key at open |
//! | `chunks/<2 hex>/<64 hex>` | one encrypted chunk (below) |
//! | `snapshots/<seq, 16 digits>.snap` | one encrypted manifest (below) |
//! | `pins/<seq, 16 digits>.<holder>` | empty; retention keeps snapshot `seq` (a lazy restore still reads it, see [`pins`]) |
//! | `.<name>.<pid>.<n>.tmp` anywhere | a write in progress, or left by a killed writer |
//!
//! Chunk file (name = BLAKE3 keyed hash of the plaintext with the name sub-key, so equal
//! blocks dedup within the vault and names say nothing without the key):
//!
//! | offset | size | field |
//! |--------|------|-------|
//! | 0      | 8    | magic `FKVMVCH1` |
//! | 8      | 24   | random nonce |
//! | 32     | rest | XChaCha20-Poly1305(zstd(plaintext)), AAD = magic + the 32-byte name |
//!
//! A chunk holds one extent: 1..=16 consecutive 4 KiB blocks inside one 64 KiB-aligned
//! window (the disk's last block may be partial).
//!
//! Manifest file: magic `FKVMVSN1` + 24-byte nonce + XChaCha20-Poly1305(JSON), AAD =
//! magic + seq as u64 LE. The JSON (see [`manifest`]) lists per disk its id, the
//! caller's base key, its size, the id of the newest sealed layer covered, and the
//! **full** map of blocks above the base as `[first_block, block_count, chunk_hex]`
//! extents, sorted and non-overlapping: every snapshot is self-contained.
//!
//! Sealed files (`vault::sealed_file`, magic `FKVMVSF1`) are small blobs sealed with
//! the same AEAD key but kept outside the vault: an archive's vCPU and device state.
//! An archive's memory is one more disk of a snapshot (id `memory`, over an all-zero
//! base); the vault does not distinguish it.
//!
//! Compatibility rule: the magics carry the format version (`…1`); a reader accepts
//! exactly the versions it knows, and the JSON refuses unknown fields.
//!
//! # Crash safety
//!
//! A snapshot writes chunks (temp name + rename, existing names skipped), `syncfs`es
//! the vault's filesystem, and only then writes the manifest (temp + fsync + rename +
//! fsync of `snapshots/`). That rename is the commit point: a kill at any moment leaves
//! the previous snapshot the newest complete one, plus at most unreferenced chunks and
//! temp files, which the next snapshot (temps) and the next retain (chunks) remove.
//! Retention deletes manifests, fsyncs `snapshots/`, and only then deletes chunks no
//! remaining manifest references. All vault bytes read back are untrusted: sizes are
//! capped, every field is checked, and every chunk is authenticated and re-hashed.

mod chunk_seal;
mod chunks;
mod crypto;
pub(crate) mod fsutil;
mod keys;
pub mod lazy;
pub mod manifest;
pub mod pins;
mod restore;
mod retain;
mod sealed_file;
mod store;

pub use chunk_seal::{ChunkSeal, SEALED_CHUNK_MAGIC, SEALED_CHUNK_OVERHEAD};
pub use keys::{default_keys_dir, KeyStore, SandboxKey};
pub use lazy::{LazyStats, Playbook, Prefetcher, SealedCache, VaultLayer};
pub use manifest::{DiskMap, Manifest};
pub use restore::RestoredLayer;
pub use retain::{RetainReport, RetentionPolicy};
pub use sealed_file::SEALED_FILE_MAGIC;
pub use store::{DiskInfo, DiskInput, SnapshotInfo, Vault};

use crate::layered_disk::LayerError;
use std::io;
use std::path::PathBuf;

/// Longest owner or disk id.
pub const MAX_NAME_LEN: usize = 64;

/// Why a vault or key store operation failed. Each variant names the step and path.
#[derive(Debug, thiserror::Error)]
pub enum VaultError {
    /// A filesystem operation failed.
    #[error("vault: {step} {path}: {source}")]
    Io {
        /// What was being done.
        step: &'static str,
        /// The file or directory involved.
        path: PathBuf,
        /// Underlying error.
        source: io::Error,
    },
    /// A key is missing, malformed, unsafely stored, or does not decrypt (wrong key).
    #[error("vault: key {path}: {reason}")]
    Key {
        /// The key file (or the vault's key check).
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A vault file fails authentication or holds values its format does not allow.
    #[error("vault: corrupt {path}: {reason}")]
    Corrupt {
        /// The file (for a chunk, its path names the chunk).
        path: PathBuf,
        /// Which check failed.
        reason: String,
    },
    /// A snapshot or disk asked for does not exist.
    #[error("vault: {what} not found in {path}")]
    NotFound {
        /// What was asked for, e.g. "snapshot 7".
        what: String,
        /// Where it was looked for.
        path: PathBuf,
    },
    /// An argument is not acceptable.
    #[error("vault: invalid {what}: {reason}")]
    Invalid {
        /// Which argument.
        what: &'static str,
        /// Why.
        reason: String,
    },
    /// A layer of the disk could not be read or written.
    #[error("vault: {step}: {source}")]
    Layer {
        /// What was being done.
        step: &'static str,
        /// Underlying error.
        source: LayerError,
    },
    /// A fault injected by a test (the process "died" here).
    #[error("vault: injected fault: {0}")]
    Fault(&'static str),
}

/// What kind of failure a [`VaultError`] is (tests and callers tell them apart by this,
/// not by text).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VaultErrorKind {
    Io,
    Key,
    Corrupt,
    NotFound,
    Invalid,
    Layer,
    Fault,
}

impl VaultError {
    pub fn kind(&self) -> VaultErrorKind {
        match self {
            VaultError::Io { .. } => VaultErrorKind::Io,
            VaultError::Key { .. } => VaultErrorKind::Key,
            VaultError::Corrupt { .. } => VaultErrorKind::Corrupt,
            VaultError::NotFound { .. } => VaultErrorKind::NotFound,
            VaultError::Invalid { .. } => VaultErrorKind::Invalid,
            VaultError::Layer { .. } => VaultErrorKind::Layer,
            VaultError::Fault(_) => VaultErrorKind::Fault,
        }
    }
}

/// Builds a [`VaultError::Io`] mapper for `step` on `path`.
pub(crate) fn io_err<'a>(step: &'static str, path: &'a std::path::Path) -> impl FnOnce(io::Error) -> VaultError + 'a {
    move |source| VaultError::Io { step, path: path.to_path_buf(), source }
}

/// Checks an owner or disk id: 1..=64 characters of `[A-Za-z0-9._-]`, not starting
/// with `.` (so it is a safe file name that never collides with temp files).
pub fn validate_name(what: &'static str, name: &str) -> Result<(), VaultError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && !name.starts_with('.')
        && name.bytes().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        let shown: String = name.chars().take(80).collect();
        Err(VaultError::Invalid {
            what,
            reason: format!(
                "{shown:?}: expected 1..={MAX_NAME_LEN} characters of [A-Za-z0-9._-], not starting with '.'"
            ),
        })
    }
}

/// Injection points for crash tests: the snapshot stops there as if killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) enum FaultPoint {
    /// After this many new chunks were written (the next one left as a temp file).
    AfterChunks(u64),
    /// After every chunk was written and synced, before the manifest.
    BeforeManifest,
    /// After the manifest's temp file was written, before the rename.
    BeforeCommit,
}

#[cfg(test)]
mod tests;
