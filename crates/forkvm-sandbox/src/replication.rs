//! Off-host continuous snapshots of sandboxes (`forkvm daemon --replicate URL`,
//! `forkvm replicate`, `forkvm restore-sandbox`).
//!
//! Why this exists: the vault keeps a sandbox's disk snapshots safe from the sandbox,
//! not from losing the host. A [`Replication`] ships a sandbox's vault to a remote after
//! its disk snapshots (`forkvm_remote::replicate`), pushing the template it runs on first
//! when the remote lacks it, so another host holding the remote key can bring the vault
//! back ([`Replication::restore`], pulling the template too) and boot its newest snapshot
//! as a disk-only fork. The recovery point is the newest replicated disk snapshot: at
//! most one snapshot interval (plus the time to upload it) of disk writes is lost, and the
//! sandbox's memory (its processes) is not carried by them. A branch carries it: the
//! daemon pushes each branch it takes ([`Replication::push_snapshot`]), and another host
//! pulls and forks it.

use crate::disk_snapshots::{keys_dir, owner_path, read_owner, vault_dir};
use forkvm_remote::push::Progress;
use forkvm_remote::replicate::{replicate_vault, restore_vault, ReplicateReport, RestoreReport, VaultFiles};
use forkvm_remote::{BlockCache, PushReport, Remote, RemoteError, RemoteKey};
use forkvm_snapshot::vault::KeyStore;
use forkvm_snapshot::{Store, StoreError};
use std::collections::HashSet;
use std::path::Path;
use std::sync::Mutex;

/// A remote sandboxes are replicated to (or restored from), with its key.
#[derive(Debug)]
pub struct Replication {
    remote: Remote,
    key: RemoteKey,
    /// Templates known to be on the remote already.
    pushed: Mutex<HashSet<String>>,
}

#[derive(Debug, thiserror::Error)]
pub enum ReplicationError {
    #[error(transparent)]
    Remote(#[from] RemoteError),
    #[error("replication: the keys directory: {0}")]
    Keys(#[from] forkvm_snapshot::vault::VaultError),
    #[error("replication: sandbox {id} runs on {tag}, which this host lacks and the remote does not hold either")]
    NoTemplate { id: String, tag: String },
}

impl ReplicationError {
    /// The API's error code.
    pub fn code(&self) -> forkvm_api::ErrorCode {
        match self {
            ReplicationError::Remote(e) => e.code(),
            ReplicationError::NoTemplate { .. } => forkvm_api::ErrorCode::NotFound,
            ReplicationError::Keys(_) => forkvm_api::ErrorCode::Internal,
        }
    }
}

/// The host's cache of remote blocks: `$FORKVM_REMOTE_CACHE`, else `<cache>/remote-blocks`
/// (safe to delete).
pub fn host_block_cache() -> BlockCache {
    let dir = std::env::var_os("FORKVM_REMOTE_CACHE")
        .filter(|d| !d.is_empty())
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| forkvm_image::kernel::cache_dir().join("remote-blocks"));
    BlockCache::configured(&dir)
}

fn vault_files(store: &Store, id: &str) -> VaultFiles {
    VaultFiles { id: id.into(), dir: vault_dir(store, id), owner_json: owner_path(store, id) }
}

impl Replication {
    /// The remote at `url`, sealed with the key at `key_file`.
    pub fn open(url: &str, key_file: &Path) -> Result<Replication, ReplicationError> {
        Ok(Replication {
            remote: Remote::open(url)?,
            key: RemoteKey::load(key_file)?,
            pushed: Mutex::new(HashSet::new()),
        })
    }

    pub fn url(&self) -> &str {
        self.remote.url()
    }

    /// The remote itself (tags, locks, collection).
    pub fn remote(&self) -> &Remote {
        &self.remote
    }

    /// The key its blocks are sealed with.
    pub fn key(&self) -> &RemoteKey {
        &self.key
    }

    /// Ships what the remote lacks of sandbox `id`'s vault (after pushing the template it
    /// runs on, once, if the remote lacks it).
    pub fn replicate(&self, store: &Store, id: &str) -> Result<ReplicateReport, ReplicationError> {
        let owner = read_owner(store, id);
        if let Some(tag) = owner.as_ref().and_then(|o| o.source_tag.clone().or(o.template.clone())) {
            let known = self.pushed.lock().unwrap_or_else(|p| p.into_inner()).contains(&tag);
            if !known && store.lookup(&tag).is_ok() {
                if !self.remote.exists(&forkvm_remote::remote::tag_object(&tag))? {
                    let cache = crate::source::assembled_cache();
                    forkvm_remote::push(store, &cache, &tag, &self.remote, &self.key, &Progress::default())?;
                }
                self.pushed.lock().unwrap_or_else(|p| p.into_inner()).insert(tag);
            }
        }
        let keys = KeyStore::open(&keys_dir())?;
        Ok(replicate_vault(&vault_files(store, id), &keys, &self.remote, &self.key)?)
    }

    /// Pushes snapshot `tag` (a sandbox's branch: memory, disks and the chain under it)
    /// to the remote, only what it lacks; another host pulls and forks it.
    pub fn push_snapshot(&self, store: &Store, tag: &str) -> Result<PushReport, ReplicationError> {
        let cache = crate::source::assembled_cache();
        let report = forkvm_remote::push(store, &cache, tag, &self.remote, &self.key, &Progress::default())?;
        self.pushed.lock().unwrap_or_else(|p| p.into_inner()).insert(tag.into());
        Ok(report)
    }

    /// Brings sandbox `id`'s replicated vault onto this host, and the template it runs on
    /// when this host lacks it; the sandbox can then be booted with `disk-fork`.
    pub fn restore(&self, store: &Store, id: &str, cache: &BlockCache) -> Result<RestoreReport, ReplicationError> {
        let keys = KeyStore::open(&keys_dir())?;
        let report = restore_vault(&vault_files(store, id), &keys, &self.remote, &self.key)?;
        if let Some(tag) = &report.source_tag {
            if matches!(store.lookup(tag), Err(StoreError::NotFound { .. })) {
                match forkvm_remote::pull(store, tag, &self.remote, &self.key, cache, &Progress::default()) {
                    Err(RemoteError::NoTag { .. }) => {
                        return Err(ReplicationError::NoTemplate { id: id.into(), tag: tag.clone() })
                    }
                    other => {
                        other?;
                    }
                }
            }
        }
        Ok(report)
    }
}
