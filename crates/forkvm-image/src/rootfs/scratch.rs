//! The blank data disk under every sandbox's writable layer.
//!
//! A sandbox's root is an overlay: the template's image, read-only and shared, below;
//! the sandbox's own writes above, in an ext4 filesystem on a layered disk (DESIGN §5)
//! whose base is this blank, sparse image. Every sandbox's disk starts from the same
//! base; its writes go to its own layers, so forks and snapshots share the base and
//! the sealed layers and copy nothing.
//!
//! The image is made once with `mkfs.ext4` (journalled, so a disk captured at any
//! instant mounts cleanly after journal replay) and cached by a key over its size and
//! options at `<cache>/disks/scratch-<key>.ext4`; deleting it is safe.

use super::build::{run, RootfsError};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Size of every sandbox's data disk. The file is sparse: a blank one takes a few MiB.
pub const SCRATCH_DISK_BYTES: u64 = 4 << 30;
/// Filesystem label the guest's agent looks for (with the disk serial).
pub const SCRATCH_LABEL: &str = "forkvm-data";
/// mkfs.ext4 options. Inode tables and the journal are not zeroed (the disk is sparse
/// and all zero already); the guest mounts with `noinit_itable` so it does not zero
/// them either. No reserved blocks: the disk is all the sandbox's.
const MKFS_ARGS: &[&str] =
    &["-q", "-F", "-L", SCRATCH_LABEL, "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard"];

/// Cache key of the scratch base: changes whenever its size or options change.
pub fn scratch_key() -> String {
    let mut h = blake3::Hasher::new();
    h.update(b"forkvm scratch disk v1\n");
    h.update(format!("{SCRATCH_DISK_BYTES}\n{}", MKFS_ARGS.join(" ")).as_bytes());
    h.finalize().to_hex()[..16].to_string()
}

/// The blank data-disk base in `cache`, made if missing.
pub fn ensure_scratch_disk(cache: &Path) -> Result<PathBuf, RootfsError> {
    let dir = cache.join("disks");
    let path = dir.join(format!("scratch-{}.ext4", scratch_key()));
    if path.is_file() {
        return Ok(path);
    }
    if !Path::new("/usr/sbin/mkfs.ext4").exists() && !Path::new("/sbin/mkfs.ext4").exists() {
        return Err(RootfsError::MissingTool { what: "mkfs.ext4", path: "/usr/sbin/mkfs.ext4", package: "e2fsprogs" });
    }
    let stage = |step: &str| {
        let dir = dir.clone();
        let step = step.to_string();
        move |source| RootfsError::Stage { dir, step, source }
    };
    std::fs::create_dir_all(&dir).map_err(stage("creating the disks directory"))?;
    // Built under a name of its own, then renamed: racing builders each publish a
    // complete image, and they are identical.
    let tmp = dir.join(format!(".scratch-{}.{}.tmp", scratch_key(), std::process::id()));
    let file = std::fs::File::create(&tmp).map_err(stage("creating the image file"))?;
    file.set_len(SCRATCH_DISK_BYTES).map_err(stage("sizing the image file"))?;
    drop(file);
    let mut cmd = Command::new("mkfs.ext4");
    cmd.args(MKFS_ARGS).arg(&tmp);
    let log = dir.join(format!(".scratch-{}.mkfs.log", std::process::id()));
    let made = run("mkfs.ext4 (scratch disk)", &mut cmd, &log);
    if let Err(e) = made {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    let _ = std::fs::remove_file(&log);
    let synced = std::fs::File::open(&tmp).and_then(|f| f.sync_all());
    synced.map_err(stage("syncing the image"))?;
    std::fs::rename(&tmp, &path).map_err(stage("publishing the image"))?;
    Ok(path)
}

/// The base of an empty volume slot in `cache`: a file of no bytes, made if missing.
/// Every Linux sandbox boots with a few such slots (a layered disk of capacity 0); a
/// restore puts a volume into one (`forkvm_sandbox::volumes`).
pub fn ensure_empty_slot(cache: &Path) -> Result<PathBuf, RootfsError> {
    let dir = cache.join("disks");
    let path = dir.join("empty-volume-slot.img");
    let stage = |step: &str| {
        let dir = dir.clone();
        let step = step.to_string();
        move |source| RootfsError::Stage { dir, step, source }
    };
    match std::fs::symlink_metadata(&path) {
        Ok(m) if m.is_file() && m.len() == 0 => return Ok(path),
        Ok(_) => std::fs::remove_file(&path).map_err(stage("removing a non-empty empty-slot image"))?,
        Err(_) => {}
    }
    std::fs::create_dir_all(&dir).map_err(stage("creating the disks directory"))?;
    let tmp = dir.join(format!(".empty-volume-slot.{}.tmp", std::process::id()));
    std::fs::File::create(&tmp).map_err(stage("creating the empty-slot image"))?;
    std::fs::rename(&tmp, &path).map_err(stage("publishing the empty-slot image"))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blank_scratch_disk_is_sparse_ext4_and_cached() {
        let cache = tempfile::tempdir().unwrap();
        let path = ensure_scratch_disk(cache.path()).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.len(), SCRATCH_DISK_BYTES);
        use std::os::unix::fs::MetadataExt;
        assert!(meta.blocks() * 512 < 64 << 20, "sparse: {} bytes allocated", meta.blocks() * 512);
        let mut sb = [0u8; 2];
        use std::os::unix::fs::FileExt;
        std::fs::File::open(&path).unwrap().read_exact_at(&mut sb, 1024 + 0x38).unwrap();
        assert_eq!(u16::from_le_bytes(sb), 0xEF53, "ext4 superblock magic");
        assert_eq!(ensure_scratch_disk(cache.path()).unwrap(), path, "made once");
    }
}
