//! Where the daemon listens: `unix:/path`, `http://host:port` or `https://host:port`,
//! parsed once so the rest of the client never looks at strings. Also the default
//! socket (next to the sandbox registry) and `FORKVM_DAEMON`, including `auto`.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// The environment variable naming the daemon's endpoint.
pub const DAEMON_ENV: &str = "FORKVM_DAEMON";
/// The daemon's socket file name inside the run root.
pub use forkvm_api::paths::SOCKET_NAME;

/// A daemon address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// A Unix domain socket (no token needed; the file mode guards it).
    Unix(PathBuf),
    /// Plain HTTP over TCP. `host` is a name or an IP address (IPv6 without brackets).
    Http { host: String, port: u16 },
    /// HTTPS over TCP.
    Https { host: String, port: u16 },
}

#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error("daemon endpoint {0:?} is not unix:/path/to.sock, http://host:port or https://host:port")]
    Scheme(String),
    #[error("daemon endpoint {input:?}: {reason}")]
    Invalid { input: String, reason: &'static str },
    #[error("{DAEMON_ENV} is not valid UTF-8")]
    NotUnicode,
}

impl Endpoint {
    /// Parses `unix:/path` (also `unix:///path`), `http://host[:port]` or
    /// `https://host[:port]` (ports default to 80 and 443; a trailing `/` is allowed).
    pub fn parse(input: &str) -> Result<Endpoint, EndpointError> {
        let invalid = |reason| EndpointError::Invalid { input: input.to_string(), reason };
        let s = input.trim();
        if let Some(rest) = s.strip_prefix("unix:") {
            // `unix:///run/x.sock` is the URL spelling of `unix:/run/x.sock`.
            let path = rest.strip_prefix("//").filter(|p| p.starts_with('/')).unwrap_or(rest);
            if path.is_empty() {
                return Err(invalid("no socket path after unix:"));
            }
            return Ok(Endpoint::Unix(PathBuf::from(path)));
        }
        let (tls, rest) = if let Some(rest) = s.strip_prefix("http://") {
            (false, rest)
        } else if let Some(rest) = s.strip_prefix("https://") {
            (true, rest)
        } else {
            return Err(EndpointError::Scheme(input.to_string()));
        };
        let authority = rest.strip_suffix('/').unwrap_or(rest);
        if authority.contains(['/', '?', '#', '@']) || authority.contains(char::is_whitespace) {
            return Err(invalid("only host and port may follow the scheme (no path, query or user)"));
        }
        let (host, port) = split_host_port(authority).map_err(invalid)?;
        let port = match port {
            Some(p) => p.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(|| invalid("the port is not 1-65535"))?,
            None if tls => 443,
            None => 80,
        };
        if host.is_empty() {
            return Err(invalid("no host"));
        }
        let host = host.to_string();
        Ok(if tls { Endpoint::Https { host, port } } else { Endpoint::Http { host, port } })
    }

    /// The daemon's default socket: `<run root>/forkvmd.sock`, the run root being the
    /// sandbox registry's (`$FORKVM_RUN`, else `$XDG_RUNTIME_DIR/forkvm`, else
    /// `/run/forkvm` for root, else `/tmp/forkvm-<uid>`).
    pub fn default_socket() -> Endpoint {
        Endpoint::Unix(Endpoint::default_socket_path())
    }

    pub fn default_socket_path() -> PathBuf {
        forkvm_api::paths::default_socket()
    }

    /// The default socket, if a daemon accepts connections on it now.
    pub fn probe_default_socket() -> Option<Endpoint> {
        let path = Endpoint::default_socket_path();
        std::os::unix::net::UnixStream::connect(&path).ok().map(|_| Endpoint::Unix(path))
    }

    /// Resolves a user's choice: empty means none, `auto` means the default socket if
    /// a daemon listens there (else none), anything else must parse.
    pub fn resolve(spec: &str) -> Result<Option<Endpoint>, EndpointError> {
        match spec.trim() {
            "" => Ok(None),
            "auto" => Ok(Endpoint::probe_default_socket()),
            s => Endpoint::parse(s).map(Some),
        }
    }

    /// `FORKVM_DAEMON`, through [`Endpoint::resolve`]; `None` when it is unset.
    pub fn from_env() -> Result<Option<Endpoint>, EndpointError> {
        match std::env::var(DAEMON_ENV) {
            Ok(v) => Endpoint::resolve(&v),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => Err(EndpointError::NotUnicode),
        }
    }

    pub fn is_tls(&self) -> bool {
        matches!(self, Endpoint::Https { .. })
    }

    pub fn socket_path(&self) -> Option<&Path> {
        match self {
            Endpoint::Unix(p) => Some(p),
            _ => None,
        }
    }

    /// The `Host` header: `host:port`, or `localhost` for a Unix socket.
    pub(crate) fn authority(&self) -> String {
        match self {
            Endpoint::Unix(_) => "localhost".to_string(),
            Endpoint::Http { host, port } | Endpoint::Https { host, port } => format!("{}:{port}", bracket(host)),
        }
    }
}

/// `host`, `host:port`, `[v6]` or `[v6]:port`.
fn split_host_port(authority: &str) -> Result<(&str, Option<&str>), &'static str> {
    if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or("an IPv6 address lacks its closing ]")?;
        return match after {
            "" => Ok((host, None)),
            _ => after.strip_prefix(':').map(|p| (host, Some(p))).ok_or("junk after the IPv6 address"),
        };
    }
    match authority.split_once(':') {
        Some((_, p)) if p.contains(':') => Err("an IPv6 address needs brackets: [::1]:port"),
        Some((h, p)) => Ok((h, Some(p))),
        None => Ok((authority, None)),
    }
}

fn bracket(host: &str) -> String {
    if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_string()
    }
}

impl FromStr for Endpoint {
    type Err = EndpointError;
    fn from_str(s: &str) -> Result<Endpoint, EndpointError> {
        Endpoint::parse(s)
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Unix(p) => write!(f, "unix:{}", p.display()),
            Endpoint::Http { .. } => write!(f, "http://{}", self.authority()),
            Endpoint::Https { .. } => write!(f, "https://{}", self.authority()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn http(host: &str, port: u16) -> Endpoint {
        Endpoint::Http { host: host.into(), port }
    }

    #[test]
    fn parses_each_scheme() {
        assert_eq!(
            Endpoint::parse("unix:/run/forkvm/forkvmd.sock").unwrap(),
            Endpoint::Unix("/run/forkvm/forkvmd.sock".into())
        );
        assert_eq!(Endpoint::parse("unix:///tmp/x.sock").unwrap(), Endpoint::Unix("/tmp/x.sock".into()));
        assert_eq!(Endpoint::parse("unix:rel.sock").unwrap(), Endpoint::Unix("rel.sock".into()));
        assert_eq!(Endpoint::parse("http://127.0.0.1:8080").unwrap(), http("127.0.0.1", 8080));
        assert_eq!(Endpoint::parse("http://daemon.example:9/").unwrap(), http("daemon.example", 9));
        assert_eq!(Endpoint::parse("http://h").unwrap(), http("h", 80));
        assert_eq!(Endpoint::parse("https://h").unwrap(), Endpoint::Https { host: "h".into(), port: 443 });
        assert_eq!(Endpoint::parse("https://[::1]:8443").unwrap(), Endpoint::Https { host: "::1".into(), port: 8443 });
    }

    #[test]
    fn display_round_trips() {
        for s in ["unix:/tmp/a b.sock", "http://127.0.0.1:8080", "https://[::1]:8443", "https://h.example:443"] {
            let e = Endpoint::parse(s).unwrap();
            assert_eq!(e.to_string(), s);
            assert_eq!(Endpoint::parse(&e.to_string()).unwrap(), e);
        }
    }

    #[test]
    fn rejects_everything_else_clearly() {
        for bad in ["", "/run/forkvmd.sock", "tcp://h:1", "ftp://h:1", "localhost:8080", "HTTP://h:1"] {
            let e = Endpoint::parse(bad).unwrap_err();
            assert!(matches!(e, EndpointError::Scheme(_)), "{bad}: {e}");
            assert!(e.to_string().contains("unix:/path/to.sock"), "{e}");
        }
        for (bad, why) in [
            ("unix:", "no socket path"),
            ("http://h:0", "port"),
            ("http://h:99999", "port"),
            ("http://h:x", "port"),
            ("http://:80", "no host"),
            ("http://h:80/v1", "no path"),
            ("http://u@h:80", "no path"),
            ("http://h:80?x=1", "no path"),
            ("http://::1:80", "brackets"),
            ("http://[::1", "closing"),
            ("http://[::1]x", "junk"),
        ] {
            let e = Endpoint::parse(bad).unwrap_err();
            assert!(e.to_string().contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn resolve_handles_empty_and_explicit() {
        assert_eq!(Endpoint::resolve("  ").unwrap(), None);
        assert_eq!(Endpoint::resolve("http://h:1").unwrap(), Some(http("h", 1)));
        assert!(Endpoint::resolve("nope").is_err());
    }

    #[test]
    fn default_socket_is_in_the_run_root() {
        let Endpoint::Unix(path) = Endpoint::default_socket() else { panic!("not a unix socket") };
        assert_eq!(path, forkvm_api::paths::default_run_root().join("forkvmd.sock"));
    }
}
