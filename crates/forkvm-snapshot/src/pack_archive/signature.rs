//! Signed packs: who made a pack, not only whether it is intact.
//!
//! The manifest lists every entry's size and BLAKE3, so signing the manifest signs the
//! whole pack. The signature (ed25519, `ed25519-dalek`) is over the BLAKE3 of a canonical
//! encoding of the manifest without its signature: a domain string, format, version,
//! every entry's name, size and hash, and the caller's `meta` as compact JSON (whose
//! object keys serde_json keeps sorted). It travels in the manifest (`signature`), with
//! the signer's public key.
//!
//! Key files are one line of text: `forkvm-ed25519-secret:<64 hex>` (made 0600 by
//! [`generate_key`]) and `forkvm-ed25519-public:<64 hex>` beside it (`<path>.pub`).

use super::{PackError, PackManifest};
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

const SECRET_PREFIX: &str = "forkvm-ed25519-secret:";
const PUBLIC_PREFIX: &str = "forkvm-ed25519-public:";
const DOMAIN: &[u8] = b"forkvm pack signature v1\0";

/// A manifest's signature and the key that made it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PackSignature {
    /// The signer's ed25519 public key, 64 hex digits.
    pub key: String,
    /// The ed25519 signature, 128 hex digits.
    pub sig: String,
}

/// Which pack signers an unpack trusts.
#[derive(Debug, Clone, Default)]
pub struct PackTrust {
    keys: Vec<VerifyingKey>,
}

impl PackTrust {
    /// Trusts no one in particular: unsigned packs are accepted, and a signed pack's
    /// signature must still be valid for the key it names.
    pub fn any() -> PackTrust {
        PackTrust::default()
    }

    /// Trusts `keys` only: unsigned packs and packs signed by anyone else are refused.
    pub fn keys(keys: Vec<VerifyingKey>) -> PackTrust {
        PackTrust { keys }
    }

    /// Reads public key files (`--trust`).
    pub fn from_files(paths: &[PathBuf]) -> Result<PackTrust, KeyError> {
        paths.iter().map(|p| read_public_key(p)).collect::<Result<Vec<_>, _>>().map(PackTrust::keys)
    }

    pub fn requires_signature(&self) -> bool {
        !self.keys.is_empty()
    }

    /// Checks `manifest`'s signature against this trust; returns the signer's key (hex).
    pub fn check(&self, manifest: &PackManifest) -> Result<Option<String>, PackError> {
        let Some(s) = &manifest.signature else {
            if self.requires_signature() {
                return Err(PackError::Signature("the pack is not signed, and only signed packs are trusted".into()));
            }
            return Ok(None);
        };
        let key = parse_hex::<32>(&s.key)
            .and_then(|b| VerifyingKey::from_bytes(&b).ok())
            .ok_or_else(|| PackError::Signature("the signature's key is not an ed25519 public key".into()))?;
        let sig = parse_hex::<64>(&s.sig)
            .map(|b| Signature::from_bytes(&b))
            .ok_or_else(|| PackError::Signature("the signature is not 128 hex digits".into()))?;
        key.verify_strict(&signed_digest(manifest), &sig)
            .map_err(|_| PackError::Signature(format!("the signature by {} does not match the pack", s.key)))?;
        if self.requires_signature() && !self.keys.contains(&key) {
            return Err(PackError::Signature(format!("the pack is signed by {}, which is not a trusted key", s.key)));
        }
        Ok(Some(s.key.clone()))
    }
}

/// Signs `manifest` (its `signature` is replaced).
pub fn sign(manifest: &mut PackManifest, key: &SigningKey) {
    manifest.signature = None;
    let sig = key.sign(&signed_digest(manifest));
    manifest.signature = Some(PackSignature { key: hex(key.verifying_key().as_bytes()), sig: hex(&sig.to_bytes()) });
}

/// What is signed: the BLAKE3 of the canonical encoding described in the module doc.
fn signed_digest(m: &PackManifest) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    let mut field = |b: &[u8]| {
        h.update(&(b.len() as u64).to_le_bytes());
        h.update(b);
    };
    field(DOMAIN);
    field(m.format.as_bytes());
    field(&m.version.to_le_bytes());
    field(&(m.entries.len() as u64).to_le_bytes());
    for e in &m.entries {
        field(e.name.as_bytes());
        field(&e.size.to_le_bytes());
        field(e.blake3.as_bytes());
    }
    field(&serde_json::to_vec(&m.meta).unwrap_or_default());
    *h.finalize().as_bytes()
}

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("pack key {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("pack key {path}: not a forkvm {kind} key (one line `{prefix}<64 hex digits>`)")]
    Format { path: PathBuf, kind: &'static str, prefix: &'static str },
    #[error("pack key {0} exists: refusing to overwrite it")]
    Exists(PathBuf),
    #[error("generating a pack key: {0}")]
    Random(String),
}

/// Reads a secret key file (`--sign`).
pub fn read_secret_key(path: &Path) -> Result<SigningKey, KeyError> {
    let bytes = read_key(path, SECRET_PREFIX, "secret")?;
    Ok(SigningKey::from_bytes(&bytes))
}

/// Reads a public key file (`--trust`).
pub fn read_public_key(path: &Path) -> Result<VerifyingKey, KeyError> {
    let bytes = read_key(path, PUBLIC_PREFIX, "public")?;
    VerifyingKey::from_bytes(&bytes).map_err(|_| KeyError::Format {
        path: path.to_path_buf(),
        kind: "public",
        prefix: PUBLIC_PREFIX,
    })
}

fn read_key(path: &Path, prefix: &'static str, kind: &'static str) -> Result<[u8; 32], KeyError> {
    let text = std::fs::read_to_string(path).map_err(|source| KeyError::Io { path: path.to_path_buf(), source })?;
    text.trim().strip_prefix(prefix).and_then(parse_hex::<32>).ok_or_else(|| KeyError::Format {
        path: path.to_path_buf(),
        kind,
        prefix,
    })
}

/// Writes a new key pair: `path` (secret, 0600, never overwritten) and `path.pub`.
/// Returns the public key's path.
pub fn generate_key(path: &Path) -> Result<PathBuf, KeyError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut seed = zeroize::Zeroizing::new([0u8; 32]);
    getrandom::getrandom(seed.as_mut()).map_err(|e| KeyError::Random(e.to_string()))?;
    let key = SigningKey::from_bytes(&seed);
    let public = PathBuf::from(format!("{}.pub", path.display()));
    let io = |p: &Path| {
        let p = p.to_path_buf();
        move |source: std::io::Error| {
            if source.kind() == std::io::ErrorKind::AlreadyExists {
                KeyError::Exists(p)
            } else {
                KeyError::Io { path: p, source }
            }
        }
    };
    let write = |p: &Path, mode: u32, text: String| -> Result<(), KeyError> {
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(mode).open(p).map_err(io(p))?;
        f.write_all(text.as_bytes()).and_then(|_| f.sync_all()).map_err(io(p))
    };
    write(path, 0o600, format!("{SECRET_PREFIX}{}\n", hex(seed.as_ref())))?;
    write(&public, 0o644, format!("{PUBLIC_PREFIX}{}\n", hex(key.verifying_key().as_bytes())))?;
    Ok(public)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn parse_hex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N || !s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return None;
    }
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::super::{PackEntry, PACK_FORMAT, PACK_VERSION};
    use super::*;

    fn manifest() -> PackManifest {
        PackManifest {
            format: PACK_FORMAT.into(),
            version: PACK_VERSION,
            entries: vec![PackEntry { name: "a".into(), size: 1, blake3: "0".repeat(64) }],
            meta: serde_json::json!({"head": "x", "links": [1, 2]}),
            signature: None,
        }
    }

    #[test]
    fn signed_manifests_verify_and_any_change_breaks_them() {
        let dir = tempfile::tempdir().unwrap();
        let (secret, other) = (dir.path().join("k"), dir.path().join("o"));
        let public = generate_key(&secret).unwrap();
        let other_public = generate_key(&other).unwrap();
        assert!(matches!(generate_key(&secret), Err(KeyError::Exists(_))));
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&secret).unwrap().permissions().mode() & 0o777, 0o600);
        let key = read_secret_key(&secret).unwrap();
        let trusted = PackTrust::from_files(std::slice::from_ref(&public)).unwrap();
        let stranger = PackTrust::from_files(&[other_public]).unwrap();

        let mut m = manifest();
        assert!(PackTrust::any().check(&m).unwrap().is_none());
        assert!(trusted.check(&m).unwrap_err().to_string().contains("not signed"));
        sign(&mut m, &key);
        let signer = trusted.check(&m).unwrap().unwrap();
        assert_eq!(Some(&signer), m.signature.as_ref().map(|s| &s.key));
        assert!(PackTrust::any().check(&m).is_ok());
        assert!(stranger.check(&m).unwrap_err().to_string().contains("not a trusted key"));
        // Any change to what the manifest says breaks the signature.
        let mut changed = m.clone();
        changed.entries[0].size = 2;
        assert!(trusted.check(&changed).unwrap_err().to_string().contains("does not match"));
        let mut changed = m.clone();
        changed.meta["head"] = "y".into();
        assert!(PackTrust::any().check(&changed).is_err());
        // Key files of the wrong kind are refused.
        assert!(read_public_key(&secret).is_err());
        assert!(read_secret_key(&public).is_err());
    }
}
