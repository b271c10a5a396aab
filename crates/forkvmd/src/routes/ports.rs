//! Exposed ports (`/v1/sandboxes/{id}/ports`: list, expose, unexpose) and raw TCP to a
//! guest's port (`GET /v1/sandboxes/{id}/tcp/{port}`, an HTTP upgrade: what
//! `forkvm port-forward` rides on). The proxy that serves exposed ports is
//! [`crate::port_proxy`].

use crate::error::ApiError;
use crate::extract::{JsonBody, Param};
use crate::lifecycle::{use_sandbox, InUse};
use crate::state::AppState;
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use forkvm_api::{ExposeRequest, ExposedPort};
use forkvm_sandbox::state::SandboxState;
use std::time::Duration;

/// How long a connection to a guest's port may take to open.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The protocol name `GET .../tcp/{port}` upgrades to.
pub const TCP_UPGRADE: &str = "tcp";

/// A guest port from a path segment, or a 400.
fn guest_port(raw: &str) -> Result<u16, ApiError> {
    forkvm_api::ports::parse_port(raw)
        .ok_or_else(|| ApiError::bad_request(format!("invalid port {raw:?}: a guest port is 1 to 65535")))
}

/// `GET /v1/sandboxes/{id}/ports`.
pub async fn list(State(s): State<AppState>, Param(id): Param) -> Result<Json<Vec<ExposedPort>>, ApiError> {
    s.blocking(move |s| {
        s.known_sandbox(&id)?;
        Ok(Json(s.registry.exposed(&id)?.iter().map(|p| p.to_api(&id, s.ports_domain())).collect()))
    })
    .await
}

/// `POST /v1/sandboxes/{id}/ports`: the port's path and token (the ones it has if it
/// was exposed already), bound to a key if `dpop_jkt` names one. A running sandbox
/// must have a network.
pub async fn expose(
    State(s): State<AppState>,
    Param(id): Param,
    JsonBody(req): JsonBody<ExposeRequest>,
) -> Result<Json<ExposedPort>, ApiError> {
    if let Some(jkt) = req.dpop_jkt.as_deref().filter(|j| !crate::dpop::is_thumbprint(j)) {
        return Err(ApiError::bad_request(format!(
            "dpop_jkt {jkt:?} is not a JWK SHA-256 thumbprint (RFC 7638: 43 base64url characters)"
        )));
    }
    s.blocking(move |s| {
        let row = s.known_sandbox(&id)?;
        if row.state != SandboxState::Archived && row.state != SandboxState::Starting {
            let r = crate::routes::sandboxes::running(&s, &id)?;
            forkvm_sandbox::network::connect::sandbox_namespace(&id, r.pid)?;
        }
        Ok(Json(s.registry.expose(&id, req.port, req.dpop_jkt.as_deref())?.to_api(&id, s.ports_domain())))
    })
    .await
}

/// `DELETE /v1/sandboxes/{id}/ports/{port}`: its token stops working at once
/// (connections already open through it stay until they close).
pub async fn unexpose(
    State(s): State<AppState>,
    Path((id, port)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let port = guest_port(&port)?;
    s.blocking(move |s| {
        s.known_sandbox(&id)?;
        match s.registry.unexpose(&id, port)? {
            true => Ok(StatusCode::NO_CONTENT),
            false => Err(ApiError::not_found(format!("port {port} of sandbox {id:?} is not exposed"))),
        }
    })
    .await
}

/// A TCP connection to `port` of running sandbox `id` (resumed if paused), with the
/// guard that keeps the sandbox from idle pause while it is open.
pub async fn connect_guest(s: &AppState, id: &str, port: u16) -> Result<(tokio::net::TcpStream, InUse), ApiError> {
    let id_owned = id.to_string();
    let (socket, in_use) = s
        .blocking(move |s| {
            let (r, in_use) = use_sandbox(&s, &id_owned)?;
            let socket = forkvm_sandbox::network::connect::guest_socket(&id_owned, r.pid)?;
            Ok((socket, in_use))
        })
        .await?;
    let socket = tokio::net::TcpSocket::from_std_stream(socket);
    let unreachable = |why: String| ApiError::new(forkvm_api::ErrorCode::BadGateway, why);
    let addr = forkvm_sandbox::network::connect::guest_addr(port);
    match tokio::time::timeout(CONNECT_TIMEOUT, socket.connect(addr)).await {
        Ok(Ok(stream)) => {
            let _ = stream.set_nodelay(true);
            Ok((stream, in_use))
        }
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            Err(unreachable(format!("nothing listens on port {port} in sandbox {id:?}")))
        }
        Ok(Err(e)) => Err(unreachable(format!("connecting to port {port} in sandbox {id:?}: {e}"))),
        Err(_) => Err(unreachable(format!(
            "port {port} in sandbox {id:?} did not answer within {}s",
            CONNECT_TIMEOUT.as_secs()
        ))),
    }
}

/// Whether `req` asks to upgrade to `protocol` (`Connection: upgrade`, `Upgrade: <it>`).
pub fn asks_upgrade(req: &Request, protocol: Option<&str>) -> bool {
    let connection_upgrade = req
        .headers()
        .get_all(header::CONNECTION)
        .iter()
        .any(|v| v.to_str().is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case("upgrade"))));
    let upgrade = req.headers().get(header::UPGRADE).and_then(|v| v.to_str().ok());
    connection_upgrade && upgrade.is_some_and(|u| protocol.is_none_or(|p| u.trim().eq_ignore_ascii_case(p)))
}

/// `GET /v1/sandboxes/{id}/tcp/{port}` with `Connection: upgrade`, `Upgrade: tcp`:
/// answers 101 once the guest's port accepted the connection, then carries bytes both
/// ways until either side closes. An unreachable port is an error answer, not a 101.
pub async fn connect_tcp(
    State(s): State<AppState>,
    Path((id, port)): Path<(String, String)>,
    mut req: Request,
) -> Result<Response, ApiError> {
    let port = guest_port(&port)?;
    let sandbox = id.clone();
    s.blocking(move |s| s.known_sandbox(&sandbox).map(drop)).await?;
    if !asks_upgrade(&req, Some(TCP_UPGRADE)) {
        return Err(ApiError::bad_request(format!(
            "a raw TCP stream needs the headers Connection: upgrade and Upgrade: {TCP_UPGRADE}"
        )));
    }
    let Some(on_upgrade) = req.extensions_mut().remove::<hyper::upgrade::OnUpgrade>() else {
        return Err(ApiError::internal("this connection cannot be upgraded"));
    };
    let (mut guest, in_use) = connect_guest(&s, &id, port).await?;
    s.metrics.inc("forkvm_port_forwards_total", &[]);
    tokio::spawn(async move {
        let _in_use = in_use;
        match on_upgrade.await {
            Ok(upgraded) => {
                let mut client = hyper_util::rt::TokioIo::new(upgraded);
                if let Err(e) = tokio::io::copy_bidirectional(&mut client, &mut guest).await {
                    tracing::debug!(sandbox_id = %id, port, %e, "a forwarded TCP stream ended with an error");
                }
            }
            Err(e) => tracing::debug!(sandbox_id = %id, port, %e, "the client's upgrade failed"),
        }
    });
    let mut resp = Response::new(Body::empty());
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    resp.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    resp.headers_mut().insert(header::UPGRADE, HeaderValue::from_static(TCP_UPGRADE));
    Ok(resp.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_in_paths() {
        assert_eq!(guest_port("8000").unwrap(), 8000);
        for bad in ["0", "65536", "+80", "", "8o", "-1"] {
            assert_eq!(guest_port(bad).unwrap_err().status(), StatusCode::BAD_REQUEST, "{bad}");
        }
    }

    #[test]
    fn upgrades_are_told_by_both_headers() {
        let req = |pairs: &[(&str, &str)]| {
            let mut b = axum::http::Request::builder();
            for (k, v) in pairs {
                b = b.header(*k, *v);
            }
            b.body(Body::empty()).unwrap()
        };
        assert!(asks_upgrade(&req(&[("connection", "keep-alive, Upgrade"), ("upgrade", "TCP")]), Some("tcp")));
        assert!(asks_upgrade(&req(&[("connection", "upgrade"), ("upgrade", "websocket")]), None));
        assert!(!asks_upgrade(&req(&[("connection", "upgrade"), ("upgrade", "websocket")]), Some("tcp")));
        assert!(!asks_upgrade(&req(&[("upgrade", "tcp")]), Some("tcp")));
        assert!(!asks_upgrade(&req(&[("connection", "close")]), None));
    }
}
