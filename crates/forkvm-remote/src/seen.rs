//! The newest manifest generation this host pulled of each tag of each remote, so a
//! remote rolled back to an older push is noticed.
//!
//! Why this exists: a manifest is sealed with the remote key, so whoever holds the bucket
//! cannot forge one, but can put back an older one of the same tag (a valid, older push).
//! Every push gives its manifest a larger generation
//! ([`crate::manifest::RemoteManifest::generation`]); a pull remembers the generation it
//! installed, in `<store>/remote-seen/<hash of the URL>/<tag>.json`, and refuses an older
//! one later. Removing that file (or the directory) accepts whatever the remote holds
//! next, e.g. after restoring a bucket from a backup on purpose.

use crate::RemoteError;
use forkvm_snapshot::Store;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Largest record read.
const MAX_RECORD_BYTES: u64 = 4096;

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SeenRecord {
    remote: String,
    tag: String,
    generation: u64,
}

fn path(store: &Store, url: &str, tag: &str) -> PathBuf {
    let dir = blake3::hash(url.as_bytes()).to_hex();
    store.root().join("remote-seen").join(&dir[..32]).join(format!("{tag}.json"))
}

fn refused(url: &str, tag: &str, reason: String) -> RemoteError {
    RemoteError::Refused { url: url.into(), object: crate::remote::tag_object(tag), reason }
}

/// The generation this host last pulled of `tag` from `url` (0: none).
fn last(store: &Store, url: &str, tag: &str) -> Result<u64, RemoteError> {
    let path = path(store, url, tag);
    let corrupt = |why: String| {
        refused(url, tag, format!("{}: {why} (remove it to accept what the remote holds)", path.display()))
    };
    let bytes = match std::fs::File::open(&path) {
        Ok(f) => {
            use std::io::Read;
            let mut bytes = Vec::new();
            f.take(MAX_RECORD_BYTES + 1)
                .read_to_end(&mut bytes)
                .map_err(RemoteError::io("reading what was pulled before", &path))?;
            bytes
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(RemoteError::io("opening what was pulled before", &path)(e)),
    };
    if bytes.len() as u64 > MAX_RECORD_BYTES {
        return Err(corrupt(format!("larger than {MAX_RECORD_BYTES} bytes")));
    }
    let record: SeenRecord = serde_json::from_slice(&bytes).map_err(|e| corrupt(e.to_string()))?;
    if record.remote != url || record.tag != tag {
        return Err(corrupt(format!("it is the record of {} on {}", record.tag, record.remote)));
    }
    Ok(record.generation)
}

/// Refuses `generation` of `tag` on `url` when this host pulled a newer one before.
pub fn check(store: &Store, url: &str, tag: &str, generation: u64) -> Result<(), RemoteError> {
    let last = last(store, url, tag)?;
    if generation < last {
        return Err(refused(
            url,
            tag,
            format!(
                "its generation {generation} is older than generation {last}, which this host pulled before: \
                 the remote was rolled back or an old manifest put back (remove {} to accept it)",
                path(store, url, tag).display()
            ),
        ));
    }
    Ok(())
}

/// Remembers that this host pulled `generation` of `tag` from `url` (never lowers it).
pub fn record(store: &Store, url: &str, tag: &str, generation: u64) -> Result<(), RemoteError> {
    if generation <= last(store, url, tag)? {
        return Ok(());
    }
    let body = serde_json::to_vec(&SeenRecord { remote: url.into(), tag: tag.into(), generation })
        .expect("a record serializes");
    crate::atomic_file::write_atomic(&path(store, url, tag), &body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_older_generation_than_one_pulled_before_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path());
        let (url, other) = ("s3://b/p", "s3://b/q");
        check(&store, url, "t", 0).unwrap();
        record(&store, url, "t", 5).unwrap();
        check(&store, url, "t", 5).unwrap();
        check(&store, url, "t", 6).unwrap();
        let err = check(&store, url, "t", 4).unwrap_err().to_string();
        assert!(err.contains("rolled back") && err.contains("tags/t"), "{err}");
        assert!(check(&store, url, "t", 0).is_err(), "a manifest from before generations is older too");
        record(&store, url, "t", 3).unwrap();
        assert!(check(&store, url, "t", 4).is_err(), "recording never lowers");
        check(&store, other, "t", 1).unwrap();
        check(&store, url, "u", 1).unwrap();

        let p = path(&store, url, "t");
        std::fs::write(&p, "{").unwrap();
        let err = check(&store, url, "t", 9).unwrap_err().to_string();
        assert!(err.contains("remove it"), "{err}");
        std::fs::remove_file(&p).unwrap();
        check(&store, url, "t", 1).unwrap();
    }
}
