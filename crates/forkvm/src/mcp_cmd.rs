//! `forkvm mcp`: the MCP server (`forkvm_mcp`) on stdio or streamable HTTP, driving
//! the daemon named by `--daemon`/`FORKVM_DAEMON` (default: its Unix socket).

use crate::remote_cmd::RemoteArgs;
use anyhow::{bail, Context, Result};
use forkvm_client::{token_from_env, Client, ClientOptions, Endpoint};
use std::net::SocketAddr;
use std::path::PathBuf;

/// Env var holding the bearer token `--http` clients must send (when no --token-file).
const MCP_TOKEN_ENV: &str = "FORKVM_MCP_TOKEN";

#[derive(clap::Args, Debug)]
pub struct McpArgs {
    /// Serve streamable HTTP on this address (e.g. 127.0.0.1:8765) at /mcp instead of
    /// stdio. Clients must send `Authorization: Bearer <token>`.
    #[arg(long, value_name = "ADDR")]
    pub http: Option<SocketAddr>,
    /// File holding that token (else FORKVM_MCP_TOKEN). Required with --http.
    #[arg(long, value_name = "PATH", requires = "http")]
    pub token_file: Option<PathBuf>,
}

fn daemon_client(remote: &RemoteArgs) -> Result<Client> {
    let spec = remote.daemon.as_deref().map(str::trim).filter(|s| !s.is_empty()).unwrap_or("auto");
    let endpoint = match Endpoint::resolve(spec)? {
        Some(e) => e,
        None => bail!(
            "no daemon listens at {} (start one with `forkvm daemon`, or name it with --daemon/FORKVM_DAEMON)",
            Endpoint::default_socket_path().display()
        ),
    };
    let what = endpoint.to_string();
    let options =
        ClientOptions { token: token_from_env(), ca_cert: remote.ca_cert.clone(), ..ClientOptions::default() };
    Client::with_options(endpoint, options).with_context(|| format!("setting up the client for {what}"))
}

fn http_token(args: &McpArgs) -> Result<String> {
    let token = match &args.token_file {
        Some(path) => {
            std::fs::read_to_string(path).with_context(|| format!("reading the MCP token file {}", path.display()))?
        }
        None => std::env::var(MCP_TOKEN_ENV).unwrap_or_default(),
    };
    let token = token.trim().to_string();
    if token.is_empty() {
        bail!("--http needs a token clients must send: --token-file PATH or {MCP_TOKEN_ENV} (e.g. `openssl rand -hex 32`)");
    }
    Ok(token)
}

pub fn run(args: McpArgs, remote: &RemoteArgs) -> Result<i32> {
    let transport = match args.http {
        Some(addr) => forkvm_mcp::Transport::Http { addr, token: http_token(&args)? },
        None => forkvm_mcp::Transport::Stdio,
    };
    let daemon = forkvm_mcp::Daemon::new(daemon_client(remote)?);
    forkvm_mcp::run(daemon, transport).map_err(|e| anyhow::anyhow!(e)).context("running the MCP server")?;
    Ok(0)
}
