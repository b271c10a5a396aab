//! Exposed ports: a sandbox's guest port reachable through the daemon at
//! `/v1/sandboxes/{id}/ports/{port}/...`, guarded by a token of that sandbox and port
//! alone (a fork's child gets tokens of its own: a parent's never routes to a child).
//! The proxy's paths are not in [`crate::routes::ROUTES`]: any method and any path below
//! the prefix are the guest's, so the gate and the router both ask [`port_proxy_target`].

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
