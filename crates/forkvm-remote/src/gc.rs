//! Removing tags from a remote, and collecting the blocks no tag needs any more.
//!
//! Why this exists: blocks are shared across tags and hosts, so removing a tag's
//! manifest frees nothing by itself, and a tag pushed again over a changed chain leaves
//! its old blocks behind. [`collect`] deletes every block that no manifest on the remote
//! names, under the remote's exclusive lock ([`crate::lock`]), so no push is between
//! choosing to reuse a block and committing its manifest meanwhile.
//!
//! A block younger than `min_age` is kept even when nothing names it: it may belong to
//! a push that was cut off and will resume (its manifest is not written yet). A
//! manifest that does not open under the key stops the collection: what it names is
//! unknown, so nothing is deleted. What the remote holds under `vaults/` (replicated
//! sandboxes, sealed with their own keys) is not touched.
//!
//! Hosts that pulled a tag **lazily** (`forkvm pull --lazy`) fetch its memory blocks
//! while their sandboxes run: remove such a tag and collect only once they have
//! everything (`forkvm ps` / the status's `lazy_memory`), or they lose their memory.

use crate::lock::{LockKind, RemoteLock};
use crate::manifest::RemoteManifest;
use crate::remote::{chunk_object, tag_object};
use crate::workers::parallel;
use crate::{Remote, RemoteError, RemoteKey};
pub use forkvm_api::remote::GcReport;
use forkvm_snapshot::ChunkId;
use std::collections::HashSet;
use std::time::{Duration, Instant, SystemTime};

/// How old an unreferenced block must be before a collection deletes it, unless told
/// otherwise: a push cut off within it resumes with the blocks it uploaded.
pub const DEFAULT_MIN_AGE: Duration = Duration::from_secs(24 * 60 * 60);

/// Removes `tag`'s manifest from `remote` (its blocks stay until a [`collect`]).
pub fn remove_tag(remote: &Remote, tag: &str) -> Result<(), RemoteError> {
    forkvm_snapshot::validate_tag(tag)
        .map_err(|e| RemoteError::BadUrl { url: remote.url().into(), reason: e.to_string() })?;
    if !remote.exists(&tag_object(tag))? {
        return Err(RemoteError::NoTag { url: remote.url().into(), tag: tag.into() });
    }
    remote.delete(&tag_object(tag))
}

/// Deletes the blocks of `remote` that no manifest names and that are at least
/// `min_age` old; with `dry_run`, only counts them.
pub fn collect(remote: &Remote, key: &RemoteKey, min_age: Duration, dry_run: bool) -> Result<GcReport, RemoteError> {
    let started = Instant::now();
    let lock = RemoteLock::acquire(remote, LockKind::Exclusive, if dry_run { "gc --dry-run" } else { "gc" })?;
    let tags = remote.tags()?;
    let mut referenced = HashSet::new();
    for tag in &tags {
        // A tag removed since the listing names nothing any more.
        let Some(sealed) = remote.get(&tag_object(tag))? else { continue };
        let manifest = RemoteManifest::open(key.seal(), tag, &sealed, remote.url()).map_err(|e| match e {
            RemoteError::Refused { url, object, reason } => RemoteError::Refused {
                url,
                object,
                reason: format!("{reason}; not collecting: what it names is unknown"),
            },
            other => other,
        })?;
        for entry in &manifest.entries {
            let blocks = entry.checked_blocks().map_err(|reason| RemoteError::Refused {
                url: remote.url().into(),
                object: tag_object(tag),
                reason: format!("{reason}; not collecting"),
            })?;
            referenced.extend(blocks.into_iter().map(|(_, _, id)| id));
        }
    }
    let now = SystemTime::now();
    let (mut blocks, mut young, mut doomed) = (0u64, 0u64, Vec::new());
    for listed in remote.listing("chunks")? {
        let Ok(id) = ChunkId::from_hex(&listed.name) else { continue };
        blocks += 1;
        if referenced.contains(&id) {
            continue;
        }
        if now.duration_since(listed.modified).unwrap_or(Duration::ZERO) < min_age {
            young += 1;
        } else {
            doomed.push((id, listed.size));
        }
    }
    let bytes_deleted = doomed.iter().map(|(_, size)| size).sum();
    if !dry_run {
        lock.check_held()?;
        parallel(&doomed, |(id, _)| remote.delete(&chunk_object(id)).map(|()| 1))?;
    }
    drop(lock);
    Ok(GcReport {
        remote: remote.url().into(),
        dry_run,
        tags: tags.len() as u64,
        blocks,
        blocks_referenced: blocks - young - doomed.len() as u64,
        blocks_young: young,
        blocks_deleted: doomed.len() as u64,
        bytes_deleted,
        ms: started.elapsed().as_secs_f64() * 1e3,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::{RemoteEntry, MANIFEST_FORMAT, MANIFEST_VERSION};

    struct Fixture {
        _dir: tempfile::TempDir,
        remote: Remote,
        key: RemoteKey,
    }

    fn fixture() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let key_path = dir.path().join("remote.key");
        let key = RemoteKey::generate(&key_path).unwrap();
        let remote = Remote::open(&format!("file://{}", dir.path().join("remote").display())).unwrap();
        Fixture { _dir: dir, remote, key }
    }

    /// Puts a block object holding `fill` (its content does not matter to collection).
    fn block(f: &Fixture, fill: u8) -> ChunkId {
        let plain = vec![fill; 4096];
        let id = f.key.seal().name_of(&plain);
        f.remote.put(&chunk_object(&id), plain).unwrap();
        id
    }

    fn manifest(f: &Fixture, tag: &str, blocks: &[ChunkId]) {
        let m = RemoteManifest {
            format: MANIFEST_FORMAT.into(),
            version: MANIFEST_VERSION,
            tag: tag.into(),
            generation: 1,
            links: vec![tag.into()],
            description: serde_json::json!({}),
            entries: vec![RemoteEntry {
                name: "disks/0".into(),
                size: blocks.len() as u64 * crate::BLOCK_BYTES,
                blocks: blocks
                    .iter()
                    .enumerate()
                    .map(|(i, id)| (i as u64 * crate::BLOCK_BYTES, 4096, id.to_hex()))
                    .collect(),
            }],
        };
        f.remote.put(&tag_object(tag), m.seal(f.key.seal()).unwrap()).unwrap();
    }

    #[test]
    fn only_blocks_no_tag_names_go_and_young_ones_stay() {
        let f = fixture();
        let (a, shared, b) = (block(&f, 1), block(&f, 2), block(&f, 3));
        manifest(&f, "one", &[a, shared]);
        manifest(&f, "two", &[shared, b]);
        let stray = block(&f, 4);
        f.remote.put("chunks/not-a-block", b"x".to_vec()).unwrap();

        let r = collect(&f.remote, &f.key, Duration::ZERO, false).unwrap();
        assert_eq!((r.tags, r.blocks, r.blocks_referenced, r.blocks_deleted), (2, 4, 3, 1), "{r:?}");
        assert_eq!(r.bytes_deleted, 4096);
        assert!(!f.remote.exists(&chunk_object(&stray)).unwrap());
        assert!(f.remote.exists("chunks/not-a-block").unwrap(), "names that are not blocks are left alone");

        remove_tag(&f.remote, "one").unwrap();
        assert!(matches!(remove_tag(&f.remote, "one"), Err(RemoteError::NoTag { .. })));
        // `a` is unreferenced now, but young under a minimum age: kept; a dry run deletes nothing.
        let r = collect(&f.remote, &f.key, Duration::from_secs(3600), false).unwrap();
        assert_eq!((r.blocks_young, r.blocks_deleted), (1, 0), "{r:?}");
        let r = collect(&f.remote, &f.key, Duration::ZERO, true).unwrap();
        assert_eq!((r.blocks_deleted, r.dry_run), (1, true));
        assert!(f.remote.exists(&chunk_object(&a)).unwrap());
        let r = collect(&f.remote, &f.key, Duration::ZERO, false).unwrap();
        assert_eq!((r.tags, r.blocks_deleted), (1, 1), "{r:?}");
        for kept in [shared, b] {
            assert!(f.remote.exists(&chunk_object(&kept)).unwrap());
        }
        assert!(f.remote.list("locks").unwrap().is_empty());
    }

    #[test]
    fn a_manifest_that_does_not_open_or_a_running_push_stops_it() {
        let f = fixture();
        let a = block(&f, 1);
        let _stray = block(&f, 2);
        manifest(&f, "one", &[a]);
        f.remote.put(&tag_object("bad"), b"not a manifest".to_vec()).unwrap();
        let err = collect(&f.remote, &f.key, Duration::ZERO, false).unwrap_err();
        assert!(err.to_string().contains("not collecting"), "{err}");
        assert_eq!(f.remote.chunks().unwrap().len(), 2, "nothing deleted");
        f.remote.delete(&tag_object("bad")).unwrap();

        let push = RemoteLock::acquire(&f.remote, LockKind::Shared, "push one").unwrap();
        let err = collect(&f.remote, &f.key, Duration::ZERO, false).unwrap_err();
        assert!(matches!(err, RemoteError::Locked { .. }) && err.to_string().contains("push one"), "{err}");
        assert_eq!(f.remote.chunks().unwrap().len(), 2, "nothing deleted");
        drop(push);
        assert_eq!(collect(&f.remote, &f.key, Duration::ZERO, false).unwrap().blocks_deleted, 1);
    }
}
