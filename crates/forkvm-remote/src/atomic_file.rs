//! Host files written whole or not at all (the records a remote's users keep locally).

use crate::RemoteError;
use std::path::Path;

/// Writes `bytes` to `path` through a temp file, synced, renamed into place (its
/// directory made first).
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), RemoteError> {
    use std::io::Write;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(RemoteError::io("creating a directory", dir))?;
    }
    let tmp = path.with_extension(format!("{}.tmp", std::process::id()));
    let mut f = std::fs::File::create(&tmp).map_err(RemoteError::io("writing", &tmp))?;
    f.write_all(bytes).and_then(|_| f.sync_all()).map_err(RemoteError::io("writing", &tmp))?;
    std::fs::rename(&tmp, path).map_err(RemoteError::io("renaming into place", path))
}
