//! Files a VMM process opened before it gave up its uid, found again by path.
//!
//! Why this exists: a sandbox's VMM runs under a uid of its own (docs/security.md), which
//! owns its run directory and nothing else. The files it reads from the store and the
//! artefact cache (its base image, a tag's sealed layers, a kernel) are root's, 0600: it
//! could not open them by then. So whoever builds the VMM opens exactly those, while
//! still root, and offers them here; the code that opens disk files by path
//! ([`open`]) takes an offered one first. Nothing else is reachable that way: a path
//! not offered is opened as usual, with the process's own permissions.
//!
//! Each [`open`] returns a new descriptor of the same open file, at offset 0. That offset
//! is shared with every other descriptor of it, in this process and in every process
//! that inherited it (the children a running sandbox forks restore from its offered
//! files at the same time): code that may run in such a child reads with positions
//! (`pread`), never through the offset.

use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

struct Offered {
    path: PathBuf,
    file: OwnedFd,
    writable: bool,
}

static OFFERED: Mutex<Vec<Offered>> = Mutex::new(Vec::new());

fn offered() -> std::sync::MutexGuard<'static, Vec<Offered>> {
    OFFERED.lock().unwrap_or_else(|p| p.into_inner())
}

/// Offers `file`, open at `path` (for writing too when `writable`), to later [`open`]s
/// of that exact path in this process and its forks. A second offer replaces the first.
pub fn offer(path: &Path, file: File, writable: bool) {
    let mut all = offered();
    all.retain(|o| o.path != path);
    all.push(Offered { path: path.to_path_buf(), file: file.into(), writable });
}

/// Opens `path` for reading (and writing, with `write`): a new descriptor of the file
/// offered at that path if there is one that allows it, else the file itself.
pub fn open(path: &Path, write: bool) -> std::io::Result<File> {
    match offered_file(path, write) {
        Some(file) => file,
        None => OpenOptions::new().read(true).write(write).open(path),
    }
}

/// A new descriptor of the file offered at `path` (allowing `write`), if there is one.
pub fn offered_file(path: &Path, write: bool) -> Option<std::io::Result<File>> {
    let all = offered();
    let o = all.iter().find(|o| o.path == path && (o.writable || !write))?;
    Some(o.file.try_clone().map(File::from).and_then(|file| {
        // SAFETY: lseek on a descriptor this function owns.
        if unsafe { libc::lseek(file.as_raw_fd(), 0, libc::SEEK_SET) } < 0 {
            // A device node that cannot seek is fine where it is.
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::ESPIPE) {
                return Err(e);
            }
        }
        Ok(file)
    }))
}

/// Withdraws the offer at `path`, if any (its file is gone: a merged layer).
pub fn withdraw(path: &Path) {
    offered().retain(|o| o.path != path);
}

/// The offered descriptors (a process that closes the rest keeps these).
pub fn fds() -> Vec<RawFd> {
    offered().iter().map(|o| o.file.as_raw_fd()).collect()
}

/// Forgets every offer (tests).
pub fn clear() {
    offered().clear();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn an_offered_file_is_opened_by_its_path_even_once_it_cannot_be() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("base.img");
        std::fs::write(&path, b"root's image").unwrap();
        offer(&path, File::open(&path).unwrap(), false);
        // Gone from the file system: only the offer can open it now.
        std::fs::remove_file(&path).unwrap();
        for _ in 0..2 {
            let mut text = String::new();
            open(&path, false).unwrap().read_to_string(&mut text).unwrap();
            assert_eq!(text, "root's image", "each open starts at offset 0");
        }
        assert!(open(&path, true).is_err(), "a read-only offer does not open for writing");
        assert!(fds().len() == 1);
        clear();
        assert!(open(&path, false).is_err());
    }
}
