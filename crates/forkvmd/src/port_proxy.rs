//! The proxy of exposed ports: `/v1/sandboxes/{id}/ports/{port}/<path>` is the guest's
//! `http://<its address>:{port}/<path>`, any method, bodies streamed both ways (never
//! held whole), upgrades (WebSocket) carried through as raw streams. So is any path of
//! a request to the port's own origin, `Host: {port}-{id}.<ports domain>`
//! ([`own_origin`], ahead of the router): there a browser keeps the port's cookies and
//! storage apart from every other port's and from the daemon's.
//!
//! **Who may pass** ([`crate::port_auth`]). Not the API's token: the port's own
//! (`X-Forkvm-Port-Token`, or once as `?forkvm_token=`, which a browser trades for a
//! cookie scoped to this port's path by a redirect that also takes the token out of its
//! address bar; for a port bound to a key, `Authorization: DPoP` with a proof). Each
//! sandbox and port has its own token, a fork's child included, so a parent's token is
//! refused by its child's URL (403). The gate lets these paths through without the API's token
//! ([`forkvm_api::ports::port_proxy_target`] decides, for the gate and here alike).
//!
//! **Whose answer.** The daemon's own answers (401, 403, 404, 502 before the guest
//! answered) carry `X-Forkvm-Error`; a guest's never do (it is taken off them).
//!
//! **What the guest sees.** The request as sent, minus hop-by-hop headers and the
//! token (header, query parameter and cookie), plus `X-Forwarded-Prefix` (where its
//! root is served). One connection to the guest per request: nothing is pooled, so a
//! fork's child never receives a request on a connection its parent opened.

use crate::error::ApiError;
use crate::port_auth::{authorize, cookie_pairs, Refusal, TokenFrom};
use crate::routes::ports::{asks_upgrade, connect_guest};
use crate::state::AppState;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use forkvm_api::ports::{
    port_target, PortTarget, PORT_TOKEN_COOKIE, PORT_TOKEN_HEADER, PORT_TOKEN_QUERY, PROXY_ERROR_HEADER,
};
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use std::time::Duration;

/// How long the guest may take to answer a request's headers.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(600);

/// Headers of one hop only (RFC 9110 §7.6.1), never passed on; `Connection` and
/// `Upgrade` are put back for an upgrade.
pub(crate) const HOP_BY_HOP: &[&str] =
    &["connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade"];

/// The query without the token parameter (every other pair kept as sent).
fn query_without_token(query: Option<&str>) -> Option<String> {
    let kept: Vec<&str> = query?
        .split('&')
        .filter(|pair| pair.split('=').next() != Some(PORT_TOKEN_QUERY))
        .filter(|pair| !pair.is_empty())
        .collect();
    (!kept.is_empty()).then(|| kept.join("&"))
}

/// The `Cookie` header without the token's cookies (`None`: nothing left).
fn cookies_without_token(headers: &HeaderMap) -> Option<HeaderValue> {
    let kept: Vec<String> =
        cookie_pairs(headers).filter(|(k, _)| *k != PORT_TOKEN_COOKIE).map(|(k, v)| format!("{k}={v}")).collect();
    (!kept.is_empty()).then(|| HeaderValue::from_str(&kept.join("; ")).ok()).flatten()
}

/// The headers the guest gets: hop-by-hop ones and the token's gone (with `dpop`, the
/// `Authorization` and `DPoP` headers that carried it), the upgrade kept.
fn guest_headers(from: &HeaderMap, prefix: &str, upgrade: bool, dpop: bool) -> HeaderMap {
    let mut out = HeaderMap::with_capacity(from.len() + 1);
    let listed_in_connection: Vec<String> = from
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_ascii_lowercase())
        .collect();
    for (name, value) in from {
        let n = name.as_str();
        let credential = n == PORT_TOKEN_HEADER || n == "dpop" || (dpop && n == "authorization");
        if HOP_BY_HOP.contains(&n) || credential || n == "cookie" || listed_in_connection.iter().any(|c| c == n) {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    if let Some(c) = cookies_without_token(from) {
        out.insert(header::COOKIE, c);
    }
    if upgrade {
        out.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        if let Some(u) = from.get(header::UPGRADE) {
            out.insert(header::UPGRADE, u.clone());
        }
    }
    // At the port's own origin the guest's root is the origin's: no prefix to tell.
    let prefix = prefix.trim_end_matches('/');
    if let Some(p) = Some(prefix).filter(|p| !p.is_empty()).and_then(|p| HeaderValue::from_str(p).ok()) {
        out.insert(HeaderName::from_static("x-forwarded-prefix"), p);
    }
    out
}

/// The exposed port a request (its headers and path) goes to under `ports_domain`, if
/// any: [`port_target`] on its `Host`, the one decision the gate, the router and the
/// proxy share.
pub fn request_target<'a>(headers: &'a HeaderMap, path: &'a str, ports_domain: &str) -> Option<PortTarget<'a>> {
    port_target(headers.get(header::HOST).and_then(|v| v.to_str().ok()), path, ports_domain)
}

/// Middleware ahead of the router: a request to a port's own origin goes to the proxy
/// whatever its path; any other request goes on to the API's routes.
pub async fn own_origin(State(s): State<AppState>, req: Request, next: axum::middleware::Next) -> Response {
    if request_target(req.headers(), req.uri().path(), s.ports_domain()).is_some_and(|t| t.own_origin) {
        return proxy(State(s), req).await;
    }
    next.run(req).await
}

/// Answers with the guest's answer, or with the daemon's error before one.
pub async fn proxy(State(s): State<AppState>, req: Request) -> Response {
    let status_of = |r: &Response| r.status().as_u16().to_string();
    let resp = match forward(&s, req).await {
        Ok(r) => r,
        Err(refusal) => {
            let mut r = refusal.into_response();
            r.headers_mut().insert(HeaderName::from_static(PROXY_ERROR_HEADER), HeaderValue::from_static("true"));
            r
        }
    };
    s.metrics.inc("forkvm_port_requests_total", &[("status", &status_of(&resp))]);
    resp
}

async fn forward(s: &AppState, mut req: Request) -> Result<Response, Refusal> {
    let path = req.uri().path().to_string();
    let Some(target) = request_target(req.headers(), &path, s.ports_domain()) else {
        return Err(ApiError::not_found(format!("no route {} {path}", req.method())).into());
    };
    let (id, port, guest_path, prefix) =
        (target.id.to_string(), target.port, target.guest_path.to_string(), target.prefix());
    let query = req.uri().query().map(str::to_string);
    let id_for_lookup = id.clone();
    let exposed = s
        .blocking(move |s| {
            s.known_sandbox(&id_for_lookup)?;
            s.registry
                .exposed_port(&id_for_lookup, port)?
                .ok_or_else(|| ApiError::not_found(format!("port {port} of sandbox {id_for_lookup:?} is not exposed")))
        })
        .await?;
    let from = authorize(&exposed, &id, req.method().as_str(), req.headers(), &path, query.as_deref())?;
    let upgrade = asks_upgrade(&req, None);
    if from == TokenFrom::Query && req.method() == axum::http::Method::GET && !upgrade {
        return Ok(trade_for_cookie(&exposed.token, &path, query_without_token(query.as_deref()), &prefix));
    }
    let client_upgrade = upgrade.then(|| req.extensions_mut().remove::<hyper::upgrade::OnUpgrade>()).flatten();
    let (guest, in_use) = connect_guest(s, &id, port).await?;
    let target = match query_without_token(query.as_deref()) {
        Some(q) => format!("{guest_path}?{q}"),
        None => guest_path,
    };
    let (parts, body) = req.into_parts();
    let mut upstream = axum::http::Request::new(body);
    *upstream.method_mut() = parts.method;
    *upstream.uri_mut() =
        target.parse::<Uri>().map_err(|e| ApiError::bad_request(format!("the guest's path {target:?}: {e}")))?;
    *upstream.headers_mut() = guest_headers(&parts.headers, &prefix, client_upgrade.is_some(), from == TokenFrom::Dpop);
    let bad_gateway = |what: String| ApiError::new(forkvm_api::ErrorCode::BadGateway, what);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(guest))
        .await
        .map_err(|e| bad_gateway(format!("port {port} of sandbox {id:?}: {e}")))?;
    let conn_id = id.clone();
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(sandbox_id = %conn_id, port, %e, "a connection to an exposed port ended with an error");
        }
    });
    let mut answer = match tokio::time::timeout(ANSWER_TIMEOUT, sender.send_request(upstream)).await {
        Ok(Ok(a)) => a,
        Ok(Err(e)) => return Err(bad_gateway(format!("port {port} of sandbox {id:?} did not answer: {e}")).into()),
        Err(_) => {
            return Err(bad_gateway(format!(
                "port {port} of sandbox {id:?} did not answer within {}s",
                ANSWER_TIMEOUT.as_secs()
            ))
            .into())
        }
    };
    if answer.status() == StatusCode::SWITCHING_PROTOCOLS {
        let Some(client_upgrade) = client_upgrade else {
            return Err(bad_gateway(format!("port {port} of sandbox {id:?} switched protocols unasked")).into());
        };
        let guest_upgrade = hyper::upgrade::on(&mut answer);
        // Its `Connection` and `Upgrade` stay (they are the switch); the daemon's mark goes.
        let mut headers = answer.headers().clone();
        headers.remove(PROXY_ERROR_HEADER);
        tokio::spawn(async move {
            let _in_use = in_use;
            match tokio::try_join!(client_upgrade, guest_upgrade) {
                Ok((client, guest)) => {
                    let (mut client, mut guest) = (TokioIo::new(client), TokioIo::new(guest));
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut guest).await;
                }
                Err(e) => tracing::debug!(sandbox_id = %id, port, %e, "an upgrade through an exposed port failed"),
            }
        });
        let mut resp = Response::new(Body::empty());
        *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        *resp.headers_mut() = headers;
        return Ok(resp);
    }
    let (parts, body) = answer.into_parts();
    // The sandbox counts as used until the answer's body is done.
    let body = body.map_frame(move |f| {
        let _ = &in_use;
        f
    });
    let mut resp = Response::new(Body::new(body));
    *resp.status_mut() = parts.status;
    *resp.headers_mut() = guest_headers_back(&parts.headers);
    Ok(resp)
}

/// The guest's answer's headers, hop-by-hop ones gone, and the daemon's mark (a guest
/// cannot pass its answers off as the daemon's).
fn guest_headers_back(from: &HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::with_capacity(from.len());
    for (name, value) in from {
        if !HOP_BY_HOP.contains(&name.as_str()) && name.as_str() != PROXY_ERROR_HEADER {
            out.append(name.clone(), value.clone());
        }
    }
    out
}

/// A redirect to the same address without the token, setting it as a cookie scoped
/// to this port's path (HttpOnly: the guest's pages cannot read it).
fn trade_for_cookie(token: &str, path: &str, query: Option<String>, prefix: &str) -> Response {
    let location = match query {
        Some(q) => format!("{path}?{q}"),
        None => path.to_string(),
    };
    let cookie = format!("{PORT_TOKEN_COOKIE}={token}; Path={prefix}; HttpOnly; SameSite=Lax");
    let mut resp = Response::new(Body::empty());
    *resp.status_mut() = StatusCode::SEE_OTHER;
    if let (Ok(l), Ok(c)) = (HeaderValue::from_str(&location), HeaderValue::from_str(&cookie)) {
        resp.headers_mut().insert(header::LOCATION, l);
        resp.headers_mut().insert(header::SET_COOKIE, c);
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::headers;

    #[test]
    fn the_guest_sees_neither_the_token_nor_hop_by_hop_headers() {
        assert_eq!(query_without_token(Some("a=1&forkvm_token=x&b=%20")), Some("a=1&b=%20".into()));
        assert_eq!(query_without_token(Some("forkvm_token=x")), None);
        let h = headers(&[
            ("x-forkvm-port-token", "fvp_h"),
            ("cookie", "a=1; forkvm_port_token=fvp_c"),
            ("connection", "keep-alive, x-private"),
            ("x-private", "hop"),
            ("keep-alive", "5"),
            ("transfer-encoding", "chunked"),
            ("accept", "text/html"),
            ("authorization", "Bearer app-own"),
        ]);
        let out = guest_headers(&h, "/v1/sandboxes/a/ports/80/", false, false);
        let names: Vec<&str> = out.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["accept", "authorization", "cookie", "x-forwarded-prefix"]);
        assert_eq!(out["cookie"], "a=1");
        assert_eq!(out["x-forwarded-prefix"], "/v1/sandboxes/a/ports/80");
        let up = guest_headers(&headers(&[("connection", "Upgrade"), ("upgrade", "websocket")]), "/p/", true, false);
        let bound = headers(&[("authorization", "DPoP fvp_t"), ("dpop", "proof"), ("accept", "*/*")]);
        let names: Vec<String> = guest_headers(&bound, "/p/", false, true).keys().map(|k| k.to_string()).collect();
        assert_eq!(names, ["accept", "x-forwarded-prefix"]);
        // At a port's own origin there is no prefix to tell.
        assert!(guest_headers(&headers(&[("accept", "*/*")]), "/", false, false).get("x-forwarded-prefix").is_none());
        assert_eq!((up["connection"].to_str().unwrap(), up["upgrade"].to_str().unwrap()), ("upgrade", "websocket"));
    }

    #[test]
    fn at_a_ports_own_origin_the_cookie_is_that_origins() {
        let r = trade_for_cookie("fvp_t", "/app", None, "/");
        assert_eq!(r.headers()["location"], "/app");
        assert_eq!(r.headers()["set-cookie"], "forkvm_port_token=fvp_t; Path=/; HttpOnly; SameSite=Lax");
    }

    #[test]
    fn a_token_in_the_address_becomes_a_cookie_of_this_port_only() {
        let r =
            trade_for_cookie("fvp_t", "/v1/sandboxes/a/ports/80/x", Some("y=1".into()), "/v1/sandboxes/a/ports/80/");
        assert_eq!(r.status(), StatusCode::SEE_OTHER);
        assert_eq!(r.headers()["location"], "/v1/sandboxes/a/ports/80/x?y=1");
        assert_eq!(
            r.headers()["set-cookie"],
            "forkvm_port_token=fvp_t; Path=/v1/sandboxes/a/ports/80/; HttpOnly; SameSite=Lax"
        );
    }
}
