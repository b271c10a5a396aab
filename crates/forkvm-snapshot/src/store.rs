//! The snapshot store: tagged snapshots under `<root>/snapshots/<tag>/`.
//!
//! Unlike the artefact cache (kernel, images, template snapshots: rebuilt on demand,
//! safe to delete), the store holds what users asked to keep — templates published under
//! a tag, branches of running sandboxes. Its root is `$FORKVM_STORE`, else
//! `$HOME/.local/share/forkvm`. Lookups go through the tag rule, report a `writing`
//! snapshot as such (it cannot be forked yet), and [`Store::sweep`] removes what crashed
//! writers left behind: `.partial` staging directories and `writing` snapshots whose
//! writer process is gone.

use crate::dir::{DirError, SnapshotDir};
use crate::metadata::{read_meta, SnapshotMeta, SnapshotStatus};
use crate::tag::{validate_tag, TagError};
use crate::SNAPSHOT_JSON;
use std::io;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    BadTag(#[from] TagError),
    #[error("snapshot {tag:?} not found in {store}")]
    NotFound { tag: String, store: PathBuf },
    #[error("snapshot {tag:?} is still being written; it can be used once it is ready")]
    Writing { tag: String },
    #[error("snapshot {tag:?} was being written by process {pid}, which is gone: it will never be ready (`forkvm snapshot sweep` removes it)")]
    Abandoned { tag: String, pid: u32 },
    #[error("snapshot {tag:?} already exists in {store}")]
    Exists { tag: String, store: PathBuf },
    #[error("snapshot {tag:?}: {source}")]
    Invalid { tag: String, source: DirError },
    #[error("snapshot store {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

impl StoreError {
    /// `not_found`, `conflict`, `bad_request` or `internal`.
    pub fn code(&self) -> forkvm_api::ErrorCode {
        match self {
            StoreError::NotFound { .. } => forkvm_api::ErrorCode::NotFound,
            StoreError::Writing { .. } | StoreError::Exists { .. } | StoreError::Abandoned { .. } => {
                forkvm_api::ErrorCode::Conflict
            }
            StoreError::BadTag(_) => forkvm_api::ErrorCode::BadRequest,
            _ => forkvm_api::ErrorCode::Internal,
        }
    }
}

/// One entry of [`Store::list`].
#[derive(Debug, Clone)]
pub struct StoreEntry {
    pub tag: String,
    pub meta: SnapshotMeta,
}

#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
}

impl Store {
    /// `$FORKVM_STORE` if set and not empty, else `$HOME/.local/share/forkvm`.
    pub fn default_root() -> PathBuf {
        match std::env::var_os("FORKVM_STORE").filter(|v| !v.is_empty()) {
            Some(v) => PathBuf::from(v),
            None => {
                let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/root"));
                home.join(".local/share/forkvm")
            }
        }
    }

    pub fn open(root: impl Into<PathBuf>) -> Store {
        Store { root: root.into() }
    }

    pub fn open_default() -> Store {
        Store::open(Store::default_root())
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The directory every tag lives in (created on demand).
    pub fn snapshots_dir(&self) -> PathBuf {
        self.root.join("snapshots")
    }

    /// Creates the snapshots directory if missing.
    pub fn ensure(&self) -> Result<PathBuf, StoreError> {
        let dir = self.snapshots_dir();
        std::fs::create_dir_all(&dir).map_err(|source| StoreError::Io { path: dir.clone(), source })?;
        Ok(dir)
    }

    /// Where `tag` lives (whether or not it exists).
    pub fn tag_dir(&self, tag: &str) -> Result<PathBuf, StoreError> {
        validate_tag(tag)?;
        Ok(self.snapshots_dir().join(tag))
    }

    /// Fails with `Exists` if `tag` is taken.
    pub fn check_free(&self, tag: &str) -> Result<PathBuf, StoreError> {
        let dir = self.tag_dir(tag)?;
        if std::fs::symlink_metadata(&dir).is_ok() {
            return Err(StoreError::Exists { tag: tag.to_string(), store: self.snapshots_dir() });
        }
        Ok(dir)
    }

    /// The ready snapshot `tag`: `NotFound`, `Writing` (conflict) or `Invalid` otherwise.
    /// A ready one a VMM wrote under its own uid (a live branch that finished after its
    /// call returned) becomes ours first ([`Store::adopt_ready`]).
    pub fn lookup(&self, tag: &str) -> Result<SnapshotDir, StoreError> {
        let dir = self.tag_dir(tag)?;
        self.adopt_ready(&dir).map_err(|source| StoreError::Io { path: dir.clone(), source })?;
        match SnapshotDir::open(&dir) {
            Ok(d) => Ok(d),
            Err(DirError::NotFound(_)) => {
                Err(StoreError::NotFound { tag: tag.to_string(), store: self.snapshots_dir() })
            }
            Err(DirError::StillWriting(_)) => {
                let writer = read_meta(&dir.join(SNAPSHOT_JSON)).ok().and_then(|m| writer_pid(&dir, m.writer_pid));
                match writer {
                    Some(pid) if !process_alive(pid) => Err(StoreError::Abandoned { tag: tag.to_string(), pid }),
                    _ => Err(StoreError::Writing { tag: tag.to_string() }),
                }
            }
            Err(source) => Err(StoreError::Invalid { tag: tag.to_string(), source }),
        }
    }

    /// Makes snapshot directory `dir` ours (owner and group, without following links) if
    /// another uid owns it and it says it is ready: a VMM under its sandbox's uid wrote
    /// it, and once ready nothing of it is the VMM's to change. A ready one also loses
    /// the note of its writer ([`WRITER_HOST_PID`]). Nothing to do otherwise.
    pub fn adopt_ready(&self, dir: &Path) -> io::Result<()> {
        use std::os::unix::fs::MetadataExt;
        let Ok(meta) = std::fs::symlink_metadata(dir) else { return Ok(()) };
        // SAFETY: geteuid cannot fail.
        let foreign = meta.uid() != unsafe { libc::geteuid() };
        let noted = dir.join(WRITER_HOST_PID);
        if !meta.is_dir() || (!foreign && std::fs::symlink_metadata(&noted).is_err()) {
            return Ok(());
        }
        if !read_meta(&dir.join(SNAPSHOT_JSON)).is_ok_and(|m| m.status == SnapshotStatus::Ready) {
            return Ok(());
        }
        if foreign {
            crate::ownership::disown_tree(dir)?;
        }
        match std::fs::remove_file(noted) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Every snapshot with a readable `snapshot.json` (ready or writing), sorted by tag.
    pub fn list(&self) -> Vec<StoreEntry> {
        let mut out = Vec::new();
        let Ok(entries) = std::fs::read_dir(self.snapshots_dir()) else {
            return out;
        };
        for e in entries.flatten() {
            let tag = e.file_name().to_string_lossy().into_owned();
            if validate_tag(&tag).is_err() {
                continue;
            }
            if let Ok(meta) = read_meta(&e.path().join(SNAPSHOT_JSON)) {
                out.push(StoreEntry { tag, meta });
            }
        }
        out.sort_by(|a, b| a.tag.cmp(&b.tag));
        out
    }

    /// Snapshot `tag` as [`Store::list`] would list it (a valid tag with a readable
    /// `snapshot.json`, ready or writing), reading only its own description.
    pub fn entry(&self, tag: &str) -> Option<StoreEntry> {
        validate_tag(tag).ok()?;
        let meta = read_meta(&self.snapshots_dir().join(tag).join(SNAPSHOT_JSON)).ok()?;
        Some(StoreEntry { tag: tag.to_string(), meta })
    }

    /// Deletes snapshot `tag` (ready or writing).
    pub fn remove(&self, tag: &str) -> Result<(), StoreError> {
        let dir = self.tag_dir(tag)?;
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                Err(StoreError::NotFound { tag: tag.to_string(), store: self.snapshots_dir() })
            }
            Err(source) => Err(StoreError::Io { path: dir, source }),
        }
    }

    /// Removes leftovers of crashed writers: `<tag>.partial` directories, `writing`
    /// snapshots whose writer process no longer exists, directories a failed live branch
    /// left without a `snapshot.json`, branch inboxes (`incoming/`) older than an hour,
    /// and staging directories of dead processes (`staging/<name>`); adopts ready ones a
    /// VMM wrote ([`Store::adopt_ready`]). Returns the names removed.
    pub fn sweep(&self) -> Vec<String> {
        let mut removed = Vec::new();
        let older_than = |e: &std::fs::DirEntry, secs: u64| {
            e.metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|a| a.as_secs() > secs)
        };
        let entries = std::fs::read_dir(self.snapshots_dir()).into_iter().flatten();
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let stale = if name.ends_with(".partial") {
                // A staging directory is only live while its writer holds the VM paused
                // (full mode) or for a moment (live mode): one older than a minute is left over.
                older_than(&e, 60)
            } else {
                let _ = self.adopt_ready(&e.path());
                match read_meta(&e.path().join(SNAPSHOT_JSON)) {
                    Ok(m) if m.status == SnapshotStatus::Writing => {
                        !writer_pid(&e.path(), m.writer_pid).is_some_and(process_alive)
                    }
                    Err(crate::metadata::MetadataError::Missing(_)) => older_than(&e, 60),
                    _ => false,
                }
            };
            if stale && std::fs::remove_dir_all(e.path()).is_ok() {
                removed.push(name);
            }
        }
        removed.extend(crate::chain::sweep_staging(self).into_iter().map(|n| format!("staging/{n}")));
        let inboxes = std::fs::read_dir(self.root.join("incoming")).into_iter().flatten();
        for e in inboxes.flatten() {
            if older_than(&e, 3600) && std::fs::remove_dir_all(e.path()).is_ok() {
                removed.push(format!("incoming/{}", e.file_name().to_string_lossy()));
            }
        }
        removed.sort();
        removed
    }
}

/// A writing snapshot's file naming its writer as this host numbers it (see
/// [`writer_pid`]).
pub const WRITER_HOST_PID: &str = ".writer-host-pid";

/// The pid of snapshot `dir`'s writer as this host numbers it: `.writer-host-pid` when
/// the host side wrote one (a jailed VMM numbers itself in its own pid namespace, which
/// is what its `snapshot.json` says), else `described`.
pub fn writer_pid(dir: &Path, described: Option<u32>) -> Option<u32> {
    let path = dir.join(WRITER_HOST_PID);
    let small = std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file() && m.len() <= 16);
    let noted = small.then(|| std::fs::read_to_string(&path).ok()).flatten().and_then(|s| s.trim().parse().ok());
    noted.or(described)
}

/// Whether a process with this pid exists.
pub fn process_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Gives the sealed layer at `from` a second name, a new directory `to` holding hard
/// links (copies across filesystems) of its data and bitmap files. An error names the
/// step and the file.
pub fn link_layer(from: &Path, to: &Path) -> io::Result<()> {
    let named = |step: &str, path: &Path| {
        let what = format!("{step} {}", path.display());
        move |e: io::Error| io::Error::new(e.kind(), format!("{what}: {e}"))
    };
    std::fs::create_dir_all(to).map_err(named("creating", to))?;
    for name in [crate::layered_disk::DATA_FILE, crate::layered_disk::BITMAP_FILE] {
        let src = from.join(name);
        link_or_copy(&src, &to.join(name)).map_err(named("linking", &src))?;
    }
    Ok(())
}

/// Hard-links `src` to `dst`, or copies it when they are on different filesystems.
pub fn link_or_copy(src: &Path, dst: &Path) -> io::Result<()> {
    match std::fs::hard_link(src, dst) {
        Ok(()) => Ok(()),
        Err(_) => std::fs::copy(src, dst).map(|_| ()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::{minimal_meta, write_meta};
    use crate::{MEMORY_IMG, VMSTATE_BIN};

    fn meta(tag: &str, status: SnapshotStatus, writer_pid: Option<u32>) -> SnapshotMeta {
        SnapshotMeta { writer_pid, ..minimal_meta(tag, status) }
    }

    fn put(store: &Store, tag: &str, status: SnapshotStatus, writer_pid: Option<u32>) {
        let dir = store.snapshots_dir().join(tag);
        std::fs::create_dir_all(&dir).unwrap();
        write_meta(&dir.join(SNAPSHOT_JSON), &meta(tag, status, writer_pid)).unwrap();
        std::fs::write(dir.join(VMSTATE_BIN), b"x").unwrap();
        std::fs::write(dir.join(MEMORY_IMG), b"x").unwrap();
    }

    #[test]
    fn lookup_reports_each_state() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path());
        put(&store, "ready", SnapshotStatus::Ready, None);
        put(&store, "busy", SnapshotStatus::Writing, Some(std::process::id()));
        assert_eq!(store.lookup("ready").unwrap().meta.tag, "ready");
        let busy = store.lookup("busy").unwrap_err();
        assert!(matches!(busy, StoreError::Writing { .. }) && busy.code() == forkvm_api::ErrorCode::Conflict, "{busy}");
        assert_eq!(store.lookup("nope").unwrap_err().code(), forkvm_api::ErrorCode::NotFound);
        assert_eq!(store.lookup("../etc").unwrap_err().code(), forkvm_api::ErrorCode::BadRequest);
        assert_eq!(store.check_free("ready").unwrap_err().code(), forkvm_api::ErrorCode::Conflict);
        assert!(store.check_free("free").is_ok());
        let tags: Vec<_> = store.list().into_iter().map(|e| e.tag).collect();
        assert_eq!(tags, ["busy", "ready"]);
    }

    #[test]
    fn one_entry_is_what_the_list_has_for_its_tag() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path());
        put(&store, "ready", SnapshotStatus::Ready, None);
        put(&store, "busy", SnapshotStatus::Writing, Some(std::process::id()));
        for e in store.list() {
            let one = store.entry(&e.tag).unwrap();
            assert_eq!((one.tag, one.meta.status), (e.tag, e.meta.status));
        }
        assert!(store.entry("nope").is_none() && store.entry("../etc").is_none());
    }

    #[test]
    fn sweep_removes_only_dead_writers_leftovers() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path());
        put(&store, "ready", SnapshotStatus::Ready, None);
        put(&store, "live-writer", SnapshotStatus::Writing, Some(std::process::id()));
        // A pid that cannot exist (above the kernel's pid_max limit).
        put(&store, "dead-writer", SnapshotStatus::Writing, Some(u32::MAX - 1));
        let abandoned = store.lookup("dead-writer").unwrap_err();
        assert!(matches!(abandoned, StoreError::Abandoned { .. }), "{abandoned}");
        assert!(abandoned.to_string().contains("snapshot sweep"), "{abandoned}");
        assert_eq!(store.sweep(), ["dead-writer"]);
        assert!(store.lookup("ready").is_ok());
        assert!(matches!(store.lookup("live-writer"), Err(StoreError::Writing { .. })));
        assert_eq!(store.lookup("dead-writer").unwrap_err().code(), forkvm_api::ErrorCode::NotFound);
    }

    #[test]
    fn a_ready_snapshot_a_vmm_wrote_becomes_ours_when_looked_up_and_a_writing_one_does_not() {
        use std::os::unix::fs::MetadataExt;
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: changing owners needs root");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path());
        let vmm_uid = 0x7FFC_0000 + 9;
        put(&store, "done", SnapshotStatus::Ready, None);
        put(&store, "busy", SnapshotStatus::Writing, Some(std::process::id()));
        for tag in ["done", "busy"] {
            crate::ownership::own_tree(&store.snapshots_dir().join(tag), vmm_uid, vmm_uid).unwrap();
        }
        let owner = |p: &str| std::fs::symlink_metadata(store.snapshots_dir().join(p)).unwrap().uid();
        store.lookup("done").unwrap();
        assert_eq!((owner("done"), owner("done/memory.img")), (0, 0));
        assert!(store.lookup("busy").is_err());
        assert_eq!(owner("busy/memory.img"), vmm_uid, "its writer still writes it");
        // A directory a failed live branch left without its description goes with the
        // sweep once old; a fresh one stays (a branch may be about to publish it).
        std::fs::create_dir_all(store.snapshots_dir().join("empty")).unwrap();
        assert!(!store.sweep().contains(&"empty".to_string()));
    }

    #[test]
    fn a_writer_is_judged_by_the_pid_the_host_noted_for_it() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path());
        // Its snapshot.json names a pid that exists here (a jailed VMM's own, in its pid
        // namespace); the host side noted the real one, which is gone.
        put(&store, "jailed", SnapshotStatus::Writing, Some(std::process::id()));
        let dir = store.snapshots_dir().join("jailed");
        std::fs::write(dir.join(WRITER_HOST_PID), (u32::MAX - 1).to_string()).unwrap();
        assert!(matches!(store.lookup("jailed"), Err(StoreError::Abandoned { .. })));
        assert_eq!(store.sweep(), ["jailed"]);
        // Once ready, the note goes.
        put(&store, "done", SnapshotStatus::Ready, None);
        let done = store.snapshots_dir().join("done");
        std::fs::write(done.join(WRITER_HOST_PID), "1").unwrap();
        store.lookup("done").unwrap();
        assert!(!done.join(WRITER_HOST_PID).exists());
    }

    #[test]
    fn remove_deletes_and_reports_missing() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path());
        put(&store, "a", SnapshotStatus::Ready, None);
        store.remove("a").unwrap();
        assert_eq!(store.remove("a").unwrap_err().code(), forkvm_api::ErrorCode::NotFound);
    }
}
