//! A snapshot directory reached through a descriptor: for a live branch's finisher,
//! whose directory the host side may move (from the VMM's inbox into the store) while
//! the memory image is still being written. Everything here works relative to the
//! descriptor, so a move does not lose it.

use crate::metadata::{MetadataError, SnapshotMeta};
use std::ffi::{CStr, CString};
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::path::{Path, PathBuf};

const META: &CStr = c"snapshot.json";
const META_TMP: &CStr = c".snapshot.json.tmp";

/// An open snapshot directory.
#[derive(Debug)]
pub struct OpenSnapshotDir {
    dir: File,
    /// Where it was when opened (for errors only: it may have moved since).
    opened_at: PathBuf,
}

impl OpenSnapshotDir {
    pub fn open(path: &Path) -> io::Result<OpenSnapshotDir> {
        use std::os::unix::fs::OpenOptionsExt;
        let dir =
            std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW).open(path)?;
        Ok(OpenSnapshotDir { dir, opened_at: path.to_path_buf() })
    }

    /// Fsyncs every file and directory under it, then itself. Those this process may not
    /// open are skipped: another user linked them in (a VMM's live branch, whose disk
    /// files the host side links as root), and syncs them itself.
    pub fn sync_tree(&self) -> io::Result<()> {
        sync_tree_fd(self.dir.as_raw_fd(), 0)
    }

    /// Replaces its `snapshot.json` with `meta`, durably (temp file, fsync, rename, fsync
    /// of the directory).
    pub fn replace_meta(&self, meta: &SnapshotMeta) -> Result<(), MetadataError> {
        let err = |source| MetadataError::WriteFile { path: self.opened_at.join("snapshot.json"), source };
        let mut json = serde_json::to_vec_pretty(meta).map_err(MetadataError::Serialize)?;
        json.push(b'\n');
        let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        // SAFETY: openat with a descriptor we own and a NUL-terminated name.
        let fd = unsafe { libc::openat(self.dir.as_raw_fd(), META_TMP.as_ptr(), flags, 0o600) };
        if fd < 0 {
            return Err(err(io::Error::last_os_error()));
        }
        // SAFETY: `fd` was just opened and is owned by nothing else.
        let mut tmp = unsafe { File::from_raw_fd(fd) };
        tmp.write_all(&json).and_then(|()| tmp.sync_all()).map_err(err)?;
        let d = self.dir.as_raw_fd();
        // SAFETY: renameat within our directory, both names NUL-terminated.
        if unsafe { libc::renameat(d, META_TMP.as_ptr(), d, META.as_ptr()) } != 0 {
            return Err(err(io::Error::last_os_error()));
        }
        self.dir.sync_all().map_err(err)
    }

    /// Takes it out of the snapshots (removes its `snapshot.json`, which every reader
    /// requires), then removes what it can of the rest. What is left, an empty or partial
    /// directory without a description, the store's sweep removes.
    pub fn unpublish(&self) {
        // SAFETY: unlinkat within our directory with NUL-terminated names.
        unsafe {
            libc::unlinkat(self.dir.as_raw_fd(), META.as_ptr(), 0);
            libc::unlinkat(self.dir.as_raw_fd(), META_TMP.as_ptr(), 0);
        }
        let _ = std::fs::remove_dir_all(&self.opened_at);
    }
}

/// Deepest directory nesting [`sync_tree_fd`] follows (a snapshot has two levels:
/// `disk/` and its layers' directories).
const MAX_DEPTH: usize = 8;

fn sync_tree_fd(fd: RawFd, depth: usize) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we hold; the duplicate is owned by the DIR stream.
    let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if dup < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `dup` is ours; the stream takes it over (closedir closes it).
    let stream = unsafe { libc::fdopendir(dup) };
    if stream.is_null() {
        let e = io::Error::last_os_error();
        // SAFETY: fdopendir failed, so `dup` is still ours to close.
        unsafe { libc::close(dup) };
        return Err(e);
    }
    let mut names: Vec<(CString, bool)> = Vec::new();
    loop {
        // SAFETY: readdir on a live stream; the entry is read before the next call.
        let entry = unsafe { libc::readdir(stream) };
        if entry.is_null() {
            break;
        }
        // SAFETY: d_name is a NUL-terminated array inside the entry.
        let name = unsafe { CStr::from_ptr((*entry).d_name.as_ptr()) };
        if name == c"." || name == c".." {
            continue;
        }
        // SAFETY: reading a field of the live entry.
        let kind = unsafe { (*entry).d_type };
        if kind == libc::DT_DIR || kind == libc::DT_REG {
            names.push((name.to_owned(), kind == libc::DT_DIR));
        }
    }
    // SAFETY: closes the stream (and `dup`) once.
    unsafe { libc::closedir(stream) };
    for (name, is_dir) in names {
        if is_dir && depth >= MAX_DEPTH {
            continue;
        }
        let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC | if is_dir { libc::O_DIRECTORY } else { 0 };
        // SAFETY: openat relative to a descriptor we hold, NUL-terminated name.
        let child = unsafe { libc::openat(fd, name.as_ptr(), flags) };
        if child < 0 {
            let e = io::Error::last_os_error();
            if matches!(e.raw_os_error(), Some(libc::EACCES) | Some(libc::EPERM)) {
                continue;
            }
            return Err(e);
        }
        // SAFETY: `child` was just opened and is owned by nothing else.
        let child = unsafe { File::from_raw_fd(child) };
        if is_dir {
            sync_tree_fd(child.as_raw_fd(), depth + 1)?;
        } else {
            child.sync_all()?;
        }
    }
    // SAFETY: fsync on a descriptor we hold.
    if unsafe { libc::fsync(fd) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::{minimal_meta, read_meta, SnapshotStatus};

    #[test]
    fn a_moved_directory_is_still_finished_through_its_descriptor() {
        let tmp = tempfile::tempdir().unwrap();
        let (inbox, store) = (tmp.path().join("inbox/t"), tmp.path().join("snapshots/t"));
        std::fs::create_dir_all(inbox.join("disk/disk0.img.layers/1")).unwrap();
        std::fs::create_dir_all(store.parent().unwrap()).unwrap();
        std::fs::write(inbox.join("disk/disk0.img.layers/1/data"), b"x").unwrap();
        crate::metadata::write_meta(&inbox.join("snapshot.json"), &minimal_meta("t", SnapshotStatus::Writing)).unwrap();
        let open = OpenSnapshotDir::open(&inbox).unwrap();
        std::fs::rename(&inbox, &store).unwrap();
        open.sync_tree().unwrap();
        open.replace_meta(&minimal_meta("t", SnapshotStatus::Ready)).unwrap();
        assert_eq!(read_meta(&store.join("snapshot.json")).unwrap().status, SnapshotStatus::Ready);
        open.unpublish();
        assert!(!store.join("snapshot.json").exists(), "no longer a snapshot");
    }
}
