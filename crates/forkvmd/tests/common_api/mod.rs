//! What the REST API test binaries (`api_contract`, `api_snapshots`, `api_lifecycle`)
//! share: a daemon app in process over a temporary directory, with a bearer token and an
//! audit log; requests against it; and a sandbox record whose VMM "is" the test process.

// Each test binary uses only a subset of these helpers.
#![allow(dead_code)]

use axum::body::Body;
use axum::http::{Request, StatusCode};
use forkvm_api::ErrorBody;
use forkvm_sandbox::{Registry, SandboxRecord};
use forkvm_snapshot::chain::AssembledCache;
use forkvm_snapshot::Store;
use forkvmd::audit::AuditLog;
use forkvmd::auth::Token;
use forkvmd::db::Db;
use forkvmd::gate::Gate;
use forkvmd::AppState;
use tower::ServiceExt;

pub const TOKEN: &str = "test-token-0123456789abcdef";

pub struct Env {
    pub dir: tempfile::TempDir,
    pub state: AppState,
    pub audit: std::path::PathBuf,
    pub app: axum::Router,
}

pub fn env() -> Env {
    let dir = tempfile::tempdir().unwrap();
    let registry = Registry::open(dir.path().join("run"));
    let store = Store::open(dir.path().join("store"));
    let db = Db::open(&dir.path().join("state.db")).unwrap();
    // The assembled-image cache of this test, not the user's.
    let cache = AssembledCache::new(&dir.path().join("cache"));
    let state = AppState::with_cache(registry, store, cache, db, None, 4);
    let audit = dir.path().join("audit.log");
    let log = AuditLog::open(&audit).unwrap();
    let gate = Gate::tcp(Token::new(TOKEN).unwrap(), &[], &[], Some(log.clone()));
    let app = forkvmd::serve::wrap(forkvmd::app(state.clone()), gate, Some(log));
    Env { dir, state, audit, app }
}

pub async fn call(
    app: &axum::Router,
    method: &str,
    uri: &str,
    token: Option<&str>,
    body: &str,
) -> (StatusCode, String) {
    // What a client of the TCP listener sends: a Host naming it, JSON typed as JSON.
    let mut b = Request::builder().method(method).uri(uri).header("host", "127.0.0.1:8889");
    if !body.is_empty() && body != "bytes" {
        b = b.header("content-type", "application/json");
    }
    if let Some(t) = token {
        b = b.header("authorization", format!("Bearer {t}"));
    }
    let resp = app.clone().oneshot(b.body(Body::from(body.to_string())).unwrap()).await.unwrap();
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20).await.unwrap();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

/// A request with exactly these headers (no defaults added).
pub async fn call_with(
    app: &axum::Router,
    method: &str,
    uri: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (StatusCode, String) {
    let mut b = Request::builder().method(method).uri(uri);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let resp = app.clone().oneshot(b.body(Body::from(body.to_string())).unwrap()).await.unwrap();
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20).await.unwrap();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

pub fn error_of(body: &str) -> ErrorBody {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not an error body ({e}): {body}"))
}

pub async fn get_json<T: serde::de::DeserializeOwned>(e: &Env, uri: &str) -> T {
    let (status, text) = call(&e.app, "GET", uri, Some(TOKEN), "").await;
    assert_eq!(status, StatusCode::OK, "GET {uri}: {text}");
    serde_json::from_str(&text).unwrap_or_else(|err| panic!("GET {uri} ({err}): {text}"))
}

/// Registers a running sandbox `id` whose VMM is this process (so it counts as alive).
pub fn fake_running(e: &Env, id: &str, source_tag: Option<&str>, forked_from: Option<&str>) {
    fake_started(e, id, source_tag, forked_from);
    e.state.registry.mark_ready(&[id]).unwrap();
}

/// Registers sandbox `id` whose VMM is this process, still `starting` (owned by this
/// process, so nobody thinks its start abandoned).
pub fn fake_started(e: &Env, id: &str, source_tag: Option<&str>, forked_from: Option<&str>) {
    let run_dir = e.state.registry.create_run_dir(id).unwrap();
    let record = SandboxRecord {
        id: id.into(),
        pid: std::process::id() as i32,
        run_dir,
        template: None,
        source_tag: source_tag.map(String::from),
        forked_from: forked_from.map(String::from),
        created_at_unix_ms: 0,
        memory_limit_bytes: None,
        cpu_millis: None,
        pids_max: None,
        io_limits: Default::default(),
        cgroup: None,
        disks: Vec::new(),
        uid: None,
        network: None,
        vcpus: 1,
    };
    e.state.registry.write(&record).unwrap();
}
