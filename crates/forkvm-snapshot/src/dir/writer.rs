//! [`SnapshotWriter`]: builds a snapshot in `<dir>.partial` and publishes it
//! atomically, so readers only ever see complete snapshots.
//!
//! Commit protocol: fsync every file, fsync the staging directory, rename it
//! to the final name (refusing to replace anything), fsync the parent. A crash
//! before the rename leaves only a `.partial` directory, which the next
//! [`SnapshotWriter::begin`] for the same path removes.

use std::ffi::OsString;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::fs_ops::{rename_noreplace, sync_dir, sync_files_in};
use super::DirError;

/// An in-progress snapshot directory. Dropping it without
/// [`commit`](SnapshotWriter::commit) removes the staging directory.
#[derive(Debug)]
pub struct SnapshotWriter {
    final_dir: PathBuf,
    /// The staging directory; `None` once committed or aborted.
    partial: Option<PathBuf>,
}

/// `<final_dir>.partial`, next to `final_dir`.
fn partial_path(final_dir: &Path) -> Result<PathBuf, DirError> {
    let name = final_dir.file_name().ok_or_else(|| DirError::InvalidPath(final_dir.to_path_buf()))?;
    let mut partial_name = OsString::from(name);
    partial_name.push(".partial");
    Ok(final_dir.with_file_name(partial_name))
}

/// Makes a published snapshot directory durable: its files, its `disk/` files, the
/// directory and its parent.
pub fn sync_snapshot_dir(dir: &Path) -> Result<(), DirError> {
    sync_tree(dir)?;
    sync_parent(dir)
}

/// Fsyncs the files of a snapshot directory (and of its `disk/`, layers included), then
/// the directory.
fn sync_tree(dir: &Path) -> Result<(), DirError> {
    let sync_err = |source| DirError::SyncPartial { path: dir.to_path_buf(), source };
    sync_files_in(dir).map_err(sync_err)?;
    let disks = dir.join(super::DISK_DIR);
    if disks.is_dir() {
        sync_files_in(&disks).map_err(sync_err)?;
        sync_layer_dirs(&disks).map_err(sync_err)?;
        sync_dir(&disks).map_err(sync_err)?;
    }
    sync_dir(dir).map_err(sync_err)
}

/// Fsyncs the sealed layers of layered disks (`disk/<file>.layers/<id>/{data,bitmap}`)
/// and the directories naming them.
fn sync_layer_dirs(disks: &Path) -> io::Result<()> {
    for entry in fs::read_dir(disks)? {
        let entry = entry?;
        let is_layers = entry.file_name().to_str().is_some_and(|n| n.ends_with(".layers"));
        if !is_layers || !entry.file_type()?.is_dir() {
            continue;
        }
        for layer in fs::read_dir(entry.path())? {
            let layer = layer?;
            if layer.file_type()?.is_dir() {
                sync_files_in(&layer.path())?;
                sync_dir(&layer.path())?;
            }
        }
        sync_dir(&entry.path())?;
    }
    Ok(())
}

/// Fsyncs the directory holding `dir`, making its name durable.
fn sync_parent(dir: &Path) -> Result<(), DirError> {
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    sync_dir(&parent).map_err(|source| DirError::SyncParent { path: parent, source })
}

/// Removes whatever is at `path` (directory or file), if anything.
fn remove_any(path: &Path) -> io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

impl SnapshotWriter {
    /// Starts writing a snapshot that will appear at `final_dir` on commit.
    ///
    /// Fails if `final_dir` already exists. A stale `<final_dir>.partial`
    /// left by a crashed writer is removed. Parent directories are created.
    pub fn begin(final_dir: &Path) -> Result<SnapshotWriter, DirError> {
        let partial = partial_path(final_dir)?;
        match fs::symlink_metadata(final_dir) {
            Ok(_) => return Err(DirError::AlreadyExists(final_dir.to_path_buf())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => return Err(DirError::CheckExisting { path: final_dir.to_path_buf(), source }),
        }
        remove_any(&partial).map_err(|source| DirError::RemoveStalePartial { path: partial.clone(), source })?;
        let create_err = |source| DirError::CreatePartial { path: partial.clone(), source };
        if let Some(parent) = partial.parent().filter(|p| !p.as_os_str().is_empty()) {
            fs::create_dir_all(parent).map_err(create_err)?;
        }
        fs::create_dir(&partial).map_err(create_err)?;
        Ok(SnapshotWriter { final_dir: final_dir.to_path_buf(), partial: Some(partial) })
    }

    /// Path of file `name` inside the staging directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.staging().join(name)
    }

    /// The staging (`.partial`) directory.
    pub fn staging(&self) -> &Path {
        // `partial` is only `None` after commit/abort, which consume `self`.
        self.partial.as_deref().unwrap_or(&self.final_dir)
    }

    /// The directory the snapshot will appear at on commit.
    pub fn final_dir(&self) -> &Path {
        &self.final_dir
    }

    /// Makes the snapshot durable and publishes it under its final name.
    ///
    /// Fails (and removes the staging directory) if anything now exists at
    /// the final path; an existing snapshot is never overwritten.
    pub fn commit(self) -> Result<PathBuf, DirError> {
        sync_tree(self.staging())?;
        let final_dir = self.publish_unsynced()?;
        sync_parent(&final_dir)?;
        Ok(final_dir)
    }

    /// Publishes the staging directory under its final name **without** syncing, for a
    /// snapshot whose `snapshot.json` says `writing`: a live branch makes its tag visible
    /// (and taken) at once and finishes the files in the background. Its writer must call
    /// [`sync_snapshot_dir`] before marking it `ready`.
    pub fn publish_unsynced(mut self) -> Result<PathBuf, DirError> {
        let partial = self.staging().to_path_buf();
        rename_noreplace(&partial, &self.final_dir).map_err(|source| {
            if source.kind() == io::ErrorKind::AlreadyExists {
                DirError::AlreadyExists(self.final_dir.clone())
            } else {
                DirError::Rename { from: partial.clone(), to: self.final_dir.clone(), source }
            }
        })?;
        self.partial = None;
        Ok(self.final_dir.clone())
    }

    /// Discards the snapshot being written (same as dropping it).
    pub fn abort(self) {}
}

impl Drop for SnapshotWriter {
    fn drop(&mut self) {
        if let Some(partial) = self.partial.take() {
            // Best effort: a leftover is removed by the next `begin`.
            let _ = fs::remove_dir_all(partial);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dir::{MEMORY_IMG, SNAPSHOT_JSON, VMSTATE_BIN};

    fn write_all(w: &SnapshotWriter) {
        for name in [SNAPSHOT_JSON, VMSTATE_BIN, MEMORY_IMG] {
            fs::write(w.path(name), name.as_bytes()).unwrap();
        }
    }

    #[test]
    fn commit_publishes_all_files() {
        let tmp = tempfile::tempdir().unwrap();
        let final_dir = tmp.path().join("snapshots").join("base");
        let w = SnapshotWriter::begin(&final_dir).unwrap();
        assert_eq!(w.path(VMSTATE_BIN), tmp.path().join("snapshots/base.partial/vmstate.bin"));
        write_all(&w);
        assert!(!final_dir.exists());
        assert_eq!(w.commit().unwrap(), final_dir);
        for name in [SNAPSHOT_JSON, VMSTATE_BIN, MEMORY_IMG] {
            assert_eq!(fs::read(final_dir.join(name)).unwrap(), name.as_bytes());
        }
        assert!(!tmp.path().join("snapshots/base.partial").exists());
    }

    #[test]
    fn drop_without_commit_leaves_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let final_dir = tmp.path().join("base");
        let w = SnapshotWriter::begin(&final_dir).unwrap();
        write_all(&w);
        drop(w);
        assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 0);
    }

    #[test]
    fn abort_leaves_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let w = SnapshotWriter::begin(&tmp.path().join("base")).unwrap();
        write_all(&w);
        w.abort();
        assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 0);
    }

    #[test]
    fn stale_partial_is_replaced() {
        let tmp = tempfile::tempdir().unwrap();
        let final_dir = tmp.path().join("base");
        let stale = tmp.path().join("base.partial");
        fs::create_dir(&stale).unwrap();
        fs::write(stale.join("leftover"), b"crash").unwrap();
        let w = SnapshotWriter::begin(&final_dir).unwrap();
        assert!(!w.path("leftover").exists());
        write_all(&w);
        w.commit().unwrap();
        assert!(!final_dir.join("leftover").exists());
        assert!(final_dir.join(MEMORY_IMG).exists());
    }

    #[test]
    fn begin_refuses_existing_final_dir() {
        let tmp = tempfile::tempdir().unwrap();
        let final_dir = tmp.path().join("base");
        fs::create_dir(&final_dir).unwrap();
        let err = SnapshotWriter::begin(&final_dir).unwrap_err();
        assert!(matches!(&err, DirError::AlreadyExists(p) if p == &final_dir));
        assert!(!tmp.path().join("base.partial").exists());
    }

    #[test]
    fn commit_refuses_to_overwrite_a_dir_that_appeared() {
        let tmp = tempfile::tempdir().unwrap();
        let final_dir = tmp.path().join("base");
        let w = SnapshotWriter::begin(&final_dir).unwrap();
        write_all(&w);
        // Another writer won the race with an (empty) directory.
        fs::create_dir(&final_dir).unwrap();
        let err = w.commit().unwrap_err();
        assert!(matches!(err, DirError::AlreadyExists(_)));
        assert_eq!(fs::read_dir(&final_dir).unwrap().count(), 0);
        assert!(!tmp.path().join("base.partial").exists());
    }

    #[test]
    fn path_without_name_is_refused() {
        assert!(matches!(SnapshotWriter::begin(Path::new("/")).unwrap_err(), DirError::InvalidPath(_)));
    }
}
