//! Changing who owns a tree of files without following a link: a sandbox's run
//! directory becomes its uid's before its VMM starts, and a branch its VMM wrote becomes
//! ours before anything trusts it (`forkvm-sandbox`'s `sandbox_uid` and `branch_inbox`,
//! [`crate::Store::lookup`]). `lchown` and a walk that never enters a symbolic link, so
//! a name a VMM planted cannot make us change a host file.
//!
//! Giving a tree away ([`own_tree`]) skips files with more than one name: a run
//! directory holds hard links to files that are not the sandbox's (an archive's disk
//! images and, through them, a tag's base), and an owner belongs to the file, not to the
//! name: chowning the link would hand the store's file to the sandbox. Its VMM opens
//! those before it confines itself. Taking a tree over ([`disown_tree`]) takes every
//! file: a VMM must not keep a branch's file by having linked it from its run directory.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Most entries [`own_tree`] walks: a run directory or a snapshot has a few dozen.
const MAX_ENTRIES: usize = 1 << 16;

/// Makes `path` and everything under it belong to `uid`:`gid`, without following a link.
/// Files with more than one name are left as they are (see the module doc).
pub fn own_tree(path: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
    let mut left = MAX_ENTRIES;
    own(path, (uid, gid), Linked::Skip, &mut left)
}

/// What a walk does with a file that has more than one name.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Linked {
    Skip,
    Take,
}

/// [`own_tree`] to this process's own ids.
pub fn disown_tree(path: &Path) -> std::io::Result<()> {
    // SAFETY: geteuid and getegid cannot fail.
    let ids = unsafe { (libc::geteuid(), libc::getegid()) };
    let mut left = MAX_ENTRIES;
    own(path, ids, Linked::Take, &mut left)
}

fn own(path: &Path, (uid, gid): (u32, u32), linked: Linked, left: &mut usize) -> std::io::Result<()> {
    *left = left.checked_sub(1).ok_or_else(|| {
        std::io::Error::other(format!("{}: more than {MAX_ENTRIES} entries to change owner", path.display()))
    })?;
    let meta = std::fs::symlink_metadata(path)?;
    let shared = !meta.is_dir() && meta.nlink() > 1;
    if (meta.uid() != uid || meta.gid() != gid) && !(shared && linked == Linked::Skip) {
        std::os::unix::fs::lchown(path, Some(uid), Some(gid))?;
    }
    if meta.is_dir() {
        for entry in std::fs::read_dir(path)? {
            own(&entry?.path(), (uid, gid), linked, left)?;
        }
    }
    Ok(())
}
