//! Which resolvers the forwarder asks: [`configure`]d by the library's caller (a test's
//! fake internet), else [`DNS_ENV`] (comma-separated addresses), else, for the host
//! uplink, the host's `resolv.conf` without loopback addresses (which mean nothing from
//! a sandbox's point of view), falling back to systemd-resolved's list of real ones.

use std::net::{IpAddr, SocketAddr};
use std::sync::OnceLock;

/// Upstream resolvers, comma-separated (`9.9.9.9,1.1.1.1`, `[2620:fe::fe]:53`).
pub const DNS_ENV: &str = "FORKVM_DNS";

static CONFIGURED: OnceLock<Vec<SocketAddr>> = OnceLock::new();

/// Sets this process's upstream resolvers; refused once they are set or were read.
pub fn configure(servers: Vec<SocketAddr>) -> Result<(), String> {
    CONFIGURED.set(servers).map_err(|_| "the upstream resolvers were already chosen for this process".to_string())
}

/// Reads a [`DNS_ENV`] value.
pub fn parse(value: &str) -> Result<Vec<SocketAddr>, String> {
    let servers: Result<Vec<SocketAddr>, String> = value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<SocketAddr>()
                .or_else(|_| s.parse::<IpAddr>().map(|ip| SocketAddr::new(ip, 53)))
                .map_err(|_| format!("{DNS_ENV}: {s:?} is not an address"))
        })
        .collect();
    let servers = servers?;
    if servers.is_empty() {
        return Err(format!("{DNS_ENV} names no resolver"));
    }
    Ok(servers)
}

/// The `nameserver` lines of a `resolv.conf`, loopback addresses left out.
pub fn from_resolv_conf(text: &str) -> Vec<SocketAddr> {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|rest| rest.trim().split('%').next()?.parse::<IpAddr>().ok())
        .filter(|ip| !ip.is_loopback())
        .map(|ip| SocketAddr::new(ip, 53))
        .collect()
}

/// This process's upstream resolvers, found once; `host_uplink` says whether the
/// host's own files describe the uplink's resolvers.
pub fn current(host_uplink: bool) -> Result<&'static [SocketAddr], String> {
    if let Some(servers) = CONFIGURED.get() {
        return Ok(servers);
    }
    static FOUND: OnceLock<Result<Vec<SocketAddr>, String>> = OnceLock::new();
    let found = FOUND.get_or_init(|| {
        if let Ok(v) = std::env::var(DNS_ENV) {
            return parse(&v);
        }
        if !host_uplink {
            return Err(format!("the uplink is a namespace of its own: name its resolvers in {DNS_ENV}"));
        }
        for file in ["/etc/resolv.conf", "/run/systemd/resolve/resolv.conf"] {
            let servers = std::fs::read_to_string(file).map(|t| from_resolv_conf(&t)).unwrap_or_default();
            if !servers.is_empty() {
                return Ok(servers);
            }
        }
        Err(format!("the host names no resolver a sandbox can use (only loopback ones): set {DNS_ENV}"))
    });
    found.as_deref().map_err(Clone::clone)
}
