//! Key management, stored apart from the vault data (see the format in [`super`]).
//!
//! Why this exists: the vault must hold no plaintext and must be shreddable per
//! sandbox. The host key never leaves the keys directory; each sandbox gets its own
//! random key, stored wrapped by the host key, so deleting one small file makes that
//! sandbox's vault unreadable while the others stay intact. The caller passes a keys
//! directory that is not inside any vault.

use super::crypto::{self, KEY_LEN, NONCE_LEN, TAG_LEN};
use super::fsutil::{create_dir, create_no_clobber, sync_dir};
use super::{io_err, validate_name, VaultError};
use std::fmt;
use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use zeroize::Zeroizing;

/// The directory of the host key and the wrapped per-sandbox keys:
/// `$FORKVM_KEYS`, else `$HOME/.config/forkvm/keys` — never inside the store.
pub fn default_keys_dir() -> PathBuf {
    if let Some(v) = std::env::var_os("FORKVM_KEYS").filter(|v| !v.is_empty()) {
        return PathBuf::from(v);
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/root"));
    home.join(".config/forkvm/keys")
}

/// The host key file inside the keys directory.
pub const HOST_KEY_FILE: &str = "host.key";
/// The directory of wrapped sandbox keys inside the keys directory.
pub const SANDBOXES_DIR: &str = "sandboxes";
/// First bytes of a wrapped sandbox key.
pub const WRAPPED_KEY_MAGIC: [u8; 8] = *b"FKVMWKEY";
/// Version of the wrapped key file (compatibility rule: exactly the known versions).
pub const WRAPPED_KEY_VERSION: u32 = 1;
/// AAD prefix of a wrapped sandbox key; the owner follows.
const WRAP_AAD: &[u8] = b"forkvm sandbox key v1\0";
/// Length of a wrapped key file.
const WRAPPED_LEN: usize = 8 + 4 + NONCE_LEN + KEY_LEN + TAG_LEN;

/// A sandbox's 32-byte key: zeroized on drop, never printed.
#[derive(Clone)]
pub struct SandboxKey(Zeroizing<[u8; KEY_LEN]>);

impl SandboxKey {
    /// Wraps raw key bytes (for callers that manage keys themselves, and tests).
    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> SandboxKey {
        SandboxKey(Zeroizing::new(bytes))
    }

    pub(crate) fn bytes(&self) -> &[u8; KEY_LEN] {
        &self.0
    }
}

impl fmt::Debug for SandboxKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SandboxKey(<redacted>)")
    }
}

/// The keys directory: the host key, loaded, and the wrapped sandbox keys.
pub struct KeyStore {
    dir: PathBuf,
    host: Zeroizing<[u8; KEY_LEN]>,
}

impl fmt::Debug for KeyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyStore").field("dir", &self.dir).field("host", &"<redacted>").finish()
    }
}

impl KeyStore {
    /// Opens the keys directory, creating it (0700) and its host key (32 random bytes,
    /// 0600) if missing. Racing creators agree on one key. Refuses a directory or host
    /// key that group or others may access, and a host key of the wrong length.
    pub fn open(dir: &Path) -> Result<KeyStore, VaultError> {
        create_dir(dir, 0o700)?;
        check_private(dir, 0o077, "keys directory")?;
        let path = dir.join(HOST_KEY_FILE);
        if !path.exists() {
            let fresh = Zeroizing::new(crypto::random::<KEY_LEN>(&path)?);
            // The loser of a race reads the winner's key below.
            create_no_clobber(&path, fresh.as_slice(), 0o600)?;
        }
        let bytes = read_key_file(&path, KEY_LEN)?;
        let mut host = Zeroizing::new([0u8; KEY_LEN]);
        host.copy_from_slice(&bytes);
        create_dir(&dir.join(SANDBOXES_DIR), 0o700)?;
        Ok(KeyStore { dir: dir.to_path_buf(), host })
    }

    /// The keys directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where `owner`'s wrapped key is stored.
    fn sandbox_path(&self, owner: &str) -> Result<PathBuf, VaultError> {
        validate_name("sandbox key owner", owner)?;
        Ok(self.dir.join(SANDBOXES_DIR).join(format!("{owner}.key")))
    }

    /// `owner`'s key: loaded and unwrapped, or created (random, wrapped with the host
    /// key, written so racing creators agree on one).
    pub fn sandbox_key(&self, owner: &str) -> Result<SandboxKey, VaultError> {
        let path = self.sandbox_path(owner)?;
        if !path.exists() {
            let key = Zeroizing::new(crypto::random::<KEY_LEN>(&path)?);
            let aad = wrap_aad(owner);
            let (nonce, ct) = crypto::seal(&self.host, &aad, key.as_slice(), &path)?;
            let mut file = Vec::with_capacity(WRAPPED_LEN);
            file.extend_from_slice(&WRAPPED_KEY_MAGIC);
            file.extend_from_slice(&WRAPPED_KEY_VERSION.to_le_bytes());
            file.extend_from_slice(&nonce);
            file.extend_from_slice(&ct);
            create_no_clobber(&path, &file, 0o600)?;
        }
        self.unwrap(owner, &path)
    }

    fn unwrap(&self, owner: &str, path: &Path) -> Result<SandboxKey, VaultError> {
        let bad = |reason: String| VaultError::Key { path: path.to_path_buf(), reason };
        let bytes = read_key_file(path, WRAPPED_LEN)?;
        if bytes[..8] != WRAPPED_KEY_MAGIC {
            return Err(bad("not a wrapped sandbox key (bad magic)".to_string()));
        }
        let version = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
        if version != WRAPPED_KEY_VERSION {
            return Err(bad(format!("version {version}; this build reads version {WRAPPED_KEY_VERSION}")));
        }
        let plain = crypto::open(&self.host, &bytes[12..12 + NONCE_LEN], &wrap_aad(owner), &bytes[12 + NONCE_LEN..])
            .map(Zeroizing::new)
            .ok_or_else(|| {
                bad("does not decrypt: wrapped with another host key, for another owner, or tampered with".to_string())
            })?;
        let mut key = [0u8; KEY_LEN];
        key.copy_from_slice(&plain);
        let key = SandboxKey::from_bytes(key);
        Ok(key)
    }

    /// `owner`'s existing key sealed under `seal` for the name `name`, to carry it to
    /// another host that holds `seal` (a remote's key); an error when `owner` has none
    /// here (never a new key).
    pub fn export_sandbox_key(
        &self,
        owner: &str,
        seal: &super::ChunkSeal,
        name: &crate::chunk_id::ChunkId,
    ) -> Result<Vec<u8>, VaultError> {
        let path = self.sandbox_path(owner)?;
        if !path.exists() {
            return Err(VaultError::Key { path, reason: format!("sandbox {owner} has no key on this host") });
        }
        let key = self.unwrap(owner, &path)?;
        seal.seal(name, key.bytes())
    }

    /// Takes in a key [`KeyStore::export_sandbox_key`] sealed, wrapped with this host's
    /// key. Refused when it does not open, or when `owner` has another key here already
    /// (the same key is fine: nothing is written).
    pub fn import_sandbox_key(
        &self,
        owner: &str,
        seal: &super::ChunkSeal,
        name: &crate::chunk_id::ChunkId,
        sealed: &[u8],
    ) -> Result<(), VaultError> {
        let path = self.sandbox_path(owner)?;
        let bad = |reason: String| VaultError::Key { path: path.clone(), reason };
        let plain = seal
            .open(name, sealed)
            .map(Zeroizing::new)
            .ok_or_else(|| bad("the carried key does not open (another remote key, or tampered with)".into()))?;
        if plain.len() != KEY_LEN {
            return Err(bad(format!("the carried key is {} bytes", plain.len())));
        }
        if path.exists() {
            let have = self.unwrap(owner, &path)?;
            if have.bytes()[..] != plain[..] {
                return Err(bad(format!("sandbox {owner} has another key on this host; not replaced")));
            }
            return Ok(());
        }
        let aad = wrap_aad(owner);
        let (nonce, ct) = crypto::seal(&self.host, &aad, &plain, &path)?;
        let mut file = Vec::with_capacity(WRAPPED_LEN);
        file.extend_from_slice(&WRAPPED_KEY_MAGIC);
        file.extend_from_slice(&WRAPPED_KEY_VERSION.to_le_bytes());
        file.extend_from_slice(&nonce);
        file.extend_from_slice(&ct);
        create_no_clobber(&path, &file, 0o600).map(|_| ())
    }

    /// Whether `owner` has a key (an invalid owner name has none).
    pub fn has_sandbox_key(&self, owner: &str) -> bool {
        self.sandbox_path(owner).is_ok_and(|p| p.exists())
    }

    /// Deletes `owner`'s key (crypto-shredding its vault); Ok if there is none.
    pub fn remove_sandbox_key(&self, owner: &str) -> Result<(), VaultError> {
        let path = self.sandbox_path(owner)?;
        match fs::remove_file(&path) {
            Ok(()) => sync_dir(&self.dir.join(SANDBOXES_DIR)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err("removing sandbox key", &path)(e)),
        }
    }
}

fn wrap_aad(owner: &str) -> Vec<u8> {
    let mut aad = WRAP_AAD.to_vec();
    aad.extend_from_slice(owner.as_bytes());
    aad
}

/// Refuses `path` if any of `forbidden` mode bits are set.
fn check_private(path: &Path, forbidden: u32, what: &str) -> Result<(), VaultError> {
    let meta = fs::metadata(path).map_err(io_err("checking permissions of", path))?;
    let mode = meta.mode() & 0o7777;
    if mode & forbidden != 0 {
        return Err(VaultError::Key {
            path: path.to_path_buf(),
            reason: format!("{what} has mode {mode:04o}; group and others must have no access (chmod go-rwx)"),
        });
    }
    Ok(())
}

/// Reads a key file of exactly `len` bytes: a regular file (no symlink), 0600 or
/// stricter.
fn read_key_file(path: &Path, len: usize) -> Result<Zeroizing<Vec<u8>>, VaultError> {
    let bad = |reason: String| VaultError::Key { path: path.to_path_buf(), reason };
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(io_err("opening key file", path))?;
    let meta = file.metadata().map_err(io_err("stat-ing key file", path))?;
    if !meta.is_file() {
        return Err(bad("not a regular file".to_string()));
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(bad(format!("mode {mode:04o}; group and others must have no access (chmod 600)")));
    }
    let mut bytes = Zeroizing::new(Vec::with_capacity(len + 1));
    read_up_to(file, len as u64 + 1, &mut bytes).map_err(io_err("reading key file", path))?;
    if bytes.len() != len {
        return Err(bad(format!("{} bytes, expected exactly {len}", bytes.len())));
    }
    Ok(bytes)
}

fn read_up_to(file: File, cap: u64, out: &mut Vec<u8>) -> io::Result<()> {
    file.take(cap).read_to_end(out).map(|_| ())
}
