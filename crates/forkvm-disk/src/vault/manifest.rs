//! Snapshot manifests, `<root>/snapshots/<seq, 16 digits>.snap` (file format in [`super`]).
//!
//! Why this exists: the manifest is the commit record of a snapshot and the only index
//! of the chunks: per disk, the full map of blocks above the base. It is encrypted like
//! the chunks (extent positions say which blocks the guest wrote) and bound to its
//! sequence number by the AAD, so one manifest cannot be passed off as another.
//!
//! The JSON:
//!
//! ```json
//! { "seq": 3, "created_unix_ms": 1764500000000,
//!   "disks": [ { "id": "rootfs", "base_key": "ubuntu-24.04@sha256:…", "size": 1073741824,
//!                "layer_id": "<32 hex, or \"base\">",
//!                "extents": [[0, 16, "<64 hex chunk name>"], [16, 3, "…"]] } ] }
//! ```
//!
//! Extents are `[first_block, block_count, chunk]`, sorted, non-overlapping, 1..=16
//! blocks each, never crossing a 64 KiB-aligned window. Decoding is untrusted input:
//! the file size is capped and every field is checked.

use super::crypto::{self, NONCE_LEN, TAG_LEN};
use super::{validate_name, VaultError};
use crate::chunk_id::ChunkId;
use crate::layered_disk::{blocks_for, BLOCK_SIZE, MAX_DISK_BYTES};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::path::Path;

/// First bytes of a manifest file.
pub const MANIFEST_MAGIC: [u8; 8] = *b"FKVMVSN1";
/// Largest manifest file (enough for ~3 million extents, i.e. ~190 GiB written).
pub const MAX_MANIFEST_BYTES: u64 = 256 << 20;
/// Blocks per window: an extent never crosses a multiple of this.
pub const WINDOW_BLOCKS: u64 = 16;
/// Longest base key.
pub const MAX_BASE_KEY_LEN: usize = 1024;

/// A decoded manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Sequence number, also the file name.
    pub seq: u64,
    /// When the snapshot was taken.
    pub created_unix_ms: u64,
    /// One entry per disk, ids unique.
    pub disks: Vec<DiskMap>,
}

/// One disk's full block map in a manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiskMap {
    /// The disk's id (the caller's name for it).
    pub id: String,
    /// Opaque name of the base image, the caller's.
    pub base_key: String,
    /// Disk size in bytes.
    pub size: u64,
    /// Id (hex, or `base`) of the newest sealed layer covered.
    pub layer_id: String,
    /// `[first_block, block_count, chunk name hex]`, sorted, non-overlapping.
    pub extents: Vec<(u64, u64, String)>,
}

impl DiskMap {
    /// Blocks present in the map.
    pub fn blocks(&self) -> u64 {
        self.extents.iter().map(|e| e.1).sum()
    }

    /// Byte length of an extent's plaintext (its last block may be partial).
    pub fn extent_len(&self, first: u64, count: u64) -> usize {
        let start = first * BLOCK_SIZE;
        ((first + count) * BLOCK_SIZE).min(self.size).saturating_sub(start) as usize
    }

    /// The chunk name of each extent (checked by [`decode`]).
    pub(crate) fn chunk_names(&self) -> impl Iterator<Item = ChunkId> + '_ {
        self.extents.iter().filter_map(|e| ChunkId::from_hex(&e.2).ok())
    }
}

fn aad(seq: u64) -> [u8; 16] {
    let mut aad = [0u8; 16];
    aad[..8].copy_from_slice(&MANIFEST_MAGIC);
    aad[8..].copy_from_slice(&seq.to_le_bytes());
    aad
}

/// The encrypted file bytes of `m`.
pub(crate) fn encode(m: &Manifest, key: &[u8; 32], path: &Path) -> Result<Vec<u8>, VaultError> {
    let json = serde_json::to_vec(m).map_err(|e| VaultError::Io {
        step: "serializing manifest",
        path: path.to_path_buf(),
        source: std::io::Error::other(e),
    })?;
    let (nonce, ct) = crypto::seal(key, &aad(m.seq), &json, path)?;
    let mut out = Vec::with_capacity(8 + NONCE_LEN + ct.len());
    out.extend_from_slice(&MANIFEST_MAGIC);
    out.extend_from_slice(&nonce);
    out.extend_from_slice(&ct);
    Ok(out)
}

/// Decrypts and validates the manifest file `bytes`, which must be snapshot `seq`.
pub(crate) fn decode(bytes: &[u8], seq: u64, key: &[u8; 32], path: &Path) -> Result<Manifest, VaultError> {
    let bad = |reason: String| VaultError::Corrupt { path: path.to_path_buf(), reason };
    if bytes.len() as u64 > MAX_MANIFEST_BYTES {
        return Err(bad(format!("larger than the {MAX_MANIFEST_BYTES}-byte cap")));
    }
    if bytes.len() < 8 + NONCE_LEN + TAG_LEN || bytes[..8] != MANIFEST_MAGIC {
        return Err(bad("not a vault manifest (short or bad magic)".to_string()));
    }
    let json = crypto::open(key, &bytes[8..8 + NONCE_LEN], &aad(seq), &bytes[8 + NONCE_LEN..])
        .ok_or_else(|| bad(format!("fails authentication as snapshot {seq} (tampered, renamed or wrong key)")))?;
    let m: Manifest = serde_json::from_slice(&json).map_err(|e| bad(format!("invalid manifest JSON: {e}")))?;
    validate(&m, seq).map_err(|m| bad(m.0))?;
    Ok(m)
}

/// Checks every field a checksum (here: an AEAD tag) cannot vouch for.
pub(crate) fn validate(m: &Manifest, seq: u64) -> Result<(), crate::malformed::Malformed> {
    if m.seq != seq {
        return Err(format!("says seq {}, its file name says {seq}", m.seq).into());
    }
    let mut ids = HashSet::new();
    for d in &m.disks {
        validate_name("disk id", &d.id).map_err(|e| e.to_string())?;
        if !ids.insert(d.id.as_str()) {
            return Err(format!("disk {} listed twice", d.id).into());
        }
        if d.base_key.len() > MAX_BASE_KEY_LEN {
            return Err(format!("disk {}: base key longer than {MAX_BASE_KEY_LEN} bytes", d.id).into());
        }
        if d.size > MAX_DISK_BYTES {
            return Err(format!("disk {}: size {} over the {MAX_DISK_BYTES}-byte cap", d.id, d.size).into());
        }
        let valid_layer = d.layer_id == "base"
            || (d.layer_id.len() == 32 && d.layer_id.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')));
        if !valid_layer {
            return Err(format!("disk {}: layer id {:?} is not 32 hex digits or \"base\"", d.id, d.layer_id).into());
        }
        let blocks = blocks_for(d.size);
        let mut next_free = 0u64;
        for &(first, count, ref chunk) in &d.extents {
            let end = first.checked_add(count).ok_or_else(|| format!("disk {}: extent overflows", d.id))?;
            if count == 0 || count > WINDOW_BLOCKS {
                return Err(
                    format!("disk {}: extent at block {first} has {count} blocks (1..={WINDOW_BLOCKS})", d.id).into()
                );
            }
            if end > blocks {
                return Err(format!("disk {}: extent {first}+{count} past the disk's {blocks} blocks", d.id).into());
            }
            if first / WINDOW_BLOCKS != (end - 1) / WINDOW_BLOCKS {
                return Err(format!("disk {}: extent {first}+{count} crosses a 64 KiB window", d.id).into());
            }
            if first < next_free {
                return Err(format!("disk {}: extent at block {first} unsorted or overlapping", d.id).into());
            }
            ChunkId::from_hex(chunk).map_err(|e| format!("disk {}: {e}", d.id))?;
            next_free = end;
        }
    }
    Ok(())
}
