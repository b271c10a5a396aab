//! A capture's disk references: where a branch taken with its disks *referenced*
//! (`DiskCapture::Reference`) says its disk files are, instead of linking them.
//!
//! Why a file and not symbolic links: VMMs may not make symbolic links at all (their
//! seccomp filters deny it), so nothing a VMM wrote can send a host-side reader through
//! a link to a file outside the VMM's jail. A reference is only a claim: whoever reads
//! one checks the path against what the sandbox may use before opening anything.
//!
//! `disk/references.json` maps a name inside `disk/` (`disk<i>.img`, or
//! `disk<i>.img.layers/<id>` for a sealed layer's directory) to an absolute path.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// File name of the references, inside a capture's `disk/`.
pub const DISK_REFERENCES: &str = "references.json";

/// Most bytes a references file may have (a VM has at most 11 disks; each a few hundred
/// layers at most): a larger one is refused unread.
pub const MAX_REFERENCES_BYTES: u64 = 1 << 20;

/// Name in `disk/` → the absolute path the VM has it at.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct DiskReferences(pub BTreeMap<String, PathBuf>);

#[derive(Debug, thiserror::Error)]
pub enum ReferencesError {
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path} is {size} bytes; at most {MAX_REFERENCES_BYTES} are read")]
    TooLarge { path: PathBuf, size: u64 },
    #[error("{path} is not a references file: {source}")]
    Parse { path: PathBuf, source: serde_json::Error },
    #[error("writing {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("the capture has no reference for {name}")]
    Missing { name: String },
}

impl DiskReferences {
    /// Reads `<disk_dir>/references.json` (a regular file, bounded).
    pub fn read(disk_dir: &Path) -> Result<DiskReferences, ReferencesError> {
        use std::io::Read;
        let path = disk_dir.join(DISK_REFERENCES);
        let read = |source| ReferencesError::Read { path: path.clone(), source };
        let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(&path).map_err(read)?;
        let size = file.metadata().map_err(read)?.len();
        if size > MAX_REFERENCES_BYTES {
            return Err(ReferencesError::TooLarge { path, size });
        }
        let mut bytes = Vec::with_capacity(size as usize);
        file.take(MAX_REFERENCES_BYTES + 1).read_to_end(&mut bytes).map_err(read)?;
        serde_json::from_slice(&bytes).map_err(|source| ReferencesError::Parse { path, source })
    }

    /// Writes `<disk_dir>/references.json`.
    pub fn write(&self, disk_dir: &Path) -> Result<(), ReferencesError> {
        let path = disk_dir.join(DISK_REFERENCES);
        let json = serde_json::to_vec_pretty(self).expect("a map of strings to paths serializes");
        std::fs::write(&path, json).map_err(|source| ReferencesError::Write { path, source })
    }

    /// The path named for `name` (unchecked: the caller checks it).
    pub fn get(&self, name: &str) -> Result<&Path, ReferencesError> {
        self.0.get(name).map(PathBuf::as_path).ok_or_else(|| ReferencesError::Missing { name: name.to_string() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_round_trip_and_refuse_oversized_or_linked_files() {
        let dir = tempfile::tempdir().unwrap();
        let mut refs = DiskReferences::default();
        refs.0.insert("disk0.img".into(), "/store/snapshots/t/disk/disk0.img".into());
        refs.write(dir.path()).unwrap();
        assert_eq!(DiskReferences::read(dir.path()).unwrap(), refs);
        assert!(matches!(refs.get("disk1.img"), Err(ReferencesError::Missing { .. })));

        let big = tempfile::tempdir().unwrap();
        std::fs::write(big.path().join(DISK_REFERENCES), vec![b' '; (MAX_REFERENCES_BYTES + 1) as usize]).unwrap();
        assert!(matches!(DiskReferences::read(big.path()), Err(ReferencesError::TooLarge { .. })));

        let linked = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(dir.path().join(DISK_REFERENCES), linked.path().join(DISK_REFERENCES)).unwrap();
        assert!(matches!(DiskReferences::read(linked.path()), Err(ReferencesError::Read { .. })));
    }
}
