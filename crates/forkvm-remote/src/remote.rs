//! A remote: an object store (S3, GCS, Azure or a local directory) and a prefix in it,
//! with blocking calls over the `object_store` crate's async ones.
//!
//! Retries and backoff are the library's (bounded here: a few tries within a minute);
//! every call names its step and object when it fails for good.

use crate::RemoteError;
use forkvm_snapshot::ChunkId;
use futures::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{BackoffConfig, ClientConfigKey, ObjectStore, ObjectStoreExt, PutPayload, RetryConfig};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

/// Largest object read back (a sealed block is at most a little over [`crate::BLOCK_BYTES`];
/// a manifest of a big chain a few MiB).
pub const MAX_OBJECT_BYTES: u64 = 64 << 20;

/// One object of a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub name: String,
    pub size: u64,
    /// When the store last wrote it (its clock, not this host's).
    pub modified: std::time::SystemTime,
}

/// One remote, opened.
pub struct Remote {
    url: String,
    store: Arc<dyn ObjectStore>,
    prefix: ObjectPath,
    rt: tokio::runtime::Runtime,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote").field("url", &self.url).finish()
    }
}

/// Object-store calls give up after this many retries…
const MAX_RETRIES: usize = 6;
/// …or this long after the first try.
const RETRY_TIMEOUT: Duration = Duration::from_secs(60);
/// One request's limit (a stalled server is retried, not waited for).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

fn retry() -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            base: 2.0,
        },
        max_retries: MAX_RETRIES,
        retry_timeout: RETRY_TIMEOUT,
    }
}

impl Remote {
    /// Opens `url`: `s3://bucket/prefix` (credentials, region and endpoint from the
    /// usual `AWS_*` environment), `gs://bucket/prefix` (`GOOGLE_*`),
    /// `az://container/prefix` (`AZURE_*`), or `file:///absolute/dir` (created).
    pub fn open(url: &str) -> Result<Remote, RemoteError> {
        let bad = |reason: String| RemoteError::BadUrl { url: url.into(), reason };
        let parsed = url::Url::parse(url).map_err(|e| bad(e.to_string()))?;
        // The request timeout as a config key: client options would replace the ones the
        // environment set (AWS_ALLOW_HTTP, proxies).
        let timeout = format!("{}s", REQUEST_TIMEOUT.as_secs());
        let store: Arc<dyn ObjectStore> = match parsed.scheme() {
            "s3" | "s3a" => Arc::new(
                object_store::aws::AmazonS3Builder::from_env()
                    .with_url(url)
                    .with_retry(retry())
                    .with_config(object_store::aws::AmazonS3ConfigKey::Client(ClientConfigKey::Timeout), &timeout)
                    .build()
                    .map_err(|e| bad(e.to_string()))?,
            ),
            "gs" => Arc::new(
                object_store::gcp::GoogleCloudStorageBuilder::from_env()
                    .with_url(url)
                    .with_retry(retry())
                    .with_config(object_store::gcp::GoogleConfigKey::Client(ClientConfigKey::Timeout), &timeout)
                    .build()
                    .map_err(|e| bad(e.to_string()))?,
            ),
            "az" | "azure" | "abfs" | "abfss" => Arc::new(
                object_store::azure::MicrosoftAzureBuilder::from_env()
                    .with_url(url)
                    .with_retry(retry())
                    .with_config(object_store::azure::AzureConfigKey::Client(ClientConfigKey::Timeout), &timeout)
                    .build()
                    .map_err(|e| bad(e.to_string()))?,
            ),
            "file" => {
                let dir = parsed.to_file_path().map_err(|_| bad("not an absolute local path".into()))?;
                std::fs::create_dir_all(&dir).map_err(RemoteError::io("creating the remote directory", &dir))?;
                Arc::new(
                    object_store::local::LocalFileSystem::new_with_prefix(&dir)
                        .map_err(|e| bad(e.to_string()))?
                        .with_automatic_cleanup(true),
                )
            }
            other => return Err(bad(format!("scheme {other:?} is not served (s3://, gs://, az://, file://)"))),
        };
        let prefix = match parsed.scheme() {
            "file" => ObjectPath::default(),
            _ => ObjectPath::parse(parsed.path().trim_matches('/')).map_err(|e| bad(e.to_string()))?,
        };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("forkvm-remote")
            .enable_all()
            .build()
            .map_err(RemoteError::io("starting the remote's runtime", "tokio"))?;
        Ok(Remote { url: url.trim_end_matches('/').into(), store, prefix, rt })
    }

    /// The URL it was opened with.
    pub fn url(&self) -> &str {
        &self.url
    }

    fn path(&self, rel: &str) -> ObjectPath {
        rel.split('/').fold(self.prefix.clone(), |p, part| p.clone().join(part))
    }

    fn err(&self, step: &'static str, object: &str) -> impl FnOnce(object_store::Error) -> RemoteError + '_ {
        let object = object.to_string();
        move |source| RemoteError::Store { url: self.url.clone(), step, object, source: Box::new(source) }
    }

    /// Stores `bytes` at `rel` (replacing what is there).
    pub fn put(&self, rel: &str, bytes: Vec<u8>) -> Result<(), RemoteError> {
        let path = self.path(rel);
        self.rt.block_on(self.store.put(&path, PutPayload::from(bytes))).map_err(self.err("uploading", rel))?;
        Ok(())
    }

    /// The object at `rel`, or `None` when there is none; refused past
    /// [`MAX_OBJECT_BYTES`] before its body is read.
    pub fn get(&self, rel: &str) -> Result<Option<Vec<u8>>, RemoteError> {
        let path = self.path(rel);
        let got = self.rt.block_on(async {
            let r = match self.store.get(&path).await {
                Ok(r) => r,
                Err(object_store::Error::NotFound { .. }) => return Ok(None),
                Err(e) => return Err(e),
            };
            if r.meta.size > MAX_OBJECT_BYTES {
                return Ok(Some(Err(r.meta.size)));
            }
            r.bytes().await.map(|b| Some(Ok(b.to_vec())))
        });
        match got.map_err(self.err("downloading", rel))? {
            None => Ok(None),
            Some(Ok(bytes)) => Ok(Some(bytes)),
            Some(Err(size)) => Err(RemoteError::Refused {
                url: self.url.clone(),
                object: rel.into(),
                reason: format!("{size} bytes (at most {MAX_OBJECT_BYTES})"),
            }),
        }
    }

    /// Whether an object is at `rel`.
    pub fn exists(&self, rel: &str) -> Result<bool, RemoteError> {
        let path = self.path(rel);
        match self.rt.block_on(self.store.head(&path)) {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(self.err("looking up", rel)(e)),
        }
    }

    /// Removes the object at `rel` (none there is not an error).
    pub fn delete(&self, rel: &str) -> Result<(), RemoteError> {
        let path = self.path(rel);
        match self.rt.block_on(self.store.delete(&path)) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.err("deleting", rel)(e)),
        }
    }

    /// The names of the objects directly under `dir` (e.g. `chunks`, `tags`).
    pub fn list(&self, dir: &str) -> Result<Vec<String>, RemoteError> {
        Ok(self.listing(dir)?.into_iter().map(|l| l.name).collect())
    }

    /// The objects directly under `dir` with their sizes and the store's modification times.
    pub fn listing(&self, dir: &str) -> Result<Vec<Listed>, RemoteError> {
        let path = self.path(dir);
        let metas: Vec<_> = self.rt.block_on(self.store.list(Some(&path)).collect());
        let mut out = Vec::with_capacity(metas.len());
        for m in metas {
            let m = m.map_err(self.err("listing", dir))?;
            let Some(name) = m.location.filename() else { continue };
            let ms = u64::try_from(m.last_modified.timestamp_millis()).unwrap_or(0);
            out.push(Listed {
                name: name.to_string(),
                size: m.size,
                modified: std::time::UNIX_EPOCH + Duration::from_millis(ms),
            });
        }
        Ok(out)
    }

    /// The paths (relative to `dir`, `/`-separated) of every object under `dir`, at any depth.
    pub fn list_paths(&self, dir: &str) -> Result<Vec<String>, RemoteError> {
        let path = self.path(dir);
        let metas: Vec<_> = self.rt.block_on(self.store.list(Some(&path)).collect());
        let mut out = Vec::with_capacity(metas.len());
        for m in metas {
            let m = m.map_err(self.err("listing", dir))?;
            let rel =
                m.location.prefix_match(&path).map(|parts| parts.map(|p| p.as_ref().to_string()).collect::<Vec<_>>());
            if let Some(rel) = rel {
                out.push(rel.join("/"));
            }
        }
        Ok(out)
    }

    /// The blocks the remote holds (names that are not block names are ignored).
    pub fn chunks(&self) -> Result<HashSet<ChunkId>, RemoteError> {
        Ok(self.list("chunks")?.iter().filter_map(|n| ChunkId::from_hex(n).ok()).collect())
    }

    /// The tags pushed to the remote.
    pub fn tags(&self) -> Result<Vec<String>, RemoteError> {
        let mut tags: Vec<String> =
            self.list("tags")?.into_iter().filter(|t| forkvm_snapshot::validate_tag(t).is_ok()).collect();
        tags.sort();
        Ok(tags)
    }
}

/// `chunks/<hex>`: where block `id` lives on a remote.
pub fn chunk_object(id: &ChunkId) -> String {
    format!("chunks/{}", id.to_hex())
}

/// `tags/<tag>`: where a tag's manifest lives on a remote.
pub fn tag_object(tag: &str) -> String {
    format!("tags/{tag}")
}
