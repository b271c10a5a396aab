//! Exposed ports: a sandbox's guest port reachable through the daemon at
//! `/v1/sandboxes/{id}/ports/{port}/...`, guarded by a token of that sandbox and port
//! alone (a fork's child gets tokens of its own: a parent's never routes to a child).
//! The proxy's paths are not in [`crate::routes::ROUTES`]: any method and any path below
//! the prefix are the guest's, so the gate and the router both ask [`port_target`].
//!
//! A port is also served at an **origin of its own**: a request whose `Host` is
//! `{port}-{id}.<ports domain>` (default `localhost`, which browsers resolve to
//! loopback) is the guest's, whole path. A browser then keeps each port's cookies and
//! storage apart, so a page one sandbox serves cannot read or drive another's.

use serde::{Deserialize, Serialize};

/// `POST /v1/sandboxes/{id}/ports`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExposeRequest {
    /// The guest's TCP port, 1 to 65535.
    pub port: u16,
    /// Binds the port's token to a key (DPoP, RFC 9449): the RFC 7638 SHA-256
    /// thumbprint of the public key whose proofs must come with every request
    /// (`Authorization: DPoP <token>` and a `DPoP` header). Absent: a bearer token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dpop_jkt: Option<String>,
}

/// A guest port reachable through the daemon.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ExposedPort {
    pub port: u16,
    /// Where it is served, relative to the daemon's address:
    /// `/v1/sandboxes/{id}/ports/{port}/`.
    pub path: String,
    /// What a request must present (header `X-Forkvm-Port-Token`, or once as the query
    /// parameter `forkvm_token`, which sets a cookie for the rest of a browser's visit).
    pub token: String,
    pub created_at_unix_ms: u64,
    /// The key thumbprint the token is bound to (DPoP); absent for a bearer token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dpop_jkt: Option<String>,
    /// The `Host` that serves the port at an origin of its own, whole path (the same
    /// token rules): `{port}-{id}.<ports domain>`, `8000-<id>.localhost` by default
    /// (browsers resolve `*.localhost` to loopback). Absent when the sandbox id cannot
    /// stand in a host name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
}

/// The header a port token comes in.
pub const PORT_TOKEN_HEADER: &str = "x-forkvm-port-token";
/// The query parameter a port token may come in (a link opened in a browser).
pub const PORT_TOKEN_QUERY: &str = "forkvm_token";
/// The cookie a port token is kept in after it came as a query parameter.
pub const PORT_TOKEN_COOKIE: &str = "forkvm_port_token";

/// On an answer of the port proxy that the daemon gave itself (an error before the
/// guest answered): the guest's own answers never carry it.
pub const PROXY_ERROR_HEADER: &str = "x-forkvm-error";

/// The path exposed port `port` of sandbox `id` is served at.
pub fn port_path(id: &str, port: u16) -> String {
    format!("/v1/sandboxes/{id}/ports/{port}/")
}

/// A guest port as a path segment writes it: decimal digits only, 1 to 65535.
pub fn parse_port(raw: &str) -> Option<u16> {
    if raw.is_empty() || !raw.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    raw.parse::<u16>().ok().filter(|p| *p != 0)
}

/// The ports domain a daemon serves ports' own origins under unless told another.
pub const DEFAULT_PORTS_DOMAIN: &str = "localhost";

/// A request for an exposed port, by its path or by its own origin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortTarget<'a> {
    pub id: &'a str,
    pub port: u16,
    /// The guest's path, with its leading slash (and the query, if the path had one).
    pub guest_path: &'a str,
    /// Whether it came to the port's own origin (`Host: {port}-{id}.<domain>`) rather
    /// than to its path below the daemon's.
    pub own_origin: bool,
}

impl PortTarget<'_> {
    /// Where the guest's root is served on the origin the request came to: `/` on the
    /// port's own, its path below the daemon's otherwise.
    pub fn prefix(&self) -> String {
        if self.own_origin {
            "/".to_string()
        } else {
            port_path(self.id, self.port)
        }
    }
}

/// Whether a request (its `Host` header, if any, and raw `path`) goes to an exposed
/// port, and which: the port's own origin first (`Host: {port}-{id}.<ports_domain>`,
/// any path), then its path below the daemon's. `None`: it is the API's. The gate and
/// the router decide with this one function, so a request the gate lets through
/// without the API's token can only reach a guest.
pub fn port_target<'a>(host: Option<&'a str>, path: &'a str, ports_domain: &str) -> Option<PortTarget<'a>> {
    if let Some((id, port)) = host.and_then(|h| port_origin(h, ports_domain)) {
        return Some(PortTarget { id, port, guest_path: path, own_origin: true });
    }
    let (id, port, guest_path) = port_proxy_target(path)?;
    Some(PortTarget { id, port, guest_path, own_origin: false })
}

/// The sandbox id and port a `Host` header value (`name[:port]`) names as a port's own
/// origin, `{port}-{id}.<ports_domain>` (the domain matched without regard to case;
/// one label before it, nothing else).
pub fn port_origin<'a>(host: &'a str, ports_domain: &str) -> Option<(&'a str, u16)> {
    let name = match host.rsplit_once(':') {
        Some((n, p)) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => n,
        Some(_) => return None,
        None => host,
    };
    let name = name.strip_suffix('.').unwrap_or(name);
    let split = name.len().checked_sub(ports_domain.len() + 1)?;
    let (label, domain) = (name.get(..split)?, name.get(split..)?);
    if !domain.starts_with('.') || !domain[1..].eq_ignore_ascii_case(ports_domain) {
        return None;
    }
    let (port, id) = label.split_once('-')?;
    let port = parse_port(port)?;
    is_origin_id(id).then_some((id, port))
}

/// The `Host` name that serves port `port` of sandbox `id` at an origin of its own,
/// if the id can be a DNS label's part (lowercase letters, digits, `-`).
pub fn port_host(id: &str, port: u16, ports_domain: &str) -> Option<String> {
    let label = format!("{port}-{id}");
    (is_origin_id(id) && label.len() <= 63).then(|| format!("{label}.{ports_domain}"))
}

/// Whether a sandbox id may stand in a port's origin: a DNS label's characters,
/// lowercase (a browser lowers a host's case, and ids are matched exactly).
fn is_origin_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 57
        && !id.ends_with('-')
        && id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// Whether `name` may be a ports domain: DNS labels of lowercase letters, digits and `-`
/// (none empty, none starting or ending with `-`), at most 200 characters.
pub fn is_ports_domain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 200
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
}

/// The sandbox id, port and guest path of a request to the port proxy (`path` is the
/// request's raw path), or `None` when it is an API path. The gate and the router
/// decide with this one function, so a path the gate lets through without the API's
/// token can only reach a guest.
pub fn port_proxy_target(path: &str) -> Option<(&str, u16, &str)> {
    let rest = path.strip_prefix("/v1/sandboxes/")?;
    let (id, rest) = rest.split_once('/')?;
    let rest = rest.strip_prefix("ports/")?;
    let (port, guest_path) = rest.split_once('/')?;
    if id.is_empty() {
        return None;
    }
    let port = parse_port(port)?;
    // The guest's path keeps its leading slash.
    Some((id, port, &path[path.len() - guest_path.len() - 1..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_paths_are_told_from_api_paths() {
        assert_eq!(port_proxy_target("/v1/sandboxes/a1/ports/8000/"), Some(("a1", 8000, "/")));
        assert_eq!(port_proxy_target("/v1/sandboxes/a1/ports/80/x/y?q"), Some(("a1", 80, "/x/y?q")));
        assert_eq!(port_proxy_target("/v1/sandboxes/a1/ports/80/../../x"), Some(("a1", 80, "/../../x")));
        for api in [
            "/v1/sandboxes/a1/ports",
            "/v1/sandboxes/a1/ports/8000",
            "/v1/sandboxes/a1/ports/0/",
            "/v1/sandboxes/a1/ports/65536/",
            "/v1/sandboxes/a1/ports/+80/",
            "/v1/sandboxes/a1/ports//",
            "/v1/sandboxes//ports/80/",
            "/v1/sandboxes/a1/files/ports/80/",
            "/v1/snapshots/a1/ports/80/",
        ] {
            assert_eq!(port_proxy_target(api), None, "{api}");
        }
    }

    #[test]
    fn a_ports_own_origin_is_told_from_the_daemons() {
        let d = DEFAULT_PORTS_DOMAIN;
        assert_eq!(port_origin("8000-a1b2.localhost:8889", d), Some(("a1b2", 8000)));
        assert_eq!(port_origin("80-a1b2.LOCALHOST", d), Some(("a1b2", 80)));
        assert_eq!(port_origin("80-a1b2.localhost.", d), Some(("a1b2", 80)));
        assert_eq!(port_origin("443-sb-1.ports.example.com", "ports.example.com"), Some(("sb-1", 443)));
        for not in [
            "localhost:8889",
            "a1b2.localhost",
            "8000a1b2.localhost",
            "0-a1b2.localhost",
            "65536-a1b2.localhost",
            "8000-.localhost",
            "8000-A1B2.localhost",
            "8000-a1b2.localhost:",
            "8000-a1b2.localhost:x",
            "x.8000-a1b2.localhost",
            "8000-a1b2.localhost.evil.example",
            "8000-a1b2.evillocalhost",
            "8000-a_b.localhost",
            "127.0.0.1:8889",
            "[::1]:8889",
            "",
        ] {
            assert_eq!(port_origin(not, d), None, "{not}");
        }
        assert_eq!(port_host("a1b2", 8000, d).as_deref(), Some("8000-a1b2.localhost"));
        assert_eq!(port_host("A1", 8000, d), None);
        // Both ways agree.
        let host = port_host("c3", 3000, "p.example").unwrap();
        assert_eq!(port_origin(&host, "p.example"), Some(("c3", 3000)));
        // The origin wins over the path; the path's form stands without it.
        let t = port_target(Some("8000-a1.localhost"), "/v1/sandboxes/b2/ports/80/x", d).unwrap();
        assert_eq!(
            (t.id, t.port, t.guest_path, t.own_origin, t.prefix()),
            ("a1", 8000, "/v1/sandboxes/b2/ports/80/x", true, "/".into())
        );
        let t = port_target(Some("localhost"), "/v1/sandboxes/b2/ports/80/x", d).unwrap();
        assert_eq!((t.id, t.port, t.guest_path, t.own_origin), ("b2", 80, "/x", false));
        assert_eq!(port_target(Some("localhost"), "/v1/sandboxes", d), None);
        assert!(is_ports_domain("localhost") && is_ports_domain("ports.example.com"));
        for bad in ["", "Ports.example", "a..b", "-a.b", "a-.b", "a_b.c", "a.b/c", "*.a"] {
            assert!(!is_ports_domain(bad), "{bad}");
        }
    }

    #[test]
    fn no_api_route_is_a_proxy_path() {
        for r in crate::routes::ROUTES {
            let filled = r.path.replace("{id}", "a1").replace("{tag}", "t").replace("{port}", "80");
            assert_eq!(port_proxy_target(&filled), None, "{} {}", r.method, r.path);
            // `DELETE .../ports/{port}` unexposes; with a slash after it, it is the guest's root.
            let with_slash = format!("{filled}/");
            let slashed = port_proxy_target(&with_slash);
            let guest_root = r.name == crate::routes::RouteName::UnexposePort && slashed == Some(("a1", 80, "/"));
            assert!(slashed.is_none() || guest_root, "{} {}/", r.method, r.path);
        }
    }
}
