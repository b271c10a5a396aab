//! `flock(2)` with the EINTR retry, and lock files, shared by the chunk store's lock,
//! the vault's lock and the assembly lock of chained images.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// Opens (creating, never truncating) the lock file at `path` and applies `op` to it
/// with [`flock`]. The lock lasts as long as the returned file.
pub fn lock_file(path: &std::path::Path, op: libc::c_int) -> io::Result<File> {
    let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)?;
    flock(&file, op)?;
    Ok(file)
}

/// Applies `op` (`LOCK_SH`, `LOCK_EX`, optionally `| LOCK_NB`) to `file`, retrying when
/// a signal interrupts the wait. The lock lasts as long as the descriptor.
pub fn flock(file: &File, op: libc::c_int) -> io::Result<()> {
    loop {
        // SAFETY: flock only operates on the descriptor, which `file` keeps open.
        if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}
