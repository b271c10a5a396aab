//! Checking a capture's disk references before anything is opened through them.
//!
//! An archive's capture names its disk files (`forkvm_snapshot::DiskReferences`) rather
//! than linking them, and the VMM that wrote the names is untrusted: a VMM a guest took
//! over could name `/etc/shadow` as its disk, and the archive would carry the host's
//! file into the vault and, restored, into a guest. So a reference is followed only when
//! it is a plain absolute path inside what the VMM's jail shows of forkvm's files (the
//! store, the artefact cache, the sandbox's own run directory; not the daemon's state or
//! the keys) and no directory on the way, nor the file, is a symbolic link. VMMs cannot
//! make symbolic links (their filters deny it), so none they wrote is there to race.

use crate::registry::SandboxRecord;
use forkvm_snapshot::Store;
use std::path::{Component, Path, PathBuf};

/// What a reference must name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// A disk image (a base or a read-only image).
    File,
    /// A sealed layer's directory.
    Dir,
}

/// The trees a capture's references may point into.
#[derive(Debug, Clone)]
pub(super) struct Roots {
    within: Vec<PathBuf>,
    hidden: Vec<PathBuf>,
}

impl Roots {
    /// What `record`'s VMM sees of forkvm's files.
    pub(super) fn for_capture(store: &Store, record: &SandboxRecord) -> Roots {
        Roots::new(
            vec![store.root().to_path_buf(), forkvm_image::kernel::cache_dir(), record.run_dir.clone()],
            vec![store.root().join("forkvmd"), crate::disk_snapshots::keys_dir()],
        )
    }

    pub(super) fn new(within: Vec<PathBuf>, hidden: Vec<PathBuf>) -> Roots {
        Roots { within, hidden }
    }

    /// `path` if a reference may name it as a `kind`, else why not.
    pub(super) fn check(&self, path: &Path, kind: Kind) -> std::io::Result<PathBuf> {
        let refuse = |why: &str| Err(std::io::Error::other(format!("the capture names {}: {why}", path.display())));
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
        let mut at = root.clone();
        let rest = path.strip_prefix(root).expect("starts with it");
        let mut meta = std::fs::symlink_metadata(&at)?;
        for part in rest.components() {
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
    fn references_stay_inside_forkvm_files_and_follow_no_link() {
        let tmp = tempfile::tempdir().unwrap();
        let (store, run, secret) = (tmp.path().join("store"), tmp.path().join("run"), tmp.path().join("secret"));
        for d in [&store.join("snapshots/t/disk"), &store.join("forkvmd"), &run.join("disks/disk1/top-0"), &secret] {
            std::fs::create_dir_all(d).unwrap();
        }
        let image = store.join("snapshots/t/disk/disk0.img");
        std::fs::write(&image, b"root image").unwrap();
        std::fs::write(secret.join("shadow"), b"host secret").unwrap();
        std::fs::write(store.join("forkvmd/db"), b"daemon state").unwrap();
        std::os::unix::fs::symlink(&secret, run.join("disks/out")).unwrap();
        let roots = Roots::new(vec![store.clone(), run.clone()], vec![store.join("forkvmd")]);

        assert_eq!(roots.check(&image, Kind::File).unwrap(), image);
        assert!(roots.check(&run.join("disks/disk1/top-0"), Kind::Dir).is_ok());
        let refused = |p: &Path, kind| roots.check(p, kind).unwrap_err().to_string();
        assert!(refused(&secret.join("shadow"), Kind::File).contains("outside the store"));
        assert!(refused(Path::new("/etc/passwd"), Kind::File).contains("outside the store"));
        assert!(refused(&store.join("snapshots/../../secret/shadow"), Kind::File).contains("not a plain"));
        assert!(refused(Path::new("disk0.img"), Kind::File).contains("not a plain"));
        assert!(refused(&run.join("disks/out/shadow"), Kind::File).contains("symbolic link"));
        assert!(refused(&store.join("forkvmd/db"), Kind::File).contains("cannot see"));
        assert!(refused(&run.join("disks/disk1/top-0"), Kind::File).contains("not a regular file"));
        assert!(refused(&image, Kind::Dir).contains("not a directory"));
    }
}
