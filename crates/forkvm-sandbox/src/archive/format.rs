//! What an archive is on disk: `<store>/archives/<id>/`, holding no plaintext of the guest.
//!
//! Why this exists: an archived sandbox leaves the host's memory for the store, and the
//! store must not hold what the guest wrote in the clear (issue 7). Its memory and its
//! layered disks go into the sandbox's vault as one encrypted snapshot (memory as one
//! more "disk" of the snapshot, over an all-zero base); its vCPU and device state is a
//! file sealed with the same key. What stays readable are names, sizes, layer ids and
//! the read-only images the sandbox was started with (the template's root image, the
//! data disk's blank base), which hold nothing the sandbox wrote.
//!
//! | file | content |
//! |------|---------|
//! | `archive.json` | [`ArchiveManifest`], written last: an archive without it is incomplete |
//! | `snapshot.json` | the capture's description (devices, layer ids, sizes) |
//! | `vmstate.sealed` | `vmstate.bin`, sealed with the vault key (`vault::sealed_file`), label `archive <seq> vmstate.bin` |
//! | `disk/disk<i>.img` | hard links of the read-only images and of each layered disk's base |
//! | `sandbox.json` | the sandbox's registry record as archived |
//!
//! The vault snapshot `vault_seq` is pinned by holder [`ARCHIVE_PIN`] for as long as the
//! archive exists. An archive is built in `<id>.partial/` and renamed into place; a
//! complete `.partial` (one with `archive.json`) left by a crash between removing the
//! previous archive and that rename is still found by [`find`], and finished by the
//! sweep ([`finish_partial`]) once nobody is archiving that sandbox.
//!
//! Compatibility: `format` is 1 and a reader accepts exactly that; the JSON refuses
//! unknown fields. An archive without `archive.json` but with `memory.img` was written
//! by forkvm before archives were encrypted (format 0, plaintext) and still restores.

use forkvm_snapshot::Store;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The archive's description file.
pub const ARCHIVE_JSON: &str = "archive.json";
/// The sealed `vmstate.bin`.
pub const VMSTATE_SEALED: &str = "vmstate.sealed";
/// In an archive: the sandbox's registry record as it was archived.
pub const ARCHIVED_RECORD: &str = "sandbox.json";
/// The disk id of the memory image in the vault snapshot.
pub const MEMORY_DISK_ID: &str = "memory";
/// The base key of the memory "disk": an all-zero image of its size.
pub const MEMORY_BASE_KEY: &str = "zeros";
/// The pin holder of an archive's vault snapshot.
pub const ARCHIVE_PIN: &str = "archive";
/// The archive format this build writes and reads.
pub const ARCHIVE_FORMAT: u32 = 1;
/// Largest `archive.json` read back.
const MAX_MANIFEST_BYTES: u64 = 1 << 20;

/// `archive.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArchiveManifest {
    /// [`ARCHIVE_FORMAT`].
    pub format: u32,
    /// The archived sandbox.
    pub sandbox_id: String,
    /// The vault snapshot holding its memory ([`MEMORY_DISK_ID`]) and layered disks.
    pub vault_seq: u64,
    /// Guest memory size in bytes.
    pub memory_bytes: u64,
    /// Its layered disks that hold blocks (a disk never written is its base alone).
    pub disks: Vec<ArchivedDisk>,
    /// When it was archived.
    pub created_unix_ms: u64,
}

/// One layered disk of an archive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArchivedDisk {
    /// Position among the VM's block devices.
    pub index: usize,
    /// Its id (serial), also its id in the vault snapshot.
    pub id: String,
    /// The sealed layer ids the saved device state names; the vault snapshot's disk is
    /// their content.
    pub layers: Vec<String>,
}

/// Where archives live in `store`.
pub fn archives_dir(store: &Store) -> PathBuf {
    store.root().join("archives")
}

/// The directory an archive of `id` is built in before it is renamed into place.
pub fn partial_dir(store: &Store, id: &str) -> PathBuf {
    archives_dir(store).join(format!("{id}.partial"))
}

/// The complete archive of `id`, if there is one: `<id>/`, else a complete
/// `<id>.partial/` (see the module doc). Either format.
pub fn find(store: &Store, id: &str) -> Option<PathBuf> {
    let dir = archives_dir(store).join(id);
    if is_complete(&dir) {
        return Some(dir);
    }
    let partial = partial_dir(store, id);
    partial.join(ARCHIVE_JSON).is_file().then_some(partial)
}

/// Finishes the commit of archive `id` whose archiver died after writing the
/// `archive.json` of `<id>.partial/` and before renaming it into place: the previous
/// archive (if any) is set aside and removed, the partial one moved to `<id>/`. Whether
/// there was such an archive to finish. Only for a sandbox nobody is archiving (its VMM
/// is gone, or it has no row): a live archiver does these renames itself.
pub fn finish_partial(store: &Store, id: &str) -> std::io::Result<bool> {
    let partial = partial_dir(store, id);
    if !partial.join(ARCHIVE_JSON).is_file() {
        return Ok(false);
    }
    let final_dir = archives_dir(store).join(id);
    let old = archives_dir(store).join(format!("{id}.old"));
    remove(store, id, &old)?;
    match std::fs::rename(&final_dir, &old) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    std::fs::rename(&partial, &final_dir)?;
    remove(store, id, &old)?;
    Ok(true)
}

/// Whether `dir` holds a complete archive of either format.
pub fn is_complete(dir: &Path) -> bool {
    dir.join(ARCHIVE_JSON).is_file()
        || (dir.join(forkvm_snapshot::SNAPSHOT_JSON).is_file() && dir.join(forkvm_snapshot::MEMORY_IMG).is_file())
}

/// An `archive.json` that cannot be used: the file and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {reason}", path.display())]
pub struct BadManifest {
    pub path: PathBuf,
    pub reason: String,
}

/// Reads and checks `dir/archive.json`; `Ok(None)` for a format-0 (plaintext) archive.
pub fn read_manifest(dir: &Path, id: &str) -> Result<Option<ArchiveManifest>, BadManifest> {
    let path = dir.join(ARCHIVE_JSON);
    let bad = |reason: String| BadManifest { path: path.clone(), reason };
    let bytes = match std::fs::metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(bad(e.to_string())),
        Ok(m) if m.len() > MAX_MANIFEST_BYTES => {
            return Err(bad(format!("{} bytes, over the {MAX_MANIFEST_BYTES}-byte cap", m.len())))
        }
        Ok(_) => std::fs::read(&path).map_err(|e| bad(e.to_string()))?,
    };
    let m: ArchiveManifest =
        serde_json::from_slice(&bytes).map_err(|e| bad(format!("not an archive description: {e}")))?;
    if m.format != ARCHIVE_FORMAT {
        return Err(bad(format!(
            "archive format {} (this forkvm reads format {ARCHIVE_FORMAT}); use the forkvm that wrote it",
            m.format
        )));
    }
    if m.sandbox_id != id {
        return Err(bad(format!("the archive of sandbox {:?}, not {id:?}", m.sandbox_id)));
    }
    if m.disks.iter().any(|d| d.id == MEMORY_DISK_ID || d.layers.iter().any(|l| !forkvm_snapshot::is_layer_name(l))) {
        return Err(bad("a disk entry names the memory or an invalid layer id".into()));
    }
    Ok(Some(m))
}

/// Writes `m` as `dir/archive.json`, synced: the archive's commit record.
pub fn write_manifest(dir: &Path, m: &ArchiveManifest) -> std::io::Result<()> {
    use std::io::Write;
    let path = dir.join(ARCHIVE_JSON);
    let mut f = std::fs::File::create(&path)?;
    f.write_all(&serde_json::to_vec_pretty(m).expect("a manifest serializes"))?;
    f.sync_all()?;
    std::fs::File::open(dir)?.sync_all()
}

/// Removes the archive directory `dir` of sandbox `id` in `store` and lets go of its
/// vault snapshot's pin. Ok if it does not exist.
pub fn remove(store: &Store, id: &str, dir: &Path) -> std::io::Result<()> {
    let set_aside = || {
        let bytes = std::fs::read(dir.join(REMOVING_JSON)).ok()?;
        serde_json::from_slice::<ArchiveManifest>(&bytes).ok().filter(|m| m.sandbox_id == id)
    };
    let seq = read_manifest(dir, id).ok().flatten().or_else(set_aside).map(|m| m.vault_seq);
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    if let Some(seq) = seq {
        let vault = crate::disk_snapshots::vault_dir(store, id);
        forkvm_snapshot::vault::pins::remove_pin(&vault, seq, ARCHIVE_PIN).map_err(std::io::Error::other)?;
    }
    Ok(())
}

/// Removes the archive a restored sandbox's run directory links to (`<store>/archives/<id>`,
/// so the store is found from it) and its pin. Ok if it does not exist.
pub fn remove_linked(dir: &Path) -> std::io::Result<()> {
    let (Some(id), Some(root)) = (dir.file_name().and_then(|n| n.to_str()), dir.parent().and_then(Path::parent)) else {
        return Err(std::io::Error::other(format!("{} is not an archive directory", dir.display())));
    };
    remove(&Store::open(root), id, dir)
}

/// `archive.json` of an archive being removed: kept (for its vault pin) but no longer
/// the commit record.
const REMOVING_JSON: &str = "archive.json.removing";

/// Makes archive `dir` incomplete, so that nothing lists, adopts or restores it any
/// more, before the rest is removed: its `archive.json` is set aside (its vault pin is
/// still found from it), a format-0 archive's `snapshot.json` removed. Ok if they are
/// gone already.
pub fn uncommit(dir: &Path) -> std::io::Result<()> {
    let not_found = |r: std::io::Result<()>| match r {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        r => r,
    };
    not_found(std::fs::rename(dir.join(ARCHIVE_JSON), dir.join(REMOVING_JSON)))?;
    not_found(std::fs::remove_file(dir.join(forkvm_snapshot::SNAPSHOT_JSON)))?;
    not_found(std::fs::File::open(dir).and_then(|d| d.sync_all()))
}

/// Removes the archives in `store` whose removal was interrupted after [`uncommit`]
/// (their `archive.json` set aside); returns their sandbox ids.
pub fn remove_uncommitted(store: &Store) -> Vec<String> {
    let mut removed = Vec::new();
    for e in std::fs::read_dir(archives_dir(store)).into_iter().flatten().flatten() {
        let dir = e.path();
        let Some(id) = e.file_name().to_str().map(String::from) else { continue };
        if !dir.join(ARCHIVE_JSON).exists() && dir.join(REMOVING_JSON).exists() && remove(store, &id, &dir).is_ok() {
            removed.push(id);
        }
    }
    removed
}

/// Removes every archive of `id` (complete, partial, or the old one being replaced).
pub fn remove_all(store: &Store, id: &str) -> std::io::Result<()> {
    for dir in [archives_dir(store).join(id), partial_dir(store, id), archives_dir(store).join(format!("{id}.old"))] {
        remove(store, id, &dir)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest() -> ArchiveManifest {
        ArchiveManifest {
            format: ARCHIVE_FORMAT,
            sandbox_id: "sb-1".into(),
            vault_seq: 4,
            memory_bytes: 1 << 30,
            disks: vec![ArchivedDisk { index: 1, id: "forkvm-data".into(), layers: vec!["ab".repeat(16)] }],
            created_unix_ms: 1,
        }
    }

    #[test]
    fn a_manifest_round_trips_and_bad_ones_are_refused_by_name() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        assert_eq!(read_manifest(dir, "sb-1"), Ok(None), "no archive.json: format 0");
        write_manifest(dir, &manifest()).unwrap();
        assert_eq!(read_manifest(dir, "sb-1").unwrap(), Some(manifest()));
        assert!(read_manifest(dir, "sb-2").unwrap_err().reason.contains("not \"sb-2\""));
        for (bad, says) in [
            (ArchiveManifest { format: 2, ..manifest() }, "archive format 2"),
            (
                ArchiveManifest {
                    disks: vec![ArchivedDisk { index: 1, id: "x".into(), layers: vec!["../etc".into()] }],
                    ..manifest()
                },
                "invalid layer id",
            ),
        ] {
            write_manifest(dir, &bad).unwrap();
            let err = read_manifest(dir, "sb-1").unwrap_err().to_string();
            assert!(err.contains(says), "{err}");
        }
        std::fs::write(dir.join(ARCHIVE_JSON), br#"{"format":1,"surprise":true}"#).unwrap();
        assert!(read_manifest(dir, "sb-1").unwrap_err().reason.contains("not an archive description"));
    }

    #[test]
    fn find_prefers_the_archive_then_a_complete_partial() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path());
        assert_eq!(find(&store, "sb-1"), None);
        let partial = partial_dir(&store, "sb-1");
        std::fs::create_dir_all(&partial).unwrap();
        assert_eq!(find(&store, "sb-1"), None, "an incomplete partial is not an archive");
        write_manifest(&partial, &manifest()).unwrap();
        assert_eq!(find(&store, "sb-1"), Some(partial.clone()));
        let dir = archives_dir(&store).join("sb-1");
        std::fs::create_dir_all(&dir).unwrap();
        write_manifest(&dir, &manifest()).unwrap();
        assert_eq!(find(&store, "sb-1"), Some(dir));
        // Removing lets go of the pin too (here: there is none; Ok).
        remove_all(&store, "sb-1").unwrap();
        assert_eq!(find(&store, "sb-1"), None);
        assert!(!partial.exists());
    }

    #[test]
    fn a_sealed_partial_is_finished_over_the_previous_archive() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path());
        assert!(!finish_partial(&store, "sb-1").unwrap(), "nothing to finish");
        let partial = partial_dir(&store, "sb-1");
        std::fs::create_dir_all(&partial).unwrap();
        assert!(!finish_partial(&store, "sb-1").unwrap(), "an unsealed partial is not finished");
        assert!(partial.is_dir(), "nor removed");
        let dir = archives_dir(&store).join("sb-1");
        std::fs::create_dir_all(&dir).unwrap();
        write_manifest(&dir, &ArchiveManifest { vault_seq: 3, ..manifest() }).unwrap();
        write_manifest(&partial, &manifest()).unwrap();
        assert!(finish_partial(&store, "sb-1").unwrap());
        assert_eq!(read_manifest(&dir, "sb-1").unwrap().unwrap().vault_seq, 4, "the newer archive is in place");
        assert!(!partial.exists());
        assert!(!archives_dir(&store).join("sb-1.old").exists(), "the previous one is gone");
    }
}
