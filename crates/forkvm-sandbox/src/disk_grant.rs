//! Which disk files a sandbox's VMM may name for the host side to read or link: the
//! check every disk reference a VMM wrote passes before anything is opened through it
//! (an archive's capture, a branch in the VMM's inbox; `forkvm_snapshot::DiskReferences`).
//!
//! A VMM a guest took over could name anything: `/etc/shadow`, or another sandbox's
//! disk layer, which the host side would then archive or link into this sandbox's
//! snapshot, and a restore would show its guest. So a reference is followed only when
//!
//! - it is a plain absolute path (no `.` or `..`), inside the store, the artefact cache
//!   or the sandbox's run directory, not the daemon's state or the keys, and no directory
//!   on the way, nor the file, is a symbolic link (VMMs cannot make symbolic links:
//!   their filters deny it, so none a VMM wrote is there to race);
//! - and it is one the sandbox was given: a disk image is one of its disks' bases, a
//!   file of the `disk/` directory of the tag it was spawned from or of its own archive,
//!   an artefact, or a file of its own run directory (a restored archive's image); a
//!   sealed layer is one it was started on or one in its own disk directories (the
//!   layers it sealed since, inherited ones, restored ones).

use crate::registry::SandboxRecord;
use forkvm_snapshot::{Store, DISK_DIR};
use std::path::{Component, Path, PathBuf};

/// What a reference must name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A disk image (a base or a read-only image).
    File,
    /// A sealed layer's directory.
    Dir,
}

/// The disk files one sandbox's VMM may name.
#[derive(Debug, Clone, Default)]
pub(crate) struct DiskGrant {
    /// Trees a reference must lie in.
    within: Vec<PathBuf>,
    /// Trees inside those it must not (the daemon's state, the keys).
    hidden: Vec<PathBuf>,
    /// Images it may name anywhere in `within`.
    images: Vec<PathBuf>,
    /// Directories whose files are images it may name.
    image_dirs: Vec<PathBuf>,
    /// Trees of images (the artefact cache, its own run directory).
    image_trees: Vec<PathBuf>,
    /// Sealed layers it may name.
    layers: Vec<PathBuf>,
    /// Directories under which every layer is its own.
    layer_trees: Vec<PathBuf>,
}

impl DiskGrant {
    /// What `record`'s VMM was given (see the module doc).
    pub(crate) fn of(store: &Store, record: &SandboxRecord) -> DiskGrant {
        let cache = forkvm_image::kernel::cache_dir();
        let mut image_dirs = vec![crate::archive::format::archives_dir(store).join(&record.id).join(DISK_DIR)];
        if let Some(tag) = &record.source_tag {
            if forkvm_snapshot::validate_tag(tag).is_ok() {
                image_dirs.push(store.snapshots_dir().join(tag).join(DISK_DIR));
            }
        }
        DiskGrant {
            within: vec![store.root().to_path_buf(), cache.clone(), record.run_dir.clone()],
            hidden: vec![store.root().join("forkvmd"), crate::disk_snapshots::keys_dir()],
            images: record.disks.iter().map(|d| d.base.clone()).collect(),
            image_dirs,
            image_trees: vec![cache, record.run_dir.clone()],
            layers: record.disks.iter().flat_map(|d| d.sealed.iter().cloned()).collect(),
            layer_trees: record.disks.iter().map(|d| d.dir.clone()).chain([record.run_dir.join("disks")]).collect(),
        }
    }

    /// The sealed layers in `record`'s own disk directories only: what a fork of the
    /// running sandbox inherits (`start::inherited_layers`).
    pub(crate) fn own_layers(record: &SandboxRecord) -> DiskGrant {
        DiskGrant {
            within: vec![record.run_dir.clone()],
            layer_trees: record.disks.iter().map(|d| d.dir.clone()).collect(),
            ..DiskGrant::default()
        }
    }

    /// `path` if a reference may name it as a `kind`, else why not.
    pub(crate) fn check(&self, path: &Path, kind: Kind) -> std::io::Result<PathBuf> {
        let refuse = |why: &str| Err(std::io::Error::other(format!("the VMM names {}: {why}", path.display())));
        let plain =
            path.is_absolute() && path.components().all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
        if !plain {
            return refuse("not a plain absolute path");
        }
        if self.hidden.iter().any(|h| path.starts_with(h)) {
            return refuse("a path VMMs cannot see");
        }
        let Some(root) = self.within.iter().filter(|r| path.starts_with(r)).max_by_key(|r| r.as_os_str().len()) else {
            return refuse("outside the store, the artefact cache and the sandbox's run directory");
        };
        let given = match kind {
            Kind::File => {
                self.images.iter().any(|i| i == path)
                    || path.parent().is_some_and(|p| self.image_dirs.iter().any(|d| d == p))
                    || self.image_trees.iter().any(|t| path.starts_with(t))
            }
            Kind::Dir => self.layers.iter().any(|l| l == path) || self.layer_trees.iter().any(|t| path.starts_with(t)),
        };
        if !given {
            return refuse("not one of the sandbox's own disk files");
        }
        let mut at = root.clone();
        let mut meta = std::fs::symlink_metadata(&at)?;
        for part in path.strip_prefix(root).expect("starts with it").components() {
            at.push(part);
            meta = std::fs::symlink_metadata(&at)?;
            if meta.file_type().is_symlink() {
                return refuse(&format!("{} is a symbolic link", at.display()));
            }
        }
        match kind {
            Kind::File if meta.is_file() => Ok(path.to_path_buf()),
            Kind::Dir if meta.is_dir() => Ok(path.to_path_buf()),
            Kind::File => refuse("not a regular file"),
            Kind::Dir => refuse("not a directory"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_name_only_the_sandboxs_own_disk_files_and_follow_no_link() {
        let tmp = tempfile::tempdir().unwrap();
        let (store, run, secret) = (tmp.path().join("store"), tmp.path().join("run"), tmp.path().join("secret"));
        let dirs = [
            store.join("snapshots/mine/disk"),
            store.join("snapshots/theirs/disk/disk1.img.layers/7"),
            store.join("forkvmd"),
            run.join("disks/disk1/top-0"),
            secret.clone(),
        ];
        for d in &dirs {
            std::fs::create_dir_all(d).unwrap();
        }
        let image = store.join("snapshots/mine/disk/disk0.img");
        for f in
            [&image, &store.join("snapshots/theirs/disk/disk0.img"), &secret.join("shadow"), &store.join("forkvmd/db")]
        {
            std::fs::write(f, b"bytes").unwrap();
        }
        std::os::unix::fs::symlink(&secret, run.join("disks/out")).unwrap();
        let grant = DiskGrant {
            within: vec![store.clone(), run.clone()],
            hidden: vec![store.join("forkvmd")],
            image_dirs: vec![store.join("snapshots/mine/disk")],
            layer_trees: vec![run.join("disks")],
            ..Default::default()
        };

        assert_eq!(grant.check(&image, Kind::File).unwrap(), image);
        assert!(grant.check(&run.join("disks/disk1/top-0"), Kind::Dir).is_ok());
        let refused = |p: &Path, kind| grant.check(p, kind).unwrap_err().to_string();
        assert!(refused(&secret.join("shadow"), Kind::File).contains("outside the store"));
        assert!(refused(Path::new("/etc/passwd"), Kind::File).contains("outside the store"));
        assert!(refused(&store.join("snapshots/../../secret/shadow"), Kind::File).contains("not a plain"));
        assert!(refused(Path::new("disk0.img"), Kind::File).contains("not a plain"));
        assert!(refused(&run.join("disks/out/shadow"), Kind::Dir).contains("symbolic link"));
        assert!(refused(&store.join("forkvmd/db"), Kind::File).contains("cannot see"));
        assert!(refused(&store.join("snapshots/theirs/disk/disk0.img"), Kind::File).contains("not one of"));
        assert!(refused(&store.join("snapshots/theirs/disk/disk1.img.layers/7"), Kind::Dir).contains("not one of"));
        assert!(refused(&run.join("disks/disk1/top-0"), Kind::File).contains("not one of"));
        assert!(refused(&image, Kind::Dir).contains("not one of"));
        let dir_as_image = DiskGrant { image_dirs: vec![run.join("disks/disk1")], ..grant.clone() };
        assert!(dir_as_image
            .check(&run.join("disks/disk1/top-0"), Kind::File)
            .unwrap_err()
            .to_string()
            .contains("not a regular file"));
    }
}
