//! What every handler shares: where sandboxes and snapshots live, the state database,
//! the spawner, metrics, and the branch concurrency limit.

use crate::db::{Db, SandboxRow, SnapshotRow};
use crate::error::ApiError;
use crate::metrics::{Gauges, Metrics};
use crate::spawner::Spawner;
use forkvm_sandbox::{Registry, SandboxRecord};
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
    pub db: Mutex<Db>,
    /// `None` only in handler tests that never spawn.
    pub spawner: Option<Arc<Spawner>>,
    pub metrics: Metrics,
    pub branch_slots: Arc<Semaphore>,
    pub branch_cap: usize,
    /// Tags of branches being taken now (a second branch to the same tag is a 409).
    pub branch_tags: Mutex<HashSet<String>>,
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
        AppState(Arc::new(Inner {
            registry,
            store,
            db: Mutex::new(db),
            spawner: spawner.map(Arc::new),
            metrics: Metrics::default(),
            branch_slots: Arc::new(Semaphore::new(branch_cap)),
            branch_cap,
            branch_tags: Mutex::new(HashSet::new()),
        }))
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

    /// The database row of sandbox `id`, if the daemon knows it.
    pub fn sandbox_row(&self, id: &str) -> Option<SandboxRow> {
        self.db().sandboxes().ok()?.into_iter().find(|r| r.id == id)
    }

    pub fn snapshot_rows(&self) -> Vec<SnapshotRow> {
        self.db().snapshots().unwrap_or_default()
    }

    /// Notes an API call on sandbox `id`.
    pub fn touch(&self, id: &str) {
        let _ = self.db().touch(id, now_unix());
    }
}

pub fn now_unix() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Where a sandbox came from, as its database row records it.
#[derive(Debug, Clone, Default)]
pub struct Origin {
    pub template: Option<String>,
    pub snapshot_tag: Option<String>,
    pub forked_from: Option<String>,
    pub memory_limit_bytes: Option<u64>,
}

impl Origin {
    /// The origin a running sandbox's record names.
    pub fn of(r: &SandboxRecord) -> Origin {
        Origin {
            template: r.template.clone(),
            snapshot_tag: r.source_tag.clone(),
            forked_from: r.forked_from.clone(),
            memory_limit_bytes: r.memory_limit_bytes,
        }
    }
}

/// A new database row: sandbox `id` in `state`, made by call `op`, last active now.
pub fn new_row(id: &str, state: &str, op: &str, origin: &Origin, created_at_unix: u64) -> SandboxRow {
    SandboxRow {
        id: id.to_string(),
        state: state.to_string(),
        op: Some(op.to_string()),
        pid: None,
        template: origin.template.clone(),
        snapshot_tag: origin.snapshot_tag.clone(),
        forked_from: origin.forked_from.clone(),
        memory_limit_mib: origin.memory_limit_bytes.map(|b| b >> 20),
        created_at_unix,
        last_active_unix: now_unix(),
        branch_count: 0,
        last_branch_tag: None,
    }
}
