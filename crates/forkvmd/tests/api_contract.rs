//! The REST contract in process (no KVM, no sandboxes): every route of the table answers
//! 401 over TCP without or with a wrong token, 404 for an unknown sandbox or tag, 400
//! for malformed JSON, unknown fields, bad tags and ids, and 409 with the current state
//! for conflicts; the OpenAPI document lists exactly the routes the router serves.
//! Snapshot chains (info, delete with dependents, compact, pack/unpack) run on synthetic
//! snapshots built with the chain library itself: a base and two diffs over it.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use forkvm_api::routes::{RouteName, ROUTES};
use forkvm_api::ErrorBody;
use forkvm_sandbox::{Registry, SandboxRecord};
use forkvm_snapshot::chain::{self, AssembledCache};
use forkvm_snapshot::{SnapshotDir, Store};
use forkvmd::audit::AuditLog;
use forkvmd::auth::Token;
use forkvmd::db::{Db, SandboxRow};
use forkvmd::AppState;
use tower::ServiceExt;

const TOKEN: &str = "test-token-0123456789abcdef";

struct Env {
    dir: tempfile::TempDir,
    state: AppState,
    audit: std::path::PathBuf,
    app: axum::Router,
}

fn env() -> Env {
    let dir = tempfile::tempdir().unwrap();
    let registry = Registry::open(dir.path().join("run"));
    let store = Store::open(dir.path().join("store"));
    let db = Db::open(&dir.path().join("state.db")).unwrap();
    // The assembled-image cache of this test, not the user's.
    let cache = AssembledCache::new(&dir.path().join("cache"));
    let state = AppState::with_cache(registry, store, cache, db, None, 4);
    let audit = dir.path().join("audit.log");
    let app = forkvmd::serve::wrap(
        forkvmd::app(state.clone()),
        Some(Token::new(TOKEN).unwrap()),
        Some(AuditLog::open(&audit).unwrap()),
    );
    Env { dir, state, audit, app }
}

async fn call(app: &axum::Router, method: &str, uri: &str, token: Option<&str>, body: &str) -> (StatusCode, String) {
    let mut b = Request::builder().method(method).uri(uri);
    if let Some(t) = token {
        b = b.header("authorization", format!("Bearer {t}"));
    }
    let resp = app.clone().oneshot(b.body(Body::from(body.to_string())).unwrap()).await.unwrap();
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20).await.unwrap();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

fn error_of(body: &str) -> ErrorBody {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not an error body ({e}): {body}"))
}

/// A concrete URI for a route, naming `subject` as its sandbox or tag, with the query a
/// files route needs.
fn uri(path: &str, subject: &str, name: RouteName) -> String {
    let p = path.replace("{id}", subject).replace("{tag}", subject);
    match name {
        RouteName::ReadFile | RouteName::WriteFile | RouteName::RemoveFile | RouteName::ListFiles => {
            format!("{p}?path=/tmp/x")
        }
        _ => p,
    }
}

/// A valid body for each route that takes one.
fn good_body(name: RouteName) -> &'static str {
    match name {
        RouteName::CreateSnapshot => r#"{"tag":"t1","template":"python"}"#,
        RouteName::CreateSandboxes => r#"{"snapshot_tag":"nope","n":1}"#,
        RouteName::Exec | RouteName::ExecStream => r#"{"args":["true"]}"#,
        RouteName::Eval => r#"{"code":"1"}"#,
        RouteName::Branch | RouteName::Fork => "{}",
        RouteName::CompactSnapshot => r#"{"to":"x2"}"#,
        RouteName::WriteFile | RouteName::UnpackSnapshot => "bytes",
        RouteName::SetTtl => r#"{"ttl_seconds":5}"#,
        _ => "",
    }
}

#[tokio::test]
async fn every_route_but_healthz_needs_the_token() {
    let e = env();
    for r in ROUTES {
        let u = uri(r.path, "nope", r.name);
        let (none, body) = call(&e.app, r.method, &u, None, good_body(r.name)).await;
        let (wrong, wbody) = call(&e.app, r.method, &u, Some("test-token-0123456789abcdeX"), good_body(r.name)).await;
        let (short, _) = call(&e.app, r.method, &u, Some("test"), good_body(r.name)).await;
        if r.name == RouteName::Health {
            assert_eq!((none, wrong), (StatusCode::OK, StatusCode::OK));
            continue;
        }
        assert_eq!(none, StatusCode::UNAUTHORIZED, "{} {}", r.method, r.path);
        assert_eq!(error_of(&body).error, "missing bearer token");
        assert_eq!(wrong, StatusCode::UNAUTHORIZED, "{} {}", r.method, r.path);
        assert_eq!(error_of(&wbody).error, "invalid bearer token");
        assert_eq!(short, StatusCode::UNAUTHORIZED);
    }
    // Refused requests are audited too.
    let log = std::fs::read_to_string(&e.audit).unwrap();
    assert!(log.lines().count() >= ROUTES.len() * 3);
    let lines: Vec<serde_json::Value> = log.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let line = lines.iter().find(|l| l["path"] == "/v1/sandboxes/nope/exec").unwrap();
    assert_eq!(line["status"], 401);
    assert_eq!(line["sandbox"], "nope");
    assert_eq!(line["method"], "POST");
    assert!(line["ts"].as_str().unwrap().ends_with('Z'));
    assert!(line["latency_us"].is_u64());
}

#[tokio::test]
async fn unknown_sandbox_or_tag_is_404_on_every_route_that_names_one() {
    let e = env();
    let mut checked = 0;
    for r in ROUTES.iter().filter(|r| r.path.contains('{')) {
        let u = uri(r.path, "nope", r.name);
        let (status, body) = call(&e.app, r.method, &u, Some(TOKEN), good_body(r.name)).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{} {u}: {body}", r.method);
        let err = error_of(&body);
        assert_eq!(err.code, "not_found");
        assert!(err.error.contains("nope"), "{body}");
        checked += 1;
    }
    assert_eq!(checked, ROUTES.iter().filter(|r| r.path.contains('{')).count());
    assert!(checked >= 14);
    let (status, body) =
        call(&e.app, "POST", "/v1/sandboxes", Some(TOKEN), good_body(RouteName::CreateSandboxes)).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
}

#[tokio::test]
async fn malformed_json_and_unknown_fields_are_400_with_a_message() {
    let e = env();
    let json_routes = [
        RouteName::CreateSnapshot,
        RouteName::CreateSandboxes,
        RouteName::Exec,
        RouteName::ExecStream,
        RouteName::Eval,
        RouteName::Branch,
        RouteName::Fork,
        RouteName::CompactSnapshot,
        RouteName::TakeDiskSnapshot,
        RouteName::RestoreSandbox,
        RouteName::DiskFork,
        RouteName::SetTtl,
    ];
    for r in ROUTES.iter().filter(|r| json_routes.contains(&r.name)) {
        let u = uri(r.path, "nope", r.name);
        let (status, body) = call(&e.app, r.method, &u, Some(TOKEN), "{\"args\": [").await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{} {u}: {body}", r.method);
        assert!(error_of(&body).error.contains("invalid JSON body"), "{body}");
        let (status, body) = call(&e.app, r.method, &u, Some(TOKEN), r#"{"bogus_field": 1}"#).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{} {u}: {body}", r.method);
        assert!(error_of(&body).error.contains("bogus_field"), "{body}");
        let (status, body) = call(&e.app, r.method, &u, Some(TOKEN), r#"[1, 2]"#).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{} {u}: {body}", r.method);
    }
    // Wrong types and values.
    for (uri, body) in [
        ("/v1/sandboxes", r#"{"snapshot_tag":"t","n":"many"}"#),
        ("/v1/sandboxes", r#"{"snapshot_tag":"t","n":0}"#),
        ("/v1/sandboxes", r#"{"snapshot_tag":"t","n":1001}"#),
        ("/v1/sandboxes", r#"{"snapshot_tag":"t","per_child_netns":true}"#),
        ("/v1/sandboxes", r#"{"snapshot_tag":"t","memory_limit_mib":0}"#),
        ("/v1/sandboxes/nope/exec", r#"{"args":[]}"#),
        ("/v1/sandboxes/nope/exec", r#"{"args":["a"],"cmd":"b"}"#),
        ("/v1/sandboxes/nope/exec", r#"{"args":["a"],"timeout_secs":0}"#),
        ("/v1/sandboxes/nope/branch", r#"{"mode":"diff","wait":false}"#),
        ("/v1/sandboxes/nope/branch", r#"{"diff":true,"wait":false}"#),
        ("/v1/sandboxes/nope/branch", r#"{"mode":"full","parent_tag":"py"}"#),
        ("/v1/sandboxes/nope/branch", r#"{"mode":"live","parent_tag":"py"}"#),
        ("/v1/sandboxes/nope/branch", r#"{"mode":"diff","parent_tag":"../py"}"#),
        ("/v1/sandboxes/nope/branch", r#"{"mode":"fast"}"#),
        ("/v1/sandboxes/nope/branch", r#"{"mode":"full","wait":false}"#),
        ("/v1/snapshots/nope/compact", r#"{"to":"nope"}"#),
        ("/v1/snapshots/nope/compact", r#"{}"#),
        ("/v1/snapshots/unpack", ""),
        ("/v1/sandboxes/nope/branch", r#"{"live":true,"diff":true}"#),
        ("/v1/sandboxes/nope/fork", r#"{"n":0}"#),
        ("/v1/sandboxes/nope/disk-snapshots", r#"{"keep_last":"all"}"#),
        ("/v1/sandboxes/nope/disk-snapshots", r#"{"keep_daily":-1}"#),
        ("/v1/sandboxes/bad.id/disk-snapshots", r#"{}"#),
        ("/v1/sandboxes/nope/ttl", r#"{}"#),
        ("/v1/sandboxes/nope/ttl", r#"{"ttl_seconds":-1}"#),
        ("/v1/sandboxes/nope/ttl", r#"{"ttl_seconds":"soon"}"#),
        ("/v1/sandboxes/nope/ttl", r#"{"ttl_seconds":999999999999}"#),
        ("/v1/sandboxes", r#"{"snapshot_tag":"t","ttl_seconds":999999999999}"#),
        ("/v1/sandboxes/nope/fork", r#"{"ttl_seconds":999999999999}"#),
        ("/v1/sandboxes/nope/restore", r#"{"ttl_seconds":999999999999}"#),
        ("/v1/sandboxes/nope/disk-fork", r#"{"seq":"newest"}"#),
        ("/v1/sandboxes/nope/disk-fork", r#"{"memory_limit_mib":0}"#),
        ("/v1/sandboxes/nope/disk-fork", r#"{"restore":"fast"}"#),
        ("/v1/sandboxes/bad.id/archive", ""),
        ("/v1/sandboxes/bad.id/restore", ""),
        ("/v1/sandboxes/bad.id/disk-fork", ""),
        ("/v1/sandboxes/bad.id/ttl", r#"{"ttl_seconds":1}"#),
    ] {
        let (status, text) = call(&e.app, "POST", uri, Some(TOKEN), body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "POST {uri} {body}: {text}");
        assert_eq!(error_of(&text).code, "bad_request");
    }
    // Unknown query parameters, relative guest paths.
    for (method, uri) in [
        ("DELETE", "/v1/snapshots/t?cascade=true&force=true"),
        ("DELETE", "/v1/snapshots/t?recursive=true"),
        ("GET", "/v1/sandboxes/nope/files?path=/x&bogus=1"),
        ("GET", "/v1/sandboxes/nope/files?path=relative"),
        ("GET", "/v1/sandboxes/nope/files"),
        ("PUT", "/v1/sandboxes/nope/files?path=/x&mode=99999"),
    ] {
        let (status, text) = call(&e.app, method, uri, Some(TOKEN), "").await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{method} {uri}: {text}");
    }
}

#[tokio::test]
async fn one_tag_rule_everywhere_and_no_path_traversal() {
    let e = env();
    let bad_tags = ["..%2F..%2Fetc", "a..b", ".hidden", "x.partial", "-x", "a%2Fb", "a%00b"];
    for t in bad_tags {
        for (method, uri, body) in [
            ("GET", format!("/v1/snapshots/{t}/info"), String::new()),
            ("DELETE", format!("/v1/snapshots/{t}"), String::new()),
            ("GET", format!("/v1/snapshots/{t}/pack"), String::new()),
            ("POST", format!("/v1/snapshots/{t}/compact"), r#"{"to":"fine"}"#.to_string()),
            ("POST", "/v1/snapshots/fine/compact".to_string(), format!(r#"{{"to":"{}"}}"#, decode(t))),
            (
                "POST",
                "/v1/sandboxes/nope/branch".to_string(),
                format!(r#"{{"mode":"diff","parent_tag":"{}"}}"#, decode(t)),
            ),
            ("POST", "/v1/snapshots".to_string(), format!(r#"{{"tag":"{}","template":"python"}}"#, decode(t))),
            ("POST", "/v1/sandboxes".to_string(), format!(r#"{{"snapshot_tag":"{}"}}"#, decode(t))),
            ("POST", "/v1/sandboxes/nope/branch".to_string(), format!(r#"{{"tag":"{}"}}"#, decode(t))),
        ] {
            let (status, text) = call(&e.app, method, &uri, Some(TOKEN), &body).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{method} {uri} {body}: {text}");
        }
    }
    // Dots are allowed by the one rule (forkd's daemon refused them; its CLI did not).
    let (status, text) = call(&e.app, "GET", "/v1/snapshots/py.v2/info", Some(TOKEN), "").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{text}");
    for id in ["..%2F..%2Fetc", "a%2Fb", "..", "x%20y"] {
        let (status, text) = call(&e.app, "GET", &format!("/v1/sandboxes/{id}"), Some(TOKEN), "").await;
        assert!(status == StatusCode::BAD_REQUEST || status == StatusCode::NOT_FOUND, "{id}: {status} {text}");
        assert!(!text.contains("/etc/"), "{text}");
    }
}

fn decode(t: &str) -> String {
    t.replace("%2F", "/").replace("%00", "\\u0000")
}

fn write_snapshot_json(store: &Store, tag: &str, status: &str, writer_pid: Option<u32>) {
    let dir = store.snapshots_dir().join(tag);
    std::fs::create_dir_all(&dir).unwrap();
    let meta = serde_json::json!({
        "format_version": 1, "tag": tag, "created_at_unix_ms": 1000, "status": status,
        "mem_size_bytes": 4096, "vcpu_count": 1, "irqchip": "split",
        "guest": {"kind": "linux", "name": "g"}, "writer_pid": writer_pid, "memory_bytes_allocated": 0,
    });
    std::fs::write(dir.join("snapshot.json"), serde_json::to_vec(&meta).unwrap()).unwrap();
}

#[tokio::test]
async fn conflicts_are_409_with_the_current_state() {
    let e = env();
    let store = e.state.store.clone();
    // A snapshot being written by a live process (this one).
    write_snapshot_json(&store, "w1", "writing", Some(std::process::id()));
    let (status, text) = call(&e.app, "POST", "/v1/sandboxes", Some(TOKEN), r#"{"snapshot_tag":"w1"}"#).await;
    assert_eq!(status, StatusCode::CONFLICT, "{text}");
    assert_eq!(error_of(&text).state.as_deref(), Some("writing"));
    let (status, text) = call(&e.app, "DELETE", "/v1/snapshots/w1", Some(TOKEN), "").await;
    assert_eq!(status, StatusCode::CONFLICT, "{text}");
    assert_eq!(error_of(&text).state.as_deref(), Some("writing"));
    // Listed as writing, not bootable.
    let (_, text) = call(&e.app, "GET", "/v1/snapshots", Some(TOKEN), "").await;
    let list: Vec<forkvm_api::SnapshotInfo> = serde_json::from_str(&text).unwrap();
    assert_eq!((list[0].status.as_str(), list[0].bootable), ("writing", false));
    // A tag that exists: creating it again is a conflict, found before any build.
    let (status, text) =
        call(&e.app, "POST", "/v1/snapshots", Some(TOKEN), r#"{"tag":"w1","template":"python"}"#).await;
    assert_eq!(status, StatusCode::CONFLICT, "{text}");
    assert_eq!(error_of(&text).state.as_deref(), Some("exists"));
    // A snapshot whose files are missing: not bootable, a 409 naming why.
    write_snapshot_json(&store, "broken", "ready", None);
    let (status, text) = call(&e.app, "POST", "/v1/sandboxes", Some(TOKEN), r#"{"snapshot_tag":"broken"}"#).await;
    assert_eq!(status, StatusCode::CONFLICT, "{text}");
    let (_, text) = call(&e.app, "GET", "/v1/snapshots", Some(TOKEN), "").await;
    let list: Vec<forkvm_api::SnapshotInfo> = serde_json::from_str(&text).unwrap();
    let broken = list.iter().find(|s| s.tag == "broken").unwrap();
    assert_eq!((broken.status.as_str(), broken.bootable), ("failed", false));
    assert!(broken.warning.is_some());
    // A sandbox still starting (its spawn has not finished): its calls are conflicts.
    let run_dir = e.state.registry.create_run_dir("s1").unwrap();
    let record = SandboxRecord {
        id: "s1".into(),
        pid: std::process::id() as i32,
        run_dir,
        template: None,
        source_tag: Some("py".into()),
        forked_from: None,
        created_at_unix_ms: 0,
        memory_limit_bytes: None,
        cgroup: None,
    };
    e.state.registry.write(&record).unwrap();
    let row = SandboxRow {
        id: "s1".into(),
        state: "starting".into(),
        op: Some("spawn-x".into()),
        pid: None,
        template: None,
        snapshot_tag: Some("py".into()),
        forked_from: None,
        memory_limit_mib: None,
        created_at_unix: 0,
        last_active_unix: 0,
        branch_count: 0,
        last_branch_tag: None,
        reason: None,
        ttl_seconds: None,
        expires_at_unix_ms: None,
        last_activity_unix_ms: 0,
        archived_at_unix_ms: None,
    };
    e.state.db().insert_sandboxes(&[row]).unwrap();
    for (method, uri, body) in [
        ("GET", "/v1/sandboxes/s1", ""),
        ("POST", "/v1/sandboxes/s1/exec", r#"{"args":["true"]}"#),
        ("POST", "/v1/sandboxes/s1/branch", "{}"),
    ] {
        let (status, text) = call(&e.app, method, uri, Some(TOKEN), body).await;
        assert_eq!(status, StatusCode::CONFLICT, "{method} {uri}: {text}");
        assert_eq!(error_of(&text).state.as_deref(), Some("starting"));
    }
    // ... and it is not listed.
    let (_, text) = call(&e.app, "GET", "/v1/sandboxes", Some(TOKEN), "").await;
    assert_eq!(text, "[]");
}

#[tokio::test]
async fn unknown_routes_and_methods_answer_json() {
    let e = env();
    let (status, text) = call(&e.app, "GET", "/v1/workspaces", Some(TOKEN), "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(error_of(&text).error.contains("/v1/workspaces"));
    let (status, text) = call(&e.app, "PATCH", "/v1/sandboxes", Some(TOKEN), "").await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(error_of(&text).code, "method_not_allowed");
    let (status, text) = call(&e.app, "GET", "/version", Some(TOKEN), "").await;
    assert_eq!(status, StatusCode::OK);
    assert!(text.contains("\"api\":\"v1\""));
    let (status, text) = call(&e.app, "GET", "/metrics", Some(TOKEN), "").await;
    assert_eq!(status, StatusCode::OK);
    assert!(text.contains("forkvm_build_info{"), "{text}");
    assert!(text.contains("forkvm_http_requests_total{method=\"GET\",route=\"/version\",status=\"200\"} 1"), "{text}");
}

#[test]
fn openapi_document_matches_the_router() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/openapi.json");
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut documented = Vec::new();
    for (p, item) in doc["paths"].as_object().expect("paths") {
        for (method, op) in item.as_object().unwrap() {
            if ["get", "post", "put", "delete", "patch", "head", "options"].contains(&method.as_str()) {
                documented.push((method.to_uppercase(), p.clone(), op["operationId"].as_str().unwrap().to_string()));
            }
        }
    }
    let mut served: Vec<(String, String, String)> =
        ROUTES.iter().map(|r| (r.method.to_string(), r.path.to_string(), snake(&format!("{:?}", r.name)))).collect();
    documented.sort();
    served.sort();
    assert_eq!(documented, served, "docs/openapi.json and forkvm_api::routes::ROUTES differ");
}

fn snake(camel: &str) -> String {
    let mut out = String::new();
    for (i, c) in camel.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}

#[tokio::test]
async fn a_stopped_sandbox_is_404_quoting_its_console() {
    let e = env();
    let mut dead = std::process::Command::new("true").spawn().unwrap();
    let pid = dead.id() as i32;
    dead.wait().unwrap();
    let run_dir = e.state.registry.create_run_dir("gone1").unwrap();
    let record = SandboxRecord {
        id: "gone1".into(),
        pid,
        run_dir: run_dir.clone(),
        template: None,
        source_tag: None,
        forked_from: None,
        created_at_unix_ms: 0,
        memory_limit_bytes: None,
        cgroup: None,
    };
    e.state.registry.write(&record).unwrap();
    std::fs::write(record.console(), "booting\nKernel panic - not syncing: Attempted to kill init!\n").unwrap();
    let (status, text) = call(&e.app, "POST", "/v1/sandboxes/gone1/exec", Some(TOKEN), r#"{"args":["true"]}"#).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{text}");
    assert!(error_of(&text).error.contains("Attempted to kill init"), "{text}");
    assert!(!run_dir.exists(), "the dead sandbox's run directory is cleaned up after it was quoted");
}

// --- snapshot chains -------------------------------------------------------------------

const MEM: u64 = 4 << 20;
const PAGE: usize = 4096;

/// A request with a binary body; the whole reply (headers too), up to 64 MiB.
async fn call_bytes(
    app: &axum::Router,
    method: &str,
    uri: &str,
    body: Vec<u8>,
) -> (StatusCode, axum::http::HeaderMap, Vec<u8>) {
    let req = Request::builder()
        .method(method)
        .uri(uri)
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(Body::from(body))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let (status, headers) = (resp.status(), resp.headers().clone());
    let bytes = axum::body::to_bytes(resp.into_body(), 64 << 20).await.unwrap();
    (status, headers, bytes.to_vec())
}

async fn get_json<T: serde::de::DeserializeOwned>(e: &Env, uri: &str) -> T {
    let (status, text) = call(&e.app, "GET", uri, Some(TOKEN), "").await;
    assert_eq!(status, StatusCode::OK, "GET {uri}: {text}");
    serde_json::from_str(&text).unwrap_or_else(|err| panic!("GET {uri} ({err}): {text}"))
}

/// A whole-image snapshot at `dir` with `mem` as its memory, a vsock device (so that it
/// counts as bootable) and one read-only disk, as a Linux branch writes them.
fn write_image_snapshot(dir: &std::path::Path, tag: &str, mem: &[u8]) {
    std::fs::create_dir_all(dir.join("disk")).unwrap();
    let meta = serde_json::json!({
        "format_version": 1, "tag": tag, "created_at_unix_ms": 5000, "status": "ready",
        "mem_size_bytes": MEM, "vcpu_count": 1, "irqchip": "split",
        "guest": {"kind": "linux", "name": "g"}, "memory_bytes_allocated": 0,
        "devices": {"vsock_cid": 3, "rng": true, "disks": [{"file": "root.img", "read_only": true, "id": "forkvm-root"}]},
    });
    std::fs::write(dir.join("snapshot.json"), serde_json::to_vec(&meta).unwrap()).unwrap();
    std::fs::write(dir.join("vmstate.bin"), format!("vmstate of {tag}")).unwrap();
    let f = forkvm_snapshot::create_image(&dir.join("memory.img"), MEM).unwrap();
    forkvm_snapshot::write_sparse(&f, 0, mem).unwrap();
    std::fs::write(dir.join("disk").join("root.img"), vec![7u8; 64 << 10]).unwrap();
}

/// Memory with every third page filled with `seed`-dependent bytes, the rest zero.
fn memory(seed: u8) -> Vec<u8> {
    let mut mem = vec![0u8; MEM as usize];
    for (i, page) in mem.chunks_mut(PAGE).enumerate() {
        if i % 3 == 0 {
            page.fill((i as u8).wrapping_mul(31).wrapping_add(seed) | 1);
        }
    }
    mem
}

/// `base` (chunked) ← `mid` (diff) ← `head` (diff), each diff rewriting a few pages;
/// every snapshot recorded in the daemon's database, as a running daemon would have them.
fn build_chain(e: &Env) {
    let store = &e.state.store;
    store.ensure().unwrap();
    let mut mem = memory(1);
    write_image_snapshot(&store.tag_dir("base").unwrap(), "base", &mem);
    chain::ingest(store, &e.state.cache, "base").unwrap();
    let mut parent = "base";
    for (n, tag) in ["mid", "head"].into_iter().enumerate() {
        for page in [5usize, 40, 41, 700 + n] {
            mem[page * PAGE..(page + 1) * PAGE].fill(0xa0 + n as u8);
        }
        let staged_dir = e.dir.path().join(format!("staged-{tag}"));
        write_image_snapshot(&staged_dir, tag, &mem);
        let staged = SnapshotDir::open(&staged_dir).unwrap();
        let parent_chain = chain::resolve(store, parent).unwrap();
        chain::write_diff(store, &e.state.cache, &parent_chain, &staged, tag).unwrap();
        parent = tag;
    }
    forkvmd::reconcile::reconcile(&e.state);
}

fn row_tags(e: &Env) -> Vec<String> {
    let mut tags: Vec<String> = e.state.snapshot_rows().into_iter().map(|r| r.tag).collect();
    tags.sort();
    tags
}

/// Every file under the store, with its size (the chunk store's lock files aside).
fn store_files(store: &Store) -> Vec<(std::path::PathBuf, u64)> {
    fn walk(dir: &std::path::Path, out: &mut Vec<(std::path::PathBuf, u64)>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = entry.path();
            if p.is_dir() {
                walk(&p, out);
            } else if !p.ends_with(".lock") {
                out.push((p.clone(), std::fs::metadata(&p).unwrap().len()));
            }
        }
    }
    let mut out = Vec::new();
    walk(store.root(), &mut out);
    out.sort();
    out
}

#[tokio::test]
async fn chain_info_reports_lineage_sizes_and_bootability() {
    let e = env();
    build_chain(&e);
    let head: forkvm_api::SnapshotInfoDetail = get_json(&e, "/v1/snapshots/head/info").await;
    assert_eq!((head.chain_depth, head.ancestors.as_slice()), (2, ["base".to_string(), "mid".to_string()].as_slice()));
    assert_eq!(head.parent_tag.as_deref(), Some("mid"));
    assert!(head.dependents.is_empty() && head.descendants.is_empty());
    assert_eq!((head.status.as_str(), head.bootable, head.problem.as_deref()), ("ready", true, None));
    assert_eq!(head.memory_format, "chunked");
    assert_eq!(head.memory_logical_bytes, MEM);
    assert_eq!(head.vmstate_bytes, "vmstate of head".len() as u64);
    assert!(head.chunks > 0, "{head:?}");
    assert!(head.memory_physical_bytes > 0 && head.memory_physical_bytes < MEM, "{head:?}");
    assert!(head.chain_physical_bytes > head.memory_physical_bytes + head.vmstate_bytes, "{head:?}");
    let mid: forkvm_api::SnapshotInfoDetail = get_json(&e, "/v1/snapshots/mid/info").await;
    assert_eq!(head.parent_content_hash, mid.content_hash);
    assert_eq!((mid.chain_depth, mid.dependents.as_slice()), (1, ["head".to_string()].as_slice()));
    let base: forkvm_api::SnapshotInfoDetail = get_json(&e, "/v1/snapshots/base/info").await;
    assert_eq!((base.chain_depth, base.parent_tag.as_deref()), (0, None));
    assert!(base.ancestors.is_empty());
    assert_eq!(base.dependents, ["mid"]);
    assert_eq!(base.descendants, ["head", "mid"], "deepest first");
    // The list's cheap size for a chunked snapshot: what it added to the chunk store.
    let list: Vec<forkvm_api::SnapshotInfo> = get_json(&e, "/v1/snapshots").await;
    assert_eq!(list.iter().map(|s| s.tag.as_str()).collect::<Vec<_>>(), ["base", "head", "mid"]);
    for s in &list {
        assert!(s.bootable && s.memory_physical_bytes > 0, "{s:?}");
    }
    assert!(list[0].memory_physical_bytes > list[1].memory_physical_bytes, "a diff stores less than its base");
}

#[tokio::test]
async fn deleting_a_snapshot_with_dependents_needs_cascade_or_force() {
    let e = env();
    build_chain(&e);
    assert_eq!(row_tags(&e), ["base", "head", "mid"]);
    let (status, text) = call(&e.app, "DELETE", "/v1/snapshots/mid", Some(TOKEN), "").await;
    assert_eq!(status, StatusCode::CONFLICT, "{text}");
    let err = error_of(&text);
    assert_eq!(err.state.as_deref(), Some("has_dependents"));
    assert!(err.error.contains("head"), "the refusal names the dependents: {text}");
    let (status, text) = call(&e.app, "DELETE", "/v1/snapshots/mid?cascade=true&force=true", Some(TOKEN), "").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    assert_eq!(row_tags(&e), ["base", "head", "mid"], "refusals change nothing");

    // force: the base goes, its dependents stay and say why they cannot boot.
    let (status, text) = call(&e.app, "DELETE", "/v1/snapshots/base?force=true", Some(TOKEN), "").await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{text}");
    assert_eq!(row_tags(&e), ["head", "mid"]);
    let mid: forkvm_api::SnapshotInfoDetail = get_json(&e, "/v1/snapshots/mid/info").await;
    assert_eq!((mid.status.as_str(), mid.bootable), ("failed", false));
    assert!(mid.problem.as_deref().is_some_and(|p| p.contains("base")), "{mid:?}");
    assert!(mid.ancestors.is_empty(), "the missing parent is not listed: {mid:?}");
    let head: forkvm_api::SnapshotInfoDetail = get_json(&e, "/v1/snapshots/head/info").await;
    assert!(!head.bootable, "{head:?}");
    let list: Vec<forkvm_api::SnapshotInfo> = get_json(&e, "/v1/snapshots").await;
    assert!(list.iter().all(|s| !s.bootable && s.status == "failed" && s.warning.is_some()), "{list:?}");
    let (status, text) = call(&e.app, "POST", "/v1/sandboxes", Some(TOKEN), r#"{"snapshot_tag":"head"}"#).await;
    assert_eq!(status, StatusCode::CONFLICT, "{text}");
    assert_eq!(error_of(&text).state.as_deref(), Some("not_bootable"));

    // cascade: the orphan and everything built on it.
    let (status, text) = call(&e.app, "DELETE", "/v1/snapshots/mid?cascade=true", Some(TOKEN), "").await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{text}");
    assert!(e.state.store.list().is_empty());
    assert!(row_tags(&e).is_empty());
    let (status, _) = call(&e.app, "GET", "/v1/snapshots/head/info", Some(TOKEN), "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // Chunks nothing references any more were collected.
    let left: Vec<_> =
        store_files(&e.state.store).into_iter().filter(|(p, _)| p.to_string_lossy().contains("chunk")).collect();
    assert!(left.is_empty(), "{left:?}");
}

#[tokio::test]
async fn compact_writes_a_flat_snapshot() {
    let e = env();
    build_chain(&e);
    let (status, text) = call(&e.app, "POST", "/v1/snapshots/head/compact", Some(TOKEN), r#"{"to":"flat"}"#).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let info: forkvm_api::SnapshotInfo = serde_json::from_str(&text).unwrap();
    assert_eq!(info.tag, "flat");
    assert_eq!(info.branched_from.as_deref(), Some("compact:head"));
    assert!(info.bootable && info.status == "ready", "{info:?}");
    assert!(row_tags(&e).contains(&"flat".to_string()));
    let flat: forkvm_api::SnapshotInfoDetail = get_json(&e, "/v1/snapshots/flat/info").await;
    assert_eq!((flat.chain_depth, flat.parent_tag.as_deref(), flat.memory_format.as_str()), (0, None, "chunked"));
    let head: forkvm_api::SnapshotInfoDetail = get_json(&e, "/v1/snapshots/head/info").await;
    assert_eq!(head.chain_depth, 2, "the chain is left as it was");

    for (body, status, state) in [
        (r#"{"to":"flat"}"#, StatusCode::CONFLICT, Some("exists")),
        (r#"{"to":"mid"}"#, StatusCode::CONFLICT, Some("exists")),
        (r#"{"to":"head"}"#, StatusCode::BAD_REQUEST, None),
        (r#"{"to":"x","extra":1}"#, StatusCode::BAD_REQUEST, None),
        (r#"{"to":".x"}"#, StatusCode::BAD_REQUEST, None),
    ] {
        let (got, text) = call(&e.app, "POST", "/v1/snapshots/head/compact", Some(TOKEN), body).await;
        assert_eq!(got, status, "{body}: {text}");
        assert_eq!(error_of(&text).state.as_deref(), state, "{body}: {text}");
    }
    let (status, text) = call(&e.app, "POST", "/v1/snapshots/nope/compact", Some(TOKEN), r#"{"to":"y"}"#).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{text}");
    // A broken chain cannot be compacted.
    let (status, _) = call(&e.app, "DELETE", "/v1/snapshots/mid?force=true", Some(TOKEN), "").await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, text) = call(&e.app, "POST", "/v1/snapshots/head/compact", Some(TOKEN), r#"{"to":"z"}"#).await;
    assert_eq!(status, StatusCode::CONFLICT, "{text}");
    assert_eq!(error_of(&text).state.as_deref(), Some("not_bootable"));
    assert!(error_of(&text).error.contains("mid"), "{text}");
    assert!(e.state.store.lookup("z").is_err());
}

#[tokio::test]
async fn pack_and_unpack_round_trip_and_a_damaged_pack_imports_nothing() {
    let e = env();
    build_chain(&e);
    let (status, headers, pack) = call_bytes(&e.app, "GET", "/v1/snapshots/head/pack", Vec::new()).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&pack));
    assert_eq!(headers["content-type"], "application/zstd");
    assert_eq!(headers["content-disposition"], "attachment; filename=\"head.tar.zst\"");
    assert_eq!(headers["content-length"], pack.len().to_string().as_str());
    assert!(pack.len() > 1000 && pack.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]), "a zstd frame");
    let staging = chain::staging_root(&e.state.store);
    assert!(std::fs::read_dir(&staging).unwrap().next().is_none(), "the pack file is not left behind");

    // Into another daemon's empty store.
    let other = env();
    let (status, _, body) = call_bytes(&other.app, "POST", "/v1/snapshots/unpack", pack.clone()).await;
    let text = String::from_utf8_lossy(&body).into_owned();
    assert_eq!(status, StatusCode::CREATED, "{text}");
    let r: forkvm_api::UnpackResponse = serde_json::from_str(&text).unwrap();
    assert_eq!(
        (r.head.as_str(), r.imported.as_slice()),
        ("head", ["base", "mid", "head"].map(String::from).as_slice())
    );
    assert!(r.reused.is_empty() && r.chunks_new > 0 && r.pack_bytes == pack.len() as u64, "{r:?}");
    assert_eq!(row_tags(&other), ["base", "head", "mid"]);
    let got: forkvm_api::SnapshotInfoDetail = get_json(&other, "/v1/snapshots/head/info").await;
    let want: forkvm_api::SnapshotInfoDetail = get_json(&e, "/v1/snapshots/head/info").await;
    assert!(got.bootable, "{got:?}");
    assert_eq!((got.content_hash, got.chain_depth), (want.content_hash, 2));
    assert!(std::fs::read_dir(chain::staging_root(&other.state.store)).unwrap().next().is_none());
    // Again: every link is there with the same content, so it is reused.
    let (status, _, body) = call_bytes(&other.app, "POST", "/v1/snapshots/unpack", pack.clone()).await;
    assert_eq!(status, StatusCode::CREATED);
    let r: forkvm_api::UnpackResponse = serde_json::from_slice(&body).unwrap();
    assert!(r.imported.is_empty() && r.reused.len() == 3, "{r:?}");

    // Damaged packs: one flipped byte, cut short, not a pack at all. Nothing changes.
    let fresh = env();
    fresh.state.store.ensure().unwrap();
    let before = store_files(&fresh.state.store);
    let mut flipped = pack.clone();
    let at = flipped.len() / 2;
    flipped[at] ^= 0x40;
    let cut = pack[..pack.len() - 100].to_vec();
    for (what, bad) in [("flipped", flipped), ("truncated", cut), ("garbage", b"not a pack".to_vec())] {
        let (status, _, body) = call_bytes(&fresh.app, "POST", "/v1/snapshots/unpack", bad).await;
        let text = String::from_utf8_lossy(&body);
        assert_eq!(status, StatusCode::BAD_REQUEST, "{what}: {text}");
        assert_eq!(error_of(&text).code, "bad_request");
        assert_eq!(store_files(&fresh.state.store), before, "{what}: the store is unchanged");
        assert!(row_tags(&fresh).is_empty());
    }
    let (status, _, _) = call_bytes(&fresh.app, "POST", "/v1/snapshots/unpack", Vec::new()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "an empty body");

    // A tag that exists with other content is a conflict, and nothing is imported.
    let clash = env();
    clash.state.store.ensure().unwrap();
    write_image_snapshot(&clash.state.store.tag_dir("mid").unwrap(), "mid", &memory(9));
    let before = store_files(&clash.state.store);
    let (status, _, body) = call_bytes(&clash.app, "POST", "/v1/snapshots/unpack", pack).await;
    let text = String::from_utf8_lossy(&body);
    assert_eq!(status, StatusCode::CONFLICT, "{text}");
    assert_eq!(error_of(&text).state.as_deref(), Some("exists"));
    assert!(error_of(&text).error.contains("mid"), "{text}");
    assert_eq!(store_files(&clash.state.store), before);
}

#[tokio::test]
async fn a_snapshot_tagged_unpack_is_still_a_snapshot() {
    let e = env();
    e.state.store.ensure().unwrap();
    write_image_snapshot(&e.state.store.tag_dir("unpack").unwrap(), "unpack", &memory(3));
    let info: forkvm_api::SnapshotInfoDetail = get_json(&e, "/v1/snapshots/unpack/info").await;
    assert_eq!((info.tag.as_str(), info.memory_format.as_str(), info.chain_depth), ("unpack", "image", 0));
    let (status, text) = call(&e.app, "DELETE", "/v1/snapshots/unpack", Some(TOKEN), "").await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{text}");
}

/// Registers a sandbox record for `id` whose VMM is this process (so it counts as alive).
fn fake_running(e: &Env, id: &str, source_tag: Option<&str>, forked_from: Option<&str>) {
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
        cgroup: None,
    };
    e.state.registry.write(&record).unwrap();
}

#[tokio::test]
async fn diff_branches_check_their_parent_first() {
    let e = env();
    for body in [r#"{"mode":"diff"}"#, r#"{"diff":true,"tag":"d1"}"#, r#"{"mode":"diff","parent_tag":"py"}"#] {
        let (status, text) = call(&e.app, "POST", "/v1/sandboxes/nope/branch", Some(TOKEN), body).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{body}: {text}");
    }
    // A fork of a running sandbox has no parent tag to diff against.
    fake_running(&e, "fork1", Some("py"), Some("src1"));
    let (status, text) = call(&e.app, "POST", "/v1/sandboxes/fork1/branch", Some(TOKEN), r#"{"mode":"diff"}"#).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    assert!(error_of(&text).error.contains("not spawned from a tagged snapshot"), "{text}");
    // A parent_tag that is not the sandbox's source.
    fake_running(&e, "sb1", Some("py"), None);
    let body = r#"{"mode":"diff","tag":"d1","parent_tag":"other"}"#;
    let (status, text) = call(&e.app, "POST", "/v1/sandboxes/sb1/branch", Some(TOKEN), body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    let message = error_of(&text).error;
    assert!(message.contains("\"py\"") && message.contains("\"other\""), "{text}");
    // Failed branches leave no in-flight record and no claimed tag.
    assert!(e.state.db().branches().unwrap().is_empty());
    assert!(e.state.branch_tags.lock().unwrap().is_empty());
    let metrics = call(&e.app, "GET", "/metrics", Some(TOKEN), "").await.1;
    assert!(metrics.contains("forkvm_branches_total{mode=\"diff\",outcome=\"bad_request\"} 2"), "{metrics}");
}

// --- disk snapshots ---------------------------------------------------------------------

/// The vault keys of this test process (`FORKVM_KEYS` is read by the library), set once:
/// sandbox ids differ between tests, so they can share it.
fn test_keys() {
    static KEYS: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    KEYS.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("forkvmd-api-contract-keys-{}", std::process::id()));
        std::env::set_var("FORKVM_KEYS", &dir);
        dir
    });
}

/// What a fake VMM does and saw.
#[derive(Default)]
struct FakeVmmState {
    /// Answer seals with an error (as a VMM whose disk failed).
    fail: std::sync::atomic::AtomicBool,
    /// Let the "guest" write nothing before the next seals.
    idle: std::sync::atomic::AtomicBool,
    seals: std::sync::atomic::AtomicUsize,
    in_flight: std::sync::atomic::AtomicUsize,
    max_in_flight: std::sync::atomic::AtomicUsize,
}

/// Registers running sandbox `id` (its VMM "is" this process) with a control socket
/// served by a thread that answers `seal_disks` as a VMM with one layered disk `data`
/// would (`layered: false`: as one with none): before each seal the "guest" writes one
/// 4 KiB block of new content, then the top is sealed into a real layer on disk.
fn fake_vmm(e: &Env, id: &str, layered: bool) -> std::sync::Arc<FakeVmmState> {
    use forkvm_snapshot::layered_disk::LayerStack;
    use std::io::{BufRead, Write};
    use std::sync::atomic::Ordering::SeqCst;
    test_keys();
    fake_running(e, id, Some("py"), None);
    let record = e.state.registry.get(id).unwrap();
    let disk_dir = e.dir.path().join(format!("disk-{id}"));
    std::fs::create_dir_all(&disk_dir).unwrap();
    let base = disk_dir.join("base.img");
    std::fs::write(&base, vec![0u8; 1 << 20]).unwrap();
    let stack = std::sync::Mutex::new(LayerStack::create(&base, &[], &disk_dir.join("top0")).unwrap());
    let state = std::sync::Arc::new(FakeVmmState::default());
    let listener = std::os::unix::net::UnixListener::bind(record.control_socket()).unwrap();
    let (st, stack) = (state.clone(), std::sync::Arc::new(stack));
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            let (st, stack, base, disk_dir) = (st.clone(), stack.clone(), base.clone(), disk_dir.clone());
            std::thread::spawn(move || {
                let mut reader = std::io::BufReader::new(conn.try_clone().unwrap());
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 {
                    return;
                }
                let req: forkvm_vmm::control::Request = serde_json::from_str(&line).unwrap();
                assert!(matches!(req, forkvm_vmm::control::Request::SealDisks {}), "{line}");
                let now = st.in_flight.fetch_add(1, SeqCst) + 1;
                st.max_in_flight.fetch_max(now, SeqCst);
                std::thread::sleep(std::time::Duration::from_millis(50));
                let n = st.seals.fetch_add(1, SeqCst) + 1;
                let answer = if st.fail.load(SeqCst) {
                    serde_json::json!({ "ok": false, "error": "sealing disk 0: injected failure" })
                } else if !layered {
                    serde_json::json!({ "ok": true, "result": [] })
                } else {
                    let mut stack = stack.lock().unwrap();
                    let mut new_layer = None;
                    if !st.idle.load(SeqCst) {
                        stack.write_at(&[n as u8; 4096], (n as u64 % 200) * 4096).unwrap();
                        let sealed = stack.seal(&disk_dir.join(format!("top{n}"))).unwrap();
                        new_layer = Some(sealed.id.to_string());
                    }
                    let layers: Vec<(std::path::PathBuf, String)> =
                        stack.sealed_layers().iter().map(|l| (l.dir().to_path_buf(), l.id().to_string())).collect();
                    let seal =
                        forkvm_vmm::vmm::disks::DiskSeal { index: 0, id: "data".into(), base, layers, new_layer };
                    serde_json::json!({ "ok": true, "result": [seal] })
                };
                st.in_flight.fetch_sub(1, SeqCst);
                let mut w = conn;
                let _ = writeln!(w, "{answer}");
            });
        }
    });
    state
}

#[tokio::test]
async fn disk_snapshots_are_taken_listed_and_outlive_their_sandbox() {
    use std::sync::atomic::Ordering::SeqCst;
    let e = env();
    // No layered disk: 400, and nothing was created in the store.
    fake_vmm(&e, "rawdisk1", false);
    let (status, text) = call(&e.app, "POST", "/v1/sandboxes/rawdisk1/disk-snapshots", Some(TOKEN), "").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    assert!(error_of(&text).error.contains("no layered disk"), "{text}");
    let list: Vec<forkvm_api::DiskSnapshotInfo> = get_json(&e, "/v1/sandboxes/rawdisk1/disk-snapshots").await;
    assert!(list.is_empty());
    assert!(!e.state.store.root().join("vault/rawdisk1").exists());

    let vmm = fake_vmm(&e, "disk1", true);
    let uri = "/v1/sandboxes/disk1/disk-snapshots";
    assert!(get_json::<Vec<forkvm_api::DiskSnapshotInfo>>(&e, uri).await.is_empty());
    let mut seqs = Vec::new();
    for _ in 0..3 {
        let (status, text) = call(&e.app, "POST", uri, Some(TOKEN), "").await;
        assert_eq!(status, StatusCode::CREATED, "{text}");
        let r: forkvm_api::DiskSnapshotReport = serde_json::from_str(&text).unwrap();
        assert_eq!((r.sandbox_id.as_str(), r.unchanged, r.new_layers), ("disk1", false, 1));
        assert!(r.written_bytes > 0 && r.written_chunks > 0, "{text}");
        seqs.push(r.seq);
    }
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    // Nothing written since: 200, no new snapshot.
    vmm.idle.store(true, SeqCst);
    let (status, text) = call(&e.app, "POST", uri, Some(TOKEN), "{}").await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let r: forkvm_api::DiskSnapshotReport = serde_json::from_str(&text).unwrap();
    assert!(r.unchanged && r.seq == seqs[2] && r.written_bytes == 0, "{text}");
    vmm.idle.store(false, SeqCst);

    let list: Vec<forkvm_api::DiskSnapshotInfo> = get_json(&e, uri).await;
    assert_eq!(list.iter().map(|s| s.seq).collect::<Vec<_>>(), seqs);
    let d = &list[2].disks[0];
    assert_eq!((d.id.as_str(), d.size, d.blocks), ("data", 1 << 20, 3), "{list:?}");
    assert!(d.base_key.starts_with("blake3:") && !d.layer_id.is_empty() && d.extents >= 1, "{list:?}");
    assert!(list[2].stored_bytes > 0);
    // The sandbox view shows the last one.
    let info: forkvm_api::SandboxInfo = get_json(&e, "/v1/sandboxes/disk1").await;
    let last = info.last_disk_snapshot.expect("last_disk_snapshot");
    assert_eq!((last.seq, last.error), (Some(seqs[2]), None));

    // Retention from the body: keep the newest 2 (and no hourly/daily ones).
    let body = r#"{"keep_last":2,"keep_hourly":0,"keep_daily":0}"#;
    let (status, text) = call(&e.app, "POST", uri, Some(TOKEN), body).await;
    assert_eq!(status, StatusCode::CREATED, "{text}");
    let r: forkvm_api::DiskSnapshotReport = serde_json::from_str(&text).unwrap();
    assert_eq!(r.retired, 2, "{text}");
    let list: Vec<forkvm_api::DiskSnapshotInfo> = get_json(&e, uri).await;
    assert_eq!(list.iter().map(|s| s.seq).collect::<Vec<_>>(), [seqs[2], r.seq]);

    // A failed seal is a 500, deletes nothing, and shows in the view and the metrics.
    vmm.fail.store(true, SeqCst);
    let (status, text) = call(&e.app, "POST", uri, Some(TOKEN), "").await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{text}");
    assert!(error_of(&text).error.contains("injected failure"), "{text}");
    assert_eq!(get_json::<Vec<forkvm_api::DiskSnapshotInfo>>(&e, uri).await.len(), 2);
    let info: forkvm_api::SandboxInfo = get_json(&e, "/v1/sandboxes/disk1").await;
    let last = info.last_disk_snapshot.unwrap();
    assert_eq!(last.seq, Some(r.seq));
    assert!(last.error.unwrap().contains("injected failure"));
    let metrics = call(&e.app, "GET", "/metrics", Some(TOKEN), "").await.1;
    assert!(metrics.contains("forkvm_disk_snapshots_total{outcome=\"ok\",trigger=\"api\"} 4"), "{metrics}");
    assert!(metrics.contains("forkvm_disk_snapshots_total{outcome=\"unchanged\",trigger=\"api\"} 1"), "{metrics}");
    assert!(metrics.contains("forkvm_disk_snapshots_total{outcome=\"failed\",trigger=\"api\"} 1"), "{metrics}");
    assert!(metrics.contains("forkvm_disk_snapshot_last_duration_seconds "), "{metrics}");
    assert!(!metrics.contains("forkvm_disk_snapshot_written_bytes_total 0\n"), "{metrics}");

    // The sandbox goes: its snapshots can still be listed (not taken); 404 with neither.
    std::fs::remove_dir_all(e.state.registry.get("disk1").unwrap().run_dir).unwrap();
    assert_eq!(get_json::<Vec<forkvm_api::DiskSnapshotInfo>>(&e, uri).await.len(), 2);
    let (status, text) = call(&e.app, "POST", uri, Some(TOKEN), "").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{text}");
    let (status, text) = call(&e.app, "GET", "/v1/sandboxes/never1/disk-snapshots", Some(TOKEN), "").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{text}");
    assert!(error_of(&text).error.contains("no disk snapshots"), "{text}");
}

#[tokio::test]
async fn disk_snapshots_of_one_sandbox_never_overlap() {
    use std::sync::atomic::Ordering::SeqCst;
    let e = env();
    let vmm = fake_vmm(&e, "serial1", true);
    let calls = (0..4).map(|_| call(&e.app, "POST", "/v1/sandboxes/serial1/disk-snapshots", Some(TOKEN), ""));
    let round = forkvmd::disk::round(&e.state, None);
    let (answers, attempted) = tokio::join!(futures_util::future::join_all(calls), round);
    assert_eq!(attempted, 1);
    for (status, text) in answers {
        assert_eq!(status, StatusCode::CREATED, "{text}");
    }
    assert_eq!(vmm.seals.load(SeqCst), 5);
    assert_eq!(vmm.max_in_flight.load(SeqCst), 1, "two seals of one sandbox ran at once");
    let list: Vec<forkvm_api::DiskSnapshotInfo> = get_json(&e, "/v1/sandboxes/serial1/disk-snapshots").await;
    assert_eq!(list.len(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schedule_snapshots_every_sandbox_by_itself_and_survives_failures() {
    use std::sync::atomic::Ordering::SeqCst;
    let e = env();
    let good = fake_vmm(&e, "sched1", true);
    let bad = fake_vmm(&e, "sched2", true);
    bad.fail.store(true, SeqCst);
    fake_vmm(&e, "sched3", false); // no layered disk: passed over quietly
    let audit = AuditLog::open(&e.dir.path().join("scheduler-audit.log")).unwrap();
    let task = tokio::spawn(forkvmd::disk::schedule(e.state.clone(), std::time::Duration::from_secs(1), Some(audit)));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let list = loop {
        let list: Vec<forkvm_api::DiskSnapshotInfo> = get_json(&e, "/v1/sandboxes/sched1/disk-snapshots").await;
        if list.len() >= 2 || std::time::Instant::now() > deadline {
            break list;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    task.abort();
    assert!(list.len() >= 2, "the schedule took {} snapshots in 30 s", list.len());
    assert!(list[0].seq < list[1].seq);
    assert!(good.seals.load(SeqCst) >= 2 && bad.seals.load(SeqCst) >= 1);
    // The failing sandbox: counted, audited, shown; the others unaffected.
    let info: forkvm_api::SandboxInfo = get_json(&e, "/v1/sandboxes/sched2").await;
    assert!(info.last_disk_snapshot.unwrap().error.unwrap().contains("injected failure"));
    let info: forkvm_api::SandboxInfo = get_json(&e, "/v1/sandboxes/sched3").await;
    assert_eq!(info.last_disk_snapshot, None);
    let metrics = call(&e.app, "GET", "/metrics", Some(TOKEN), "").await.1;
    assert!(metrics.contains("forkvm_disk_snapshots_total{outcome=\"failed\",trigger=\"schedule\"}"), "{metrics}");
    assert!(metrics.contains("forkvm_disk_snapshots_total{outcome=\"ok\",trigger=\"schedule\"}"), "{metrics}");
    let log = std::fs::read_to_string(e.dir.path().join("scheduler-audit.log")).unwrap();
    let line: serde_json::Value = serde_json::from_str(log.lines().next().expect("an audit line")).unwrap();
    assert_eq!((line["event"].as_str(), line["sandbox"].as_str()), (Some("disk_snapshot"), Some("sched2")));
    assert!(line["error"].as_str().unwrap().contains("injected failure"), "{line}");
    assert!(!log.contains("sched1") && !log.contains("sched3"), "{log}");
}

// --- lifecycle: archive, restore, TTL, idle pause --------------------------------------

/// Registers running sandbox `id` (its VMM "is" this process) whose control socket
/// answers every request `ok` and records its name (`pause`, `resume`, ...).
fn fake_control(e: &Env, id: &str) -> std::sync::Arc<std::sync::Mutex<Vec<String>>> {
    use std::io::{BufRead, Write};
    fake_running(e, id, Some("py"), None);
    let record = e.state.registry.get(id).unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let listener = std::os::unix::net::UnixListener::bind(record.control_socket()).unwrap();
    let log = seen.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            let mut line = String::new();
            if std::io::BufReader::new(conn.try_clone().unwrap()).read_line(&mut line).unwrap_or(0) == 0 {
                continue;
            }
            let v: serde_json::Value = serde_json::from_str(&line).unwrap();
            let name =
                v.get("op").and_then(|o| o.as_str()).map(String::from).unwrap_or_else(|| line.trim().to_string());
            log.lock().unwrap().push(name);
            let mut w = conn;
            let _ = writeln!(w, "{}", serde_json::json!({ "ok": true, "result": null }));
        }
    });
    seen
}

fn row_of(e: &Env, id: &str) -> SandboxRow {
    e.state.db().sandboxes().unwrap().into_iter().find(|r| r.id == id).expect("a row")
}

fn running_row(id: &str, last_activity_unix_ms: u64) -> SandboxRow {
    SandboxRow {
        id: id.into(),
        state: "running".into(),
        op: Some("spawn-x".into()),
        pid: Some(std::process::id() as i32),
        template: Some("python".into()),
        snapshot_tag: Some("py".into()),
        forked_from: None,
        memory_limit_mib: None,
        created_at_unix: 1,
        last_active_unix: last_activity_unix_ms / 1000,
        branch_count: 0,
        last_branch_tag: None,
        reason: None,
        ttl_seconds: None,
        expires_at_unix_ms: None,
        last_activity_unix_ms,
        archived_at_unix_ms: None,
    }
}

#[tokio::test]
async fn archived_sandboxes_are_listed_refuse_calls_and_only_delete_removes_them() {
    let e = env();
    // An archived sandbox: the daemon's row and its archive on disk.
    let archive = e.state.store.root().join("archives/arch1");
    std::fs::create_dir_all(&archive).unwrap();
    std::fs::write(archive.join("archive.json"), "{}").unwrap();
    let mut row = running_row("arch1", 5_000);
    row.state = "archived".into();
    row.reason = Some("ttl".into());
    row.pid = None;
    e.state.db().insert_sandboxes(&[row]).unwrap();
    e.state.db().set_state("arch1", "archived", Some("ttl"), 7_000).unwrap();

    let info: forkvm_api::SandboxInfo = get_json(&e, "/v1/sandboxes/arch1").await;
    assert_eq!((info.state.as_str(), info.reason.as_deref(), info.pid), ("archived", Some("ttl"), None));
    assert_eq!((info.archived_at_unix_ms, info.last_activity_unix_ms), (Some(7_000), 5_000));
    let list: Vec<forkvm_api::SandboxInfo> = get_json(&e, "/v1/sandboxes").await;
    assert_eq!(list.iter().map(|s| (s.id.as_str(), s.state.as_str())).collect::<Vec<_>>(), [("arch1", "archived")]);
    // Calls that need it running, and archiving it again: 409 archived.
    for (method, uri, body) in [
        ("POST", "/v1/sandboxes/arch1/exec", r#"{"args":["true"]}"#),
        ("POST", "/v1/sandboxes/arch1/archive", ""),
        ("POST", "/v1/sandboxes/arch1/ttl", r#"{"ttl_seconds":5}"#),
        ("POST", "/v1/sandboxes/arch1/fork", "{}"),
        ("GET", "/v1/sandboxes/arch1/files?path=/tmp/x", ""),
    ] {
        let (status, text) = call(&e.app, method, uri, Some(TOKEN), body).await;
        assert_eq!(status, StatusCode::CONFLICT, "{method} {uri}: {text}");
        assert_eq!(error_of(&text).state.as_deref(), Some("archived"), "{text}");
    }
    // Restoring a running sandbox: 409 running; this test daemon has no spawner, so
    // restoring the archived one is a 500 that leaves it archived.
    fake_control(&e, "run1");
    let (status, text) = call(&e.app, "POST", "/v1/sandboxes/run1/restore", Some(TOKEN), "").await;
    assert_eq!(status, StatusCode::CONFLICT, "{text}");
    assert_eq!(error_of(&text).state.as_deref(), Some("running"));
    let (status, text) = call(&e.app, "POST", "/v1/sandboxes/arch1/restore", Some(TOKEN), "{}").await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{text}");
    assert_eq!(row_of(&e, "arch1").state, "archived");
    assert!(archive.exists());
    // Delete is the only destructive call: it removes the archive and the record.
    let (status, text) = call(&e.app, "DELETE", "/v1/sandboxes/arch1", Some(TOKEN), "").await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{text}");
    assert!(!archive.exists());
    let (status, _) = call(&e.app, "GET", "/v1/sandboxes/arch1", Some(TOKEN), "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = call(&e.app, "DELETE", "/v1/sandboxes/arch1", Some(TOKEN), "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let metrics = call(&e.app, "GET", "/metrics", Some(TOKEN), "").await.1;
    assert!(metrics.contains("forkvm_archives_total{outcome=\"conflict\",reason=\"api\"} 1"), "{metrics}");
    assert!(metrics.contains("forkvm_restores_total{outcome=\"conflict\"} 1"), "{metrics}");
}

#[tokio::test]
async fn ttls_are_set_shown_and_cleared() {
    let e = env();
    fake_control(&e, "ttl1");
    e.state.db().insert_sandboxes(&[running_row("ttl1", 1_000)]).unwrap();
    let before = forkvm_sandbox::registry::now_unix_ms();
    let (status, text) = call(&e.app, "POST", "/v1/sandboxes/ttl1/ttl", Some(TOKEN), r#"{"ttl_seconds":60}"#).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let info: forkvm_api::SandboxInfo = serde_json::from_str(&text).unwrap();
    assert_eq!(info.ttl_seconds, Some(60));
    let at = info.expires_at_unix_ms.unwrap();
    assert!(at >= before + 60_000 && at <= forkvm_sandbox::registry::now_unix_ms() + 60_000, "{text}");
    let (_, text) = call(&e.app, "POST", "/v1/sandboxes/ttl1/ttl", Some(TOKEN), r#"{"ttl_seconds":0}"#).await;
    let info: forkvm_api::SandboxInfo = serde_json::from_str(&text).unwrap();
    assert_eq!((info.ttl_seconds, info.expires_at_unix_ms), (None, None));
    // A TTL that ran out archives the sandbox; when the archive fails (this fake VMM
    // cannot be archived), nothing is deleted and the failure is audited and counted.
    e.state.db().set_ttl("ttl1", Some(1), Some(1)).unwrap();
    let audit = AuditLog::open(&e.dir.path().join("lifecycle-audit.log")).unwrap();
    forkvmd::lifecycle::tick(&e.state, Some(&audit)).await;
    assert_eq!(row_of(&e, "ttl1").state, "running");
    assert!(e.state.registry.get("ttl1").is_ok(), "the sandbox is still there");
    let log = std::fs::read_to_string(e.dir.path().join("lifecycle-audit.log")).unwrap();
    let line: serde_json::Value = serde_json::from_str(log.lines().next().expect("an audit line")).unwrap();
    assert_eq!((line["event"].as_str(), line["sandbox"].as_str()), (Some("archive"), Some("ttl1")));
    assert_eq!((line["reason"].as_str(), line["outcome"].as_str()), (Some("ttl"), Some("failed")));
    let metrics = call(&e.app, "GET", "/metrics", Some(TOKEN), "").await.1;
    assert!(metrics.contains("forkvm_ttl_archives_total{outcome=\"failed\"} 1"), "{metrics}");
    // Retried later, not on every tick.
    forkvmd::lifecycle::tick(&e.state, Some(&audit)).await;
    assert_eq!(std::fs::read_to_string(e.dir.path().join("lifecycle-audit.log")).unwrap().lines().count(), 1);
}

#[tokio::test]
async fn idle_sandboxes_are_paused_and_the_next_call_resumes_them() {
    use forkvmd::lifecycle::LifecycleConfig;
    let e = env();
    e.state
        .lifecycle
        .set_config(LifecycleConfig { idle_pause: Some(std::time::Duration::from_secs(1)), default_ttl: None });
    let vmm = fake_control(&e, "idle1");
    let busy = fake_control(&e, "busy1");
    let now = forkvm_sandbox::registry::now_unix_ms();
    e.state.db().insert_sandboxes(&[running_row("idle1", now - 5_000), running_row("busy1", now)]).unwrap();
    forkvmd::lifecycle::tick(&e.state, None).await;
    assert_eq!(*vmm.lock().unwrap(), ["pause"]);
    assert!(busy.lock().unwrap().is_empty(), "a sandbox used just now is not paused");
    let info: forkvm_api::SandboxInfo = get_json(&e, "/v1/sandboxes/idle1").await;
    assert_eq!((info.state.as_str(), info.reason.as_deref()), ("paused", Some("idle")));
    let list: Vec<forkvm_api::SandboxInfo> = get_json(&e, "/v1/sandboxes").await;
    assert_eq!(list.len(), 2, "a paused sandbox is listed");
    // Looking at it does not resume it; a call that needs it does, before it is served
    // (this fake has no agent, so the exec itself then fails).
    forkvmd::lifecycle::tick(&e.state, None).await;
    assert_eq!(vmm.lock().unwrap().len(), 1, "paused once");
    let (status, text) = call(&e.app, "POST", "/v1/sandboxes/idle1/exec", Some(TOKEN), r#"{"args":["true"]}"#).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{text}");
    assert_eq!(*vmm.lock().unwrap(), ["pause", "resume"]);
    let info: forkvm_api::SandboxInfo = get_json(&e, "/v1/sandboxes/idle1").await;
    assert_eq!((info.state.as_str(), info.reason.as_deref()), ("running", None));
    assert!(info.last_activity_unix_ms >= now, "{info:?}");
    // Just used: not paused again on the next tick.
    forkvmd::lifecycle::tick(&e.state, None).await;
    assert_eq!(vmm.lock().unwrap().len(), 2);
    let metrics = call(&e.app, "GET", "/metrics", Some(TOKEN), "").await.1;
    assert!(metrics.contains("forkvm_auto_pauses_total 1\n"), "{metrics}");
    assert!(metrics.contains("forkvm_auto_resumes_total 1\n"), "{metrics}");
}
