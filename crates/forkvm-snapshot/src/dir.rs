//! Snapshot directories: the on-disk unit a snapshot lives in.
//!
//! Writing goes through [`SnapshotWriter`], which builds the snapshot in a
//! `<dir>.partial` sibling and publishes it with one atomic rename, so a crash
//! never leaves a half-written directory under the final name. Reading goes
//! through [`SnapshotDir::open`], which checks that the directory is complete
//! before anyone trusts its contents.

mod at_fd;
mod fs_ops;
mod writer;

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::metadata::{read_meta, MemoryFormat, MetadataError, SnapshotMeta, SnapshotStatus};

pub use at_fd::OpenSnapshotDir;
pub use fs_ops::rename_noreplace;
pub use writer::{sync_snapshot_dir, SnapshotWriter};

/// File name of the snapshot metadata.
pub const SNAPSHOT_JSON: &str = "snapshot.json";
/// File name of the encoded VM state.
pub const VMSTATE_BIN: &str = "vmstate.bin";
/// File name of the sparse guest memory image.
pub const MEMORY_IMG: &str = "memory.img";
/// File name of a chunked snapshot's memory description (see `page_map`).
pub const MEMORY_MAP: &str = "memory.map";
/// Directory of the snapshot's disk images.
pub const DISK_DIR: &str = "disk";

/// Why a snapshot directory could not be created, committed or opened.
#[derive(Debug, thiserror::Error)]
pub enum DirError {
    /// The path has no final component to name the snapshot directory.
    #[error("snapshot directory path {0} has no final name component")]
    InvalidPath(PathBuf),
    /// A snapshot already exists at the target path.
    #[error("snapshot directory {0} already exists: choose another tag or delete the old snapshot first")]
    AlreadyExists(PathBuf),
    /// Checking whether the target path exists failed.
    #[error("cannot check snapshot directory {path}: {source}")]
    CheckExisting {
        /// The path checked.
        path: PathBuf,
        /// Underlying error.
        source: io::Error,
    },
    /// A leftover `.partial` directory from a crashed write could not be removed.
    #[error("cannot remove stale partial snapshot {path} left by an earlier crash: {source}")]
    RemoveStalePartial {
        /// The stale directory.
        path: PathBuf,
        /// Underlying error.
        source: io::Error,
    },
    /// Creating the `.partial` directory (or its parents) failed.
    #[error("cannot create snapshot staging directory {path}: {source}")]
    CreatePartial {
        /// The directory.
        path: PathBuf,
        /// Underlying error.
        source: io::Error,
    },
    /// Fsyncing the files or the staging directory failed.
    #[error("cannot sync snapshot files in {path} to disk: {source}")]
    SyncPartial {
        /// The staging directory.
        path: PathBuf,
        /// Underlying error.
        source: io::Error,
    },
    /// Renaming the staging directory to its final name failed.
    #[error("cannot publish snapshot {from} as {to}: {source}")]
    Rename {
        /// The staging directory.
        from: PathBuf,
        /// The final directory.
        to: PathBuf,
        /// Underlying error.
        source: io::Error,
    },
    /// Fsyncing the parent directory after the rename failed.
    #[error("cannot sync directory {path} after publishing the snapshot: {source}")]
    SyncParent {
        /// The parent directory.
        path: PathBuf,
        /// Underlying error.
        source: io::Error,
    },
    /// No snapshot directory exists at the path.
    #[error("snapshot not found: {0} does not exist")]
    NotFound(PathBuf),
    /// The path exists but is not a directory.
    #[error("snapshot path {0} is not a directory")]
    NotADirectory(PathBuf),
    /// Stat-ing the snapshot directory failed.
    #[error("cannot access snapshot directory {path}: {source}")]
    StatDir {
        /// The directory.
        path: PathBuf,
        /// Underlying error.
        source: io::Error,
    },
    /// `snapshot.json` could not be read.
    #[error(transparent)]
    ReadMeta(MetadataError),
    /// The snapshot's metadata says it is still being written.
    #[error("snapshot {0} is still being written (or its writer crashed): it cannot be used")]
    StillWriting(PathBuf),
    /// A required file is missing from the snapshot directory.
    #[error("snapshot {dir} is incomplete: {name} is missing")]
    MissingFile {
        /// The snapshot directory.
        dir: PathBuf,
        /// The missing file's name.
        name: &'static str,
    },
}

/// A complete, ready snapshot directory with its parsed metadata.
#[derive(Debug, Clone)]
pub struct SnapshotDir {
    /// The snapshot directory.
    pub path: PathBuf,
    /// Its parsed `snapshot.json`.
    pub meta: SnapshotMeta,
}

impl SnapshotDir {
    /// Opens the snapshot at `path`: it must be a directory whose
    /// `snapshot.json` parses and says `ready`, and which holds
    /// `vmstate.bin` and its memory (`memory.img`, or `memory.map` when chunked).
    ///
    /// The contents of the files are not validated here; their readers
    /// ([`crate::read_vmstate_file`], [`crate::open_image`]) do that.
    pub fn open(path: &Path) -> Result<SnapshotDir, DirError> {
        match fs::metadata(path) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(DirError::NotADirectory(path.to_path_buf())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(DirError::NotFound(path.to_path_buf())),
            Err(source) => return Err(DirError::StatDir { path: path.to_path_buf(), source }),
        }
        let meta = read_meta(&path.join(SNAPSHOT_JSON)).map_err(DirError::ReadMeta)?;
        if meta.status == SnapshotStatus::Writing {
            return Err(DirError::StillWriting(path.to_path_buf()));
        }
        let memory = match meta.memory_format {
            MemoryFormat::Image => MEMORY_IMG,
            MemoryFormat::Chunked => MEMORY_MAP,
        };
        for name in [VMSTATE_BIN, memory] {
            if !path.join(name).is_file() {
                return Err(DirError::MissingFile { dir: path.to_path_buf(), name });
            }
        }
        Ok(SnapshotDir { path: path.to_path_buf(), meta })
    }

    /// Path of this snapshot's `vmstate.bin`.
    pub fn vmstate_path(&self) -> PathBuf {
        self.path.join(VMSTATE_BIN)
    }

    /// Path of this snapshot's `memory.img`.
    pub fn memory_path(&self) -> PathBuf {
        self.path.join(MEMORY_IMG)
    }

    /// Path of this snapshot's `memory.map` (chunked snapshots).
    pub fn memory_map_path(&self) -> PathBuf {
        self.path.join(MEMORY_MAP)
    }

    /// Whether the memory is in the chunk store (`memory.map`) rather than `memory.img`.
    pub fn is_chunked(&self) -> bool {
        self.meta.memory_format == MemoryFormat::Chunked
    }

    /// Path of this snapshot's `snapshot.json`.
    pub fn meta_path(&self) -> PathBuf {
        self.path.join(SNAPSHOT_JSON)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::{minimal_meta, write_meta};

    fn meta(status: SnapshotStatus) -> SnapshotMeta {
        minimal_meta("t", status)
    }

    fn make_snapshot(dir: &Path, status: SnapshotStatus, files: &[&str]) {
        fs::create_dir_all(dir).unwrap();
        write_meta(&dir.join(SNAPSHOT_JSON), &meta(status)).unwrap();
        for name in files {
            fs::write(dir.join(name), b"x").unwrap();
        }
    }

    #[test]
    fn opens_a_ready_snapshot() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("t");
        make_snapshot(&dir, SnapshotStatus::Ready, &[VMSTATE_BIN, MEMORY_IMG]);
        let snap = SnapshotDir::open(&dir).unwrap();
        assert_eq!(snap.meta, meta(SnapshotStatus::Ready));
        assert_eq!(snap.vmstate_path(), dir.join("vmstate.bin"));
        assert_eq!(snap.memory_path(), dir.join("memory.img"));
    }

    #[test]
    fn missing_dir_is_not_found() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("nope");
        let err = SnapshotDir::open(&dir).unwrap_err();
        assert!(matches!(&err, DirError::NotFound(p) if p == &dir));
        assert!(err.to_string().contains("nope"));
    }

    #[test]
    fn file_instead_of_dir_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("f");
        fs::write(&path, b"").unwrap();
        assert!(matches!(SnapshotDir::open(&path).unwrap_err(), DirError::NotADirectory(_)));
    }

    #[test]
    fn missing_metadata_is_reported() {
        let tmp = tempfile::tempdir().unwrap();
        fs::create_dir(tmp.path().join("t")).unwrap();
        assert!(matches!(
            SnapshotDir::open(&tmp.path().join("t")).unwrap_err(),
            DirError::ReadMeta(MetadataError::Missing(_))
        ));
    }

    #[test]
    fn missing_files_are_named() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("t");
        make_snapshot(&dir, SnapshotStatus::Ready, &[VMSTATE_BIN]);
        let err = SnapshotDir::open(&dir).unwrap_err();
        assert!(matches!(err, DirError::MissingFile { name: MEMORY_IMG, .. }));
        assert!(err.to_string().ends_with("memory.img is missing"));

        fs::remove_file(dir.join(VMSTATE_BIN)).unwrap();
        fs::write(dir.join(MEMORY_IMG), b"").unwrap();
        assert!(matches!(SnapshotDir::open(&dir).unwrap_err(), DirError::MissingFile { name: VMSTATE_BIN, .. }));
    }

    #[test]
    fn writing_status_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("t");
        make_snapshot(&dir, SnapshotStatus::Writing, &[VMSTATE_BIN, MEMORY_IMG]);
        let err = SnapshotDir::open(&dir).unwrap_err();
        assert!(matches!(err, DirError::StillWriting(_)));
        assert!(err.to_string().contains("still being written"));
    }
}
