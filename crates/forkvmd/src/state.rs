//! What every handler shares: where sandboxes and snapshots live, the cache of assembled
//! chain images, the state database, the spawner, metrics, the branch concurrency
//! limit, and the disk snapshots' locks.

use crate::db::{Db, SnapshotRow};
use crate::disk::DiskSnapshots;
use crate::error::ApiError;
use crate::lifecycle::Lifecycle;
use crate::metrics::{Gauges, Metrics};
use crate::spawner::Spawner;
use forkvm_sandbox::registry::{Origin, SandboxRow};
use forkvm_sandbox::{Registry, SandboxRecord};
use forkvm_snapshot::chain::AssembledCache;
use forkvm_snapshot::Store;
use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::Semaphore;

/// Default number of BRANCH calls at once (forkd's default).
pub const DEFAULT_BRANCH_CONCURRENCY: usize = 4;

#[derive(Debug)]
pub struct Inner {
    pub registry: Registry,
    pub store: Store,
    /// Assembled memory images of chunked snapshots: evicted when a snapshot is deleted,
    /// filled by compaction. The daemon's is the one spawns use
    /// ([`forkvm_sandbox::source::assembled_cache`]); tests give their own.
    pub cache: AssembledCache,
    pub db: Mutex<Db>,
    /// `None` only in handler tests that never spawn.
    pub spawner: Option<Arc<Spawner>>,
    pub metrics: Metrics,
    pub branch_slots: Arc<Semaphore>,
    pub branch_cap: usize,
    /// Tags of snapshots being made now by branches and compactions (a second call making
    /// the same tag is a 409); see [`AppState::claim_tag`].
    pub branch_tags: Mutex<HashSet<String>>,
    /// Disk snapshots: per-sandbox locks, last attempts, retention ([`crate::disk`]).
    pub disk: DiskSnapshots,
    /// Idle pause, TTL, activity ([`crate::lifecycle`]).
    pub lifecycle: Lifecycle,
    /// Which pack signers an upload must be signed by, and the key downloads are signed
    /// with ([`AppState::set_pack_policy`]).
    pub packs: Mutex<Arc<PackPolicy>>,
    /// Where exposed ports have origins of their own (`--ports-domain`;
    /// [`forkvm_api::ports::DEFAULT_PORTS_DOMAIN`] unless set).
    pub ports_domain: std::sync::OnceLock<String>,
    /// The remote `/v1/remote*` pushes to and pulls from (`--remote`, else `--replicate`).
    pub remote: std::sync::OnceLock<Arc<forkvm_sandbox::replication::Replication>>,
}

/// The daemon's pack signing and trust (`--pack-signing-key`, `--trust-pack-key`).
#[derive(Debug, Clone, Default)]
pub struct PackPolicy {
    pub trust: forkvm_snapshot::pack_archive::PackTrust,
    pub key: Option<ed25519_dalek::SigningKey>,
}

#[derive(Debug, Clone)]
pub struct AppState(pub Arc<Inner>);

impl std::ops::Deref for AppState {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}

impl AppState {
    pub fn new(registry: Registry, store: Store, db: Db, spawner: Option<Spawner>, branch_cap: usize) -> AppState {
        let cache = forkvm_sandbox::source::assembled_cache();
        AppState::with_cache(registry, store, cache, db, spawner, branch_cap)
    }

    /// [`AppState::new`] with the assembled-image cache at `cache` (tests: not the user's).
    pub fn with_cache(
        registry: Registry,
        store: Store,
        cache: AssembledCache,
        db: Db,
        spawner: Option<Spawner>,
        branch_cap: usize,
    ) -> AppState {
        // A sandbox whose VMM died has its disk writes salvaged into its vault.
        let registry = registry.salvaging_into(store.root());
        AppState(Arc::new(Inner {
            registry,
            store,
            cache,
            db: Mutex::new(db),
            spawner: spawner.map(Arc::new),
            metrics: Metrics::default(),
            branch_slots: Arc::new(Semaphore::new(branch_cap)),
            branch_cap,
            branch_tags: Mutex::new(HashSet::new()),
            disk: DiskSnapshots::default(),
            lifecycle: Lifecycle::default(),
            packs: Mutex::new(Arc::new(PackPolicy::default())),
            ports_domain: std::sync::OnceLock::new(),
            remote: std::sync::OnceLock::new(),
        }))
    }

    /// Sets the ports domain (once, before serving); false if it was set already.
    pub fn set_ports_domain(&self, domain: &str) -> bool {
        self.ports_domain.set(domain.to_string()).is_ok()
    }

    /// The domain exposed ports have their own origins under.
    pub fn ports_domain(&self) -> &str {
        self.ports_domain.get().map_or(forkvm_api::ports::DEFAULT_PORTS_DOMAIN, String::as_str)
    }

    pub fn set_pack_policy(&self, policy: PackPolicy) {
        *self.packs.lock().unwrap_or_else(|p| p.into_inner()) = Arc::new(policy);
    }

    pub fn pack_policy(&self) -> Arc<PackPolicy> {
        self.packs.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn db(&self) -> MutexGuard<'_, Db> {
        self.db.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs blocking work (agent and VMM calls, file system) off the async threads.
    pub async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(AppState) -> Result<T, ApiError> + Send + 'static,
    ) -> Result<T, ApiError> {
        let me = self.clone();
        tokio::task::spawn_blocking(move || f(me))
            .await
            .map_err(|e| ApiError::internal(format!("a worker thread failed: {e}")))?
    }

    pub fn gauges(&self) -> Gauges {
        Gauges {
            sandboxes_active: self.registry.list().len(),
            snapshots: self.store.list().len(),
            branches_in_flight: self.branch_cap - self.branch_slots.available_permits(),
            branch_concurrency_cap: self.branch_cap,
        }
    }

    /// Sandbox `id`'s registry row, if it has one.
    pub fn sandbox_row(&self, id: &str) -> Option<SandboxRow> {
        self.registry.row(id)
    }

    /// Sandbox `id`'s registry row, or the API's 404.
    pub fn known_sandbox(&self, id: &str) -> Result<SandboxRow, ApiError> {
        self.sandbox_row(id).ok_or_else(|| ApiError::not_found(format!("sandbox {id:?} not found")))
    }

    /// Records new sandboxes `ids` as `starting` for call `op`, before any process
    /// exists (one transaction): the daemon owns them until they run, so if it dies
    /// meanwhile the next start (or sweep) finds them abandoned.
    pub fn begin_sandboxes(&self, ids: &[String], op: &str, origin: &Origin) -> Result<(), ApiError> {
        let records = ids
            .iter()
            .map(|id| self.registry.new_record(id, origin.clone()))
            .collect::<Result<Vec<SandboxRecord>, _>>()?;
        self.registry.begin(&records.iter().collect::<Vec<_>>(), Some(op))?;
        Ok(())
    }

    pub fn snapshot_rows(&self) -> Vec<SnapshotRow> {
        self.db().snapshots().unwrap_or_default()
    }

    /// Reserves `tag` for a snapshot this call is about to make (branch, compaction), so a
    /// concurrent call making the same tag is refused before either writes. `None` when
    /// another call holds it; the claim ends when the returned value is dropped.
    pub fn claim_tag(&self, tag: &str) -> Option<TagClaim> {
        let fresh = self.branch_tags.lock().unwrap_or_else(|p| p.into_inner()).insert(tag.to_string());
        fresh.then(|| TagClaim { s: self.clone(), tag: tag.to_string() })
    }

    /// Notes an API call on sandbox `id`.
    pub fn touch(&self, id: &str) {
        let _ = self.registry.touch(id, forkvm_sandbox::registry::now_unix_ms());
    }
}

/// A tag reserved by [`AppState::claim_tag`], released on drop however the call ends.
#[derive(Debug)]
pub struct TagClaim {
    s: AppState,
    tag: String,
}

impl TagClaim {
    pub fn tag(&self) -> &str {
        &self.tag
    }
}

impl Drop for TagClaim {
    fn drop(&mut self) {
        self.s.branch_tags.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.tag);
    }
}

pub fn now_unix() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}
