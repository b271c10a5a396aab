//! The data plane front (`--e2b-sandbox`): one address for every sandbox and port, as
//! E2B's edge proxy. A request names its sandbox and port by the `E2b-Sandbox-Id` and
//! `E2b-Sandbox-Port` headers (what the SDKs send with `E2B_SANDBOX_URL`), or by a Host
//! `<port>-<id>.<domain>` under the configured domain. Then:
//!
//! - an unknown, paused, killed or expired sandbox is `502 The sandbox was not found`
//!   (the SDKs read that as "not running");
//! - every request but envd's `GET /health` needs the sandbox's `X-Access-Token`
//!   (compared in constant time), or on another port than envd's the same secret as
//!   `E2B-Traffic-Access-Token` (the create reply's `trafficAccessToken`), else 401;
//! - port 49983 is envd, served here ([`super::envd`]); any other port is the guest's
//!   own, reached over the sandbox's network like an exposed port, bodies streamed (a
//!   code-interpreter cell gets the sandbox's envs first, [`super::code_envs`]).
//!
//! Under a domain, `Host: api.<domain>` is E2B's control plane, answered here too: the
//! SDKs then reach everything at port 443 of one address, as at E2B.

use super::control::{seen, Seen};
use super::records::{self, E2bSandbox};
use super::{E2b, ENVD_PORT};
use crate::port_proxy::HOP_BY_HOP;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use subtle::ConstantTimeEq;

/// The front's router: every path goes through [`route`], but `api.<domain>`'s to the
/// control plane's router.
pub fn router(e2b: E2b) -> Router {
    use tower::ServiceExt;
    // Bodies stream through (uploads of any size): no limit of axum's on top.
    let front = Router::new().fallback(route).layer(axum::extract::DefaultBodyLimit::disable()).with_state(e2b.clone());
    let Some(domain) = e2b.config.domain.clone() else { return front };
    let control = super::control::router(e2b);
    Router::new().fallback_service(tower::service_fn(move |req: Request| {
        let to = if is_api_host(req.headers(), &domain) { control.clone() } else { front.clone() };
        to.oneshot(req)
    }))
}

/// Whether a request's Host is `api.<domain>` (with any port).
fn is_api_host(headers: &HeaderMap, domain: &str) -> bool {
    label_under(headers, domain) == Some("api")
}

/// The part of a request's Host before `.<domain>`, without a port: `49983-<id>` or `api`.
fn label_under<'h>(headers: &'h HeaderMap, domain: &str) -> Option<&'h str> {
    let host = headers.get("host").and_then(|v| v.to_str().ok()).map(str::trim)?;
    let host = host.rsplit_once(':').filter(|(_, p)| p.chars().all(|c| c.is_ascii_digit())).map_or(host, |(h, _)| h);
    host.strip_suffix(domain)?.strip_suffix('.')
}

/// E2B's answer for a sandbox that is not running (its proxy's exact message).
pub fn not_found(id: &str) -> Response {
    let body = serde_json::json!({ "sandboxId": id, "message": "The sandbox was not found", "code": 502 });
    (StatusCode::BAD_GATEWAY, axum::Json(body)).into_response()
}

/// An error as envd and E2B's proxy write them: `{"code": <status>, "message": ...}`.
pub(crate) fn plain_error(status: StatusCode, message: impl Into<String>) -> Response {
    let body = serde_json::json!({ "code": status.as_u16(), "message": message.into() });
    (status, axum::Json(body)).into_response()
}

/// The sandbox id and port a request is for.
fn target(headers: &HeaderMap, domain: Option<&str>) -> Option<(String, u16)> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    if let Some(id) = text("e2b-sandbox-id") {
        let port = match text("e2b-sandbox-port") {
            Some(p) => p.parse().ok()?,
            None => ENVD_PORT,
        };
        return Some((id.to_string(), port));
    }
    let (port, id) = label_under(headers, domain?)?.split_once('-')?;
    Some((id.to_string(), port.parse().ok()?))
}

/// A plausible sandbox id (forkvm's are lowercase hex): anything else is not looked up.
fn plausible_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
}

/// Whether the request carries the sandbox's token: `X-Access-Token` (envd's header), or
/// for another port `E2B-Traffic-Access-Token`, which E2B's SDKs send instead on their
/// code interpreter's context calls (the create reply's `trafficAccessToken` is the same
/// secret: no port of a sandbox is public).
fn token_matches(rec: &E2bSandbox, headers: &HeaderMap, port: u16) -> bool {
    let matches = |name: &str| {
        let given = headers.get(name).map(HeaderValue::as_bytes).unwrap_or_default();
        !given.is_empty() && bool::from(rec.access_token.as_bytes().ct_eq(given))
    };
    matches("x-access-token") || (port != ENVD_PORT && matches("e2b-traffic-access-token"))
}

async fn route(State(e2b): State<E2b>, req: Request) -> Response {
    let Some((id, port)) = target(req.headers(), e2b.config.domain.as_deref()) else {
        return plain_error(
            StatusCode::BAD_REQUEST,
            "name the sandbox with the E2b-Sandbox-Id and E2b-Sandbox-Port headers, or a Host <port>-<id>.<domain>",
        );
    };
    if !plausible_id(&id) {
        return not_found(&id);
    }
    // The database and the registry are read on a blocking thread, as the API's calls do.
    let (e2b_for_lookup, id_for_lookup) = (e2b.clone(), id.clone());
    let found = tokio::task::spawn_blocking(move || {
        let rec = records::get(&e2b_for_lookup.app.db(), &id_for_lookup)?;
        Ok::<_, crate::db::DbError>(rec.filter(|_| seen(&e2b_for_lookup, &id_for_lookup) == Seen::Running))
    })
    .await;
    let rec = match found {
        Ok(Ok(Some(rec))) => rec,
        Ok(Ok(None)) => return not_found(&id),
        Ok(Err(e)) => return plain_error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        Err(e) => return plain_error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let health = port == ENVD_PORT && req.method() == axum::http::Method::GET && req.uri().path() == "/health";
    if !health && !token_matches(&rec, req.headers(), port) {
        return plain_error(StatusCode::UNAUTHORIZED, "missing or wrong X-Access-Token for this sandbox");
    }
    if port == ENVD_PORT {
        return super::envd::serve(e2b, rec, req).await;
    }
    if !rec.env_vars.is_empty() && super::code_envs::applies(port, req.method(), req.uri().path()) {
        return match super::code_envs::with_sandbox_envs(req, &rec.env_vars).await {
            Ok(req) => forward(e2b, id, port, req).await,
            Err(refused) => refused,
        };
    }
    forward(e2b, id, port, req).await
}

/// Headers for the front only, which never reach the guest (nor do the hop-by-hop ones,
/// [`HOP_BY_HOP`], as through an exposed port).
const FRONT_ONLY: &[&str] = &["x-access-token", "e2b-sandbox-id", "e2b-sandbox-port", "e2b-traffic-access-token"];

/// Forwards a request to `port` of the guest, its body and the answer's streamed.
async fn forward(e2b: E2b, id: String, port: u16, req: Request) -> Response {
    let (guest, in_use) = match crate::routes::ports::connect_guest(&e2b.app, &id, port).await {
        Ok(g) => g,
        Err(e) if e.status() == StatusCode::BAD_GATEWAY => {
            // E2B's proxy says so when a port has no listener; the SDKs look for it.
            return plain_error(
                StatusCode::BAD_GATEWAY,
                format!("The sandbox is running but port is not open: {}", e.message),
            );
        }
        Err(e) => return plain_error(e.status(), e.message),
    };
    let (parts, body) = req.into_parts();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str()).to_string();
    let mut upstream = axum::http::Request::new(body);
    *upstream.method_mut() = parts.method;
    *upstream.uri_mut() = match path.parse() {
        Ok(u) => u,
        Err(e) => return plain_error(StatusCode::BAD_REQUEST, format!("path {path:?}: {e}")),
    };
    for (name, value) in &parts.headers {
        if !HOP_BY_HOP.contains(&name.as_str()) && !FRONT_ONLY.contains(&name.as_str()) {
            upstream.headers_mut().append(name.clone(), value.clone());
        }
    }
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(guest)).await {
        Ok(pair) => pair,
        Err(e) => return plain_error(StatusCode::BAD_GATEWAY, format!("port {port} of sandbox {id}: {e}")),
    };
    // The connection ends with the exchange; dropping the client's side (a client gone
    // mid-stream) drops this task's body and so closes the guest's connection too.
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let answer = match sender.send_request(upstream).await {
        Ok(a) => a,
        Err(e) => {
            return plain_error(StatusCode::BAD_GATEWAY, format!("port {port} of sandbox {id} did not answer: {e}"))
        }
    };
    let (parts, body) = answer.into_parts();
    let body = body.map_frame(move |f| {
        let _ = &in_use;
        f
    });
    let mut resp = Response::new(Body::new(body));
    *resp.status_mut() = parts.status;
    for (name, value) in &parts.headers {
        if !HOP_BY_HOP.contains(&name.as_str()) {
            resp.headers_mut().append(name.clone(), value.clone());
        }
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_host_is_the_control_plane_under_the_domain_only() {
        let h = |host: &str| headers(&[("host", host)]);
        assert!(is_api_host(&h("api.sb.test"), "sb.test"));
        assert!(is_api_host(&h("api.sb.test:443"), "sb.test"));
        for other in ["49983-abc.sb.test", "api.sb.test.evil", "xapi.sb.test", "api.other.test", "sb.test"] {
            assert!(!is_api_host(&h(other), "sb.test"), "{other}");
        }
        assert!(!is_api_host(&HeaderMap::new(), "sb.test"));
    }
    use crate::test_util::headers;

    #[test]
    fn a_request_names_its_sandbox_by_headers_or_host() {
        let h = headers(&[("e2b-sandbox-id", "abc123"), ("e2b-sandbox-port", "49999"), ("host", "localhost:3001")]);
        assert_eq!(target(&h, Some("sb.test")), Some(("abc123".into(), 49999)));
        let h = headers(&[("e2b-sandbox-id", "abc123")]);
        assert_eq!(target(&h, None), Some(("abc123".into(), ENVD_PORT)));
        assert_eq!(target(&headers(&[("e2b-sandbox-id", "a"), ("e2b-sandbox-port", "x")]), None), None);
        let h = headers(&[("host", "49983-abc123.sb.test:8443")]);
        assert_eq!(target(&h, Some("sb.test")), Some(("abc123".into(), 49983)));
        assert_eq!(target(&headers(&[("host", "49983-abc123.other.test")]), Some("sb.test")), None);
        assert_eq!(target(&headers(&[("host", "49983-abc123.sb.test")]), None), None);
        assert!(plausible_id("0123abcd"));
        assert!(!plausible_id("../etc") && !plausible_id("") && !plausible_id("ABC"));
    }
}
