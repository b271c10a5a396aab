//! Listeners and connections: a Unix socket (default, no token: its file mode and a
//! peer-credential check guard it), and optionally TCP, always with a bearer token,
//! optionally TLS. Each connection is served by hyper with the request's peer attached
//! for the audit log, under [`ConnLimits`]: a header timeout, a TLS handshake deadline
//! and a cap on open connections; a failing `accept()` backs off instead of spinning. SIGTERM or SIGINT stops
//! accepting and drains open requests (at most [`DRAIN`]); sandboxes keep running.

use crate::audit::{AuditLog, Peer};
use crate::auth::Token;
use crate::gate::Gate;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tower::ServiceExt;

/// How long open requests may finish after a stop signal.
pub const DRAIN: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("another forkvmd is listening on {0}")]
    InUse(PathBuf),
    #[error("listening on {what}: {source}")]
    Listen { what: String, source: std::io::Error },
    #[error("refusing to listen on {0} without a token: every TCP listener, loopback too, needs --token-file")]
    Unauthenticated(SocketAddr),
    #[error("TLS: {0}")]
    Tls(String),
}

/// TCP listener settings.
#[derive(Debug, Clone)]
pub struct TcpConfig {
    pub addr: SocketAddr,
    pub token: Option<Token>,
    /// PEM certificate chain and private key.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// Host names allowed in `Host` besides IP literals and `localhost`.
    pub allowed_hosts: Vec<String>,
}

impl TcpConfig {
    /// The token every TCP listener needs (loopback too: any local process, and any
    /// web page through the user's browser, can reach loopback).
    pub fn token(&self) -> Result<Token, ServeError> {
        self.token.clone().ok_or(ServeError::Unauthenticated(self.addr))
    }
}

/// Binds the Unix socket, replacing a stale socket file but never a live listener; mode
/// 0600, or 0660 and owned by `group` when one is given.
pub fn bind_unix(path: &Path, group: Option<u32>) -> Result<UnixListener, ServeError> {
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(ServeError::InUse(path.to_path_buf()));
        }
        let _ = std::fs::remove_file(path);
    }
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let listen = |source| ServeError::Listen { what: path.display().to_string(), source };
    let l = UnixListener::bind(path).map_err(listen)?;
    use std::os::unix::fs::PermissionsExt;
    let mode = if group.is_some() { 0o660 } else { 0o600 };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(listen)?;
    if let Some(g) = group {
        std::os::unix::fs::chown(path, None, Some(g)).map_err(listen)?;
    }
    Ok(l)
}

pub fn tls_acceptor(cert: &Path, key: &Path) -> Result<tokio_rustls::TlsAcceptor, ServeError> {
    let read = |p: &Path| std::fs::read(p).map_err(|e| ServeError::Tls(format!("reading {}: {e}", p.display())));
    let certs: Vec<_> = rustls_pemfile::certs(&mut read(cert)?.as_slice())
        .collect::<Result<_, _>>()
        .map_err(|e| ServeError::Tls(format!("parsing {}: {e}", cert.display())))?;
    if certs.is_empty() {
        return Err(ServeError::Tls(format!("{} holds no certificate", cert.display())));
    }
    let key = rustls_pemfile::private_key(&mut read(key)?.as_slice())
        .map_err(|e| ServeError::Tls(format!("parsing {}: {e}", key.display())))?
        .ok_or_else(|| ServeError::Tls(format!("{} holds no private key", key.display())))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ServeError::Tls(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| ServeError::Tls(format!("certificate and key: {e}")))?;
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// The router a listener serves: the app behind the audit log, behind the gate
/// (browser, Host and token checks; see [`crate::gate`]), so only requests that pass the
/// gate get a full audit line.
pub fn wrap(app: Router, gate: Gate, audit: Option<AuditLog>) -> Router {
    let mut r = app;
    if let Some(a) = audit {
        r = r.layer(axum::middleware::from_fn_with_state(a, crate::audit::record));
    }
    r.layer(axum::middleware::from_fn_with_state(gate, crate::gate::check))
}

/// Limits on connections, the same for every listener.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    /// A client must send a request's whole header within this (slowloris).
    pub header_timeout: Duration,
    /// A TLS handshake must finish within this.
    pub handshake_timeout: Duration,
    /// Most connections open at once, over all listeners; more are closed at accept.
    pub max_connections: usize,
}

impl Default for ConnLimits {
    fn default() -> ConnLimits {
        ConnLimits {
            header_timeout: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(10),
            max_connections: 1024,
        }
    }
}

/// Who may connect to the Unix socket: its owner (the daemon's user), root, and members
/// of `group` when one is configured (the socket is then 0660 and that group's).
#[derive(Debug, Clone, Copy)]
pub struct UnixPeers {
    pub owner: u32,
    pub group: Option<u32>,
}

impl UnixPeers {
    /// The daemon's own user, and `group`.
    pub fn this_user(group: Option<u32>) -> UnixPeers {
        // SAFETY: geteuid cannot fail.
        UnixPeers { owner: unsafe { libc::geteuid() }, group }
    }

    fn allows(&self, s: &tokio::net::UnixStream) -> Result<(), PeerRefused> {
        let cred = s.peer_cred().map_err(PeerRefused::Credentials)?;
        if cred.uid() == self.owner || cred.uid() == 0 {
            return Ok(());
        }
        if let Some(g) = self.group {
            if cred.gid() == g || peer_groups(s).contains(&g) {
                return Ok(());
            }
        }
        Err(PeerRefused::Stranger { uid: cred.uid() })
    }
}

/// Why a Unix-socket peer is refused.
#[derive(Debug, thiserror::Error)]
enum PeerRefused {
    #[error("reading the peer's credentials: {0}")]
    Credentials(#[source] std::io::Error),
    #[error("uid {uid} is neither the daemon's user nor in its socket group")]
    Stranger { uid: u32 },
}

/// The peer's supplementary groups (`SO_PEERGROUPS`); empty if they cannot be read.
fn peer_groups(s: &tokio::net::UnixStream) -> Vec<u32> {
    use std::os::fd::AsRawFd;
    let mut groups = vec![0u32; 256];
    let mut len = (groups.len() * 4) as libc::socklen_t;
    // SAFETY: the buffer holds `len` bytes and outlives the call.
    let rc = unsafe {
        libc::getsockopt(s.as_raw_fd(), libc::SOL_SOCKET, libc::SO_PEERGROUPS, groups.as_mut_ptr().cast(), &mut len)
    };
    if rc != 0 {
        return Vec::new();
    }
    groups.truncate(len as usize / 4);
    groups
}

/// Tells open connections to finish their request and close (a stop signal).
type Draining = watch::Receiver<bool>;

/// Serves one HTTP/1.1 connection over `io` (upgrades allowed: WebSocket and raw TCP to
/// a guest's port), with `peer` attached to each request, until it closes; once
/// `draining` turns true, it finishes the request it serves and closes. The permit is
/// held until then, so the drain waits on the permits. An upgraded stream is no longer
/// this connection's: it is cut when the process exits, not drained.
fn spawn_connection<S>(
    io: S,
    app: Router,
    peer: String,
    limits: ConnLimits,
    mut draining: Draining,
    permit: OwnedSemaphorePermit,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = app.map_request(move |mut req: axum::http::Request<hyper::body::Incoming>| {
        req.extensions_mut().insert(Peer(peer.clone()));
        req
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .serve_connection(TokioIo::new(io), TowerToHyperService::new(svc))
        .with_upgrades();
    tokio::spawn(async move {
        let mut conn = std::pin::pin!(conn);
        let stop = async move {
            if draining.wait_for(|d| *d).await.map(|_| ()).is_err() {
                // The server is gone without a drain: serve on until the peer closes.
                std::future::pending::<()>().await
            }
        };
        let ended = tokio::select! {
            ended = conn.as_mut() => ended,
            () = stop => {
                conn.as_mut().graceful_shutdown();
                conn.await
            }
        };
        if let Err(e) = ended {
            tracing::debug!(%e, "connection ended with an error");
        }
        drop(permit);
    });
}

fn unix_peer(s: &tokio::net::UnixStream) -> String {
    match s.peer_cred() {
        Ok(c) => format!("unix:uid={},pid={}", c.uid(), c.pid().unwrap_or(0)),
        Err(_) => "unix".into(),
    }
}

/// The Unix listener: socket, router and who may connect.
#[allow(missing_debug_implementations)]
pub struct UnixServe {
    pub listener: UnixListener,
    pub app: Router,
    pub peers: UnixPeers,
}

/// The TCP listener: socket, router and TLS.
#[allow(missing_debug_implementations)]
pub struct TcpServe {
    pub listener: TcpListener,
    pub app: Router,
    pub tls: Option<tokio_rustls::TlsAcceptor>,
}

/// Sleeps after a failed `accept()` (EMFILE, ENFILE, ENOBUFS...), doubling up to a
/// second, so a full descriptor table does not spin the accept loop.
#[derive(Debug, Default)]
struct AcceptBackoff(Option<Duration>);

impl AcceptBackoff {
    async fn failed(&mut self, what: &str, e: &std::io::Error) {
        let wait = self.0.map_or(Duration::from_millis(10), |d| (d * 2).min(Duration::from_secs(1)));
        self.0 = Some(wait);
        tracing::warn!(%e, ?wait, "{what}: accept failed; backing off");
        tokio::time::sleep(wait).await;
    }
    fn succeeded(&mut self) {
        self.0 = None;
    }
}

/// A permit for one more connection, or `None` (logged) at the cap.
fn connection_permit(slots: &Arc<Semaphore>, peer: &str, audit: Option<&AuditLog>) -> Option<OwnedSemaphorePermit> {
    let permit = slots.clone().try_acquire_owned().ok();
    if permit.is_none() {
        if let Some(a) = audit {
            a.refused(peer, "-", "-", 503, "connection limit reached; connection closed");
        }
    }
    permit
}

/// Serves until `stop` resolves, then drains. `audit` receives refused connections.
pub async fn run(
    unix: Option<UnixServe>,
    tcp: Option<TcpServe>,
    limits: ConnLimits,
    audit: Option<AuditLog>,
    stop: impl std::future::Future<Output = ()>,
) {
    let (drain, draining) = watch::channel(false);
    let max_connections = limits.max_connections.max(1);
    let slots = Arc::new(Semaphore::new(max_connections));
    let (mut unix_backoff, mut tcp_backoff) = (AcceptBackoff::default(), AcceptBackoff::default());
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => break,
            Some(accepted) = async { match &unix { Some(u) => Some(u.listener.accept().await), None => None } } => {
                let Some(u) = &unix else { continue };
                let stream = match accepted {
                    Ok((stream, _)) => { unix_backoff.succeeded(); stream }
                    Err(e) => { unix_backoff.failed("unix socket", &e).await; continue }
                };
                let peer = unix_peer(&stream);
                if let Err(why) = u.peers.allows(&stream) {
                    if let Some(a) = &audit {
                        a.refused(&peer, "-", "-", 403, &why.to_string());
                    }
                    continue;
                }
                let Some(permit) = connection_permit(&slots, &peer, audit.as_ref()) else { continue };
                spawn_connection(stream, u.app.clone(), peer, limits, draining.clone(), permit);
            }
            Some(accepted) = async { match &tcp { Some(t) => Some(t.listener.accept().await), None => None } } => {
                let Some(t) = &tcp else { continue };
                let (stream, addr) = match accepted {
                    Ok(a) => { tcp_backoff.succeeded(); a }
                    Err(e) => { tcp_backoff.failed("tcp", &e).await; continue }
                };
                let Some(permit) = connection_permit(&slots, &addr.to_string(), audit.as_ref()) else { continue };
                let (app, draining) = (t.app.clone(), draining.clone());
                match t.tls.clone() {
                    None => spawn_connection(stream, app, addr.to_string(), limits, draining, permit),
                    // The handshake runs in the connection's own task, not the accept loop,
                    // and must finish within the handshake timeout.
                    Some(acceptor) => {
                        tokio::spawn(async move {
                            match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(stream)).await {
                                Ok(Ok(tls)) => {
                                    spawn_connection(tls, app, format!("tls:{addr}"), limits, draining, permit);
                                }
                                Ok(Err(e)) => tracing::debug!(%addr, %e, "TLS handshake failed"),
                                Err(_) => tracing::debug!(%addr, "TLS handshake timed out"),
                            }
                        });
                    }
                }
            }
        }
    }
    tracing::info!("stopping: draining open requests");
    let _ = drain.send(true);
    let all_closed = slots.acquire_many(max_connections as u32);
    if tokio::time::timeout(DRAIN, all_closed).await.is_err() {
        tracing::warn!("requests still open after {DRAIN:?}; stopping anyway");
    }
}

/// Resolves on SIGTERM or SIGINT.
pub async fn stop_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
