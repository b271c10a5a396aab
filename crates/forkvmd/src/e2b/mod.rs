//! The E2B face: E2B's own SDKs (`e2b`, `e2b-code-interpreter` on PyPI and npm), pointed
//! at forkvm with `E2B_API_URL` and `E2B_SANDBOX_URL`, work unchanged (docs/e2b.md; the
//! wire contract is `../shared/reference/e2b-api.md`).
//!
//! Two listeners, both off by default:
//! - `--e2b-api ADDR`: the control plane ([`control`]), behind the operator's API keys;
//! - `--e2b-sandbox ADDR`: the data plane front ([`front`]), which routes on the
//!   `E2b-Sandbox-Id` / `E2b-Sandbox-Port` headers (or a `<port>-<id>.<domain>` Host),
//!   checks the sandbox's `X-Access-Token`, and serves port 49983 as **envd** itself
//!   ([`envd`]: Connect-JSON RPCs for processes and the file system, `/files`,
//!   `/health`, `/envs`), translated onto the one agent protocol; other ports go to the
//!   guest's own.
//!
//! What E2B keeps per sandbox beyond the registry (token, metadata, env, lifetime) is in
//! [`records`]; lifetimes end in [`expiry`]; [`metrics_history`] samples them.
//!
//! The design makes one thing awkward, said here rather than hidden: a forkvm sandbox's
//! TTL archives, while E2B's lifetime kills (or pauses), so E2B sandboxes carry no TTL
//! of the registry's and the E2B face ends them itself.

pub mod code_envs;
pub mod connect;
pub mod control;
pub mod envd;
pub mod expiry;
pub mod front;
pub mod metrics_history;
pub mod records;
pub mod wire;

use crate::state::AppState;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use subtle::ConstantTimeEq;

/// The port E2B's SDKs reach envd on.
pub const ENVD_PORT: u16 = 49983;

/// The operator's settings for the E2B face.
#[derive(Debug, Clone, Default)]
pub struct E2bConfig {
    /// Where the control plane listens.
    pub api: Option<SocketAddr>,
    /// Where the data plane front listens.
    pub sandbox: Option<SocketAddr>,
    /// The API keys clients may send (one per line of `--e2b-api-keys FILE`).
    pub api_keys: Vec<String>,
    /// `templateID` → forkvm tag (`--e2b-template NAME=TAG`); a name not listed is a tag.
    pub templates: BTreeMap<String, String>,
    /// The guest user envd runs commands as when the client names none (E2B: `user`).
    pub default_user: String,
    /// The domain sandboxes' hosts are under (`<port>-<id>.<domain>`), given to clients
    /// as `domain` and used to route by Host.
    pub domain: Option<String>,
    /// PEM certificate and key: both listeners speak TLS (`--e2b-tls-cert/-key`).
    pub tls: Option<(PathBuf, PathBuf)>,
}

#[derive(Debug, thiserror::Error)]
pub enum E2bConfigError {
    #[error("--e2b-api needs --e2b-api-keys FILE: E2B's API is never served without a key")]
    NoKeys,
    #[error("reading the E2B API keys from {path}: {source}")]
    ReadKeys { path: PathBuf, source: std::io::Error },
    #[error("{path} holds no API key (one per line)")]
    EmptyKeys { path: PathBuf },
    #[error("an API key in {path} is shorter than 16 characters")]
    ShortKey { path: PathBuf },
    #[error("--e2b-template {0:?}: use NAME=TAG")]
    Template(String),
}

impl E2bConfig {
    /// Reads the keys of `path`: one per line, blank lines and `#` comments skipped.
    pub fn read_keys(path: &Path) -> Result<Vec<String>, E2bConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| E2bConfigError::ReadKeys { path: path.to_path_buf(), source })?;
        let keys: Vec<String> =
            text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(String::from).collect();
        if keys.is_empty() {
            return Err(E2bConfigError::EmptyKeys { path: path.to_path_buf() });
        }
        if keys.iter().any(|k| k.len() < 16) {
            return Err(E2bConfigError::ShortKey { path: path.to_path_buf() });
        }
        Ok(keys)
    }

    /// Parses `NAME=TAG`.
    pub fn parse_template(arg: &str) -> Result<(String, String), E2bConfigError> {
        match arg.split_once('=') {
            Some((name, tag)) if !name.is_empty() && !tag.is_empty() => Ok((name.to_string(), tag.to_string())),
            _ => Err(E2bConfigError::Template(arg.to_string())),
        }
    }

    /// Whether `given` is one of the keys (each compared in constant time).
    pub fn api_key_matches(&self, given: &[u8]) -> bool {
        let mut ok = subtle::Choice::from(0);
        for k in &self.api_keys {
            ok |= k.as_bytes().ct_eq(given);
        }
        !given.is_empty() && bool::from(ok)
    }

    /// The forkvm tag for a `templateID`: the operator's mapping, else the name itself
    /// (E2B's `name:tag` and `team/name` forms are the name before the colon, without
    /// the team).
    pub fn tag_for(&self, template_id: &str) -> String {
        if let Some(tag) = self.templates.get(template_id) {
            return tag.clone();
        }
        let name = template_id.rsplit('/').next().unwrap_or(template_id);
        let name = name.split(':').next().unwrap_or(name);
        self.templates.get(name).cloned().unwrap_or_else(|| name.to_string())
    }
}

/// The state both E2B listeners share.
#[derive(Debug, Clone)]
pub struct E2b {
    pub app: AppState,
    pub config: Arc<E2bConfig>,
    /// What envd was asked to start (List reports it).
    pub processes: envd::process::Processes,
    /// The polled file-system watchers envd's clients created.
    pub watchers: envd::watch::Watchers,
    /// Each running sandbox's metrics over the last hour.
    pub metrics_history: metrics_history::History,
}

/// Starts the configured listeners and the lifetime tick; returns their addresses. The
/// listeners serve under the daemon's connection limits (header timeout, connection cap,
/// accept backoff), each with a cap of its own.
pub async fn start(
    app: AppState,
    config: E2bConfig,
    limits: crate::serve::ConnLimits,
) -> Result<Vec<SocketAddr>, crate::serve::ServeError> {
    use crate::serve::{ServeError, TcpServe};
    if config.api.is_none() && config.sandbox.is_none() {
        return Ok(Vec::new());
    }
    records::create_table(&app.db()).map_err(|e| ServeError::Listen {
        what: "the E2B table".into(),
        source: std::io::Error::other(e.to_string()),
    })?;
    // Read before anything listens: a bad certificate is a start-up error.
    let tls = match &config.tls {
        Some((cert, key)) => Some(crate::serve::tls_acceptor(cert, key)?),
        None => None,
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    let e2b = E2b {
        app,
        config: Arc::new(config),
        processes: Default::default(),
        watchers: Default::default(),
        metrics_history: Default::default(),
    };
    let mut bound = Vec::new();
    for (addr, router, what) in [
        (e2b.config.api, control::router(e2b.clone()), "E2B API"),
        (e2b.config.sandbox, front::router(e2b.clone()), "E2B sandbox front"),
    ] {
        let Some(addr) = addr else { continue };
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| ServeError::Listen { what: format!("{what} {addr}"), source })?;
        let local = listener.local_addr().unwrap_or(addr);
        println!("forkvmd {what} listening on {scheme}://{local}");
        bound.push(local);
        let serve = TcpServe { listener, app: router, tls: tls.clone() };
        tokio::spawn(crate::serve::run(None, Some(serve), limits, None, std::future::pending()));
    }
    tokio::spawn(metrics_history::schedule(e2b.clone()));
    tokio::spawn(expiry::schedule(e2b));
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_templates_and_tags() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("keys");
        std::fs::write(&f, "# ops\ne2b_0123456789abcdef\n\n e2b_fedcba9876543210 \n").unwrap();
        let keys = E2bConfig::read_keys(&f).unwrap();
        assert_eq!(keys, ["e2b_0123456789abcdef", "e2b_fedcba9876543210"]);
        std::fs::write(&f, "short\n").unwrap();
        assert!(matches!(E2bConfig::read_keys(&f), Err(E2bConfigError::ShortKey { .. })));
        std::fs::write(&f, "# nothing\n").unwrap();
        assert!(matches!(E2bConfig::read_keys(&f), Err(E2bConfigError::EmptyKeys { .. })));

        let c = E2bConfig {
            api_keys: keys,
            templates: [E2bConfig::parse_template("base=py").unwrap()].into(),
            ..E2bConfig::default()
        };
        assert!(c.api_key_matches(b"e2b_fedcba9876543210"));
        assert!(!c.api_key_matches(b"e2b_fedcba987654321"));
        assert!(!c.api_key_matches(b""));
        assert_eq!(c.tag_for("base"), "py");
        assert_eq!(c.tag_for("team/base:v2"), "py");
        assert_eq!(c.tag_for("other"), "other");
        assert!(E2bConfig::parse_template("base").is_err());
        assert!(E2bConfig::parse_template("=x").is_err());
    }
}
