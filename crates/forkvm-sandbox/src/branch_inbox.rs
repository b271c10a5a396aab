//! Where a sandbox's VMM writes a branch, and how the branch becomes the store's.
//!
//! Why: a VMM runs under its sandbox's uid (`forkvm_vmm::host::ids`) and may not write
//! the store, nor link root's files (a base image, a tag's layers). So it writes its
//! branch into an inbox of its own, `<store>/incoming/<sandbox id>-<n>/`, naming its disk
//! files instead of linking them (`DiskReferences`), and the host side adopts it:
//!
//! 1. every name is checked against what the sandbox was given (`disk_grant`) and linked
//!    by us, so the snapshot stands alone;
//! 2. a complete branch becomes ours (owner and group, without following links): the
//!    VMM can no longer change it, and we write the defaults its spawns take (limits,
//!    network policy: the sandbox's, as we know them) into its `snapshot.json` over
//!    whatever the VMM wrote. A live branch still being written is adopted by the
//!    store's sweep once its writer marked it ready (`Store::adopt_ready`), with the
//!    defaults its VMM was asked to write: a VMM that a guest took over could widen
//!    those of a branch it was still writing (`docs/security.md`);
//! 3. it moves into place (`snapshots/<tag>`, or a diff's staging), never over an
//!    existing one.
//!
//! The inbox is on the store's file system, so the move is a rename. VMMs without a uid
//! of their own write the same way: one path for every branch.

use crate::disk_grant::{DiskGrant, Kind};
use crate::registry::SandboxRecord;
use forkvm_snapshot::{is_layer_name, link_or_copy, DiskReferences, Store, DISK_DIR, DISK_REFERENCES};
use std::path::{Path, PathBuf};

/// The inboxes' directory under a store's root.
pub const INCOMING_DIR: &str = "incoming";

#[derive(Debug, thiserror::Error)]
pub enum AdoptError {
    #[error("branch {tag}: {step}: {source}")]
    Io { tag: String, step: String, source: std::io::Error },
    #[error("branch {tag}: the VMM named disk file {name:?}, which is not a disk or layer name")]
    BadName { tag: String, name: String },
    #[error("branch {tag}: {reason}")]
    Refused { tag: String, reason: String },
    #[error("branch {tag}: {dest} exists")]
    Exists { tag: String, dest: PathBuf },
}

impl AdoptError {
    pub fn code(&self) -> forkvm_api::ErrorCode {
        match self {
            AdoptError::Exists { .. } => forkvm_api::ErrorCode::Conflict,
            _ => forkvm_api::ErrorCode::Internal,
        }
    }
}

/// What the spawns from a branch take unless they ask otherwise: its sandbox's limits and
/// network policy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct BranchDefaults {
    pub limits: Option<forkvm_snapshot::DefaultLimits>,
    pub network: Option<forkvm_api::NetworkPolicy>,
}

/// One sandbox's inbox, made empty for one branch and removed when dropped.
#[derive(Debug)]
pub(crate) struct Inbox {
    dir: PathBuf,
}

impl Inbox {
    /// Makes an inbox for one branch of `record`'s (empty, its uid's) in `store`.
    pub(crate) fn make(store: &Store, record: &SandboxRecord) -> std::io::Result<Inbox> {
        let incoming = store.root().join(INCOMING_DIR);
        std::fs::create_dir_all(&incoming)?;
        if record.uid.is_some() {
            // The sandbox's uid passes through both to its own inbox.
            crate::sandbox_uid::traversable(store.root())?;
            crate::sandbox_uid::traversable(&incoming)?;
        }
        let dir = incoming.join(format!("{}-{}", record.id, crate::start::new_sandbox_id()));
        std::fs::create_dir(&dir)?;
        let inbox = Inbox { dir };
        if let Some(uid) = record.uid {
            std::os::unix::fs::lchown(&inbox.dir, Some(uid), Some(uid))?;
        }
        Ok(inbox)
    }

    /// Where the VMM writes (its `BranchRequest::store`).
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Adopts branch `tag` (see the module doc) into `dest`, which must not exist, with
    /// `defaults` for the spawns from it. `writer`: the host pid of the VMM still writing
    /// it (a live branch returned early), which readers check is alive; none: it is
    /// complete.
    pub(crate) fn adopt(
        &self,
        tag: &str,
        grant: &DiskGrant,
        dest: &Path,
        writer: Option<i32>,
        defaults: &BranchDefaults,
    ) -> Result<(), AdoptError> {
        let io = |step: &str| {
            let step = step.to_string();
            move |source| AdoptError::Io { tag: tag.to_string(), step, source }
        };
        let branch = self.dir.join(tag);
        let meta = std::fs::symlink_metadata(&branch).map_err(io("finding it in the inbox"))?;
        if !meta.is_dir() {
            return Err(AdoptError::Refused { tag: tag.into(), reason: "it is not a directory".into() });
        }
        match writer {
            None => {
                crate::sandbox_uid::disown_tree(&branch).map_err(io("taking it over"))?;
                stamp_defaults(tag, &branch, defaults)?;
            }
            // Its snapshot.json numbers the writer in the VMM's pid namespace.
            Some(pid) => std::fs::write(branch.join(forkvm_snapshot::WRITER_HOST_PID), pid.to_string())
                .map_err(io("noting its writer"))?,
        }
        let disk = branch.join(DISK_DIR);
        link_references(tag, &disk, grant)?;
        if writer.is_none() && std::fs::symlink_metadata(&disk).is_ok() {
            // The sandbox's own layers it named are the branch's now, like every other
            // file of it (a live branch's are taken with the rest by `Store::adopt_ready`):
            // its VMM keeps them open (`layered_disk::offer_sealed_layer`) but can no
            // longer change what the branch's spawns read.
            crate::sandbox_uid::disown_tree(&disk).map_err(io("taking its disk files over"))?;
        }
        forkvm_snapshot::rename_noreplace(&branch, dest).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                AdoptError::Exists { tag: tag.into(), dest: dest.to_path_buf() }
            } else {
                io(&format!("moving it to {}", dest.display()))(e)
            }
        })?;
        if let Some(parent) = dest.parent() {
            std::fs::File::open(parent).and_then(|d| d.sync_all()).map_err(io("syncing its new directory"))?;
        }
        Ok(())
    }
}

impl Drop for Inbox {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Writes `defaults` into the `snapshot.json` of branch `tag` at `dir` (ours by now).
pub(crate) fn stamp_defaults(tag: &str, dir: &Path, defaults: &BranchDefaults) -> Result<(), AdoptError> {
    let refused = |e: forkvm_snapshot::MetadataError| AdoptError::Refused { tag: tag.into(), reason: e.to_string() };
    let mut meta = forkvm_snapshot::read_meta(&dir.join(forkvm_snapshot::SNAPSHOT_JSON)).map_err(refused)?;
    meta.default_limits = defaults.limits;
    meta.default_network = defaults.network.clone();
    forkvm_snapshot::replace_meta(dir, &meta).map_err(refused)
}

/// Links every file `disk_dir/references.json` names into `disk_dir` (checked against
/// `grant`), then removes the references. No references: the disks are there already.
fn link_references(tag: &str, disk_dir: &Path, grant: &DiskGrant) -> Result<(), AdoptError> {
    let io = |step: String| move |source| AdoptError::Io { tag: tag.to_string(), step, source };
    let refs = match DiskReferences::read(disk_dir) {
        Ok(r) => r,
        Err(forkvm_snapshot::ReferencesError::Read { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            return Ok(())
        }
        Err(e) => return Err(AdoptError::Refused { tag: tag.into(), reason: e.to_string() }),
    };
    for (name, path) in &refs.0 {
        let bad = || AdoptError::BadName { tag: tag.into(), name: name.clone() };
        let refused = |e: std::io::Error| AdoptError::Refused { tag: tag.into(), reason: e.to_string() };
        match name.split_once(".layers/") {
            None if is_image_name(name) => {
                let from = grant.check(path, Kind::File).map_err(refused)?;
                link_or_copy(&from, &disk_dir.join(name)).map_err(io(format!("linking {}", from.display())))?;
            }
            Some((image, layer)) if is_image_name(image) && is_layer_name(layer) => {
                let from = grant.check(path, Kind::Dir).map_err(refused)?;
                let to = disk_dir.join(name);
                for file in [forkvm_snapshot::layered_disk::DATA_FILE, forkvm_snapshot::layered_disk::BITMAP_FILE] {
                    let src = from.join(file);
                    let is_file = std::fs::symlink_metadata(&src).is_ok_and(|m| m.is_file());
                    if !is_file {
                        return Err(refused(std::io::Error::other(format!("{} is not a regular file", src.display()))));
                    }
                }
                forkvm_snapshot::link_layer(&from, &to).map_err(io(format!("linking layer {}", from.display())))?;
                sync(&to).map_err(io(format!("syncing {}", to.display())))?;
            }
            _ => return Err(bad()),
        }
    }
    std::fs::remove_file(disk_dir.join(DISK_REFERENCES)).map_err(io("removing the references".into()))?;
    // The links are ours to make durable: a live branch's writer, under the sandbox's
    // uid, may not open them.
    sync(disk_dir).map_err(io(format!("syncing {}", disk_dir.display())))
}

fn sync(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// `disk<N>.img`, the names a capture gives its disks.
fn is_image_name(name: &str) -> bool {
    name.strip_prefix("disk")
        .and_then(|n| n.strip_suffix(".img"))
        .is_some_and(|n| !n.is_empty() && n.len() <= 2 && n.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::RecordedDisk;
    use std::os::unix::fs::MetadataExt;

    const L1: &str = "11111111111111111111111111111111";
    const L2: &str = "22222222222222222222222222222222";

    fn layer(dir: &Path) {
        std::fs::create_dir_all(dir).unwrap();
        for f in [forkvm_snapshot::layered_disk::DATA_FILE, forkvm_snapshot::layered_disk::BITMAP_FILE] {
            std::fs::write(dir.join(f), b"layer").unwrap();
        }
    }

    /// A store with tag `t` (a base and a sealed layer), another tag `u`, and sandbox
    /// `sb1` spawned from `t` with a layer of its own.
    fn setup(tmp: &Path) -> (Store, SandboxRecord) {
        let store = Store::open(tmp.join("store"));
        let t = store.snapshots_dir().join("t/disk");
        std::fs::create_dir_all(&t).unwrap();
        std::fs::write(t.join("disk0.img"), b"root image").unwrap();
        std::fs::write(t.join("disk1.img"), b"blank base").unwrap();
        layer(&t.join(format!("disk1.img.layers/{L1}")));
        layer(&store.snapshots_dir().join(format!("u/disk/disk1.img.layers/{L2}")));
        let run = tmp.join("run/sandboxes/sb1");
        layer(&run.join("disks/disk1/top-0"));
        let record = SandboxRecord {
            id: "sb1".into(),
            pid: 0,
            run_dir: run.clone(),
            template: None,
            source_tag: Some("t".into()),
            forked_from: None,
            created_at_unix_ms: 0,
            memory_limit_bytes: None,
            cpu_millis: None,
            pids_max: None,
            io_limits: Default::default(),
            cgroup: None,
            disks: vec![RecordedDisk {
                id: "data".into(),
                base: t.join("disk1.img"),
                sealed: vec![t.join(format!("disk1.img.layers/{L1}"))],
                dir: run.join("disks/disk1"),
            }],
            uid: None,
            network: None,
            vcpus: 1,
        };
        (store, record)
    }

    /// Writes branch `tag` into `inbox` with `refs` as its disk references.
    fn branch(inbox: &Inbox, tag: &str, refs: &[(&str, PathBuf)]) {
        let disk = inbox.dir().join(tag).join(DISK_DIR);
        std::fs::create_dir_all(&disk).unwrap();
        std::fs::write(inbox.dir().join(tag).join("memory.img"), b"memory").unwrap();
        let refs = DiskReferences(refs.iter().map(|(n, p)| (n.to_string(), p.clone())).collect());
        refs.write(&disk).unwrap();
        // What a VMM that a guest took over might write: every name reachable.
        let meta = format!(
            r#"{{"format_version":1,"tag":"{tag}","created_at_unix_ms":1,"status":"ready",
            "mem_size_bytes":4096,"vcpu_count":1,"irqchip":"x","guest":{{"kind":"linux","name":"g"}},
            "memory_bytes_allocated":0,"default_network":{{"allow_internet":true}},
            "default_limits":{{"cpu_millis":1024000}}}}"#
        );
        std::fs::write(inbox.dir().join(tag).join(forkvm_snapshot::SNAPSHOT_JSON), meta).unwrap();
    }

    fn no_internet() -> BranchDefaults {
        BranchDefaults {
            limits: Some(forkvm_snapshot::DefaultLimits { pids_max: Some(64), ..Default::default() }),
            network: Some(forkvm_api::NetworkPolicy {
                allow_internet: false,
                allow: vec!["pypi.org".into()],
                deny: Vec::new(),
            }),
        }
    }

    #[test]
    fn a_branch_is_adopted_with_its_named_disks_linked_and_nothing_else() {
        let tmp = tempfile::tempdir().unwrap();
        let (store, record) = setup(tmp.path());
        let grant = DiskGrant::of(&store, &record);
        let t = store.snapshots_dir().join("t/disk");
        let inbox = Inbox::make(&store, &record).unwrap();
        let own = record.run_dir.join("disks/disk1/top-0");
        branch(
            &inbox,
            "b",
            &[
                ("disk0.img", t.join("disk0.img")),
                ("disk1.img", t.join("disk1.img")),
                (&format!("disk1.img.layers/{L1}"), t.join(format!("disk1.img.layers/{L1}"))),
                (&format!("disk1.img.layers/{L2}"), own.clone()),
            ],
        );
        // The sandbox's own layer is its uid's until the branch takes it.
        let sandbox_uid = 0x7FFC_0000 + 65_536 + 7;
        for f in ["data", "bitmap"] {
            std::os::unix::fs::lchown(own.join(f), Some(sandbox_uid), Some(sandbox_uid)).unwrap();
        }
        let dest = store.snapshots_dir().join("b");
        inbox.adopt("b", &grant, &dest, None, &no_internet()).unwrap();
        // SAFETY: geteuid cannot fail.
        let us = unsafe { libc::geteuid() };
        for f in ["data", "bitmap"] {
            assert_eq!(std::fs::metadata(own.join(f)).unwrap().uid(), us, "{f}: the branch's now, not the sandbox's");
        }
        let meta = forkvm_snapshot::read_meta(&dest.join(forkvm_snapshot::SNAPSHOT_JSON)).unwrap();
        assert_eq!(meta.default_network, no_internet().network, "our policy, not the VMM's");
        assert_eq!(meta.default_limits, no_internet().limits, "our limits, not the VMM's");
        let ino = |p: &Path| std::fs::metadata(p).unwrap().ino();
        assert_eq!(ino(&dest.join("disk/disk1.img")), ino(&t.join("disk1.img")), "linked, not copied");
        assert_eq!(ino(&dest.join(format!("disk/disk1.img.layers/{L2}/data"))), ino(&own.join("data")));
        assert!(!dest.join("disk/references.json").exists(), "the references are gone once linked");
        assert_eq!(std::fs::read(dest.join("memory.img")).unwrap(), b"memory");
        assert!(!inbox.dir().join("b").exists(), "moved out of the inbox");
        // Never over an existing snapshot.
        branch(&inbox, "b", &[]);
        assert!(matches!(inbox.adopt("b", &grant, &dest, None, &no_internet()), Err(AdoptError::Exists { .. })));
        let dir = inbox.dir().to_path_buf();
        drop(inbox);
        assert!(!dir.exists(), "the inbox goes with its branch");
    }

    #[test]
    fn a_branch_naming_a_host_file_or_a_neighbours_disk_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let (store, record) = setup(tmp.path());
        let grant = DiskGrant::of(&store, &record);
        let theirs = store.snapshots_dir().join(format!("u/disk/disk1.img.layers/{L2}"));
        let hostile: [(&str, PathBuf); 4] = [
            ("disk0.img", PathBuf::from("/etc/passwd")),
            (&format!("disk1.img.layers/{L2}"), theirs),
            ("disk0.img", record.run_dir.join("../../../store/snapshots/t/disk/disk0.img")),
            ("../../escape", store.snapshots_dir().join("t/disk/disk0.img")),
        ];
        for (i, (name, path)) in hostile.into_iter().enumerate() {
            let inbox = Inbox::make(&store, &record).unwrap();
            branch(&inbox, "h", &[(name, path.clone())]);
            let dest = store.snapshots_dir().join(format!("h{i}"));
            let err = inbox.adopt("h", &grant, &dest, None, &no_internet()).unwrap_err();
            assert!(
                matches!(err, AdoptError::Refused { .. } | AdoptError::BadName { .. }),
                "{name} -> {path:?}: {err}"
            );
            assert!(!dest.exists(), "{name} -> {path:?}: adopted anyway");
        }
        assert!(!store.root().join("escape").exists());
    }

    #[test]
    fn disk_names_are_the_captures_own() {
        assert!(is_image_name("disk0.img") && is_image_name("disk10.img"));
        for bad in ["disk.img", "disk0.img/..", "../disk0.img", "disk0.imgx", "disk123.img", "disk-1.img"] {
            assert!(!is_image_name(bad), "{bad}");
        }
    }
}
