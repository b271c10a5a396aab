//! `forkvm daemon`: runs forkvmd, the REST controller (see the forkvmd crate and
//! docs/api.md). Sandboxes it starts keep running when it stops; the next start
//! re-attaches to them.

use anyhow::{bail, Context, Result};
use clap::Args;
use forkvm_sandbox::Registry;
use forkvm_snapshot::Store;
use forkvmd::auth::Token;
use forkvmd::serve::TcpConfig;
use forkvmd::DaemonConfig;
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct DaemonArgs {
    /// Unix socket to listen on [default: $FORKVM_RUN/forkvmd.sock].
    #[arg(long, env = "FORKVMD_SOCKET")]
    socket: Option<PathBuf>,
    /// Also listen on TCP (e.g. 127.0.0.1:8889); needs --token-file unless loopback.
    #[arg(long, env = "FORKVMD_BIND")]
    bind: Option<SocketAddr>,
    /// File holding the bearer token for TCP (at least 16 bytes; placeholders refused).
    #[arg(long, env = "FORKVMD_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// PEM certificate chain for TLS on TCP (with --tls-key).
    #[arg(long, env = "FORKVMD_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key for TLS on TCP (with --tls-cert).
    #[arg(long, env = "FORKVMD_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Database, audit log and lock [default: $FORKVM_STORE/forkvmd].
    #[arg(long, env = "FORKVMD_STATE_DIR")]
    state_dir: Option<PathBuf>,
    /// Most BRANCH calls at once.
    #[arg(long, default_value_t = forkvmd::state::DEFAULT_BRANCH_CONCURRENCY, env = "FORKVMD_BRANCH_CONCURRENCY")]
    branch_concurrency: usize,
}

pub fn run(a: DaemonArgs) -> Result<i32> {
    let registry = Registry::open_default();
    let store = Store::open_default();
    let token = a.token_file.as_deref().map(Token::from_file).transpose().context("--token-file")?;
    let tcp = match a.bind {
        Some(addr) => Some(TcpConfig { addr, token, tls: a.tls_cert.zip(a.tls_key) }),
        None => {
            if token.is_some() || a.tls_cert.is_some() {
                bail!("--token-file and --tls-cert/--tls-key apply to TCP: give --bind too");
            }
            None
        }
    };
    let cfg = DaemonConfig {
        socket: a.socket.unwrap_or_else(|| DaemonConfig::default_socket(&registry)),
        state_dir: a.state_dir.unwrap_or_else(|| DaemonConfig::default_state_dir(&store)),
        registry,
        store,
        tcp,
        branch_concurrency: a.branch_concurrency,
    };
    forkvmd::run(cfg)?;
    Ok(0)
}
