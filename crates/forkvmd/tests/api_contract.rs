//! The REST contract in process (no KVM, no sandboxes): every route of the table answers
//! 401 over TCP without or with a wrong token, 404 for an unknown sandbox or tag, 400
//! for malformed JSON, unknown fields, bad tags and ids, and 409 with the current state
//! for conflicts; the OpenAPI document lists exactly the routes the router serves.
//! Snapshot chains are tested in `api_snapshots.rs`, disk snapshots and the sandbox
//! lifecycle in `api_lifecycle.rs`; the helpers the three share are in `common_api/`.

mod common_api;

use axum::http::StatusCode;
use common_api::{call, env, error_of, TOKEN};
use forkvm_api::routes::{RouteName, ROUTES};
use forkvm_sandbox::SandboxRecord;
use forkvm_snapshot::Store;

/// A concrete URI for a route, naming `subject` as its sandbox or tag, with the query a
/// files route needs.
fn uri(path: &str, subject: &str, name: RouteName) -> String {
    let p = path
        .replace("{id}", subject)
        .replace("{tag}", subject)
        .replace("{name}", subject)
        .replace("{port}", "8000")
        .replace("{pid}", "7");
    match name {
        RouteName::ReadFile
        | RouteName::WriteFile
        | RouteName::RemoveFile
        | RouteName::ListFiles
        | RouteName::WatchFiles
        | RouteName::FileChecksum
        | RouteName::ReadTar
        | RouteName::WriteTar => {
            format!("{p}?path=/tmp/x")
        }
        RouteName::ImportOciTemplate => format!("{p}?name={subject}"),
        RouteName::BuildTemplate => format!("{p}?tag={subject}"),
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
        RouteName::WriteFile
        | RouteName::WriteTar
        | RouteName::UnpackSnapshot
        | RouteName::ImportOciTemplate
        | RouteName::BuildTemplate => "bytes",
        RouteName::SetTtl => r#"{"ttl_seconds":5}"#,
        RouteName::ExposePort => r#"{"port":8000}"#,
        RouteName::CreateWorkspace => r#"{"name":"w1","snapshot_tag":"nope"}"#,
        RouteName::SuspendWorkspace => r#"{"diff":false}"#,
        RouteName::CreateVolume => r#"{"name":"v1","size_mib":16}"#,
        RouteName::SnapshotVolume => r#"{"to":"v2"}"#,
        RouteName::StartProcess => r#"{"args":["sleep","9"]}"#,
        RouteName::SignalProcess => r#"{"signal":15}"#,
        RouteName::ResizeProcess => r#"{"rows":24,"cols":80}"#,
        RouteName::ProcessInput => "bytes",
        RouteName::SetCheckpointPolicy => r#"{"every_seconds":5,"keep":3}"#,
        RouteName::RewindSandbox => r#"{"seq":1}"#,
        RouteName::PushTag | RouteName::PullTag => r#"{"tag":"t1"}"#,
        RouteName::CollectRemote => "{}",
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
    // Refused requests are audited too, at a bounded rate (the first ones of a burst).
    let log = std::fs::read_to_string(&e.audit).unwrap();
    let lines: Vec<serde_json::Value> = log.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let first = ROUTES.iter().find(|r| r.name != RouteName::Health).unwrap();
    let line = lines.iter().find(|l| l["refused"].is_string()).expect("a refusal line");
    assert_eq!(line["path"], uri(first.path, "nope", first.name));
    assert_eq!(line["status"], 401);
    assert_eq!(line["refused"], "missing bearer token");
    assert_eq!(line["method"], first.method);
    assert!(line["ts"].as_str().unwrap().ends_with('Z'));
    let refused = lines.iter().filter(|l| l["refused"].is_string()).count();
    assert!(refused < ROUTES.len() * 3, "{refused} refusal lines: the rate limit did not hold");
    // Requests that pass the gate get the full line.
    let (status, _) = call(&e.app, "POST", "/v1/sandboxes/nope/exec", Some(TOKEN), r#"{"args":["true"]}"#).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let log = std::fs::read_to_string(&e.audit).unwrap();
    let line: serde_json::Value = serde_json::from_str(log.lines().last().unwrap()).unwrap();
    assert_eq!((line["path"].as_str(), line["status"].as_u64()), (Some("/v1/sandboxes/nope/exec"), Some(404)));
    assert_eq!(line["sandbox"], "nope");
    assert!(line["latency_us"].is_u64());
}

#[tokio::test]
async fn unknown_sandbox_or_tag_is_404_on_every_route_that_names_one() {
    let e = env();
    let mut checked = 0;
    // The remote's own routes answer 409 on a daemon without a remote (`api_remote.rs`).
    let named = || ROUTES.iter().filter(|r| r.path.contains('{') && !r.path.starts_with("/v1/remote/"));
    for r in named() {
        let u = uri(r.path, "nope", r.name);
        let (status, body) = call(&e.app, r.method, &u, Some(TOKEN), good_body(r.name)).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{} {u}: {body}", r.method);
        let err = error_of(&body);
        assert_eq!(err.code.as_str(), "not_found");
        assert!(err.error.contains("nope"), "{body}");
        checked += 1;
    }
    assert_eq!(checked, named().count());
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
        RouteName::SetNetwork,
        RouteName::CreateWorkspace,
        RouteName::SuspendWorkspace,
        RouteName::CreateVolume,
        RouteName::SnapshotVolume,
        RouteName::StartProcess,
        RouteName::SignalProcess,
        RouteName::ResizeProcess,
        RouteName::CreateCheckpoint,
        RouteName::SetCheckpointPolicy,
        RouteName::RewindSandbox,
        RouteName::PushTag,
        RouteName::PullTag,
        RouteName::CollectRemote,
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
        ("/v1/sandboxes", r#"{"snapshot_tag":"t","network":{"deny":["10.0.0.1/8"]}}"#),
        ("/v1/sandboxes", r#"{"snapshot_tag":"t","network":{"allow":["::1"]}}"#),
        ("/v1/sandboxes/nope/fork", r#"{"network":{"allow_internet":"no"}}"#),
        ("/v1/sandboxes/nope/fork", r#"{"network":{"allow":["a..b"]}}"#),
        ("/v1/sandboxes/nope/network", r#"{"allow":"pypi.org"}"#),
        ("/v1/sandboxes/nope/network", r#"{"deny":["*.*.example.com"]}"#),
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
        ("/v1/sandboxes/nope/checkpoints", r#"{"note":"a\u0000b"}"#),
        ("/v1/sandboxes/nope/rewind", r#"{}"#),
        ("/v1/sandboxes/nope/rewind", r#"{"seq":"last"}"#),
        ("/v1/sandboxes/nope/processes", r#"{"args":[]}"#),
        ("/v1/sandboxes/nope/processes", r#"{"cmd":"sleep 1","pty":{"rows":0,"cols":80}}"#),
        ("/v1/sandboxes/nope/processes", r#"{"cmd":"sleep 1","ring_bytes":999999999999}"#),
        ("/v1/sandboxes/nope/processes", r#"{"cmd":"sleep 1","timeout_secs":0}"#),
        ("/v1/sandboxes/nope/processes/7/signal", r#"{"signal":0}"#),
        ("/v1/sandboxes/nope/processes/7/resize", r#"{"rows":24,"cols":0}"#),
        ("/v1/sandboxes/nope/processes/x7/signal", r#"{"signal":15}"#),
        ("/v1/sandboxes/nope/processes/0/input", ""),
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
        let method = if uri.ends_with("/network") { "PUT" } else { "POST" };
        let (status, text) = call(&e.app, method, uri, Some(TOKEN), body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{method} {uri} {body}: {text}");
        assert_eq!(error_of(&text).code.as_str(), "bad_request");
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
    common_api::fake_started(&e, "s1", Some("py"), None);
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
    let (status, text) = call(&e.app, "GET", "/v1/templates", Some(TOKEN), "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(error_of(&text).error.contains("/v1/templates"));
    let (status, text) = call(&e.app, "PATCH", "/v1/sandboxes", Some(TOKEN), "").await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(error_of(&text).code.as_str(), "method_not_allowed");
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

#[test]
fn openapi_error_codes_are_the_error_code_enum() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/openapi.json");
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let documented: Vec<&str> = doc["components"]["schemas"]["ErrorBody"]["properties"]["code"]["enum"]
        .as_array()
        .expect("ErrorBody.code enum")
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let sent: Vec<&str> = forkvm_api::ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
    assert_eq!(documented, sent, "docs/openapi.json's ErrorBody.code and forkvm_api::ErrorCode differ");
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
    e.state.registry.mark_ready(&["gone1"]).unwrap();
    std::fs::write(record.console(), "booting\nKernel panic - not syncing: Attempted to kill init!\n").unwrap();
    let (status, text) = call(&e.app, "POST", "/v1/sandboxes/gone1/exec", Some(TOKEN), r#"{"args":["true"]}"#).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{text}");
    assert!(error_of(&text).error.contains("Attempted to kill init"), "{text}");
    // The call cleans nothing up, so the next one can say why too; the sweep does.
    let (status, text) = call(&e.app, "GET", "/v1/sandboxes/gone1", Some(TOKEN), "").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{text}");
    assert!(error_of(&text).error.contains("Attempted to kill init"), "{text}");
    assert!(run_dir.exists());
    assert_eq!(forkvmd::sweeper::sweep_once(&e.state).stopped, ["gone1"]);
    assert!(!run_dir.exists(), "the sweep cleans up the dead sandbox's run directory");
}

#[tokio::test]
async fn exposed_port_paths_need_their_own_token_not_the_apis() {
    let e = env();
    let origin = forkvm_sandbox::registry::Origin::default();
    e.state.begin_sandboxes(&["p1".to_string()], "test", &origin).unwrap();
    let token = e.state.registry.expose("p1", 8000, None).unwrap().token;
    let host = ("host", "127.0.0.1:8889");
    let port_token = ("x-forkvm-port-token", token.as_str());
    let (status, body) = common_api::call_with(&e.app, "GET", "/v1/sandboxes/p1/ports/8000/x", &[host], "").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert!(error_of(&body).error.contains("x-forkvm-port-token"), "{body}");
    let wrong = ("x-forkvm-port-token", "fvp_not-this-one");
    let (status, _) = common_api::call_with(&e.app, "GET", "/v1/sandboxes/p1/ports/8000/x", &[host, wrong], "").await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    // The API's token is no port's token.
    let bearer = format!("Bearer {TOKEN}");
    let api = ("authorization", bearer.as_str());
    let (status, _) = common_api::call_with(&e.app, "GET", "/v1/sandboxes/p1/ports/8000/x", &[host, api], "").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) =
        common_api::call_with(&e.app, "GET", "/v1/sandboxes/p1/ports/8001/", &[host, port_token], "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) =
        common_api::call_with(&e.app, "GET", "/v1/sandboxes/nope/ports/8000/", &[host, port_token], "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // A browser's visit with the token in the address: let through the gate, and sent
    // back without it, holding a cookie of this port's path.
    let visit = format!("/v1/sandboxes/p1/ports/8000/app?forkvm_token={token}");
    let browser = ("origin", "https://elsewhere.example");
    let (status, _) = common_api::call_with(&e.app, "GET", &visit, &[host, browser], "").await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    // The API beside it still needs the API's token; a rebound Host is refused.
    let (status, _) = common_api::call_with(&e.app, "GET", "/v1/sandboxes/p1/ports", &[host], "").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // A binding that is no thumbprint is refused before anything is recorded.
    let bad = r#"{"port": 9000, "dpop_jkt": "not-a-thumbprint"}"#;
    let (status, body) = call(&e.app, "POST", "/v1/sandboxes/p1/ports", Some(TOKEN), bad).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(e.state.registry.exposed_port("p1", 9000).unwrap().is_none());
    let rebound = ("host", "evil.example");
    let (status, _) =
        common_api::call_with(&e.app, "GET", "/v1/sandboxes/p1/ports/8000/", &[rebound, port_token], "").await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}

/// A tar archive of `files` (name, text), as a request body.
fn context_tar(files: &[(&str, &str)]) -> String {
    let mut b = tar::Builder::new(Vec::new());
    for (name, text) in files {
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o644);
        h.set_size(text.len() as u64);
        b.append_data(&mut h, name, text.as_bytes()).unwrap();
    }
    String::from_utf8(b.into_inner().unwrap()).unwrap()
}

#[tokio::test]
async fn a_build_context_that_does_not_check_out_is_a_400_before_anything_runs() {
    let e = env();
    let build = |query: &str, body: String| {
        let app = e.app.clone();
        let uri = format!("/v1/templates/build?{query}");
        async move { call(&app, "POST", &uri, Some(TOKEN), &body).await }
    };
    let cases = [
        (
            "tag=app",
            "not a tar archive at all, long enough to look like one? no".to_string(),
            "not a usable build context",
        ),
        ("tag=app", context_tar(&[("other", "x")]), "has no \"Dockerfile\""),
        ("tag=app", context_tar(&[("Dockerfile", "FROM tiny\nHEALTHCHECK CMD true\n")]), "line 2: HEALTHCHECK"),
        ("tag=app", context_tar(&[("Dockerfile", "FROM tiny\nCOPY nope /x\n")]), "line 2: COPY nope: not found"),
        ("tag=app&dockerfile=sub/D", context_tar(&[("sub/D", "FROM tiny\nFROBNICATE\n")]), "FROBNICATE"),
        ("tag=app&build_args=%5B1%5D", context_tar(&[("Dockerfile", "FROM tiny\n")]), "build_args"),
        ("tag=..%2Fx", context_tar(&[("Dockerfile", "FROM tiny\n")]), "tag"),
    ];
    for (query, body, needle) in cases {
        let (status, reply) = build(query, body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {reply}");
        assert!(error_of(&reply).error.contains(needle), "{query}: {reply}");
    }
    assert!(e.state.0.registry.list().is_empty(), "nothing was started");
    let staging = e.state.0.store.root().join("staging");
    assert_eq!(std::fs::read_dir(&staging).map_or(0, |d| d.count()), 0, "the staged contexts are gone");
}
