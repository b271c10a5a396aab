//! Starting the daemon: check the configuration, take the state directory's lock, fork
//! the spawner while still single-threaded, open the database and audit log, reconcile,
//! then start the runtime, the disk snapshot schedule, the lifecycle tick and the sweep
//! of stopped sandboxes (`sweeper.rs`), and serve until SIGTERM/SIGINT.

use crate::audit::AuditLog;
use crate::db::Db;
use crate::disk::DiskSnapshotConfig;
use crate::gate::Gate;
use crate::lifecycle::LifecycleConfig;
use crate::reconcile::reconcile;
use crate::serve::{bind_unix, tls_acceptor, wrap, ConnLimits, ServeError, TcpConfig, TcpServe, UnixPeers, UnixServe};
use crate::spawner::Spawner;
use crate::state::AppState;
use forkvm_sandbox::Registry;
use forkvm_snapshot::Store;
use std::os::fd::AsRawFd;
use std::path::PathBuf;

#[derive(Debug, Clone)]
pub struct DaemonConfig {
    pub registry: Registry,
    pub store: Store,
    /// The Unix socket (always served).
    pub socket: PathBuf,
    pub tcp: Option<TcpConfig>,
    /// Database, audit log and lock.
    pub state_dir: PathBuf,
    pub branch_concurrency: usize,
    /// The disk snapshot schedule and retention.
    pub disk_snapshots: DiskSnapshotConfig,
    /// Idle pause and the default TTL.
    pub lifecycle: LifecycleConfig,
    /// Header timeout, TLS handshake deadline, connection cap.
    pub limits: ConnLimits,
    /// Origins whose browser requests are allowed (none by default).
    pub allowed_origins: Vec<String>,
    /// A group whose members may use the Unix socket besides the daemon's user.
    pub socket_group: Option<u32>,
    /// Pack signing (downloads) and trust (uploads).
    pub packs: crate::state::PackPolicy,
    /// The `forkvm` binary, executed again as the spawner (`forkvm __spawner`).
    pub spawner_exe: PathBuf,
    /// The domain exposed ports have origins of their own under (`{port}-{id}.<it>`).
    pub ports_domain: String,
    /// The E2B face's listeners and settings (off unless given).
    pub e2b: crate::e2b::E2bConfig,
    /// Serve the web console (`/ui/`) on the TCP listener.
    pub console: bool,
    /// Where every sandbox's disk snapshots are shipped after they are taken (off unless given).
    pub replication: Option<std::sync::Arc<forkvm_sandbox::replication::Replication>>,
    /// The remote of `/v1/remote*` (push, pull, collection); off unless given.
    pub remote: Option<std::sync::Arc<forkvm_sandbox::replication::Replication>>,
}

impl DaemonConfig {
    /// The default socket: `<run root>/forkvmd.sock`.
    pub fn default_socket(registry: &Registry) -> PathBuf {
        registry.root().join(forkvm_api::paths::SOCKET_NAME)
    }
    /// The default state directory: `<store root>/forkvmd`.
    pub fn default_state_dir(store: &Store) -> PathBuf {
        store.root().join("forkvmd")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("--branch-concurrency must be at least 1")]
    ZeroConcurrency,
    #[error("state directory {path}: {source}")]
    StateDir { path: PathBuf, source: std::io::Error },
    #[error("another forkvmd uses the state directory {0} (its lock is held)")]
    Locked(PathBuf),
    #[error("starting the spawner process: {0}")]
    Spawner(std::io::Error),
    #[error(transparent)]
    Db(#[from] crate::db::DbError),
    #[error("audit log {path}: {source}")]
    Audit { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Serve(#[from] ServeError),
    #[error("starting the async runtime: {0}")]
    Runtime(std::io::Error),
}

/// Runs the daemon until a stop signal.
pub fn run(mut cfg: DaemonConfig) -> Result<(), DaemonError> {
    if cfg.branch_concurrency == 0 {
        return Err(DaemonError::ZeroConcurrency);
    }
    let (tls, tcp_token) = match &cfg.tcp {
        Some(t) => (t.tls.as_ref().map(|(c, k)| tls_acceptor(c, k)).transpose()?, Some(t.token()?)),
        None => (None, None),
    };
    let dir_err = |source| DaemonError::StateDir { path: cfg.state_dir.clone(), source };
    std::fs::create_dir_all(&cfg.state_dir).map_err(dir_err)?;
    private_dirs(&cfg).map_err(dir_err)?;
    let lock_path = cfg.state_dir.join("forkvmd.lock");
    let lock =
        std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&lock_path).map_err(dir_err)?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(DaemonError::Locked(cfg.state_dir.clone()));
    }
    crate::own_cgroup::join(forkvm_vmm::host::cgroup::Service::Daemon);
    // A new process from our binary: it holds none of our memory (the token and keys
    // loaded above) and inherits none of our descriptors (the lock among them).
    let spawner = Spawner::start(&cfg.spawner_exe, &cfg.registry, &cfg.store).map_err(DaemonError::Spawner)?;
    let db = Db::open(&cfg.state_dir.join("state.db"))?;
    let audit_path = cfg.state_dir.join("audit.log");
    let audit = AuditLog::open(&audit_path).map_err(|source| DaemonError::Audit { path: audit_path, source })?;
    let state = AppState::new(cfg.registry.clone(), cfg.store.clone(), db, Some(spawner), cfg.branch_concurrency);
    state.disk.set_retention(cfg.disk_snapshots.retention);
    state.disk.set_replication(cfg.replication.clone());
    if let Some(remote) = cfg.remote.clone() {
        let _ = state.remote.set(remote);
    }
    state.lifecycle.set_config(cfg.lifecycle);
    state.set_pack_policy(std::mem::take(&mut cfg.packs));
    state.set_ports_domain(&cfg.ports_domain);
    let (reconciled, watch) = reconcile(&state);
    tracing::info!(?reconciled, "reconciled state with running sandboxes and the store");
    println!("forkvmd reconciled {}", serde_json::to_string(&reconciled).unwrap_or_default());

    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(DaemonError::Runtime)?;
    runtime.block_on(async move {
        for (op, tag) in watch {
            tokio::spawn(crate::routes::branch::watch_writing(state.clone(), op, tag));
        }
        let app = crate::app(state.clone());
        let unix = bind_unix(&cfg.socket, cfg.socket_group)?;
        println!("forkvmd listening on unix:{}", cfg.socket.display());
        let tcp = match &cfg.tcp {
            Some(t) => {
                let l = tokio::net::TcpListener::bind(t.addr)
                    .await
                    .map_err(|source| ServeError::Listen { what: t.addr.to_string(), source })?;
                let scheme = if tls.is_some() { "https" } else { "http" };
                println!("forkvmd listening on {scheme}://{}", l.local_addr().unwrap_or(t.addr));
                let token = tcp_token.clone().ok_or(ServeError::Unauthenticated(t.addr))?;
                let mut gate = Gate::tcp(token, &cfg.allowed_origins, &t.allowed_hosts, Some(audit.clone()))
                    .with_ports_domain(&cfg.ports_domain);
                let mut tcp_app = app.clone();
                if cfg.console {
                    gate = gate.with_console();
                    tcp_app = tcp_app.merge(crate::ui::router());
                    println!("forkvmd console on {scheme}://{}/ui/", l.local_addr().unwrap_or(t.addr));
                }
                Some(TcpServe { listener: l, app: wrap(tcp_app, gate, Some(audit.clone())), tls })
            }
            None => None,
        };
        crate::e2b::start(state.clone(), cfg.e2b.clone(), cfg.limits).await?;
        use std::io::Write;
        let _ = std::io::stdout().flush();
        tokio::spawn(reopen_on_hangup(audit.clone()));
        match cfg.disk_snapshots.interval {
            Some(every) => {
                tracing::info!(?every, retention = ?cfg.disk_snapshots.retention, "disk snapshots scheduled");
                tokio::spawn(crate::disk::schedule(state.clone(), every, Some(audit.clone())));
            }
            None => tracing::info!("scheduled disk snapshots are off (--disk-snapshot-interval 0)"),
        }
        tracing::info!(idle_pause = ?cfg.lifecycle.idle_pause, default_ttl = ?cfg.lifecycle.default_ttl, "lifecycle");
        tokio::spawn(crate::lifecycle::schedule(state.clone(), Some(audit.clone())));
        tokio::spawn(crate::sweeper::schedule(state.clone()));
        tokio::spawn(crate::checkpoints::schedule(state.clone()));
        let unix = UnixServe {
            listener: unix,
            app: wrap(
                app,
                Gate::unix(&cfg.allowed_origins, Some(audit.clone())).with_ports_domain(&cfg.ports_domain),
                Some(audit.clone()),
            ),
            peers: UnixPeers::this_user(cfg.socket_group),
        };
        crate::serve::run(Some(unix), tcp, cfg.limits, Some(audit), crate::serve::stop_signal()).await;
        let _ = std::fs::remove_file(&cfg.socket);
        Ok::<(), DaemonError>(())
    })?;
    drop(lock);
    Ok(())
}

/// The state directory, the store and the run root are the daemon's user's alone (0700);
/// the database, audit log and lock files in the state directory 0600 (files created
/// before this daemon set its umask may be wider). A shared directory (sticky, like
/// `/tmp`) or one another user owns is left as it is.
fn private_dirs(cfg: &DaemonConfig) -> std::io::Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let mode = |p: &std::path::Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m));
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    for dir in [cfg.state_dir.as_path(), cfg.store.root(), cfg.registry.root()] {
        std::fs::create_dir_all(dir)?;
        let meta = std::fs::metadata(dir)?;
        if meta.uid() == me && meta.mode() & 0o1000 == 0 {
            mode(dir, 0o700)?;
        }
    }
    for entry in std::fs::read_dir(&cfg.state_dir)?.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_file()) {
            mode(&entry.path(), 0o600)?;
        }
    }
    Ok(())
}

async fn reopen_on_hangup(audit: AuditLog) {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut hup) = signal(SignalKind::hangup()) else { return };
    while hup.recv().await.is_some() {
        if let Err(e) = audit.reopen() {
            tracing::warn!(path = %audit.path().display(), %e, "reopening the audit log");
        }
    }
}
