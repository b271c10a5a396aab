//! `filesystem.Filesystem`: Stat, ListDir, MakeDir, Move and Remove through the agent's
//! file requests, paths resolved against the call's user's home, directories made
//! owned by that user. Watching (WatchDir and the watcher calls) is [`super::watch`].

use super::{open, Call};
use crate::e2b::connect::{self, RpcError};
use crate::e2b::records::E2bSandbox;
use crate::e2b::wire::rfc3339;
use crate::e2b::E2b;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use forkvm_proto::{ErrorKind, FileInfo, FileType, MkdirRequest};
use serde::Deserialize;

/// Largest request body.
const MAX_REQUEST: usize = 1 << 20;
/// The most entries one ListDir answers (a deeper or larger tree is cut, not buffered).
const MAX_ENTRIES: usize = 100_000;
/// The deepest ListDir walks.
const MAX_DEPTH: u32 = 32;

#[derive(Debug, Deserialize)]
struct PathRequest {
    path: String,
    #[serde(default)]
    depth: Option<u32>,
}

#[derive(Debug, Deserialize)]
struct MoveRequest {
    source: String,
    destination: String,
}

/// `ls -l`'s permission string for a mode and type.
fn permissions(file_type: FileType, mode: u32) -> String {
    let kind = match file_type {
        FileType::Dir => 'd',
        FileType::Symlink => 'l',
        _ => '-',
    };
    let bit = |b: u32, c: char| if mode & b != 0 { c } else { '-' };
    [
        kind,
        bit(0o400, 'r'),
        bit(0o200, 'w'),
        bit(0o100, 'x'),
        bit(0o040, 'r'),
        bit(0o020, 'w'),
        bit(0o010, 'x'),
        bit(0o004, 'r'),
        bit(0o002, 'w'),
        bit(0o001, 'x'),
    ]
    .iter()
    .collect()
}

/// envd's `EntryInfo` for `info` at absolute `path`.
pub fn entry(info: &FileInfo, path: &str) -> serde_json::Value {
    let kind = match info.file_type {
        FileType::Dir => "FILE_TYPE_DIRECTORY",
        FileType::Symlink => "FILE_TYPE_SYMLINK",
        _ => "FILE_TYPE_FILE",
    };
    let mtime_ms = u64::try_from(info.mtime_unix_ns / 1_000_000).unwrap_or(0);
    let mut entry = serde_json::json!({
        "name": info.name,
        "type": kind,
        "path": path,
        "size": info.size.to_string(),
        "mode": info.mode,
        "permissions": permissions(info.file_type, info.mode),
        "owner": info.owner.as_deref().unwrap_or_default(),
        "group": info.group.as_deref().unwrap_or_default(),
        "modifiedTime": rfc3339(mtime_ms),
        "isSymlink": info.file_type == FileType::Symlink,
    });
    if let Some(target) = &info.symlink_target {
        entry["symlinkTarget"] = target.as_str().into();
    }
    entry
}

fn join(dir: &str, name: &str) -> String {
    if dir.ends_with('/') {
        format!("{dir}{name}")
    } else {
        format!("{dir}/{name}")
    }
}

fn stat(call: &Call, path: &str) -> Result<serde_json::Value, RpcError> {
    let info = call.agent.stat(path)?;
    Ok(entry(&info, path))
}

fn list_dir(call: &Call, path: &str, depth: u32) -> Result<serde_json::Value, RpcError> {
    let top = call.agent.stat(path)?;
    if top.file_type != FileType::Dir {
        return Err(RpcError::invalid(format!("path {path} is not a directory")));
    }
    let mut entries = Vec::new();
    let mut dirs = vec![(path.to_string(), 1u32)];
    while let Some((dir, level)) = dirs.pop() {
        for info in call.agent.list(&dir)? {
            let p = join(&dir, &info.name);
            if info.file_type == FileType::Dir && level < depth {
                dirs.push((p.clone(), level + 1));
            }
            entries.push(entry(&info, &p));
            if entries.len() >= MAX_ENTRIES {
                return Err(RpcError::new(
                    "resource_exhausted",
                    format!("more than {MAX_ENTRIES} entries under {path}"),
                ));
            }
        }
    }
    Ok(serde_json::json!({ "entries": entries }))
}

fn make_dir(call: &Call, path: &str) -> Result<serde_json::Value, RpcError> {
    match call.agent.stat(path) {
        Ok(_) => return Err(RpcError::new("already_exists", format!("directory {path} already exists"))),
        Err(forkvm_proto::ClientError::Agent(e)) if e.kind == ErrorKind::NotFound => {}
        Err(e) => return Err(e.into()),
    }
    call.agent.mkdir(&MkdirRequest { path: path.into(), parents: true, mode: None, owner: Some(call.user.clone()) })?;
    Ok(serde_json::json!({ "entry": stat(call, path)? }))
}

pub async fn serve(e2b: E2b, rec: E2bSandbox, user: String, rpc: &str, req: Request) -> Response {
    let body = match super::body_bytes(req, MAX_REQUEST).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    if matches!(rpc, "WatchDir" | "CreateWatcher" | "GetWatcherEvents" | "RemoveWatcher") {
        return super::watch::serve(e2b, rec, user, rpc, body).await;
    }
    let call = match open(&e2b, &rec, user).await {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    let rpc = rpc.to_string();
    let answer = tokio::task::spawn_blocking(move || -> Result<serde_json::Value, RpcError> {
        match rpc.as_str() {
            "Stat" => {
                let r: PathRequest = connect::unary_request(&body)?;
                Ok(serde_json::json!({ "entry": stat(&call, &call.resolve(&r.path)?)? }))
            }
            "ListDir" => {
                let r: PathRequest = connect::unary_request(&body)?;
                let depth = r.depth.unwrap_or(1).clamp(1, MAX_DEPTH);
                list_dir(&call, &call.resolve(&r.path)?, depth)
            }
            "MakeDir" => {
                let r: PathRequest = connect::unary_request(&body)?;
                make_dir(&call, &call.resolve(&r.path)?)
            }
            "Move" => {
                let r: MoveRequest = connect::unary_request(&body)?;
                let (from, to) = (call.resolve(&r.source)?, call.resolve(&r.destination)?);
                call.agent.rename(&from, &to)?;
                Ok(serde_json::json!({ "entry": stat(&call, &to)? }))
            }
            "Remove" => {
                let r: PathRequest = connect::unary_request(&body)?;
                call.agent.remove(&call.resolve(&r.path)?, true)?;
                Ok(serde_json::json!({}))
            }
            other => Err(RpcError::unimplemented(format!("filesystem.Filesystem has no {other}"))),
        }
    })
    .await;
    match answer {
        Ok(Ok(v)) => connect::unary(&v),
        Ok(Err(e)) => e.into_response(),
        Err(e) => RpcError::internal(e.to_string()).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_look_like_envds() {
        let info = FileInfo {
            name: "a.txt".into(),
            file_type: FileType::File,
            size: 5,
            mode: 0o644,
            mtime_unix_ns: 1_000_000_000_000,
            owner: Some("user".into()),
            group: Some("users".into()),
            symlink_target: None,
        };
        let e = entry(&info, "/home/user/a.txt");
        assert_eq!((e["owner"].as_str(), e["group"].as_str()), (Some("user"), Some("users")));
        assert!(e.get("symlinkTarget").is_none());
        let link = FileInfo {
            file_type: FileType::Symlink,
            symlink_target: Some("a.txt".into()),
            owner: None,
            ..info.clone()
        };
        let l = entry(&link, "/home/user/l");
        assert_eq!((l["symlinkTarget"].as_str(), l["owner"].as_str()), (Some("a.txt"), Some("")));
        assert_eq!(e["type"], "FILE_TYPE_FILE");
        assert_eq!(e["size"], "5");
        assert_eq!(e["permissions"], "-rw-r--r--");
        assert_eq!(e["modifiedTime"], "1970-01-01T00:16:40.000Z");
        assert_eq!(permissions(FileType::Dir, 0o755), "drwxr-xr-x");
        assert_eq!(join("/", "x"), "/x");
    }
}
