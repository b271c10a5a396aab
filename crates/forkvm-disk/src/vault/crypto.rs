//! The few cryptographic primitives the vault uses, in one place: OS randomness,
//! XChaCha20-Poly1305 seal/open with a fresh random nonce, and sub-key derivation.

use super::VaultError;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use std::io;
use std::path::Path;
use zeroize::Zeroizing;

/// Bytes of an XChaCha20-Poly1305 nonce.
pub(crate) const NONCE_LEN: usize = 24;
/// Bytes of a Poly1305 tag.
pub(crate) const TAG_LEN: usize = 16;
/// Bytes of every key.
pub(crate) const KEY_LEN: usize = 32;

/// `blake3::derive_key` context of the AEAD sub-key.
const AEAD_CONTEXT: &str = "forkvm vault 2026 aead key v1";
/// `blake3::derive_key` context of the chunk-name sub-key.
const NAME_CONTEXT: &str = "forkvm vault 2026 chunk name key v1";

/// `N` bytes from the OS CSPRNG; `path` names what they are for in the error.
pub(crate) fn random<const N: usize>(path: &Path) -> Result<[u8; N], VaultError> {
    let mut out = [0u8; N];
    getrandom::getrandom(&mut out).map_err(|e| VaultError::Io {
        step: "reading the OS random source for",
        path: path.to_path_buf(),
        source: io::Error::other(e.to_string()),
    })?;
    Ok(out)
}

/// Encrypts `msg` under `key` with a fresh random nonce; returns nonce and ciphertext+tag.
pub(crate) fn seal(
    key: &[u8; KEY_LEN],
    aad: &[u8],
    msg: &[u8],
    path: &Path,
) -> Result<([u8; NONCE_LEN], Vec<u8>), VaultError> {
    let nonce = random::<NONCE_LEN>(path)?;
    let cipher = XChaCha20Poly1305::new(key.into());
    let ct = cipher.encrypt(XNonce::from_slice(&nonce), Payload { msg, aad }).map_err(|_| VaultError::Io {
        step: "encrypting",
        path: path.to_path_buf(),
        source: io::Error::other("AEAD encryption failed"),
    })?;
    Ok((nonce, ct))
}

/// Decrypts and authenticates `ct`; `None` when the key, nonce, AAD or bytes are wrong.
pub(crate) fn open(key: &[u8; KEY_LEN], nonce: &[u8], aad: &[u8], ct: &[u8]) -> Option<Vec<u8>> {
    if nonce.len() != NONCE_LEN {
        return None;
    }
    let cipher = XChaCha20Poly1305::new(key.into());
    cipher.decrypt(XNonce::from_slice(nonce), Payload { msg: ct, aad }).ok()
}

/// The two sub-keys of a sandbox key.
#[derive(Clone)]
pub(crate) struct SubKeys {
    /// XChaCha20-Poly1305 key of chunks, manifests and the key check.
    pub(crate) aead: Zeroizing<[u8; KEY_LEN]>,
    /// BLAKE3 key naming chunks.
    pub(crate) name: Zeroizing<[u8; KEY_LEN]>,
}

impl SubKeys {
    pub(crate) fn derive(key: &[u8; KEY_LEN]) -> SubKeys {
        SubKeys {
            aead: Zeroizing::new(blake3::derive_key(AEAD_CONTEXT, key)),
            name: Zeroizing::new(blake3::derive_key(NAME_CONTEXT, key)),
        }
    }
}

impl std::fmt::Debug for SubKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SubKeys(<redacted>)")
    }
}
