//! The remote key: the 32 bytes every host sharing a remote holds, sealing its blocks
//! and manifests.
//!
//! A raw 32-byte file, mode 0600 (a key readable by group or others is refused, as
//! ssh refuses such a private key). `forkvm remote keygen` makes one; copying it to
//! the other hosts is the operator's step, as with any shared secret.

use crate::RemoteError;
use forkvm_disk::vault::{ChunkSeal, SandboxKey};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Environment variable naming the remote key file.
pub const REMOTE_KEY_ENV: &str = "FORKVM_REMOTE_KEY";

/// A loaded remote key, as the seal it gives.
#[derive(Clone, Debug)]
pub struct RemoteKey {
    seal: ChunkSeal,
    path: PathBuf,
}

impl RemoteKey {
    /// `$FORKVM_REMOTE_KEY`, else `remote.key` in the vault's keys directory.
    pub fn default_path() -> PathBuf {
        match std::env::var_os(REMOTE_KEY_ENV) {
            Some(p) if !p.is_empty() => PathBuf::from(p),
            _ => forkvm_disk::vault::default_keys_dir().join("remote.key"),
        }
    }

    /// Reads the key at `path`.
    pub fn load(path: &Path) -> Result<RemoteKey, RemoteError> {
        let bad = |reason: String| RemoteError::Key { path: path.into(), reason };
        let meta = std::fs::metadata(path).map_err(|e| {
            bad(format!("{e} (make one with `forkvm remote keygen`, or copy the key of the hosts sharing the remote)"))
        })?;
        if meta.permissions().mode() & 0o077 != 0 {
            return Err(bad(format!("mode {:o} lets others read it; chmod 600 it", meta.permissions().mode() & 0o777)));
        }
        if meta.len() != 32 {
            return Err(bad(format!("{} bytes; a remote key is 32", meta.len())));
        }
        let bytes = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
        let key: [u8; 32] = bytes.as_slice().try_into().map_err(|_| bad("not 32 bytes".into()))?;
        Ok(RemoteKey { seal: ChunkSeal::of_key(&SandboxKey::from_bytes(key)), path: path.into() })
    }

    /// Writes a new random key to `path` (0600); refused when `path` exists.
    pub fn generate(path: &Path) -> Result<RemoteKey, RemoteError> {
        let mut key = [0u8; 32];
        getrandom::getrandom(&mut key).map_err(|e| RemoteError::Key { path: path.into(), reason: e.to_string() })?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(RemoteError::io("creating the key's directory", dir))?;
        }
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(RemoteError::io("creating the remote key", path))?;
        f.write_all(&key).and_then(|_| f.sync_all()).map_err(RemoteError::io("writing the remote key", path))?;
        RemoteKey::load(path)
    }

    /// The seal of blocks and manifests.
    pub fn seal(&self) -> &ChunkSeal {
        &self.seal
    }

    /// Where the key was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_made_once_and_refused_when_others_can_read_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k/remote.key");
        let k = RemoteKey::generate(&path).unwrap();
        assert!(RemoteKey::generate(&path).is_err(), "never overwritten");
        let again = RemoteKey::load(&path).unwrap();
        let id = k.seal().name_of(b"x");
        assert_eq!(id, again.seal().name_of(b"x"));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(RemoteKey::load(&path).unwrap_err().to_string().contains("chmod 600"));
        let short = dir.path().join("short");
        std::fs::write(&short, [1u8; 16]).unwrap();
        std::fs::set_permissions(&short, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(RemoteKey::load(&short).unwrap_err().to_string().contains("16 bytes"));
        assert!(RemoteKey::load(&dir.path().join("none")).unwrap_err().to_string().contains("keygen"));
    }
}
