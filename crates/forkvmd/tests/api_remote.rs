//! `/v1/remote*` in process (no KVM): the daemon's remote is its own (a `file://`
//! directory here, the real `object_store` client), a daemon without one answers 409
//! saying how to give it one, and what a request names (tags, lock names) is checked
//! before anything is touched. A real chain pushed by one daemon and pulled and spawned
//! by another is `sdk/python/tests/test_daemon.py::test_a_tag_pushed_*`.

mod common_api;

use axum::http::StatusCode;
use common_api::{call, env, error_of, TOKEN};
use forkvm_remote::{Remote, RemoteKey};
use forkvm_sandbox::replication::Replication;
use std::sync::Arc;

/// Drives the app from a plain test: the remote keeps a runtime of its own, which must
/// not be dropped inside another's async context.
fn run<T>(rt: &tokio::runtime::Runtime, f: impl std::future::Future<Output = T>) -> T {
    rt.block_on(f)
}

#[test]
fn the_remote_routes_act_on_the_daemons_remote_and_check_what_they_are_given() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let e = env();
    let app = e.app.clone();

    // No remote: every route says how to give the daemon one.
    let (status, text) = run(&rt, call(&app, "GET", "/v1/remote", Some(TOKEN), ""));
    assert_eq!(status, StatusCode::CONFLICT, "{text}");
    assert!(error_of(&text).error.contains("--remote URL"), "{text}");
    let (status, _) = run(&rt, call(&app, "POST", "/v1/remote/push", Some(TOKEN), r#"{"tag":"py"}"#));
    assert_eq!(status, StatusCode::CONFLICT);

    let key = e.dir.path().join("remote.key");
    RemoteKey::generate(&key).unwrap();
    let url = format!("file://{}", e.dir.path().join("remote").display());
    assert!(e.state.remote.set(Arc::new(Replication::open(&url, &key).unwrap())).is_ok());

    let (status, text) = run(&rt, call(&app, "GET", "/v1/remote", Some(TOKEN), ""));
    assert_eq!(status, StatusCode::OK, "{text}");
    let info: forkvm_api::RemoteInfo = serde_json::from_str(&text).unwrap();
    assert_eq!((info.url.as_str(), info.tags.len()), (url.as_str(), 0));

    // Unknown and bad tags, both ways.
    for (method, uri, body, want) in [
        ("POST", "/v1/remote/push", r#"{"tag":"nope"}"#, StatusCode::NOT_FOUND),
        ("POST", "/v1/remote/pull", r#"{"tag":"nope"}"#, StatusCode::NOT_FOUND),
        ("DELETE", "/v1/remote/tags/nope", "", StatusCode::NOT_FOUND),
        ("POST", "/v1/remote/push", r#"{"tag":"../etc"}"#, StatusCode::BAD_REQUEST),
        ("POST", "/v1/remote/pull", r#"{"tag":"a/b"}"#, StatusCode::BAD_REQUEST),
        ("DELETE", "/v1/remote/tags/a..b", "", StatusCode::BAD_REQUEST),
        ("POST", "/v1/remote/push", r#"{"tag":"py","to":"s3://elsewhere"}"#, StatusCode::BAD_REQUEST),
        ("POST", "/v1/remote/gc", r#"{"min_age_s":-1}"#, StatusCode::BAD_REQUEST),
        ("DELETE", "/v1/remote/locks/..%2Ftags%2Fpy", "", StatusCode::BAD_REQUEST),
        ("DELETE", "/v1/remote/locks/shared-0123", "", StatusCode::BAD_REQUEST),
        ("DELETE", "/v1/remote/locks/shared-0123456789abcdef", "", StatusCode::NOT_FOUND),
    ] {
        let (status, text) = run(&rt, call(&app, method, uri, Some(TOKEN), body));
        assert_eq!(status, want, "{method} {uri} {body}: {text}");
    }
    assert!(!e.dir.path().join("etc").exists() && !e.dir.path().join("remote/tags").exists());

    // A lock a dead push left: listed, in the way of a collection, broken by name.
    let remote = Remote::open(&url).unwrap();
    remote
        .put(
            "locks/shared-00000000000000aa",
            br#"{"kind":"shared","host":"h","pid":7,"purpose":"push d1","since_unix_ms":1}"#.to_vec(),
        )
        .unwrap();
    let (status, text) = run(&rt, call(&app, "GET", "/v1/remote/locks", Some(TOKEN), ""));
    assert_eq!(status, StatusCode::OK, "{text}");
    let locks: Vec<forkvm_api::LockInfo> = serde_json::from_str(&text).unwrap();
    assert_eq!(locks.len(), 1);
    assert_eq!((locks[0].purpose.as_deref(), locks[0].pid, locks[0].stale), (Some("push d1"), Some(7), false));
    let (status, text) = run(&rt, call(&app, "POST", "/v1/remote/gc", Some(TOKEN), "{}"));
    assert_eq!(status, StatusCode::CONFLICT, "{text}");
    assert!(text.contains("push d1 on host"), "{text}");
    let (status, text) = run(&rt, call(&app, "DELETE", "/v1/remote/locks/shared-00000000000000aa", Some(TOKEN), ""));
    assert_eq!(status, StatusCode::OK, "{text}");
    let broken: forkvm_api::LockInfo = serde_json::from_str(&text).unwrap();
    assert_eq!(broken.name, "shared-00000000000000aa");
    let (status, text) = run(&rt, call(&app, "POST", "/v1/remote/gc", Some(TOKEN), r#"{"dry_run":true}"#));
    assert_eq!(status, StatusCode::OK, "{text}");
    let gc: forkvm_api::GcReport = serde_json::from_str(&text).unwrap();
    assert_eq!((gc.dry_run, gc.tags, gc.blocks, gc.blocks_deleted), (true, 0, 0, 0));
    assert!(remote.list("locks").unwrap().is_empty(), "the collection's own lock is gone");
    drop((app, e, remote));
}
