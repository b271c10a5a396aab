//! The sealed layers a child of a running sandbox inherits, linked by us.
//!
//! Why this exists: the children of a running sandbox restore on their source's layers,
//! and each keeps its own names for the ones in the source's directory
//! (`<child disks>/disk<i>/inherited-<name>`): the source removes its layers when it
//! stops or merges them. The children's VMMs, under the source's uid, could link those
//! names themselves until a branch of the source took a layer over (a branch becomes
//! root's, every file of it: `branch_inbox`); a VMM may not link a file it does not own
//! (`fs.protected_hardlinks`). So we link every sealed layer the source has in its disk
//! directories before the fork; a child's VMM links only what its source sealed after
//! (the fork's own seal: still its uid's), and reads them all through the descriptors its
//! source kept open (`forkvm_vmm::vmm::disks::inherit_layers`).
//!
//! The source's directories are its VMM's to write: each layer is checked against what
//! the source was given (`DiskGrant::own_layers`: inside its disk directories, no link on
//! the way) and must be two regular files whose bitmap header says sealed (its first 16
//! bytes: a VMM that lied would only hand its own children a bad layer of its own).

use crate::disk_grant::{DiskGrant, Kind};
use crate::registry::{RegistryError, SandboxRecord};
use forkvm_snapshot::layered_disk::{dir_holds_sealed_layer, BITMAP_FILE, DATA_FILE};
use std::path::{Path, PathBuf};

/// The most layers one disk directory is looked at for (a day of minute snapshots,
/// unmerged, is 1 440).
const MAX_LAYERS_PER_DISK: usize = 4096;

/// Links every sealed layer in `source`'s disk directories into each child's disk
/// directories (`children[i].disks`, in the source's order), then gives the directories
/// made to the child's uid (the links stay as they were: another name of a file is not
/// the sandbox's to own).
pub(crate) fn link_inherited_layers(source: &SandboxRecord, children: &[SandboxRecord]) -> Result<(), RegistryError> {
    let grant = DiskGrant::own_layers(source);
    let mut linked = false;
    for (index, disk) in source.disks.iter().enumerate() {
        let layers = sealed_layers(&grant, &disk.dir)?;
        for child in children {
            let Some(to_disk) = child.disks.get(index) else { continue };
            for (name, from) in &layers {
                let to = to_disk.dir.join(format!("inherited-{name}"));
                forkvm_snapshot::link_layer(from, &to).map_err(|source| RegistryError::Io { path: to, source })?;
                linked = true;
            }
        }
    }
    if !linked {
        return Ok(());
    }
    for child in children {
        if let Some(uid) = child.uid {
            crate::sandbox_uid::own_tree(&child.run_dir, uid, uid)
                .map_err(|source| RegistryError::Io { path: child.run_dir.clone(), source })?;
        }
    }
    Ok(())
}

/// The sealed layers in disk directory `dir` (none when it was never written), by name.
fn sealed_layers(grant: &DiskGrant, dir: &Path) -> Result<Vec<(String, PathBuf)>, RegistryError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| RegistryError::Io { path, source }
    };
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io(dir)(e)),
    };
    let mut layers = Vec::new();
    for entry in entries.take(MAX_LAYERS_PER_DISK) {
        let entry = entry.map_err(io(dir))?;
        let Some(name) = entry.file_name().to_str().map(str::to_string) else { continue };
        let path = entry.path();
        // A top being written, a staging directory, anything else the VMM made: skipped.
        if grant.check(&path, Kind::Dir).is_err() || !dir_holds_sealed_layer(&path) {
            continue;
        }
        let plain =
            [DATA_FILE, BITMAP_FILE].iter().all(|f| std::fs::symlink_metadata(path.join(f)).is_ok_and(|m| m.is_file()));
        if plain {
            layers.push((name, path));
        }
    }
    Ok(layers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::{tests::record, RecordedDisk, Registry};
    use forkvm_snapshot::LayerStack;
    use std::os::unix::fs::MetadataExt;

    fn inode(path: &Path) -> u64 {
        std::fs::metadata(path).unwrap().ino()
    }

    #[test]
    fn a_fork_gets_links_to_its_sources_sealed_layers_and_nothing_else() {
        let tmp = tempfile::tempdir().unwrap();
        let reg = Registry::open(tmp.path().join("run"));
        let (mut source, mut child) = (record(&reg, "src", 1), record(&reg, "kid", 2));
        let dir = source.disk_dir().join("disk1");
        std::fs::create_dir_all(&dir).unwrap();
        let base = tmp.path().join("base.img");
        std::fs::write(&base, vec![0u8; 1 << 20]).unwrap();
        let mut stack = LayerStack::create(&base, &[], &dir.join("top-0")).unwrap();
        stack.write_at(&[7u8; 4096], 0).unwrap();
        stack.seal(&dir.join("top-1")).unwrap();
        // The top being written, a staging directory and a link are not inherited.
        stack.write_at(&[8u8; 4096], 4096).unwrap();
        std::fs::create_dir(dir.join("top-2.partial")).unwrap();
        std::os::unix::fs::symlink(dir.join("top-0"), dir.join("top-9")).unwrap();
        source.disks = vec![RecordedDisk { id: "d".into(), base, sealed: Vec::new(), dir: dir.clone() }];
        child.disks = vec![RecordedDisk { dir: child.disk_dir().join("disk1"), ..source.disks[0].clone() }];

        link_inherited_layers(&source, std::slice::from_ref(&child)).unwrap();
        let kid = child.disk_dir().join("disk1");
        let names: Vec<String> =
            std::fs::read_dir(&kid).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        assert_eq!(names, ["inherited-top-0"]);
        for f in [DATA_FILE, BITMAP_FILE] {
            assert_eq!(inode(&dir.join("top-0").join(f)), inode(&kid.join("inherited-top-0").join(f)), "{f}");
        }
        // A source that never wrote its disk has nothing to give.
        let (mut quiet, mut kid2) = (record(&reg, "quiet", 3), record(&reg, "kid2", 4));
        quiet.disks = vec![RecordedDisk { dir: quiet.disk_dir().join("disk1"), ..source.disks[0].clone() }];
        kid2.disks = vec![RecordedDisk { dir: kid2.disk_dir().join("disk1"), ..source.disks[0].clone() }];
        link_inherited_layers(&quiet, std::slice::from_ref(&kid2)).unwrap();
        assert!(!kid2.disk_dir().exists());
    }
}
