//! Small files sealed with a vault's key but kept outside it: an archive's vCPU and
//! device state (`vmstate.bin`), which can hold guest data (buffered vsock bytes,
//! register contents) and so must not sit in the store in the clear.
//!
//! Why this exists: chunks are content-addressed blocks of a disk map; a state file is
//! one opaque blob read whole. File layout:
//!
//! | offset | size | field |
//! |--------|------|-------|
//! | 0      | 8    | magic `FKVMVSF1` |
//! | 8      | 24   | random nonce |
//! | 32     | rest | XChaCha20-Poly1305(plaintext), AAD = magic + label |
//!
//! The label says what the file is (e.g. `archive 7 vmstate.bin`), so one sealed file
//! cannot be passed off as another of the same vault.

use super::crypto::{self, NONCE_LEN, TAG_LEN};
use super::fsutil;
use super::{Vault, VaultError};
use std::path::Path;

/// First bytes of a sealed file.
pub const SEALED_FILE_MAGIC: [u8; 8] = *b"FKVMVSF1";

fn aad(label: &str) -> Vec<u8> {
    [&SEALED_FILE_MAGIC[..], label.as_bytes()].concat()
}

impl Vault {
    /// Writes `plaintext` encrypted to `path` (temp name, fsync, rename, directory
    /// fsync), bound to `label`.
    pub fn write_sealed_file(&self, path: &Path, label: &str, plaintext: &[u8]) -> Result<(), VaultError> {
        let (nonce, ct) = crypto::seal(&self.keys.aead, &aad(label), plaintext, path)?;
        let bytes = [&SEALED_FILE_MAGIC[..], &nonce, &ct].concat();
        let tmp = fsutil::write_temp(path, &bytes, 0o600)?;
        fsutil::commit(&tmp, path)
    }

    /// Reads back a file [`Vault::write_sealed_file`] wrote with the same `label`;
    /// refuses one over `cap` bytes, of another vault or label, or altered.
    pub fn read_sealed_file(&self, path: &Path, label: &str, cap: u64) -> Result<Vec<u8>, VaultError> {
        let bytes = fsutil::read_capped(path, cap)?;
        let bad = |reason: &str| VaultError::Corrupt { path: path.to_path_buf(), reason: reason.to_string() };
        if bytes.len() < 8 + NONCE_LEN + TAG_LEN || bytes[..8] != SEALED_FILE_MAGIC {
            return Err(bad("not a sealed file (short or bad magic)"));
        }
        crypto::open(&self.keys.aead, &bytes[8..8 + NONCE_LEN], &aad(label), &bytes[8 + NONCE_LEN..])
            .ok_or_else(|| bad(&format!("fails authentication as {label:?} (tampered, another file, or another key)")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vault::SandboxKey;
    use crate::vault::VaultErrorKind;

    #[test]
    fn a_sealed_file_reads_back_only_with_its_key_and_label() {
        let tmp = tempfile::tempdir().unwrap();
        let key = SandboxKey::from_bytes([7; 32]);
        let vault = Vault::open(&tmp.path().join("v"), key.clone()).unwrap();
        let path = tmp.path().join("state.sealed");
        let secret = b"FORKVM-SEALED-CANARY registers and vsock bytes".repeat(10);
        vault.write_sealed_file(&path, "archive 1 vmstate.bin", &secret).unwrap();
        let raw = std::fs::read(&path).unwrap();
        assert!(!raw.windows(20).any(|w| w == &secret[..20]), "plaintext on disk");
        assert_eq!(vault.read_sealed_file(&path, "archive 1 vmstate.bin", 1 << 20).unwrap(), secret);

        let err = |r: Result<Vec<u8>, VaultError>| r.unwrap_err().kind();
        assert_eq!(err(vault.read_sealed_file(&path, "archive 2 vmstate.bin", 1 << 20)), VaultErrorKind::Corrupt);
        assert_eq!(err(vault.read_sealed_file(&path, "archive 1 vmstate.bin", 16)), VaultErrorKind::Corrupt);
        let other = Vault::open(&tmp.path().join("w"), SandboxKey::from_bytes([8; 32])).unwrap();
        assert_eq!(err(other.read_sealed_file(&path, "archive 1 vmstate.bin", 1 << 20)), VaultErrorKind::Corrupt);
        let mut flipped = raw.clone();
        *flipped.last_mut().unwrap() ^= 1;
        std::fs::write(&path, &flipped).unwrap();
        assert_eq!(err(vault.read_sealed_file(&path, "archive 1 vmstate.bin", 1 << 20)), VaultErrorKind::Corrupt);
        assert_eq!(err(vault.read_sealed_file(&tmp.path().join("none"), "x", 1 << 20)), VaultErrorKind::Io);
    }
}
