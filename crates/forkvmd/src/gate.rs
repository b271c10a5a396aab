//! The gate every request passes before the API sees it, outermost first:
//!
//! 1. **Browser requests are refused** (403): a page in the user's browser can reach a
//!    loopback listener (CSRF), so a request carrying `Origin` or a cross-site
//!    `Sec-Fetch-Site` is refused unless its origin is configured (`--allow-origin`).
//! 2. **On TCP, `Host` must name this daemon** (403): an IP literal, `localhost`, or a
//!    configured name (`--allow-host`). A rebound DNS name is refused (DNS rebinding).
//! 3. **On TCP, the bearer token** (401), compared in constant time ([`Token::matches`]).
//!
//! Exposed ports' paths (`/v1/sandboxes/{id}/ports/{port}/...`) skip 1 and 3: they are
//! meant for browsers, and their own token guards them (`crate::port_proxy`). Only
//! the guest behind the port answers there, never the API; and a client that sends
//! the API's token there anyway has it taken off before the guest could see it.
//! Requests to a port's own origin (`Host: {port}-{id}.<ports domain>`) skip 1 to 3:
//! their Host names the ports domain the daemon was given, and every path there is
//! the guest's ([`forkvm_api::ports::port_target`] decides, here and in the router).
//!
//! With the web console on ([`Gate::with_console`], TCP listeners only), its assets
//! (`/ui/...`) are public but for the Host check, the page's own requests pass check 1
//! (their `Origin` is the `Host` they are sent to: same-origin, which a cross-site page
//! cannot forge and a rebound name fails at 2), and a WebSocket may carry the token
//! as a subprotocol, `forkvm.bearer.<hex of the token>`, since a browser cannot set
//! `Authorization` on one.
//!
//! Refusals are logged to the audit log at a bounded rate ([`AuditLog::refused`]), so a
//! flood of bad requests cannot grow the log faster than that; only requests that pass
//! the gate get the full audit line.

use crate::audit::{AuditLog, Peer};
use crate::auth::Token;
use crate::error::ApiError;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use forkvm_api::ports::PortTarget;
use std::sync::Arc;

/// What a listener's gate checks.
#[derive(Debug, Clone, Default)]
pub struct Gate {
    /// The bearer token every non-public path needs (TCP listeners).
    pub token: Option<Token>,
    /// Check `Host` (TCP listeners; a Unix socket has no DNS name to rebind).
    pub check_host: bool,
    /// Origins whose browser requests are allowed (exact `scheme://host[:port]`).
    pub allowed_origins: Arc<[String]>,
    /// Host names allowed besides IP literals and `localhost`.
    pub allowed_hosts: Arc<[String]>,
    /// Where refusals are logged (rate-limited).
    pub audit: Option<AuditLog>,
    /// The domain exposed ports have origins of their own under; `None`: the default.
    pub ports_domain: Option<Arc<str>>,
    /// The web console is served here (see the module doc).
    pub console: bool,
}

impl Gate {
    /// The gate of a TCP listener: token, Host and Origin checks.
    pub fn tcp(token: Token, allowed_origins: &[String], allowed_hosts: &[String], audit: Option<AuditLog>) -> Gate {
        Gate {
            token: Some(token),
            check_host: true,
            allowed_origins: allowed_origins.into(),
            allowed_hosts: allowed_hosts.into(),
            audit,
            ports_domain: None,
            console: false,
        }
    }

    /// The gate of the Unix socket: its file mode and peer check stand in for a token;
    /// browser requests are still refused.
    pub fn unix(allowed_origins: &[String], audit: Option<AuditLog>) -> Gate {
        Gate { allowed_origins: allowed_origins.into(), audit, ..Gate::default() }
    }

    /// This gate with exposed ports' own origins under `domain`.
    pub fn with_ports_domain(self, domain: &str) -> Gate {
        Gate { ports_domain: Some(domain.into()), ..self }
    }

    /// This gate with the web console on (its assets public, same-origin requests and a
    /// WebSocket's subprotocol token admitted).
    pub fn with_console(self) -> Gate {
        Gate { console: true, ..self }
    }

    /// Whether a request goes to an exposed port, and which (see the module doc).
    fn port_target<'a>(&self, headers: &'a HeaderMap, path: &'a str) -> Option<PortTarget<'a>> {
        let domain = self.ports_domain.as_deref().unwrap_or(forkvm_api::ports::DEFAULT_PORTS_DOMAIN);
        crate::port_proxy::request_target(headers, path, domain)
    }

    /// Why `headers` are refused, if they are.
    fn refusal(&self, headers: &HeaderMap, path: &str) -> Option<ApiError> {
        let target = self.port_target(headers, path);
        if target.is_some_and(|t| t.own_origin) {
            return None;
        }
        let port_proxy = target.is_some();
        if port_proxy && self.check_host {
            return self.host_refusal(headers).map(|why| ApiError::new(forkvm_api::ErrorCode::Forbidden, why));
        }
        if port_proxy {
            return None;
        }
        if self.console && crate::ui::is_console_path(path) {
            let host = if self.check_host { self.host_refusal(headers) } else { None };
            return host.map(|why| ApiError::new(forkvm_api::ErrorCode::Forbidden, why));
        }
        if let Some(why) = self.browser_refusal(headers) {
            return Some(ApiError::new(forkvm_api::ErrorCode::Forbidden, why));
        }
        if self.check_host {
            if let Some(why) = self.host_refusal(headers) {
                return Some(ApiError::new(forkvm_api::ErrorCode::Forbidden, why));
            }
        }
        let token = self.token.as_ref()?;
        if forkvm_api::routes::is_public(path) {
            return None;
        }
        match headers.get(header::AUTHORIZATION).map(|v| v.as_bytes()) {
            None if self.console => match socket_token(headers) {
                Some(t) if token.matches(&t) => None,
                Some(_) => Some(ApiError::unauthorized("invalid bearer token (WebSocket subprotocol)")),
                None => Some(ApiError::unauthorized("missing bearer token")),
            },
            None => Some(ApiError::unauthorized("missing bearer token")),
            Some(v) => match v.strip_prefix(b"Bearer ") {
                Some(t) if token.matches(t) => None,
                _ => Some(ApiError::unauthorized("invalid bearer token")),
            },
        }
    }

    /// Takes the API's token off a request to an exposed port: a guest must never
    /// learn it (an app's own `Authorization` passes).
    fn keep_token_from_guests(&self, req: &mut Request) {
        let Some(token) = &self.token else { return };
        if self.port_target(req.headers(), req.uri().path()).is_none() {
            return;
        }
        let is_api_token =
            |v: &axum::http::HeaderValue| v.as_bytes().strip_prefix(b"Bearer ").is_some_and(|t| token.matches(t));
        if req.headers().get_all(header::AUTHORIZATION).iter().any(is_api_token) {
            req.headers_mut().remove(header::AUTHORIZATION);
        }
    }

    fn browser_refusal(&self, headers: &HeaderMap) -> Option<String> {
        let origin = headers.get(header::ORIGIN).map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        let fetch_site = headers.get("sec-fetch-site").map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        let from_browser = origin.is_some() || fetch_site.as_deref().is_some_and(|s| s != "none");
        if !from_browser || (self.console && same_origin(headers, origin.as_deref(), fetch_site.as_deref())) {
            return None;
        }
        match origin {
            Some(o) if self.allowed_origins.contains(&o) => None,
            Some(o) => Some(format!(
                "browser requests are refused (Origin: {o}); start the daemon with --allow-origin {o} to allow this origin"
            )),
            None => Some("browser requests are refused (Sec-Fetch-Site without Origin)".into()),
        }
    }

    fn host_refusal(&self, headers: &HeaderMap) -> Option<String> {
        let Some(raw) = headers.get(header::HOST) else {
            return Some("the Host header is missing".into());
        };
        let host = String::from_utf8_lossy(raw.as_bytes()).into_owned();
        if host_is_allowed(&host, &self.allowed_hosts) {
            None
        } else {
            Some(format!(
                "Host {host:?} is not this daemon: use an IP address or localhost, or start the daemon with --allow-host NAME"
            ))
        }
    }
}

/// Whether a browser's request comes from a page of the origin it is sent to: its
/// `Origin`'s host and port are the `Host` it names, or, without `Origin` (a GET of a
/// script or style), the browser marks it `Sec-Fetch-Site: same-origin`.
fn same_origin(headers: &HeaderMap, origin: Option<&str>, fetch_site: Option<&str>) -> bool {
    let Some(origin) = origin else { return fetch_site == Some("same-origin") };
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    let authority = origin.strip_prefix("http://").or_else(|| origin.strip_prefix("https://"));
    matches!((authority, host), (Some(a), Some(h)) if !a.is_empty() && a.eq_ignore_ascii_case(h))
}

/// The token a WebSocket upgrade carries as a subprotocol, `forkvm.bearer.<hex>`.
fn socket_token(headers: &HeaderMap) -> Option<Vec<u8>> {
    let upgrade = headers.get(header::UPGRADE).and_then(|v| v.to_str().ok());
    if !upgrade.is_some_and(|u| u.eq_ignore_ascii_case("websocket")) {
        return None;
    }
    let offered = headers.get_all(header::SEC_WEBSOCKET_PROTOCOL).iter().filter_map(|v| v.to_str().ok());
    let hex = offered.flat_map(|v| v.split(',')).find_map(|p| p.trim().strip_prefix(SOCKET_TOKEN_PREFIX))?;
    decode_hex(hex)
}

/// The subprotocol prefix of a WebSocket's token.
pub const SOCKET_TOKEN_PREFIX: &str = "forkvm.bearer.";

fn decode_hex(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) || hex.len() > 1024 {
        return None;
    }
    let digit = |b: u8| (b as char).to_digit(16);
    hex.as_bytes().chunks(2).map(|p| Some((digit(p[0])? * 16 + digit(p[1])?) as u8)).collect()
}

/// Whether a `Host` header value (`name[:port]`, `[v6]:port`) is an IP literal,
/// `localhost`, or one of `allowed` (case-insensitive).
pub fn host_is_allowed(host: &str, allowed: &[String]) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((v6, after)) if after.is_empty() || after.starts_with(':') => {
                return v6.parse::<std::net::Ipv6Addr>().is_ok();
            }
            _ => return false,
        },
        None => host.rsplit_once(':').map_or(host, |(n, port)| if port.parse::<u16>().is_ok() { n } else { host }),
    };
    name.parse::<std::net::Ipv4Addr>().is_ok()
        || name.eq_ignore_ascii_case("localhost")
        || allowed.iter().any(|a| a.eq_ignore_ascii_case(name))
}

/// Middleware: refuses what the gate refuses (logged at a bounded rate), passes the rest.
pub async fn check(State(gate): State<Gate>, mut req: Request, next: Next) -> Response {
    let Some(err) = gate.refusal(req.headers(), req.uri().path()) else {
        gate.keep_token_from_guests(&mut req);
        return next.run(req).await;
    };
    if let Some(audit) = &gate.audit {
        let peer = req.extensions().get::<Peer>().map(|p| p.0.as_str()).unwrap_or("in-process");
        audit.refused(peer, req.method().as_str(), req.uri().path(), err.status().as_u16(), &err.message);
    }
    err.into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::headers;
    use axum::http::StatusCode;

    #[test]
    fn hosts() {
        let allowed = vec!["forkvm.internal".to_string()];
        for ok in ["127.0.0.1:8889", "127.0.0.1", "[::1]:80", "localhost:1", "LOCALHOST", "forkvm.internal:9"] {
            assert!(host_is_allowed(ok, &allowed), "{ok}");
        }
        for bad in ["evil.example:8889", "evil.example", "[::1", "[zz]:1", "127.0.0.1.evil:1", ""] {
            assert!(!host_is_allowed(bad, &allowed), "{bad}");
        }
    }

    #[test]
    fn browser_requests_are_refused_unless_allowed() {
        let gate = Gate::unix(&["https://ok.example".to_string()], None);
        let refused = gate.refusal(&headers(&[("origin", "https://evil.example")]), "/v1/sandboxes").unwrap();
        assert_eq!(refused.status(), StatusCode::FORBIDDEN);
        assert!(refused.message.contains("--allow-origin https://evil.example"), "{}", refused.message);
        assert!(gate.refusal(&headers(&[("sec-fetch-site", "cross-site")]), "/").is_some());
        assert!(gate.refusal(&headers(&[("origin", "null")]), "/").is_some());
        assert!(gate.refusal(&headers(&[("origin", "https://ok.example")]), "/").is_none());
        assert!(gate.refusal(&headers(&[("sec-fetch-site", "none")]), "/").is_none());
        assert!(gate.refusal(&HeaderMap::new(), "/v1/sandboxes").is_none());
    }

    #[test]
    fn the_api_token_never_reaches_a_guest() {
        let gate = Gate::tcp(Token::new("0123456789abcdef").unwrap(), &[], &[], None);
        let req = |path: &str, auth: &str| {
            axum::http::Request::builder()
                .uri(path)
                .header("authorization", auth)
                .body(axum::body::Body::empty())
                .unwrap()
        };
        let mut r = req("/v1/sandboxes/a1/ports/80/x", "Bearer 0123456789abcdef");
        gate.keep_token_from_guests(&mut r);
        assert!(r.headers().get("authorization").is_none());
        let mut r = req("/v1/sandboxes/a1/ports/80/x", "Bearer the-app-own");
        gate.keep_token_from_guests(&mut r);
        assert_eq!(r.headers()["authorization"], "Bearer the-app-own");
        let mut r = req("/v1/sandboxes", "Bearer 0123456789abcdef");
        gate.keep_token_from_guests(&mut r);
        assert!(r.headers().get("authorization").is_some(), "API requests keep it");
    }

    #[test]
    fn the_console_admits_its_assets_its_own_pages_and_a_socket_token() {
        let token = Token::new("0123456789abcdef+/=").unwrap();
        let off = Gate::tcp(token.clone(), &[], &[], None);
        let on = off.clone().with_console();
        let code =
            |g: &Gate, pairs: &[(&'static str, &str)], path| g.refusal(&headers(pairs), path).map(|e| e.status());
        let typed = [("host", "127.0.0.1:8"), ("sec-fetch-site", "none")];
        assert_eq!(code(&on, &typed, "/ui/"), None, "the page itself needs no token");
        assert_eq!(code(&off, &typed, "/ui/"), Some(StatusCode::UNAUTHORIZED), "off: an API path like any other");
        assert_eq!(code(&on, &[("host", "evil.example:8")], "/ui/"), Some(StatusCode::FORBIDDEN), "rebinding");
        let script = [("host", "127.0.0.1:8"), ("sec-fetch-site", "same-origin")];
        assert_eq!(code(&on, &script, "/ui/app.js"), None);
        // The page's API calls: same origin, with the token.
        let auth = ("authorization", "Bearer 0123456789abcdef+/=");
        let own = [("host", "127.0.0.1:8"), ("origin", "http://127.0.0.1:8"), ("sec-fetch-site", "same-origin"), auth];
        assert_eq!(code(&on, &own, "/v1/lineage"), None);
        assert_eq!(code(&off, &own, "/v1/lineage"), Some(StatusCode::FORBIDDEN), "off: browsers are refused");
        let no_token = [("host", "127.0.0.1:8"), ("origin", "http://127.0.0.1:8")];
        assert_eq!(code(&on, &no_token, "/v1/lineage"), Some(StatusCode::UNAUTHORIZED));
        // Another site's page, even with the token (it cannot have it, but still).
        let cross = [("host", "127.0.0.1:8"), ("origin", "http://127.0.0.1:9"), auth];
        assert_eq!(code(&on, &cross, "/v1/lineage"), Some(StatusCode::FORBIDDEN));
        let cross =
            [("host", "127.0.0.1:8"), ("origin", "https://evil.example"), ("sec-fetch-site", "cross-site"), auth];
        assert_eq!(code(&on, &cross, "/v1/lineage"), Some(StatusCode::FORBIDDEN));
        let sneaky = [("host", "127.0.0.1:8"), ("sec-fetch-site", "cross-site"), auth];
        assert_eq!(code(&on, &sneaky, "/v1/lineage"), Some(StatusCode::FORBIDDEN));
        // A WebSocket: the token as a subprotocol, hex of its bytes.
        let hex: String = b"0123456789abcdef+/=".iter().map(|b| format!("{b:02x}")).collect();
        let offered = format!("forkvm, forkvm.bearer.{hex}");
        let socket = |protocols: &str| -> Vec<(&'static str, String)> {
            vec![
                ("host", "127.0.0.1:8".into()),
                ("origin", "http://127.0.0.1:8".into()),
                ("upgrade", "websocket".into()),
                ("sec-websocket-protocol", protocols.into()),
            ]
        };
        let code_owned = |g: &Gate, pairs: &[(&'static str, String)]| {
            let pairs: Vec<(&'static str, &str)> = pairs.iter().map(|(k, v)| (*k, v.as_str())).collect();
            code(g, &pairs, "/v1/sandboxes/a/processes/1/attach")
        };
        assert_eq!(code_owned(&on, &socket(&offered)), None);
        assert_eq!(code_owned(&on, &socket("forkvm, forkvm.bearer.30313233")), Some(StatusCode::UNAUTHORIZED));
        assert_eq!(code_owned(&on, &socket("forkvm, forkvm.bearer.zz")), Some(StatusCode::UNAUTHORIZED));
        assert_eq!(code_owned(&off, &socket(&offered)), Some(StatusCode::FORBIDDEN));
        let mut not_upgrade = socket(&offered);
        not_upgrade.retain(|(k, _)| *k != "upgrade");
        assert_eq!(code_owned(&on, &not_upgrade), Some(StatusCode::UNAUTHORIZED), "only an upgrade carries it");
        assert_eq!(decode_hex("4a4B"), Some(vec![0x4a, 0x4b]));
        assert_eq!(decode_hex("4"), None);
    }

    #[test]
    fn tcp_needs_host_and_token() {
        let gate = Gate::tcp(Token::new("0123456789abcdef").unwrap(), &[], &[], None);
        let code = |pairs: &[(&'static str, &str)], path| gate.refusal(&headers(pairs), path).map(|e| e.status());
        assert_eq!(code(&[("host", "127.0.0.1:1")], "/v1/sandboxes"), Some(StatusCode::UNAUTHORIZED));
        assert_eq!(code(&[("host", "127.0.0.1:1")], "/healthz"), None);
        let good = [("host", "127.0.0.1:1"), ("authorization", "Bearer 0123456789abcdef")];
        assert_eq!(code(&good, "/v1/sandboxes"), None);
        let rebound = [("host", "evil.example:1"), ("authorization", "Bearer 0123456789abcdef")];
        assert_eq!(code(&rebound, "/v1/sandboxes"), Some(StatusCode::FORBIDDEN));
        assert_eq!(code(&[("authorization", "Bearer 0123456789abcdef")], "/v1/x"), Some(StatusCode::FORBIDDEN));
        // An exposed port's path needs no API token (its own guards it), but a good Host.
        let browser = [("host", "127.0.0.1:1"), ("origin", "https://else.example")];
        assert_eq!(code(&browser, "/v1/sandboxes/a1/ports/8000/app"), None);
        assert_eq!(code(&[("host", "evil.example")], "/v1/sandboxes/a1/ports/8000/"), Some(StatusCode::FORBIDDEN));
        assert_eq!(code(&[("host", "127.0.0.1:1")], "/v1/sandboxes/a1/ports/8000"), Some(StatusCode::UNAUTHORIZED));
        assert_eq!(code(&[("host", "127.0.0.1:1")], "/v1/sandboxes/a1/ports"), Some(StatusCode::UNAUTHORIZED));
        // A port's own origin: any path is the guest's, a browser's too, without the
        // API's token; the API's token never reaches it.
        let own = [("host", "8000-a1.localhost:1"), ("origin", "http://8000-a1.localhost:1")];
        assert_eq!(code(&own, "/v1/sandboxes"), None);
        assert_eq!(code(&[("host", "8000-a1.localhost.evil.example")], "/v1/sandboxes"), Some(StatusCode::FORBIDDEN));
        let mut r = axum::http::Request::builder()
            .uri("/v1/sandboxes")
            .header("host", "8000-a1.localhost")
            .header("authorization", "Bearer 0123456789abcdef")
            .body(axum::body::Body::empty())
            .unwrap();
        gate.keep_token_from_guests(&mut r);
        assert!(r.headers().get("authorization").is_none());
        // Under another ports domain, localhost's subdomains are the daemon's again.
        let gate = gate.with_ports_domain("ports.example");
        let code = |pairs: &[(&'static str, &str)], path| gate.refusal(&headers(pairs), path).map(|e| e.status());
        assert_eq!(code(&[("host", "8000-a1.localhost")], "/x"), Some(StatusCode::FORBIDDEN));
        assert_eq!(code(&[("host", "8000-a1.ports.example")], "/x"), None);
    }
}
