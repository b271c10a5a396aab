//! Crash-safe file creation for the vault and the key store: temp name, fsync, then
//! either a no-clobber `link()` (first writer wins) or a `rename()` (commit), and an
//! fsync of the directory so the new name is durable.

use super::{io_err, VaultError};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Distinguishes temp files written by the same process.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A temp name next to `path`: `.<file name>.<pid>.<n>.tmp`.
pub(crate) fn temp_path(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    path.with_file_name(format!(".{name}.{}.{n}.tmp", std::process::id()))
}

/// Whether `name` is a temp name made by [`temp_path`].
pub(crate) fn is_temp_name(name: &str) -> bool {
    name.starts_with('.') && name.ends_with(".tmp")
}

/// Writes `bytes` to a new temp file next to `path` with `mode`, synced. Returns its path.
pub(crate) fn write_temp(path: &Path, bytes: &[u8], mode: u32) -> Result<PathBuf, VaultError> {
    let tmp = temp_path(path);
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .map_err(io_err("creating temp file", &tmp))?;
    let written = f.write_all(bytes).and_then(|()| f.sync_all());
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(io_err("writing temp file", &tmp)(e));
    }
    Ok(tmp)
}

/// Creates `path` holding `bytes` unless it exists: the content is complete and synced
/// before the name appears, and of racing creators exactly one wins. Returns whether
/// this call created it.
pub(crate) fn create_no_clobber(path: &Path, bytes: &[u8], mode: u32) -> Result<bool, VaultError> {
    let tmp = write_temp(path, bytes, mode)?;
    let linked = fs::hard_link(&tmp, path);
    let _ = fs::remove_file(&tmp);
    match linked {
        Ok(()) => {
            sync_dir(parent_of(path))?;
            Ok(true)
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(io_err("linking into place", path)(e)),
    }
}

/// Replaces `path` with `tmp` and makes the rename durable.
pub(crate) fn commit(tmp: &Path, path: &Path) -> Result<(), VaultError> {
    fs::rename(tmp, path).map_err(io_err("renaming into place", path))?;
    sync_dir(parent_of(path))
}

/// Makes a directory's entries durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), VaultError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io_err("syncing directory", dir))
}

/// The directory holding `path`.
pub(crate) fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Creates `dir` and its missing parents with `mode`; Ok if it exists.
pub(crate) fn create_dir(dir: &Path, mode: u32) -> Result<(), VaultError> {
    use std::os::unix::fs::DirBuilderExt;
    fs::DirBuilder::new().recursive(true).mode(mode).create(dir).map_err(io_err("creating directory", dir))
}

/// Reads at most `cap` bytes of `path`; longer files are [`VaultError::Corrupt`].
pub(crate) fn read_capped(path: &Path, cap: u64) -> Result<Vec<u8>, VaultError> {
    use std::io::Read;
    let file = File::open(path).map_err(io_err("opening", path))?;
    let mut bytes = Vec::new();
    file.take(cap + 1).read_to_end(&mut bytes).map_err(io_err("reading", path))?;
    if bytes.len() as u64 > cap {
        return Err(VaultError::Corrupt {
            path: path.to_path_buf(),
            reason: format!("larger than the {cap}-byte cap"),
        });
    }
    Ok(bytes)
}
