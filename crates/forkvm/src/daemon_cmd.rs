//! `forkvm daemon`: runs forkvmd, the REST controller (see the forkvmd crate and
//! docs/api.md). Sandboxes it starts keep running when it stops; the next start
//! re-attaches to them.

use anyhow::{bail, Context, Result};
use clap::Args;
use forkvm_sandbox::disk_snapshots::DEFAULT_RETENTION;
use forkvm_sandbox::Registry;
use forkvm_snapshot::vault::RetentionPolicy;
use forkvm_snapshot::Store;
use forkvmd::auth::Token;
use forkvmd::disk::DiskSnapshotConfig;
use forkvmd::lifecycle::LifecycleConfig;
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
    /// Take a disk snapshot of every running sandbox this often (60, 30s, 5m, 1h; no
    /// unit means seconds); 0 turns the schedule off.
    #[arg(long, default_value = "60s", value_parser = interval, env = "FORKVMD_DISK_SNAPSHOT_INTERVAL")]
    disk_snapshot_interval: Interval,
    /// Disk snapshot retention: keep the newest N snapshots of each sandbox.
    #[arg(long, default_value_t = DEFAULT_RETENTION.keep_last, env = "FORKVMD_DISK_RETENTION_KEEP_LAST")]
    disk_retention_keep_last: u32,
    /// Disk snapshot retention: also keep the newest of each of the last N hours.
    #[arg(long, default_value_t = DEFAULT_RETENTION.keep_hourly, env = "FORKVMD_DISK_RETENTION_KEEP_HOURLY")]
    disk_retention_keep_hourly: u32,
    /// Disk snapshot retention: also keep the newest of each of the last N days.
    #[arg(long, default_value_t = DEFAULT_RETENTION.keep_daily, env = "FORKVMD_DISK_RETENTION_KEEP_DAILY")]
    disk_retention_keep_daily: u32,
    /// Pause a running sandbox that no call used for this long (300s, 5m, ...); the next
    /// call that needs it resumes it. 0 turns auto-pause off.
    #[arg(long, default_value = "300s", value_parser = interval, env = "FORKVMD_IDLE_PAUSE")]
    idle_pause: Interval,
    /// Archive (never delete) a sandbox this long after it started, unless its request
    /// set `ttl_seconds` (1h, 30m, ...). 0, the default, means no TTL.
    #[arg(long, default_value = "0", value_parser = interval, env = "FORKVMD_DEFAULT_TTL")]
    default_ttl: Interval,
}

/// A parsed interval flag (`None`: off).
#[derive(Debug, Clone, Copy)]
struct Interval(Option<std::time::Duration>);

fn interval(text: &str) -> Result<Interval, String> {
    forkvmd::disk::parse_interval(text).map(Interval)
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
        disk_snapshots: DiskSnapshotConfig {
            interval: a.disk_snapshot_interval.0,
            retention: RetentionPolicy {
                keep_last: a.disk_retention_keep_last,
                keep_hourly: a.disk_retention_keep_hourly,
                keep_daily: a.disk_retention_keep_daily,
            },
        },
        lifecycle: LifecycleConfig { idle_pause: a.idle_pause.0, default_ttl: a.default_ttl.0 },
    };
    forkvmd::run(cfg)?;
    Ok(0)
}
