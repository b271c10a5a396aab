//! Chunks of the snapshot store sealed with a sandbox's key.
//!
//! Why this exists: the snapshot store's chunk store holds memory as plaintext chunks
//! named by their BLAKE3 hash, shared by every snapshot (templates, branches). A
//! checkpoint holds what a sandbox computed, so, like its disk snapshots in the vault,
//! its memory must not reach the store in the clear. A sealed chunk is named by a
//! BLAKE3 hash *keyed* with a sub-key of the sandbox's key, so a sandbox's checkpoints
//! still share every unchanged chunk (convergent within the sandbox, and nothing a name
//! says outside it), and holds its compressed bytes encrypted with XChaCha20-Poly1305
//! under another sub-key, its name as associated data (a chunk moved to another name
//! does not open). Format: [`SEALED_CHUNK_MAGIC`], a 24-byte random nonce, ciphertext
//! and tag.

use super::crypto::{self, KEY_LEN, NONCE_LEN, TAG_LEN};
use super::{KeyStore, SandboxKey, VaultError};
use crate::chunk_id::ChunkId;
use std::path::Path;
use zeroize::Zeroizing;

/// First bytes of a sealed chunk file.
pub const SEALED_CHUNK_MAGIC: [u8; 8] = *b"FKVMSCH1";
/// Bytes a sealed chunk adds to its compressed content.
pub const SEALED_CHUNK_OVERHEAD: usize = SEALED_CHUNK_MAGIC.len() + NONCE_LEN + TAG_LEN;

/// `blake3::derive_key` context of the chunk AEAD sub-key.
const AEAD_CONTEXT: &str = "forkvm snapshot store 2026 sealed chunk aead key v1";
/// `blake3::derive_key` context of the chunk-name sub-key.
const NAME_CONTEXT: &str = "forkvm snapshot store 2026 sealed chunk name key v1";

/// The two sub-keys sealing one sandbox's chunks.
#[derive(Clone)]
pub struct ChunkSeal {
    aead: Zeroizing<[u8; KEY_LEN]>,
    name: Zeroizing<[u8; KEY_LEN]>,
}

impl std::fmt::Debug for ChunkSeal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ChunkSeal(<redacted>)")
    }
}

impl ChunkSeal {
    /// The seal of `key`'s owner.
    pub fn of_key(key: &SandboxKey) -> ChunkSeal {
        ChunkSeal {
            aead: Zeroizing::new(blake3::derive_key(AEAD_CONTEXT, key.bytes())),
            name: Zeroizing::new(blake3::derive_key(NAME_CONTEXT, key.bytes())),
        }
    }

    /// The seal of `owner`'s existing key in the keys directory `keys_dir`: an error
    /// when it has none (never made, or shredded by a purge), never a new key.
    ///
    /// Looks before it opens: a host without that key gets no keys directory made.
    pub fn load(keys_dir: &Path, owner: &str) -> Result<ChunkSeal, VaultError> {
        super::validate_name("sandbox key owner", owner)?;
        let path = keys_dir.join(super::keys::SANDBOXES_DIR).join(format!("{owner}.key"));
        if !path.exists() {
            return Err(VaultError::Key {
                path,
                reason: format!("sandbox {owner} has no key (its vault was purged, or this is another host's store)"),
            });
        }
        KeyStore::open(keys_dir)?.sandbox_key(owner).map(|k| ChunkSeal::of_key(&k))
    }

    /// The name of a chunk holding `plain`.
    pub fn name_of(&self, plain: &[u8]) -> ChunkId {
        ChunkId(*blake3::keyed_hash(&self.name, plain).as_bytes())
    }

    /// `content` (a chunk's compressed bytes) sealed for the chunk named `id`.
    pub fn seal(&self, id: &ChunkId, content: &[u8]) -> Result<Vec<u8>, VaultError> {
        let (nonce, ct) = crypto::seal(&self.aead, &id.0, content, Path::new("sealed chunk"))?;
        let mut out = Vec::with_capacity(SEALED_CHUNK_OVERHEAD + content.len());
        out.extend_from_slice(&SEALED_CHUNK_MAGIC);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&ct);
        Ok(out)
    }

    /// The content of sealed chunk `id`; `None` when it is not one, or does not open
    /// under this seal and name (another sandbox's, renamed, or tampered with).
    pub fn open(&self, id: &ChunkId, sealed: &[u8]) -> Option<Vec<u8>> {
        let rest = sealed.strip_prefix(&SEALED_CHUNK_MAGIC)?;
        if rest.len() < NONCE_LEN + TAG_LEN {
            return None;
        }
        let (nonce, ct) = rest.split_at(NONCE_LEN);
        crypto::open(&self.aead, nonce, &id.0, ct)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_chunk_opens_under_its_key_and_name_only() {
        let a = ChunkSeal::of_key(&SandboxKey::from_bytes([1; 32]));
        let b = ChunkSeal::of_key(&SandboxKey::from_bytes([2; 32]));
        let plain = b"the sandbox's pages".repeat(100);
        let id = a.name_of(&plain);
        assert_eq!(id, a.name_of(&plain), "names are convergent under one key");
        assert_ne!(id, b.name_of(&plain), "and differ between keys");
        assert_ne!(id, ChunkId::of(&plain), "and from the store's plain names");
        let sealed = a.seal(&id, &plain).unwrap();
        assert_eq!(sealed.len(), plain.len() + SEALED_CHUNK_OVERHEAD);
        assert!(!sealed.windows(19).any(|w| w == b"the sandbox's pages"), "no plaintext");
        assert_ne!(sealed, a.seal(&id, &plain).unwrap(), "a fresh nonce each time");
        assert_eq!(a.open(&id, &sealed).as_deref(), Some(&plain[..]));
        assert_eq!(b.open(&id, &sealed), None, "another sandbox's key");
        assert_eq!(a.open(&b.name_of(&plain), &sealed), None, "under another name");
        let mut flipped = sealed.clone();
        flipped[40] ^= 1;
        assert_eq!(a.open(&id, &flipped), None, "a flipped byte");
        assert_eq!(a.open(&id, &sealed[..20]), None, "truncated");
        assert_eq!(a.open(&id, &plain), None, "not sealed at all");
    }

    #[test]
    fn loading_never_makes_a_key() {
        let dir = tempfile::tempdir().unwrap();
        let keys = dir.path().join("keys");
        let e = ChunkSeal::load(&keys, "sb1").unwrap_err();
        assert!(e.to_string().contains("sandbox sb1 has no key"), "{e}");
        let made = KeyStore::open(&keys).unwrap().sandbox_key("sb1").unwrap();
        let loaded = ChunkSeal::load(&keys, "sb1").unwrap();
        assert_eq!(loaded.name_of(b"x"), ChunkSeal::of_key(&made).name_of(b"x"));
        assert!(ChunkSeal::load(&keys, "../x").is_err(), "an owner is a name, not a path");
    }
}
