//! `forkvm mcp`: the MCP server (`forkvm_mcp`) on stdio or streamable HTTP, driving
//! the daemon named by `--daemon`/`FORKVM_DAEMON` (default: its Unix socket).

use crate::remote_cmd::RemoteArgs;
use anyhow::{bail, Context, Result};
use forkvmd::auth::Token;
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

/// The token `--http` clients must send: the daemon's kind and rules
/// (`forkvmd::auth::Token`).
fn http_token(args: &McpArgs) -> Result<Token> {
    let token = match &args.token_file {
        Some(path) => Token::from_file(path),
        None => match std::env::var(MCP_TOKEN_ENV).unwrap_or_default() {
            raw if raw.trim().is_empty() => bail!(
                "--http needs a token clients must send: --token-file PATH or {MCP_TOKEN_ENV} (e.g. `openssl rand -hex 32`)"
            ),
            raw => Token::new(&raw),
        },
    };
    token.context("the MCP HTTP token")
}

pub fn run(args: McpArgs, remote: &RemoteArgs) -> Result<i32> {
    let transport = match args.http {
        Some(addr) => forkvm_mcp::Transport::Http { addr, token: http_token(&args)? },
        None => forkvm_mcp::Transport::Stdio,
    };
    let daemon = forkvm_mcp::Daemon::new(remote.required_client("forkvm mcp")?);
    forkvm_mcp::run(daemon, transport).map_err(|e| anyhow::anyhow!(e)).context("running the MCP server")?;
    Ok(0)
}
