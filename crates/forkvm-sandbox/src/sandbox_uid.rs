//! Sandboxes' own uids on the host side: which starts give their VMM one, and the files
//! that change hands — a run directory becomes its sandbox's uid's before the VMM starts,
//! and what a VMM wrote (a branch) becomes ours again before anything trusts it.
//!
//! Why: a VMM runs under its sandbox's uid (`forkvm_vmm::host::ids`), which must own
//! what it writes (its run directory, its branch inbox) and nothing it only reads.
//! Ownership is changed without following links (`lchown`, a walk that never enters a
//! symbolic link), so a name a VMM planted cannot make us change a host file.

use crate::registry::Registry;
pub(crate) use forkvm_snapshot::ownership::{disown_tree, own_tree};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

/// Whether sandboxes started through `registry` get uids of their own: only a root
/// process can give them, and only jailed VMMs are laid out for them (the jail shows
/// the paths they reach at their usual places; without it a VMM would need the host's
/// directories opened to every uid).
pub fn confines_by_uid(registry: &Registry) -> bool {
    // SAFETY: geteuid cannot fail.
    registry.jail() == forkvm_vmm::host::jail::Jail::Enforce && unsafe { libc::geteuid() } == 0
}

/// Lets every uid pass through `dir` (mode 0711: search, no listing), when it is ours.
/// For the directories on a VMM's way to what it owns (the run directories' parent, the
/// store and its inboxes' parent).
pub(crate) fn traversable(dir: &Path) -> std::io::Result<()> {
    let meta = std::fs::metadata(dir)?;
    // SAFETY: geteuid cannot fail.
    if meta.uid() == unsafe { libc::geteuid() } && meta.mode() & 0o7777 != 0o711 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ownership_changes_never_follow_a_link() {
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: changing owners needs root");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let (tree, outside) = (tmp.path().join("run"), tmp.path().join("host-file"));
        std::fs::create_dir_all(tree.join("disks/disk1")).unwrap();
        std::fs::write(tree.join("disks/disk1/data"), b"x").unwrap();
        std::fs::write(&outside, b"host").unwrap();
        std::os::unix::fs::symlink(&outside, tree.join("link")).unwrap();
        // A store file linked into the run directory (an archive's disk image).
        let store_file = tmp.path().join("archive-disk1.img");
        std::fs::write(&store_file, b"base").unwrap();
        std::fs::hard_link(&store_file, tree.join("disk1.img")).unwrap();
        let sandbox = forkvm_vmm::host::ids::SANDBOX_ID_RANGE.start + 77;
        own_tree(&tree, sandbox, sandbox).unwrap();
        for p in ["", "disks", "disks/disk1", "disks/disk1/data", "link"] {
            assert_eq!(std::fs::symlink_metadata(tree.join(p)).unwrap().uid(), sandbox, "{p}");
        }
        assert_eq!(std::fs::metadata(&outside).unwrap().uid(), 0, "the link's target is not changed");
        assert_eq!(std::fs::metadata(&store_file).unwrap().uid(), 0, "a file with another name is not given away");
        // Taking over takes even a file the sandbox linked elsewhere.
        std::os::unix::fs::lchown(&store_file, Some(sandbox), Some(sandbox)).unwrap();
        disown_tree(&tree).unwrap();
        assert_eq!(std::fs::metadata(tree.join("disks/disk1/data")).unwrap().uid(), 0);
        assert_eq!(std::fs::metadata(&store_file).unwrap().uid(), 0);
        traversable(&tree).unwrap();
        assert_eq!(std::fs::metadata(&tree).unwrap().mode() & 0o7777, 0o711);
    }
}
