//! Changing who owns a tree of files without following a link: a sandbox's run
//! directory becomes its uid's before its VMM starts, and a branch its VMM wrote becomes
//! ours before anything trusts it (`forkvm-sandbox`'s `sandbox_uid` and `branch_inbox`,
//! [`crate::Store::lookup`]). `lchown` and a walk that never enters a symbolic link, so
//! a name a VMM planted cannot make us change a host file.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Most entries [`own_tree`] walks: a run directory or a snapshot has a few dozen.
const MAX_ENTRIES: usize = 1 << 16;

/// Makes `path` and everything under it belong to `uid`:`gid`, without following a link.
pub fn own_tree(path: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
    let mut left = MAX_ENTRIES;
    own(path, uid, gid, &mut left)
}

/// [`own_tree`] to this process's own ids.
pub fn disown_tree(path: &Path) -> std::io::Result<()> {
    // SAFETY: geteuid and getegid cannot fail.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    own_tree(path, uid, gid)
}

fn own(path: &Path, uid: u32, gid: u32, left: &mut usize) -> std::io::Result<()> {
    *left = left.checked_sub(1).ok_or_else(|| {
        std::io::Error::other(format!("{}: more than {MAX_ENTRIES} entries to change owner", path.display()))
    })?;
    let meta = std::fs::symlink_metadata(path)?;
    if meta.uid() != uid || meta.gid() != gid {
        std::os::unix::fs::lchown(path, Some(uid), Some(gid))?;
    }
    if meta.is_dir() {
        for entry in std::fs::read_dir(path)? {
            own(&entry?.path(), uid, gid, left)?;
        }
    }
    Ok(())
}
