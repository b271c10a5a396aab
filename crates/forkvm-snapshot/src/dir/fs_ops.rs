//! Low-level filesystem steps for crash-safe directory commits: fsync of
//! files and directories, and a rename that refuses to replace its target.
//!
//! These are kept apart from the writer logic because they are the only
//! places that talk to the kernel directly (one of them through `unsafe`).

use std::ffi::CString;
use std::fs::{self, File};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Fsyncs every regular file directly inside `dir`.
pub(super) fn sync_files_in(dir: &Path) -> io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_file() {
            File::open(entry.path())?.sync_all()?;
        }
    }
    Ok(())
}

/// Fsyncs a directory, making the names inside it durable.
pub(super) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Converts a path to a C string for a syscall.
fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

/// Renames `from` to `to`, failing with `ErrorKind::AlreadyExists` if `to`
/// exists instead of replacing it.
///
/// Uses `renameat2(RENAME_NOREPLACE)`, which is atomic. On filesystems or
/// kernels without it, falls back to check-then-rename (racy, but only
/// against another writer of the same snapshot tag).
pub fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    let c_from = c_path(from)?;
    let c_to = c_path(to)?;
    // SAFETY: both pointers come from live `CString`s, so they are valid,
    // NUL-terminated and outlive the call; AT_FDCWD makes the relative-path
    // behaviour identical to rename(2). The call does not retain them.
    let rc = unsafe {
        libc::renameat2(libc::AT_FDCWD, c_from.as_ptr(), libc::AT_FDCWD, c_to.as_ptr(), libc::RENAME_NOREPLACE)
    };
    if rc == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EINVAL) | Some(libc::ENOSYS) | Some(libc::EOPNOTSUPP) => {
            if fs::symlink_metadata(to).is_ok() {
                return Err(io::Error::new(io::ErrorKind::AlreadyExists, "destination already exists"));
            }
            fs::rename(from, to)
        }
        _ => Err(err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rename_noreplace_moves_and_refuses_to_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        let b = dir.path().join("b");
        fs::create_dir(&a).unwrap();
        rename_noreplace(&a, &b).unwrap();
        assert!(!a.exists() && b.is_dir());

        fs::create_dir(&a).unwrap();
        fs::write(a.join("marker"), b"x").unwrap();
        let err = rename_noreplace(&a, &b).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AlreadyExists);
        assert!(a.join("marker").exists());
        assert!(!b.join("marker").exists());
    }

    #[test]
    fn syncs_files_and_dirs() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("f"), b"data").unwrap();
        fs::create_dir(dir.path().join("sub")).unwrap();
        sync_files_in(dir.path()).unwrap();
        sync_dir(dir.path()).unwrap();
    }
}
