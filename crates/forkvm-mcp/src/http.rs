//! The streamable HTTP transport: `POST/GET/DELETE /mcp` on a TCP address, every
//! request carrying `Authorization: Bearer <token>` (compared in constant time). Without
//! the token anyone who can reach the port could drive the daemon with the MCP server's
//! own credentials, so there is no tokenless mode. The token is the daemon's kind
//! (`forkvmd::auth::Token`): the same rules, the same constant-time check. Host headers other than loopback and
//! the bound address are refused (DNS rebinding), and so are browser `Origin`s.

use crate::{Daemon, ForkvmMcp};
use axum::extract::Request;
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use forkvmd::auth::Token;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// The path the MCP endpoint is served at.
pub const MCP_PATH: &str = "/mcp";

/// Why the HTTP server could not run.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("binding {addr}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error("serving MCP over HTTP on {addr}")]
    Serve { addr: SocketAddr, source: std::io::Error },
}

async fn require_token(token: Token, req: Request, next: Next) -> Response {
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if token.matches(presented.as_bytes()) {
        return next.run(req).await;
    }
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        "this MCP endpoint needs Authorization: Bearer <token> (the token forkvm mcp was started with)\n",
    )
        .into_response()
}

/// Serves MCP on `addr` until `stop` is cancelled. `ready` gets the bound address
/// (useful with port 0) before the first request is accepted.
pub async fn serve(
    daemon: Daemon,
    addr: SocketAddr,
    token: Token,
    stop: CancellationToken,
    ready: impl FnOnce(SocketAddr),
) -> Result<(), HttpError> {
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|source| HttpError::Bind { addr, source })?;
    let bound = listener.local_addr().map_err(|source| HttpError::Bind { addr, source })?;
    let mut hosts: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
    hosts.push(bound.ip().to_string());
    hosts.push(bound.to_string());
    let config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(hosts)
        .enforce_origin_validation()
        .with_cancellation_token(stop.child_token());
    let service: StreamableHttpService<ForkvmMcp, LocalSessionManager> = StreamableHttpService::new(
        move || Ok(ForkvmMcp::new(daemon.clone())),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let app = axum::Router::new()
        .nest_service(MCP_PATH, service)
        .layer(axum::middleware::from_fn(move |req: Request, next: Next| require_token(token.clone(), req, next)));
    ready(bound);
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { stop.cancelled_owned().await })
        .await
        .map_err(|source| HttpError::Serve { addr: bound, source })
}
