//! Listeners and connections: a Unix socket (default, no token: its file mode guards
//! it), and optionally TCP with a bearer token, optionally TLS. Each connection is served
//! by hyper with the request's peer attached for the audit log. SIGTERM or SIGINT stops
//! accepting and drains open requests (at most [`DRAIN`]); sandboxes keep running.

use crate::audit::{AuditLog, Peer};
use crate::auth::Token;
use axum::Router;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::{GracefulConnection, GracefulShutdown, Watcher};
use hyper_util::service::TowerToHyperService;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, UnixListener};
use tower::ServiceExt;

/// How long open requests may finish after a stop signal.
pub const DRAIN: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("another forkvmd is listening on {0}")]
    InUse(PathBuf),
    #[error("listening on {what}: {source}")]
    Listen { what: String, source: std::io::Error },
    #[error("refusing to listen on {0} without a token: a non-loopback address needs --token-file")]
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
}

impl TcpConfig {
    /// Refuses a non-loopback bind without a token.
    pub fn check(&self) -> Result<(), ServeError> {
        if self.token.is_none() && !self.addr.ip().is_loopback() {
            return Err(ServeError::Unauthenticated(self.addr));
        }
        Ok(())
    }
}

/// Binds the Unix socket, replacing a stale socket file but never a live listener.
pub fn bind_unix(path: &Path) -> Result<UnixListener, ServeError> {
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
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(listen)?;
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

/// The router a listener serves: the app, behind the token check (TCP), behind the
/// audit log (so refused requests are logged too).
pub fn wrap(app: Router, token: Option<Token>, audit: Option<AuditLog>) -> Router {
    let mut r = app;
    if let Some(t) = token {
        r = r.layer(axum::middleware::from_fn_with_state(t, crate::auth::require_token));
    }
    if let Some(a) = audit {
        r = r.layer(axum::middleware::from_fn_with_state(a, crate::audit::record));
    }
    r
}

/// One HTTP/1.1 connection over `io`, serving `app` with `peer` attached to each request.
fn http_connection<S>(io: S, app: Router, peer: String) -> impl GracefulConnection<Error = hyper::Error> + Send
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = app.map_request(move |mut req: axum::http::Request<hyper::body::Incoming>| {
        req.extensions_mut().insert(Peer(peer.clone()));
        req
    });
    hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(io), TowerToHyperService::new(svc))
}

fn spawn_connection(conn: impl GracefulConnection<Error = hyper::Error> + Send + 'static, watcher: Watcher) {
    tokio::spawn(async move {
        if let Err(e) = watcher.watch(conn).await {
            tracing::debug!(%e, "connection ended with an error");
        }
    });
}

fn unix_peer(s: &tokio::net::UnixStream) -> String {
    match s.peer_cred() {
        Ok(c) => format!("unix:uid={},pid={}", c.uid(), c.pid().unwrap_or(0)),
        Err(_) => "unix".into(),
    }
}

/// Serves until `stop` resolves, then drains.
pub async fn run(
    unix: Option<(UnixListener, Router)>,
    tcp: Option<(TcpListener, Router, Option<tokio_rustls::TlsAcceptor>)>,
    stop: impl std::future::Future<Output = ()>,
) {
    let graceful = GracefulShutdown::new();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => break,
            Some(accepted) = async { match &unix { Some((l, _)) => Some(l.accept().await), None => None } } => {
                if let (Ok((stream, _)), Some((_, app))) = (accepted, &unix) {
                    let peer = unix_peer(&stream);
                    spawn_connection(http_connection(stream, app.clone(), peer), graceful.watcher());
                }
            }
            Some(accepted) = async { match &tcp { Some((l, _, _)) => Some(l.accept().await), None => None } } => {
                if let (Ok((stream, addr)), Some((_, app, tls))) = (accepted, &tcp) {
                    let (app, watcher) = (app.clone(), graceful.watcher());
                    match tls.clone() {
                        None => spawn_connection(http_connection(stream, app, addr.to_string()), watcher),
                        // The handshake runs in the connection's own task, not the accept loop.
                        Some(acceptor) => {
                            tokio::spawn(async move {
                                match acceptor.accept(stream).await {
                                    Ok(tls) => spawn_connection(http_connection(tls, app, format!("tls:{addr}")), watcher),
                                    Err(e) => tracing::debug!(%addr, %e, "TLS handshake failed"),
                                }
                            });
                        }
                    }
                }
            }
        }
    }
    tracing::info!("stopping: draining open requests");
    if tokio::time::timeout(DRAIN, graceful.shutdown()).await.is_err() {
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
