//! A tag's manifest on a remote: the chain's description and, for each of its entries,
//! where its blocks are.
//!
//! Sealed like a block (zstd JSON, XChaCha20-Poly1305 under the remote key), its
//! associated data a hash of the tag, so a manifest copied to another tag's name does
//! not open. Everything in it is checked on read: names are the pack's names only,
//! blocks lie inside their entry, aligned and in order, and sizes are capped.

#[cfg(feature = "client")]
use crate::RemoteError;
use crate::BLOCK_BYTES;
use forkvm_disk::vault::ChunkSeal;
use forkvm_snapshot::chain::accept_entry_name;
use forkvm_snapshot::pack_archive::PackLimits;
use forkvm_snapshot::ChunkId;
use serde::{Deserialize, Serialize};

/// Value of [`RemoteManifest::format`].
pub const MANIFEST_FORMAT: &str = "forkvm-remote";
/// Value of [`RemoteManifest::version`] written and accepted by this build.
pub const MANIFEST_VERSION: u32 = 1;
/// `blake3::derive_key` context naming a tag's manifest for its associated data.
const MANIFEST_NAME_CONTEXT: &str = "forkvm remote 2026 manifest name v1";
/// Largest manifest JSON accepted.
const MAX_MANIFEST_JSON: usize = 64 << 20;

/// What `tags/<tag>` holds.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RemoteManifest {
    /// Always [`MANIFEST_FORMAT`].
    pub format: String,
    /// Always [`MANIFEST_VERSION`].
    pub version: u32,
    /// The tag it is the manifest of (also bound in by the seal).
    pub tag: String,
    /// Tags from the base to the head.
    pub links: Vec<String>,
    /// Grows with every push of the tag: `max(previous + 1, push time in ms)`. A host
    /// refuses a manifest older than one it pulled before ([`crate::seen`]: a remote
    /// rolled back, or an old manifest put back). 0: written before generations.
    #[serde(default)]
    pub generation: u64,
    /// The store's description of the chain (`ChainWalk::description`), opaque here.
    pub description: serde_json::Value,
    pub entries: Vec<RemoteEntry>,
}

/// One entry of the chain (a pack's entry name) as blocks.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RemoteEntry {
    pub name: String,
    /// The file's length; bytes no block covers are zeros.
    pub size: u64,
    /// `[offset, length, block name]`, offsets [`BLOCK_BYTES`]-aligned and increasing.
    pub blocks: Vec<(u64, u32, String)>,
}

impl RemoteEntry {
    /// The blocks, checked: inside the entry, aligned, in order, named by block names.
    pub fn checked_blocks(&self) -> Result<Vec<(u64, u32, ChunkId)>, String> {
        let mut out = Vec::with_capacity(self.blocks.len());
        let mut next = 0u64;
        for (off, len, hex) in &self.blocks {
            let id = ChunkId::from_hex(hex).map_err(|e| format!("{}: block name {hex:?}: {}", self.name, e.0))?;
            let end = off.checked_add(u64::from(*len)).unwrap_or(u64::MAX);
            if off % BLOCK_BYTES != 0 || *off < next || *len == 0 || u64::from(*len) > BLOCK_BYTES || end > self.size {
                return Err(format!("{}: block at {off} (+{len}) is out of place", self.name));
            }
            next = end;
            out.push((*off, *len, id));
        }
        Ok(out)
    }
}

/// The associated-data name of `tag`'s manifest.
fn manifest_name(tag: &str) -> ChunkId {
    ChunkId(blake3::derive_key(MANIFEST_NAME_CONTEXT, tag.as_bytes()))
}

impl RemoteManifest {
    /// The manifest sealed for `tags/<tag>`.
    pub fn seal(&self, seal: &ChunkSeal) -> Result<Vec<u8>, String> {
        let json = serde_json::to_vec(self).map_err(|e| e.to_string())?;
        let packed = zstd::bulk::compress(&json, 3).map_err(|e| e.to_string())?;
        seal.seal(&manifest_name(&self.tag), &packed).map_err(|e| e.to_string())
    }

    /// Opens and checks the manifest read from `tags/<tag>`.
    #[cfg(feature = "client")]
    pub fn open(seal: &ChunkSeal, tag: &str, sealed: &[u8], url: &str) -> Result<RemoteManifest, RemoteError> {
        let refused =
            |reason: String| RemoteError::Refused { url: url.into(), object: crate::remote::tag_object(tag), reason };
        let packed = seal.open(&manifest_name(tag), sealed).ok_or_else(|| {
            refused("it does not open under the remote key (another key, tampered with, or another tag's)".into())
        })?;
        let json = zstd::bulk::decompress(&packed, MAX_MANIFEST_JSON).map_err(|e| refused(format!("zstd: {e}")))?;
        RemoteManifest::from_json(tag, &json).map_err(refused)
    }

    /// Parses and checks an opened manifest's JSON as `tag`'s (the fuzzed half of
    /// [`RemoteManifest::open`]).
    pub fn from_json(tag: &str, json: &[u8]) -> Result<RemoteManifest, String> {
        if json.len() > MAX_MANIFEST_JSON {
            return Err(format!("{} bytes of JSON (at most {MAX_MANIFEST_JSON})", json.len()));
        }
        let m: RemoteManifest = serde_json::from_slice(json).map_err(|e| format!("JSON: {e}"))?;
        m.check(tag)?;
        Ok(m)
    }

    fn check(&self, tag: &str) -> Result<(), String> {
        if self.format != MANIFEST_FORMAT || self.version != MANIFEST_VERSION {
            return Err(format!(
                "format {:?} v{} (this build reads {MANIFEST_FORMAT} v{MANIFEST_VERSION})",
                self.format, self.version
            ));
        }
        if self.tag != tag || self.links.last().map(String::as_str) != Some(tag) {
            return Err(format!("it is the manifest of {:?}", self.tag));
        }
        let limits = PackLimits::configured();
        if self.entries.len() as u64 > limits.max_entries {
            return Err(format!("{} entries (at most {})", self.entries.len(), limits.max_entries));
        }
        let mut total = 0u64;
        let mut names = std::collections::HashSet::new();
        for e in &self.entries {
            if !accept_entry_name(&e.name) || !names.insert(e.name.as_str()) {
                return Err(format!("entry name {:?} refused (unknown or repeated)", e.name));
            }
            if e.size > limits.max_entry_bytes {
                return Err(format!("{}: {} bytes (at most {})", e.name, e.size, limits.max_entry_bytes));
            }
            total = total.saturating_add(e.size);
            e.checked_blocks()?;
        }
        if total > limits.max_total_bytes {
            return Err(format!("{total} bytes in all (at most {})", limits.max_total_bytes));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use forkvm_disk::vault::SandboxKey;

    fn manifest() -> RemoteManifest {
        RemoteManifest {
            format: MANIFEST_FORMAT.into(),
            version: MANIFEST_VERSION,
            tag: "t".into(),
            generation: 1,
            links: vec!["t".into()],
            description: serde_json::json!({"head": "t"}),
            entries: vec![RemoteEntry {
                name: "disks/0".into(),
                size: 3 << 20,
                blocks: vec![(0, 4096, ChunkId::of(b"a").to_hex()), (2 << 20, 1 << 20, ChunkId::of(b"b").to_hex())],
            }],
        }
    }

    #[test]
    fn a_manifest_opens_under_its_key_and_tag_only() {
        let seal = ChunkSeal::of_key(&SandboxKey::from_bytes([7; 32]));
        let other = ChunkSeal::of_key(&SandboxKey::from_bytes([8; 32]));
        let sealed = manifest().seal(&seal).unwrap();
        assert_eq!(RemoteManifest::open(&seal, "t", &sealed, "u").unwrap(), manifest());
        assert!(RemoteManifest::open(&other, "t", &sealed, "u").is_err(), "another key");
        assert!(RemoteManifest::open(&seal, "u", &sealed, "u").is_err(), "moved to another tag");
        let mut flipped = sealed.clone();
        let at = flipped.len() / 2;
        flipped[at] ^= 1;
        assert!(RemoteManifest::open(&seal, "t", &flipped, "u").is_err(), "a flipped byte");
    }

    #[test]
    fn blocks_outside_their_entry_or_unknown_names_are_refused() {
        let seal = ChunkSeal::of_key(&SandboxKey::from_bytes([7; 32]));
        let refused = |m: RemoteManifest| RemoteManifest::open(&seal, "t", &m.seal(&seal).unwrap(), "u").unwrap_err();
        let mut m = manifest();
        m.entries[0].blocks[1].0 = 3 << 20;
        assert!(refused(m).to_string().contains("out of place"));
        let mut m = manifest();
        m.entries[0].blocks[1].0 = 4096;
        assert!(refused(m).to_string().contains("out of place"), "unaligned");
        let mut m = manifest();
        m.entries[0].blocks.swap(0, 1);
        assert!(refused(m).to_string().contains("out of place"), "out of order");
        let mut m = manifest();
        m.entries[0].name = "../etc/passwd".into();
        assert!(refused(m).to_string().contains("refused"));
        let mut m = manifest();
        m.entries.push(m.entries[0].clone());
        assert!(refused(m).to_string().contains("repeated"));
    }
}
