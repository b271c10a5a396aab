//! envd, E2B's in-sandbox daemon, served by forkvm on the host: the calls E2B's SDKs make
//! on port 49983 are translated onto the one agent protocol (one vsock connection per
//! call), so no second agent runs in the guest.
//!
//! - [`process`]: `process.Process` (Start, Connect, List, SendSignal, SendInput,
//!   StreamInput, CloseStdin, Update) on the agent's background processes;
//! - [`filesystem`]: `filesystem.Filesystem` (Stat, ListDir, MakeDir, Move, Remove);
//! - [`watch`]: its watching (WatchDir, and the polled CreateWatcher, GetWatcherEvents,
//!   RemoveWatcher) over the agent's inotify watch;
//! - [`files`]: `GET /files` (streamed) and `POST /files` (multipart, streamed);
//! - `GET /health` (204) and `GET /envs` (the sandbox's `envVars`).
//!
//! Commands run, and files are created, as the request's user (`Authorization: Basic
//! <user>:`) or the daemon's E2B default user (`user`); relative paths and `~` resolve
//! against that user's home.

pub mod files;
pub mod filesystem;
pub mod process;
pub mod watch;

use super::connect::RpcError;
use super::records::E2bSandbox;
use super::E2b;
use crate::lifecycle::InUse;
use axum::extract::Request;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use forkvm_proto::AgentClient;
use std::os::unix::net::UnixStream;

/// One envd call: the sandbox, its user, and its agent (kept from idle pause while held).
#[derive(Debug)]
pub struct Call {
    pub e2b: E2b,
    pub rec: E2bSandbox,
    pub user: String,
    pub agent: AgentClient<UnixStream>,
    pub in_use: InUse,
}

impl Call {
    /// The user's home.
    pub fn home(&self) -> String {
        home_of(&self.user)
    }

    /// `path` as the guest's absolute path: `~` and relative paths under the home.
    pub fn resolve(&self, path: &str) -> Result<String, RpcError> {
        resolve(path, &self.home())
    }
}

/// The home of `user` by E2B's convention (`/home/<user>`; `/root` for root).
pub fn home_of(user: &str) -> String {
    if user == "root" {
        "/root".into()
    } else {
        format!("/home/{user}")
    }
}

/// `path` made absolute against `home`; an empty path or a NUL is refused.
pub fn resolve(path: &str, home: &str) -> Result<String, RpcError> {
    if path.is_empty() || path.contains('\0') {
        return Err(RpcError::invalid(format!("path {path:?} is empty or holds a NUL")));
    }
    Ok(if path == "~" {
        home.to_string()
    } else if let Some(rest) = path.strip_prefix("~/") {
        format!("{home}/{rest}")
    } else if path.starts_with('/') {
        path.to_string()
    } else {
        format!("{home}/{path}")
    })
}

/// The user a request names (`Authorization: Basic base64("<user>:")`), if any.
pub fn basic_user(headers: &HeaderMap) -> Result<Option<String>, RpcError> {
    let Some(value) = headers.get("authorization").and_then(|v| v.to_str().ok()) else { return Ok(None) };
    let Some(b64) = value.strip_prefix("Basic ") else { return Ok(None) };
    let bad = || RpcError::new("unauthenticated", "the Authorization header names no user");
    let decoded = base64::engine::general_purpose::STANDARD.decode(b64.trim()).map_err(|_| bad())?;
    let text = String::from_utf8(decoded).map_err(|_| bad())?;
    match text.split(':').next().unwrap_or_default() {
        "" => Ok(None),
        user => checked_user(user).map(Some),
    }
}

/// A `username` query parameter (the `/files` calls name the user there).
pub fn checked_user(name: &str) -> Result<String, RpcError> {
    if name.is_empty() || name.len() > 32 || !name.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c)) {
        return Err(RpcError::invalid(format!("user {name:?} is not a user name")));
    }
    Ok(name.to_string())
}

/// Opens a call on sandbox `rec` as `user` (resuming it if the daemon paused it idle).
pub async fn open(e2b: &E2b, rec: &E2bSandbox, user: String) -> Result<Call, RpcError> {
    let id = rec.id.clone();
    let (record, in_use) = e2b
        .app
        .blocking(move |s| crate::lifecycle::use_sandbox(&s, &id))
        .await
        .map_err(|e| RpcError::new("unavailable", e.message))?;
    let agent = AgentClient::vsock_uds(record.vsock(), forkvm_sandbox::guest::AGENT_PORT);
    Ok(Call { e2b: e2b.clone(), rec: rec.clone(), user, agent, in_use })
}

/// Serves one request to envd.
pub async fn serve(e2b: E2b, rec: E2bSandbox, req: Request) -> Response {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    if path == "/health" && method == Method::GET {
        return StatusCode::NO_CONTENT.into_response();
    }
    if path == "/envs" && method == Method::GET {
        return axum::Json(&rec.env_vars).into_response();
    }
    let user = match basic_user(req.headers()) {
        Ok(u) => u.unwrap_or_else(|| e2b.config.default_user.clone()),
        Err(e) => return e.into_response(),
    };
    if path == "/files" {
        return files::serve(e2b, rec, user, req).await;
    }
    if method != Method::POST {
        return RpcError::new("unimplemented", format!("{method} {path}: envd's calls are POSTs")).into_response();
    }
    if let Some(rpc) = path.strip_prefix("/process.Process/") {
        return process::serve(e2b, rec, user, rpc, req).await;
    }
    match path.strip_prefix("/filesystem.Filesystem/") {
        Some(rpc) => filesystem::serve(e2b, rec, user, rpc, req).await,
        None => RpcError::unimplemented(format!("envd has no {path}")).into_response(),
    }
}

/// The body of a request, at most `max` bytes.
pub async fn body_bytes(req: Request, max: usize) -> Result<axum::body::Bytes, RpcError> {
    axum::body::to_bytes(req.into_body(), max)
        .await
        .map_err(|e| RpcError::new("resource_exhausted", format!("reading the request: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::headers;

    #[test]
    fn paths_resolve_against_the_home() {
        assert_eq!(resolve("~", "/home/user").unwrap(), "/home/user");
        assert_eq!(resolve("~/a/b", "/home/user").unwrap(), "/home/user/a/b");
        assert_eq!(resolve("a.txt", "/home/user").unwrap(), "/home/user/a.txt");
        assert_eq!(resolve("/etc/x", "/home/user").unwrap(), "/etc/x");
        assert!(resolve("", "/home/user").is_err() && resolve("a\0b", "/h").is_err());
        assert_eq!(home_of("root"), "/root");
    }

    #[test]
    fn the_user_comes_from_basic_auth() {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let user = |v: String| basic_user(&headers(&[("authorization", v.as_str())]));
        assert_eq!(user(format!("Basic {}", b64("root:"))).unwrap(), Some("root".into()));
        assert_eq!(user(format!("Basic {}", b64(":"))).unwrap(), None);
        assert!(user(format!("Basic {}", b64("a b:"))).is_err());
        assert!(user("Basic !!".into()).is_err());
        assert_eq!(basic_user(&headers(&[])).unwrap(), None);
    }
}
