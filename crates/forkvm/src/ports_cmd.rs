//! `forkvm expose`, `forkvm ports`, `forkvm unexpose` and `forkvm port-forward`:
//! a sandbox's guest ports reached through the daemon (which alone can enter a
//! sandbox's namespace for as long as it lives), by URL with a token of the port's own,
//! or as raw TCP on a local port.

use crate::remote_cmd::RemoteArgs;
use anyhow::{bail, Context, Result};
use clap::Args;
use forkvm_client::api::ExposedPort;
use forkvm_client::{Client, Endpoint};
use std::io::Write;
use std::sync::Arc;

#[derive(Args, Debug)]
pub struct ExposeArgs {
    /// The sandbox.
    pub id: String,
    /// The guest's TCP port.
    pub port: u16,
    /// Bind the token to a key (DPoP, RFC 9449): its RFC 7638 SHA-256 thumbprint. Every
    /// request then needs `Authorization: DPoP <token>` and a proof signed by that key.
    /// (Base64url: a thumbprint may start with '-', so it is never read as a flag.)
    #[arg(long, value_name = "JKT", allow_hyphen_values = true)]
    pub dpop_jkt: Option<String>,
    /// Print the port as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct PortsArgs {
    /// The sandbox.
    pub id: String,
    /// Print the ports as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct UnexposeArgs {
    /// The sandbox.
    pub id: String,
    /// The guest's TCP port.
    pub port: u16,
}

#[derive(Args, Debug)]
pub struct PortForwardArgs {
    /// The sandbox.
    pub id: String,
    /// Where to listen: PORT (on 127.0.0.1) or HOST:PORT; port 0 picks a free one.
    pub listen: String,
    /// The guest's TCP port.
    pub guest_port: u16,
}

fn daemon(remote: &RemoteArgs, what: &str) -> Result<Client> {
    match remote.client()? {
        Some(c) => Ok(c),
        None => bail!(
            "{what} needs the daemon (--daemon or FORKVM_DAEMON): it reaches a sandbox's ports from the sandbox's \
             own network namespace, which it keeps for as long as the sandbox lives"
        ),
    }
}

/// Where a browser opens `p` (with its token, traded for a cookie on the first visit),
/// when the daemon listens on TCP and the token is not bound to a key: at the port's
/// own origin when it has one this host can reach (a `*.localhost` one only when the
/// daemon is on this host's loopback), else at its path below the daemon's.
fn browser_url(endpoint: &Endpoint, p: &ExposedPort) -> Option<String> {
    let (scheme, host, port) = match endpoint {
        Endpoint::Unix(_) => return None,
        Endpoint::Http { host, port } => ("http", host, port),
        Endpoint::Https { host, port } => ("https", host, port),
    };
    if p.dpop_jkt.is_some() {
        return None;
    }
    let loopback = host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|a| a.is_loopback());
    match &p.host {
        Some(own) if loopback || !own.ends_with(".localhost") => {
            Some(format!("{scheme}://{own}:{port}/?forkvm_token={}", p.token))
        }
        _ => Some(format!("{endpoint}{}?forkvm_token={}", p.path, p.token)),
    }
}

fn print_port(endpoint: &Endpoint, p: &ExposedPort) {
    let how = match &p.dpop_jkt {
        Some(jkt) => format!("Authorization: DPoP {} (with a proof of key {jkt})", p.token),
        None => format!("{}: {}", forkvm_client::api::ports::PORT_TOKEN_HEADER, p.token),
    };
    match browser_url(endpoint, p) {
        Some(url) => println!("{}\t{url}", p.port),
        None => println!("{}\t{endpoint}{}\t{how}", p.port, p.path),
    }
}

/// `forkvm expose ID PORT`.
pub fn expose(a: ExposeArgs, remote: &RemoteArgs) -> Result<i32> {
    let client = daemon(remote, "expose")?;
    let p = client
        .expose(&a.id, a.port, a.dpop_jkt.as_deref())
        .with_context(|| format!("exposing port {} of {}", a.port, a.id))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&p)?);
    } else {
        print_port(client.endpoint(), &p);
    }
    Ok(0)
}

/// `forkvm ports ID`.
pub fn list(a: PortsArgs, remote: &RemoteArgs) -> Result<i32> {
    let client = daemon(remote, "ports")?;
    let ports = client.exposed_ports(&a.id)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&ports)?);
    } else {
        for p in &ports {
            print_port(client.endpoint(), p);
        }
    }
    Ok(0)
}

/// `forkvm unexpose ID PORT`.
pub fn unexpose(a: UnexposeArgs, remote: &RemoteArgs) -> Result<i32> {
    daemon(remote, "unexpose")?.unexpose(&a.id, a.port)?;
    Ok(0)
}

/// `PORT` or `HOST:PORT` as an address to listen on.
fn listen_addr(listen: &str) -> Result<String> {
    if listen.parse::<u16>().is_ok() {
        return Ok(format!("127.0.0.1:{listen}"));
    }
    match listen.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => Ok(listen.to_string()),
        _ => bail!("where to listen {listen:?}: give PORT or HOST:PORT"),
    }
}

/// `forkvm port-forward ID [HOST:]PORT GUEST_PORT`: until interrupted.
pub fn port_forward(a: PortForwardArgs, remote: &RemoteArgs) -> Result<i32> {
    let client = daemon(remote, "port-forward")?;
    let listen = listen_addr(&a.listen)?;
    let (id, guest_port) = (a.id.clone(), a.guest_port);
    client
        .port_forward(
            &a.id,
            &listen,
            a.guest_port,
            |local| {
                println!("forwarding {local} -> sandbox {id} port {guest_port}");
                let _ = std::io::stdout().flush();
            },
            Arc::new(|why: &str| eprintln!("forkvm: port-forward: {why}")),
        )
        .with_context(|| format!("forwarding to port {} of {}", a.guest_port, a.id))?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thumbprint_that_starts_with_a_hyphen_is_a_value() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            expose: ExposeArgs,
        }
        let jkt = "-Q9peYbFb1ywEWjHyOHGEXgrWoB9RTJF0rvMfejYXp0";
        let cli = Cli::try_parse_from(["expose", "8e5b1f7b17713e86", "8001", "--dpop-jkt", jkt, "--json"]).unwrap();
        assert_eq!(cli.expose.dpop_jkt.as_deref(), Some(jkt));
    }

    #[test]
    fn where_to_listen() {
        assert_eq!(listen_addr("8080").unwrap(), "127.0.0.1:8080");
        assert_eq!(listen_addr("0.0.0.0:0").unwrap(), "0.0.0.0:0");
        assert_eq!(listen_addr("[::1]:80").unwrap(), "[::1]:80");
        for bad in ["", ":80", "host", "host:x", "70000"] {
            assert!(listen_addr(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn urls_for_browsers_only_over_tcp() {
        let p = ExposedPort {
            port: 80,
            path: "/v1/sandboxes/a/ports/80/".into(),
            token: "fvp_x".into(),
            created_at_unix_ms: 0,
            dpop_jkt: None,
            host: None,
        };
        let tcp: Endpoint = "http://127.0.0.1:8889".parse().unwrap();
        assert_eq!(browser_url(&tcp, &p).unwrap(), "http://127.0.0.1:8889/v1/sandboxes/a/ports/80/?forkvm_token=fvp_x");
        let unix: Endpoint = "unix:/run/forkvm/forkvmd.sock".parse().unwrap();
        assert_eq!(browser_url(&unix, &p), None);
        // Its own origin, where this host reaches it.
        let own = ExposedPort { host: Some("80-a.localhost".into()), ..p.clone() };
        assert_eq!(browser_url(&tcp, &own).unwrap(), "http://80-a.localhost:8889/?forkvm_token=fvp_x");
        let remote: Endpoint = "https://forkvm.example:443".parse().unwrap();
        assert_eq!(
            browser_url(&remote, &own).unwrap(),
            "https://forkvm.example:443/v1/sandboxes/a/ports/80/?forkvm_token=fvp_x",
            "another host's localhost is not this one's"
        );
        let named = ExposedPort { host: Some("80-a.ports.example".into()), ..p.clone() };
        assert_eq!(browser_url(&remote, &named).unwrap(), "https://80-a.ports.example:443/?forkvm_token=fvp_x");
        let bound = ExposedPort { dpop_jkt: Some("k".repeat(43)), ..p };
        assert_eq!(browser_url(&tcp, &bound), None, "a browser cannot sign DPoP proofs");
    }
}
