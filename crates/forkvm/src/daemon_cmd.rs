//! `forkvm daemon`: runs forkvmd, the REST controller (see the forkvmd crate and
//! docs/api.md). Sandboxes it starts keep running when it stops; the next start
//! re-attaches to them.

use anyhow::{bail, Context, Result};
use clap::Args;
use forkvm_sandbox::disk_snapshots::DEFAULT_RETENTION;
use forkvm_sandbox::Registry;
use forkvm_snapshot::vault::RetentionPolicy;
use forkvm_snapshot::Store;
use forkvm_vmm::host::jail::Jail;
use forkvm_vmm::host::seccomp::Seccomp;
use forkvmd::auth::Token;
use forkvmd::disk::DiskSnapshotConfig;
use forkvmd::lifecycle::LifecycleConfig;
use forkvmd::serve::{ConnLimits, TcpConfig};
use forkvmd::DaemonConfig;
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct DaemonArgs {
    /// Unix socket to listen on [default: $FORKVM_RUN/forkvmd.sock].
    #[arg(long, env = "FORKVMD_SOCKET")]
    socket: Option<PathBuf>,
    /// Also listen on TCP (e.g. 127.0.0.1:8889); needs --token-file, loopback too.
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
    /// A Host name clients use for the TCP listener besides IP addresses and localhost
    /// (repeatable); other names are refused (DNS rebinding).
    #[arg(long = "allow-host", value_name = "NAME")]
    allow_hosts: Vec<String>,
    /// An origin (scheme://host[:port]) whose browser requests are allowed (repeatable);
    /// every other request carrying Origin is refused (CSRF).
    #[arg(long = "allow-origin", value_name = "ORIGIN")]
    allow_origins: Vec<String>,
    /// The domain exposed ports are served at origins of their own under:
    /// `http://8000-<id>.<NAME>:<daemon port>/` (a wildcard DNS name and certificate of
    /// yours for another host; `*.localhost` is loopback in browsers).
    #[arg(long, value_name = "NAME", default_value = forkvm_client::api::ports::DEFAULT_PORTS_DOMAIN, value_parser = ports_domain, env = "FORKVMD_PORTS_DOMAIN")]
    ports_domain: String,
    /// A group (name or gid) whose members may use the Unix socket besides this user;
    /// the socket is then 0660 and owned by that group.
    #[arg(long, env = "FORKVMD_SOCKET_GROUP")]
    socket_group: Option<String>,
    /// A client must send a request's whole header within this (30s, 10, ...).
    #[arg(long, default_value = "10s", value_parser = interval, env = "FORKVMD_HEADER_TIMEOUT")]
    header_timeout: Interval,
    /// Most connections open at once over all listeners; more are closed at accept.
    #[arg(long, default_value_t = 1024, env = "FORKVMD_MAX_CONNECTIONS")]
    max_connections: usize,
    /// Accept uploaded packs only if signed by this public key (`forkvm pack-keygen`;
    /// repeatable). Without it, unsigned packs are accepted.
    #[arg(long = "trust-pack-key", value_name = "PUBLIC_KEY")]
    trust_pack_keys: Vec<PathBuf>,
    /// Sign the packs this daemon writes (`GET /v1/snapshots/{tag}/pack`) with this key.
    #[arg(long, value_name = "KEY", env = "FORKVMD_PACK_SIGNING_KEY")]
    pack_signing_key: Option<PathBuf>,
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
    /// Ship every sandbox's disk snapshots (and the templates they run on) to this
    /// remote as they are taken (s3://bucket/prefix, file:///dir; docs/object-storage.md).
    #[arg(long, value_name = "URL", env = "FORKVMD_REPLICATE")]
    replicate: Option<String>,
    /// The remote key for --replicate [default: $FORKVM_REMOTE_KEY, else remote.key in the keys directory].
    #[arg(long, value_name = "FILE", env = "FORKVMD_REPLICATE_KEY")]
    replicate_key: Option<PathBuf>,
    /// The remote the API pushes tags to and pulls them from (`/v1/remote*`; s3://bucket/prefix,
    /// file:///dir) [default: the --replicate remote, if any].
    #[arg(long, value_name = "URL", env = "FORKVMD_REMOTE")]
    remote: Option<String>,
    /// The remote key for --remote [default: $FORKVM_REMOTE_KEY, else remote.key in the keys directory].
    #[arg(long, value_name = "FILE", env = "FORKVMD_REMOTE_KEY")]
    remote_key: Option<PathBuf>,
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
    /// call that needs it resumes it. 0 turns auto-pause off [default: 300s; 0 with
    /// --forkd-compat].
    #[arg(long, value_parser = interval, env = "FORKVMD_IDLE_PAUSE")]
    idle_pause: Option<Interval>,
    /// forkd's defaults, so forkd's own clients (its SDKs, CLI and MCP server) work
    /// unchanged: TCP on 127.0.0.1:8889 unless --bind says otherwise, the token file
    /// from $FORKD_TOKEN_FILE unless --token-file is given, no idle auto-pause unless
    /// --idle-pause is given (docs/forkd-compat.md). The Unix socket stays.
    #[arg(long, env = "FORKVMD_FORKD_COMPAT")]
    forkd_compat: bool,
    /// Serve the web console at /ui/ on the TCP listener (--bind): sandboxes, snapshots,
    /// their lineage, terminals (docs/console.md) [default: on; off with --forkd-compat].
    #[arg(long, overrides_with = "no_console")]
    console: bool,
    /// Do not serve the web console.
    #[arg(long, overrides_with = "console")]
    no_console: bool,
    /// Archive (never delete) a sandbox this long after it started, unless its request
    /// set `ttl_seconds` (1h, 30m, ...). 0, the default, means no TTL.
    #[arg(long, default_value = "0", value_parser = interval, env = "FORKVMD_DEFAULT_TTL")]
    default_ttl: Interval,
    /// Run VMMs without their seccomp filters. For debugging a VMM that a filter stops
    /// (its console log names the call): a VMM without filters is one guest bug away from
    /// every system call of the host.
    #[arg(long)]
    no_seccomp: bool,
    /// Run VMMs outside their jail (their own namespaces and a root holding only forkvm's
    /// files). For debugging only: a VMM outside it sees the whole host filesystem.
    #[arg(long)]
    no_jail: bool,
    #[command(flatten)]
    e2b: crate::daemon_e2b_args::E2bArgs,
}

/// A parsed interval flag (`None`: off).
#[derive(Debug, Clone, Copy)]
struct Interval(Option<std::time::Duration>);

fn interval(text: &str) -> Result<Interval, forkvmd::disk::BadInterval> {
    forkvmd::disk::parse_interval(text).map(Interval)
}

fn ports_domain(text: &str) -> Result<String, String> {
    if forkvm_client::api::ports::is_ports_domain(text) {
        Ok(text.to_string())
    } else {
        Err(format!(
            "{text:?} is not a domain name of lowercase DNS labels (letters, digits, '-'), at most 200 characters"
        ))
    }
}

/// forkd's listener address (`forkd-controller serve --bind`'s default).
const FORKD_BIND: &str = "127.0.0.1:8889";
/// How long an unused sandbox runs before it is paused, unless told otherwise.
const DEFAULT_IDLE_PAUSE: std::time::Duration = std::time::Duration::from_secs(300);

impl DaemonArgs {
    /// The idle pause: the flag's, else off under --forkd-compat, else the default.
    fn idle_pause(&self) -> Option<std::time::Duration> {
        match self.idle_pause {
            Some(Interval(d)) => d,
            None if self.forkd_compat => None,
            None => Some(DEFAULT_IDLE_PAUSE),
        }
    }

    /// Whether the web console is served: the flags', else off under --forkd-compat.
    fn console(&self) -> bool {
        self.console || (!self.no_console && !self.forkd_compat)
    }

    /// --forkd-compat's listener and token file, where the flags leave them open.
    fn apply_forkd_compat(&mut self) {
        if !self.forkd_compat {
            return;
        }
        self.bind.get_or_insert_with(|| FORKD_BIND.parse().expect("a socket address"));
        if self.token_file.is_none() {
            self.token_file = std::env::var_os("FORKD_TOKEN_FILE").filter(|v| !v.is_empty()).map(PathBuf::from);
        }
    }
}

pub fn run(mut a: DaemonArgs) -> Result<i32> {
    a.apply_forkd_compat();
    let idle_pause = a.idle_pause();
    let console = a.console();
    let mut registry = Registry::open_default();
    if a.no_seccomp {
        eprintln!("forkvm daemon: --no-seccomp: sandboxes' VMMs run without their seccomp filters");
        registry = registry.without_seccomp();
    }
    if a.no_jail {
        eprintln!("forkvm daemon: --no-jail: sandboxes' VMMs run outside their jail");
        registry = registry.without_jail();
    }
    let store = Store::open_default();
    let token = a.token_file.as_deref().map(Token::from_file).transpose().context("--token-file")?;
    let tcp = match a.bind {
        Some(addr) => {
            if token.is_none() {
                let hint = if a.forkd_compat { " (or $FORKD_TOKEN_FILE)" } else { "" };
                bail!("--bind {addr} needs --token-file{hint}: every TCP listener, loopback too, takes a bearer token");
            }
            Some(TcpConfig { addr, token, tls: a.tls_cert.zip(a.tls_key), allowed_hosts: a.allow_hosts })
        }
        None => {
            if token.is_some() || a.tls_cert.is_some() || !a.allow_hosts.is_empty() {
                bail!("--token-file, --tls-cert/--tls-key and --allow-host apply to TCP: give --bind too");
            }
            None
        }
    };
    for o in &a.allow_origins {
        if !(o.starts_with("http://") || o.starts_with("https://"))
            || o.ends_with('/')
            || o.contains(char::is_whitespace)
        {
            bail!("--allow-origin {o:?}: give an origin as scheme://host[:port], e.g. https://app.example.com");
        }
    }
    let socket_group = a.socket_group.as_deref().map(group_id).transpose()?;
    let Some(header_timeout) = a.header_timeout.0 else { bail!("--header-timeout must be more than 0") };
    if a.max_connections == 0 {
        bail!("--max-connections must be at least 1");
    }
    let e2b = a.e2b.config()?;
    let replication = open_remote(a.replicate.as_deref(), a.replicate_key.as_ref(), "--replicate")?;
    if a.remote.is_none() && a.remote_key.is_some() {
        bail!("--remote-key applies to --remote: give --remote URL too");
    }
    let remote = match open_remote(a.remote.as_deref(), a.remote_key.as_ref(), "--remote")? {
        Some(remote) => Some(remote),
        None => replication.clone(),
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
        lifecycle: LifecycleConfig { idle_pause, default_ttl: a.default_ttl.0 },
        limits: ConnLimits { header_timeout, max_connections: a.max_connections, ..ConnLimits::default() },
        allowed_origins: a.allow_origins,
        socket_group,
        packs: forkvmd::state::PackPolicy {
            trust: forkvm_snapshot::pack_archive::PackTrust::from_files(&a.trust_pack_keys)
                .context("--trust-pack-key")?,
            key: a
                .pack_signing_key
                .as_deref()
                .map(forkvm_snapshot::pack_archive::signature::read_secret_key)
                .transpose()
                .context("--pack-signing-key")?,
        },
        spawner_exe: std::env::current_exe().context("finding the forkvm binary to run the spawner")?,
        ports_domain: a.ports_domain,
        e2b,
        console,
        replication,
        remote,
    };
    forkvmd::run(cfg)?;
    Ok(0)
}

/// The remote at `url` (a daemon flag, `flag`) with its key file, else the default key.
fn open_remote(
    url: Option<&str>,
    key: Option<&PathBuf>,
    flag: &str,
) -> Result<Option<std::sync::Arc<forkvm_sandbox::replication::Replication>>> {
    let Some(url) = url else { return Ok(None) };
    let key = key.cloned().unwrap_or_else(forkvm_remote::RemoteKey::default_path);
    let remote = forkvm_sandbox::replication::Replication::open(url, &key).with_context(|| flag.to_string())?;
    Ok(Some(std::sync::Arc::new(remote)))
}

/// `forkvm __spawner`: the daemon's spawner process ([`forkvmd::spawner::main`]).
#[derive(clap::Args, Debug)]
pub struct SpawnerArgs {
    /// The daemon's pid (the spawner stops when it is gone).
    #[arg(long)]
    parent: i32,
    #[arg(long)]
    run_root: std::path::PathBuf,
    #[arg(long)]
    store: std::path::PathBuf,
    /// Start VMMs without their seccomp filters (the daemon's `--no-seccomp`).
    #[arg(long)]
    no_seccomp: bool,
    /// Start VMMs outside their jail (the daemon's `--no-jail`).
    #[arg(long)]
    no_jail: bool,
}

pub fn spawner(a: SpawnerArgs) -> Result<i32> {
    let seccomp = if a.no_seccomp { Seccomp::Off } else { Seccomp::Enforce };
    let jail = if a.no_jail { Jail::Off } else { Jail::Enforce };
    Ok(forkvmd::spawner::main(a.parent, &a.run_root, &a.store, seccomp, jail))
}

/// A group name (from /etc/group) or a numeric gid.
fn group_id(name: &str) -> Result<u32> {
    if let Ok(gid) = name.parse::<u32>() {
        return Ok(gid);
    }
    let groups = std::fs::read_to_string("/etc/group").context("--socket-group: reading /etc/group")?;
    groups
        .lines()
        .find_map(|l| {
            let mut f = l.split(':');
            (f.next() == Some(name)).then(|| f.nth(1).and_then(|g| g.parse().ok())).flatten()
        })
        .with_context(|| format!("--socket-group {name:?}: no such group in /etc/group"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: DaemonArgs,
    }

    fn args(argv: &[&str]) -> DaemonArgs {
        let mut a = Cli::try_parse_from(std::iter::once("daemon").chain(argv.iter().copied())).unwrap().args;
        a.apply_forkd_compat();
        a
    }

    #[test]
    fn forkd_compat_gives_forkds_listener_and_no_idle_pause_unless_told_otherwise() {
        let plain = args(&[]);
        assert_eq!((plain.bind, plain.idle_pause()), (None, Some(DEFAULT_IDLE_PAUSE)));
        let compat = args(&["--forkd-compat"]);
        assert_eq!(compat.bind, Some("127.0.0.1:8889".parse().unwrap()));
        assert_eq!(compat.idle_pause(), None, "forkd never pauses an idle sandbox");
        assert!(!compat.console(), "forkd has no console");
        assert!(args(&["--forkd-compat", "--console"]).console());
        assert!(args(&[]).console() && !args(&["--no-console"]).console());
        assert!(args(&["--no-console", "--console"]).console(), "the last flag wins");
        let told = args(&["--forkd-compat", "--bind", "127.0.0.1:9000", "--idle-pause", "60s", "--token-file", "/t"]);
        assert_eq!(told.bind, Some("127.0.0.1:9000".parse().unwrap()));
        assert_eq!(told.idle_pause(), Some(std::time::Duration::from_secs(60)));
        assert_eq!(told.token_file.as_deref(), Some(std::path::Path::new("/t")));
        assert_eq!(args(&["--idle-pause", "0"]).idle_pause(), None);
    }
}
