//! `filesystem.Filesystem`'s watching, over the agent's `watch` (inotify in the guest):
//! `WatchDir` streams envd's `start`, `filesystem` and `keepalive` messages (the async
//! SDKs); `CreateWatcher` / `GetWatcherEvents` / `RemoveWatcher` keep the changes here
//! between polls (the sync SDKs).
//!
//! A polled watcher buffers at most [`MAX_BUFFERED`] changes and the daemon holds at
//! most [`MAX_WATCHERS`]: a client that stops polling cannot grow the daemon. Changes
//! lost (to that cap, or to the guest kernel's queue overflowing) end the watch with
//! `resource_exhausted` rather than leaving a silent gap; so does the watched directory
//! going away (`not_found`). A watched sandbox is in use: the daemon does not pause it
//! idle, since a paused guest would see no changes to report.

use super::{open, Call};
use crate::e2b::connect::{self, RpcError};
use crate::e2b::records::E2bSandbox;
use crate::e2b::E2b;
use axum::body::Bytes;
use axum::response::{IntoResponse, Response};
use forkvm_proto::{ChangeKind, WatchMessage, WatchRequest};
use serde::Deserialize;
use std::collections::{HashMap, VecDeque};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

type WatchStream = forkvm_proto::WatchStream<UnixStream>;

/// Changes one polled watcher keeps between polls.
pub const MAX_BUFFERED: usize = 10_000;
/// Polled watchers the daemon keeps, over all sandboxes.
pub const MAX_WATCHERS: usize = 1024;

#[derive(Debug, Deserialize)]
struct WatchDirRequest {
    path: String,
    #[serde(default)]
    recursive: bool,
    #[serde(default, rename = "includeEntry", alias = "include_entry")]
    include_entry: bool,
}

#[derive(Debug, Deserialize)]
struct WatcherRequest {
    #[serde(rename = "watcherId", alias = "watcher_id")]
    watcher_id: String,
}

/// envd's `FilesystemEvent`.
fn fs_event(kind: ChangeKind, path: &str) -> serde_json::Value {
    let t = match kind {
        ChangeKind::Create => "EVENT_TYPE_CREATE",
        ChangeKind::Write => "EVENT_TYPE_WRITE",
        ChangeKind::Remove => "EVENT_TYPE_REMOVE",
        ChangeKind::Rename => "EVENT_TYPE_RENAME",
        ChangeKind::Chmod => "EVENT_TYPE_CHMOD",
    };
    serde_json::json!({ "name": path, "type": t })
}

fn overflowed() -> RpcError {
    RpcError::new("resource_exhausted", "changes were lost: the guest's inotify queue overflowed; watch again")
}

/// Starts the agent's watch for `req` on `call` (blocking until it is armed).
fn start_watch(call: &Call, path: &str, recursive: bool) -> Result<WatchStream, RpcError> {
    let path = call.resolve(path)?;
    let (stream, _) = call.agent.watch(&WatchRequest { path, recursive })?;
    Ok(stream)
}

fn parse_watch(body: &[u8], streaming: bool) -> Result<WatchDirRequest, RpcError> {
    let r: WatchDirRequest = if streaming { connect::stream_request(body)? } else { connect::unary_request(body)? };
    if r.include_entry {
        return Err(RpcError::unimplemented("include_entry: watch events carry no entry info yet (docs/e2b.md)"));
    }
    Ok(r)
}

/// `WatchDir`: the changes as a server stream, until the client goes away.
pub async fn watch_dir(e2b: E2b, rec: E2bSandbox, user: String, body: Bytes) -> Response {
    let req = match parse_watch(&body, true) {
        Ok(r) => r,
        Err(e) => return connect::stream_error(e),
    };
    let call = match open(&e2b, &rec, user).await {
        Ok(c) => c,
        Err(e) => return connect::stream_error(e),
    };
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    tokio::task::spawn_blocking(move || {
        let mut stream = match start_watch(&call, &req.path, req.recursive) {
            Ok(s) => s,
            Err(e) => {
                let _ = tx.blocking_send(connect::end_stream(Some(&e)));
                return;
            }
        };
        let send = |m: serde_json::Value| tx.blocking_send(connect::message(&m)).is_ok();
        if !send(serde_json::json!({ "start": {} })) {
            return;
        }
        let end = loop {
            let delivered = match stream.recv() {
                Ok(Some(WatchMessage::Change { kind, path })) => {
                    send(serde_json::json!({ "filesystem": fs_event(kind, &path) }))
                }
                Ok(Some(WatchMessage::Keepalive)) => send(serde_json::json!({ "keepalive": {} })),
                Ok(Some(WatchMessage::Armed { .. })) => true,
                Ok(Some(WatchMessage::Overflow)) => break Some(overflowed()),
                Ok(None) => break Some(RpcError::not_found(format!("{} is gone: the watch ended", req.path))),
                Err(e) => break Some(RpcError::from(e)),
            };
            if !delivered {
                // The client went away: end the watch in the guest too.
                let _ = stream.stop();
                return;
            }
        };
        drop(call);
        let _ = tx.blocking_send(connect::end_stream(end.as_ref()));
    });
    connect::stream_response(rx)
}

/// What a polled watcher saw since the last poll.
#[derive(Debug, Default)]
struct Buffer {
    changes: VecDeque<serde_json::Value>,
    /// Why the watch ended, once it has.
    ended: Option<RpcError>,
}

#[derive(Debug)]
struct Watcher {
    sandbox: String,
    buffer: Arc<Mutex<Buffer>>,
    stop: Arc<AtomicBool>,
}

/// The polled watchers, by id.
#[derive(Debug, Clone, Default)]
pub struct Watchers(Arc<Mutex<HashMap<String, Watcher>>>);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The watch loop of a polled watcher: changes into its buffer until it is removed, the
/// buffer overflows or the watch ends.
fn pump(call: Call, mut stream: WatchStream, buffer: Arc<Mutex<Buffer>>, stop: Arc<AtomicBool>) {
    let end = loop {
        if stop.load(Ordering::SeqCst) {
            let _ = stream.stop();
            return;
        }
        match stream.recv() {
            Ok(Some(WatchMessage::Change { kind, path })) => {
                let mut b = lock(&buffer);
                if b.changes.len() >= MAX_BUFFERED {
                    break RpcError::new(
                        "resource_exhausted",
                        format!("more than {MAX_BUFFERED} changes were not fetched: watch again and poll sooner"),
                    );
                }
                b.changes.push_back(fs_event(kind, &path));
            }
            Ok(Some(WatchMessage::Keepalive | WatchMessage::Armed { .. })) => {}
            Ok(Some(WatchMessage::Overflow)) => break overflowed(),
            Ok(None) => break RpcError::not_found("the watched directory is gone: the watch ended"),
            Err(e) => break RpcError::from(e),
        }
    };
    drop(stream);
    drop(call);
    lock(&buffer).ended = Some(end);
}

impl Watchers {
    async fn create(
        &self,
        e2b: E2b,
        rec: E2bSandbox,
        user: String,
        body: Bytes,
    ) -> Result<serde_json::Value, RpcError> {
        let req = parse_watch(&body, false)?;
        if !self.has_room() {
            return Err(RpcError::new(
                "resource_exhausted",
                format!("{MAX_WATCHERS} watchers exist: remove one first"),
            ));
        }
        let id =
            crate::e2b::records::new_access_token().map_err(|e| RpcError::internal(e.to_string()))?[..16].to_string();
        let call = open(&e2b, &rec, user).await?;
        let (buffer, stop) = (Arc::new(Mutex::new(Buffer::default())), Arc::new(AtomicBool::new(false)));
        let (b, s) = (buffer.clone(), stop.clone());
        tokio::task::spawn_blocking(move || -> Result<(), RpcError> {
            let stream = start_watch(&call, &req.path, req.recursive)?;
            std::thread::Builder::new()
                .name("e2b-watcher".into())
                .spawn(move || pump(call, stream, b, s))
                .map_err(|e| RpcError::internal(format!("starting the watcher thread: {e}")))?;
            Ok(())
        })
        .await
        .map_err(|e| RpcError::internal(e.to_string()))??;
        lock(&self.0).insert(id.clone(), Watcher { sandbox: rec.id.clone(), buffer, stop });
        Ok(serde_json::json!({ "watcherId": id }))
    }

    /// Whether another watcher fits; watchers that ended and were never polled again
    /// make room first.
    fn has_room(&self) -> bool {
        let mut all = lock(&self.0);
        if all.len() >= MAX_WATCHERS {
            all.retain(|_, w| lock(&w.buffer).ended.is_none());
        }
        all.len() < MAX_WATCHERS
    }

    fn events(&self, rec: &E2bSandbox, body: &[u8]) -> Result<serde_json::Value, RpcError> {
        let r: WatcherRequest = connect::unary_request(body)?;
        let mut all = lock(&self.0);
        let w = all.get(&r.watcher_id).filter(|w| w.sandbox == rec.id).ok_or_else(|| unknown(&r.watcher_id))?;
        let mut b = lock(&w.buffer);
        if b.changes.is_empty() {
            if let Some(end) = b.ended.take() {
                drop(b);
                all.remove(&r.watcher_id);
                return Err(end);
            }
        }
        let events: Vec<serde_json::Value> = b.changes.drain(..).collect();
        Ok(serde_json::json!({ "events": events }))
    }

    fn remove(&self, rec: &E2bSandbox, body: &[u8]) -> Result<serde_json::Value, RpcError> {
        let r: WatcherRequest = connect::unary_request(body)?;
        let mut all = lock(&self.0);
        if all.get(&r.watcher_id).is_none_or(|w| w.sandbox != rec.id) {
            return Err(unknown(&r.watcher_id));
        }
        if let Some(w) = all.remove(&r.watcher_id) {
            w.stop.store(true, Ordering::SeqCst);
        }
        Ok(serde_json::json!({}))
    }
}

fn unknown(id: &str) -> RpcError {
    RpcError::not_found(format!("no watcher {id:?} in this sandbox"))
}

/// Serves the watcher calls (`rpc` is one of them) with the request's `body`.
pub async fn serve(e2b: E2b, rec: E2bSandbox, user: String, rpc: &str, body: Bytes) -> Response {
    let watchers = e2b.watchers.clone();
    let answer = match rpc {
        "WatchDir" => return watch_dir(e2b, rec, user, body).await,
        "CreateWatcher" => watchers.create(e2b, rec, user, body).await,
        "GetWatcherEvents" => watchers.events(&rec, &body),
        "RemoveWatcher" => watchers.remove(&rec, &body),
        other => Err(RpcError::unimplemented(format!("filesystem.Filesystem has no {other}"))),
    };
    match answer {
        Ok(v) => connect::unary(&v),
        Err(e) => e.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_look_like_envds_events() {
        assert_eq!(
            fs_event(ChangeKind::Create, "a/b"),
            serde_json::json!({"name": "a/b", "type": "EVENT_TYPE_CREATE"})
        );
        assert_eq!(fs_event(ChangeKind::Chmod, "c")["type"], "EVENT_TYPE_CHMOD");
        let r: WatchDirRequest = connect::unary_request(br#"{"path": "/x", "recursive": true}"#).unwrap();
        assert!(r.recursive && !r.include_entry);
        assert_eq!(parse_watch(br#"{"path": "/x", "includeEntry": true}"#, false).unwrap_err().code, "unimplemented");
        let w: WatcherRequest = connect::unary_request(br#"{"watcherId": "ab"}"#).unwrap();
        assert_eq!(w.watcher_id, "ab");
    }
}
