//! The blob store: every imported image's manifests, configs and layers, one file per
//! sha256 digest (`<root>/blobs/sha256/<hex>`), so images that share base layers store
//! them once. A blob is written under a temporary name, checked against its digest and
//! renamed into place: the store never holds a blob whose name lies about its bytes.

use super::digest::{copy_hashed, Digest};
use super::OciError;
use std::io::Read;
use std::path::{Path, PathBuf};

/// The largest JSON document (index, manifest, config) read from a store or an image.
pub const MAX_JSON: u64 = 4 << 20;

/// A directory of blobs named by their digests.
#[derive(Debug, Clone)]
pub struct BlobStore {
    root: PathBuf,
}

impl BlobStore {
    pub fn new(root: impl Into<PathBuf>) -> BlobStore {
        BlobStore { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where the blob `digest` is (or would be).
    pub fn path(&self, digest: &Digest) -> PathBuf {
        self.root.join("blobs/sha256").join(digest.hex())
    }

    pub fn has(&self, digest: &Digest) -> bool {
        self.path(digest).is_file()
    }

    /// Stores what `from` yields; returns its digest, its length and whether the store
    /// lacked it. With `expect`, bytes that hash to anything else are refused (and not
    /// stored).
    pub fn put(&self, from: &mut dyn Read, expect: Option<&Digest>) -> Result<(Digest, u64, bool), OciError> {
        let dir = self.root.join("blobs/sha256");
        let io = |step: &'static str| {
            let path = dir.clone();
            move |source| OciError::Store { step, path, source }
        };
        std::fs::create_dir_all(&dir).map_err(io("creating the blob directory"))?;
        let mut tmp = tempfile::NamedTempFile::new_in(&dir).map_err(io("creating a blob"))?;
        let (digest, len) = copy_hashed(from, tmp.as_file_mut()).map_err(io("writing a blob"))?;
        if let Some(want) = expect.filter(|want| **want != digest) {
            return Err(OciError::DigestMismatch { want: want.to_string(), got: digest.to_string() });
        }
        let new = !self.has(&digest);
        if new {
            tmp.as_file().sync_all().map_err(io("syncing a blob"))?;
            tmp.persist(self.path(&digest)).map_err(|e| OciError::Store {
                step: "placing a blob",
                path: dir.clone(),
                source: e.error,
            })?;
        }
        Ok((digest, len, new))
    }

    /// Stores `bytes`; returns their digest.
    pub fn put_bytes(&self, bytes: &[u8]) -> Result<Digest, OciError> {
        Ok(self.put(&mut &bytes[..], None)?.0)
    }

    /// Opens the blob `digest`.
    pub fn open(&self, digest: &Digest) -> Result<std::fs::File, OciError> {
        std::fs::File::open(self.path(digest)).map_err(|source| OciError::MissingBlob {
            digest: digest.to_string(),
            store: self.root.clone(),
            source,
        })
    }

    /// Reads the JSON blob `digest` (at most [`MAX_JSON`] bytes) as `T`.
    pub fn read_json<T: serde::de::DeserializeOwned>(
        &self,
        digest: &Digest,
        what: &'static str,
    ) -> Result<T, OciError> {
        let mut text = Vec::new();
        self.open(digest)?.take(MAX_JSON + 1).read_to_end(&mut text).map_err(|source| OciError::Store {
            step: "reading a blob",
            path: self.path(digest),
            source,
        })?;
        parse_json(&text, what)
    }
}

/// `bytes` as `T`, refusing documents over [`MAX_JSON`].
pub fn parse_json<T: serde::de::DeserializeOwned>(bytes: &[u8], what: &'static str) -> Result<T, OciError> {
    if bytes.len() as u64 > MAX_JSON {
        return Err(OciError::Invalid(format!("the {what} is over {MAX_JSON} bytes")));
    }
    serde_json::from_slice(bytes).map_err(|e| OciError::Invalid(format!("the {what} is not valid: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blobs_are_named_by_their_digest_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let store = BlobStore::new(dir.path());
        let d = store.put_bytes(b"layer").unwrap();
        assert_eq!(std::fs::read(store.path(&d)).unwrap(), b"layer");
        // The same bytes again: stored once.
        assert_eq!(store.put_bytes(b"layer").unwrap(), d);
        let wrong = Digest::of(b"other");
        let e = store.put(&mut &b"layer!"[..], Some(&wrong)).unwrap_err().to_string();
        assert!(e.contains("does not match"), "{e}");
        let names: Vec<_> = std::fs::read_dir(dir.path().join("blobs/sha256")).unwrap().flatten().collect();
        assert_eq!(names.len(), 1, "a refused blob left a file behind");
    }
}
