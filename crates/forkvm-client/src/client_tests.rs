//! The client against a real HTTP server (`test_server`): what goes on the wire
//! (targets, headers, bodies) and how replies, errors and streams come back.

use crate::test_server::{Recorded, Reply, TestServer};
use crate::{Client, ClientError, ClientOptions, Endpoint, WriteFileOptions};
use forkvm_api::{BranchSandboxRequest, CreateSandboxRequest, ExecEvent, ExecRequest, WatchEvent};
use serde_json::json;

fn sandbox_json(id: &str) -> serde_json::Value {
    json!({
        "id": id, "snapshot_tag": "base", "netns": null, "guest_addr": "unix:/run/x", "created_at_unix": 1,
        "pid": 42, "memory_limit_mib": null, "has_branched": false, "last_branch_memory_path": null,
        "branch_count": 0, "state": "running", "template": "tiny", "forked_from": null, "last_active_unix": 2
    })
}

#[test]
fn the_bearer_token_is_sent() {
    let server = TestServer::tcp(|_| Reply::json(200, json!([sandbox_json("sb-1")])));
    let client = Client::new(server.endpoint.clone(), Some("s3cret".into())).unwrap();
    let list = client.list_sandboxes().unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].id, "sb-1");
    assert_eq!(list[0].pid, Some(42));
    let req = server.last();
    assert_eq!((req.method.as_str(), req.target.as_str()), ("GET", "/v1/sandboxes"));
    assert_eq!(req.header("authorization"), Some("Bearer s3cret"));
    assert_eq!(req.header("host"), Some(server.endpoint.to_string().trim_start_matches("http://")));
    // The token never shows in debug output.
    assert!(!format!("{client:?}").contains("s3cret"));
}

#[test]
fn the_unix_socket_works_without_a_token() {
    let server = TestServer::unix(|_| Reply::json(200, json!({"version": "0.1.0", "api": "v1"})));
    let client = Client::new(server.endpoint.clone(), None).unwrap();
    let v = client.version().unwrap();
    assert_eq!((v.version.as_str(), v.api.as_str()), ("0.1.0", "v1"));
    let req = server.last();
    assert_eq!(req.target, "/version");
    assert_eq!(req.header("authorization"), None);
    assert_eq!(req.header("host"), Some("localhost"));
}

#[test]
fn error_bodies_become_api_errors() {
    let server = TestServer::tcp(|_| {
        Reply::json(409, json!({"error": "snapshot t is being written", "code": "conflict", "state": "writing"}))
    });
    let client = Client::new(server.endpoint.clone(), None).unwrap();
    let e = client.delete_snapshot("t", true, true).unwrap_err();
    match &e {
        ClientError::Api { status, code, message, state } => {
            assert_eq!(*status, 409);
            assert_eq!(*code, crate::ErrorCode::Conflict);
            assert_eq!(message, "snapshot t is being written");
            assert_eq!(state.as_deref(), Some("writing"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(e.to_string(), "snapshot t is being written");
    let req = server.last();
    assert_eq!((req.method.as_str(), req.target.as_str()), ("DELETE", "/v1/snapshots/t?cascade=true&force=true"));
}

#[test]
fn a_reply_that_is_not_json_is_a_decode_error_with_an_excerpt() {
    let server = TestServer::tcp(|_| Reply::raw(200, "text/html", b"<html>proxy login</html>".to_vec()));
    let client = Client::new(server.endpoint.clone(), None).unwrap();
    match client.list_snapshots().unwrap_err() {
        ClientError::Decode { what, body, .. } => {
            assert_eq!(what, "snapshot list");
            assert_eq!(body, "<html>proxy login</html>");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn ids_tags_and_paths_are_encoded_on_the_wire() {
    let server = TestServer::tcp(|r: &Recorded| match r.method.as_str() {
        "GET" if r.target.contains("/files/list") => Reply::json(200, json!([])),
        "GET" => Reply::json(200, sandbox_json("x")),
        _ => Reply::empty(204),
    });
    let client = Client::new(server.endpoint.clone(), None).unwrap();
    client.get_sandbox("../snapshots").unwrap();
    client.kill_sandbox("..").unwrap();
    client.delete_snapshot("a/b c", false, false).unwrap();
    client.list_files("sb 1", "/tmp/a b&c=d#e").unwrap();
    client.remove_file("sb", "/tmp/x", true).unwrap();
    let targets: Vec<String> = server.requests().into_iter().map(|r| r.target).collect();
    assert_eq!(
        targets,
        [
            "/v1/sandboxes/..%2Fsnapshots",
            "/v1/sandboxes/%2E%2E",
            "/v1/snapshots/a%2Fb%20c",
            "/v1/sandboxes/sb%201/files/list?path=/tmp/a%20b%26c%3Dd%23e",
            "/v1/sandboxes/sb/files?path=/tmp/x&recursive=true",
        ]
    );
    // An empty id is refused before anything is sent.
    assert!(matches!(client.get_sandbox(""), Err(ClientError::InvalidArgument { .. })));
    assert_eq!(server.requests().len(), 5);
}

#[test]
fn request_bodies_are_the_api_types() {
    let server = TestServer::tcp(|r: &Recorded| {
        if r.target.ends_with("/branch") {
            Reply::json(
                201,
                json!({"tag": "b1", "dir": "/s/b1", "created_at_unix": 3, "status": "ready", "bootable": true,
                       "pause_ms": 12.5, "mode": "live"}),
            )
        } else {
            Reply::json(201, json!([sandbox_json("sb-a"), sandbox_json("sb-b")]))
        }
    });
    let client = Client::new(server.endpoint.clone(), None).unwrap();
    let req = CreateSandboxRequest {
        snapshot_tag: "base".into(),
        n: 2,
        memory_limit_mib: Some(256),
        cpu_limit_millis: Some(500),
        pids_limit: None,
        io_limits: None,
        vcpus: None,
        per_child_netns: false,
        network: None,
        prewarm: false,
        live_fork: false,
        hugepages: false,
        ttl_seconds: Some(60),
        volumes: Vec::new(),
        checkpoints: None,
    };
    assert_eq!(client.spawn(&req).unwrap().len(), 2);
    let sent = server.last();
    assert_eq!(sent.header("content-type"), Some("application/json"));
    assert_eq!(sent.json()["snapshot_tag"], "base");
    assert_eq!(sent.json()["n"], 2);
    assert_eq!(sent.json()["memory_limit_mib"], 256);
    assert_eq!(sent.json()["cpu_limit_millis"], 500);
    assert!(sent.json().get("pids_limit").is_none(), "an unset new limit is left out of the body");
    assert_eq!(sent.json()["ttl_seconds"], 60);
    let snap = client
        .branch(
            "sb-a",
            &BranchSandboxRequest {
                tag: Some("b1".into()),
                mode: Some("live".into()),
                wait: true,
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!((snap.tag.as_str(), snap.pause_ms, snap.mode.as_deref()), ("b1", Some(12.5), Some("live")));
    let sent = server.last();
    assert_eq!(sent.target, "/v1/sandboxes/sb-a/branch");
    assert_eq!(
        (sent.json()["tag"].clone(), sent.json()["mode"].clone(), sent.json()["wait"].clone()),
        (json!("b1"), json!("live"), json!(true))
    );
}

/// The NDJSON of an exec stream, cut mid-line and mid-character across frames.
fn exec_stream_chunks() -> Vec<Vec<u8>> {
    let text = concat!(
        r#"{"type":"stdout","data":"héllo\n"}"#,
        "\n",
        r#"{"type":"stderr","data":"warn"}"#,
        "\n",
        r#"{"type":"stdout","data":"two"}"#,
        "\n",
        r#"{"type":"exit","exit_code":3,"signal":null,"timed_out":false,"duration_ms":7}"#,
        "\n"
    )
    .as_bytes()
    .to_vec();
    let e_acute = text.iter().position(|&b| b == 0xC3).unwrap();
    let cuts = [5, e_acute + 1, 40, 41, 70, text.len() - 3];
    let mut chunks = Vec::new();
    let mut start = 0;
    for cut in cuts {
        chunks.push(text[start..cut].to_vec());
        start = cut;
    }
    chunks.push(text[start..].to_vec());
    chunks
}

#[test]
fn exec_stream_parses_lines_split_across_frames() {
    let server = TestServer::tcp(|_| Reply::chunked(200, "application/x-ndjson", exec_stream_chunks()));
    let client = Client::new(server.endpoint.clone(), None).unwrap();
    let req = ExecRequest { args: vec!["sh".into(), "-c".into(), "x".into()], timeout_secs: 30, ..Default::default() };
    let mut events = Vec::new();
    let exit = client.exec_stream("sb-1", &req, |e| events.push(e)).unwrap();
    assert_eq!(
        events,
        [
            ExecEvent::Stdout { data: "héllo\n".into() },
            ExecEvent::Stderr { data: "warn".into() },
            ExecEvent::Stdout { data: "two".into() },
        ]
    );
    assert_eq!((exit.exit_code, exit.signal, exit.timed_out, exit.duration_ms), (3, None, false, 7));
    let sent = server.last();
    assert_eq!(sent.target, "/v1/sandboxes/sb-1/exec/stream");
    assert_eq!(sent.json()["args"], json!(["sh", "-c", "x"]));
}

#[test]
fn exec_stream_error_and_truncation_are_errors() {
    let server = TestServer::tcp(|r: &Recorded| {
        let lines: &[u8] = if r.target.starts_with("/v1/sandboxes/bad/") {
            b"{\"type\":\"stdout\",\"data\":\"a\"}\n{\"type\":\"error\",\"error\":\"agent went away\"}\n"
        } else {
            b"{\"type\":\"stdout\",\"data\":\"a\"}\n"
        };
        Reply::chunked(200, "application/x-ndjson", vec![lines.to_vec()])
    });
    let client = Client::new(server.endpoint.clone(), None).unwrap();
    let req = ExecRequest { cmd: Some("true".into()), timeout_secs: 30, ..Default::default() };
    let e = client.exec_stream("bad", &req, |_| {}).unwrap_err();
    assert!(matches!(&e, ClientError::Stream { message } if message == "agent went away"), "{e:?}");
    let e = client.exec_stream("cut", &req, |_| {}).unwrap_err();
    assert!(matches!(e, ClientError::Truncated), "{e:?}");
}

#[test]
fn a_watch_hands_over_its_lines_until_the_caller_or_the_sandbox_ends_it() {
    let server = TestServer::tcp(|r: &Recorded| {
        let lines: &[u8] = if r.target.starts_with("/v1/sandboxes/bad/") {
            b"{\"type\":\"armed\",\"directories\":1}\n{\"type\":\"error\",\"error\":\"agent went away\"}\n"
        } else if r.target.starts_with("/v1/sandboxes/cut/") {
            b"{\"type\":\"armed\",\"directories\":1}\n"
        } else {
            b"{\"type\":\"armed\",\"directories\":2}\n{\"type\":\"change\",\"kind\":\"create\",\"path\":\"a\"}\n\
              {\"type\":\"keepalive\"}\n{\"type\":\"change\",\"kind\":\"remove\",\"path\":\"a\"}\n\
              {\"type\":\"end\",\"reason\":\"gone\"}\n"
        };
        // Cut mid-line: lines are whole however the body is framed.
        Reply::chunked(200, "application/x-ndjson", lines.chunks(7).map(<[u8]>::to_vec).collect())
    });
    let client = Client::new(server.endpoint.clone(), None).unwrap();
    let mut seen = Vec::new();
    let end = client.watch_files("sb-1", "/w", true, |e| {
        seen.push(e);
        true
    });
    assert_eq!(end.unwrap(), Some("gone".to_string()));
    assert_eq!(server.last().target, "/v1/sandboxes/sb-1/files/watch?path=/w&recursive=true");
    assert_eq!(
        seen,
        [
            WatchEvent::Armed { directories: 2 },
            WatchEvent::Change { kind: "create".into(), path: "a".into() },
            WatchEvent::Keepalive,
            WatchEvent::Change { kind: "remove".into(), path: "a".into() },
        ]
    );
    let mut n = 0;
    let stopped = client.watch_files("sb-1", "/w", false, |_| {
        n += 1;
        n < 2
    });
    assert_eq!((stopped.unwrap(), n), (None, 2), "the caller stopped at the second line");
    let e = client.watch_files("bad", "/w", false, |_| true).unwrap_err();
    assert!(matches!(&e, ClientError::Stream { message } if message == "agent went away"), "{e:?}");
    let e = client.watch_files("cut", "/w", false, |_| true).unwrap_err();
    assert!(matches!(e, ClientError::Truncated), "{e:?}");
}

#[test]
fn uploads_stream_from_a_reader_and_downloads_into_a_writer() {
    let content: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let served = content.clone();
    let server = TestServer::tcp(move |r: &Recorded| match r.method.as_str() {
        "PUT" => Reply::json(201, json!({"path": "/tmp/f", "bytes": r.body.len(), "sha256": "ab".repeat(32)})),
        _ => Reply::chunked(200, "application/octet-stream", served.chunks(70_000).map(<[u8]>::to_vec).collect()),
    });
    let client = Client::new(server.endpoint.clone(), None).unwrap();
    let opts = WriteFileOptions { mode: Some(0o644), create_parents: true };
    let written = client.write_file_from("sb", "/tmp/f", &mut content.as_slice(), &opts).unwrap();
    assert_eq!(written.bytes, content.len() as u64);
    let sent = server.last();
    assert_eq!(sent.target, "/v1/sandboxes/sb/files?path=/tmp/f&mode=420&create_parents=true");
    assert_eq!(sent.header("transfer-encoding"), Some("chunked"));
    assert!(sent.body == content, "the upload arrived byte-identical");

    let written = client.write_file("sb", "/tmp/g", b"small", &WriteFileOptions::default()).unwrap();
    assert_eq!(written.bytes, 5);
    assert_eq!(server.last().target, "/v1/sandboxes/sb/files?path=/tmp/g");
    assert_eq!(server.last().header("content-length"), Some("5"));

    let mut sink = Vec::new();
    assert_eq!(client.read_file("sb", "/tmp/f", &mut sink).unwrap(), content.len() as u64);
    assert!(sink == content, "the download arrived byte-identical");
}

#[test]
fn an_upload_reader_failure_is_reported_as_such() {
    struct Failing;
    impl std::io::Read for Failing {
        fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
            Err(std::io::Error::other("disk on fire"))
        }
    }
    let server = TestServer::tcp(|_| Reply::json(201, json!({"path": "/x", "bytes": 0})));
    let client = Client::new(server.endpoint.clone(), None).unwrap();
    let e = client.write_file_from("sb", "/x", &mut Failing, &WriteFileOptions::default()).unwrap_err();
    assert!(matches!(&e, ClientError::Source(s) if s.to_string() == "disk on fire"), "{e:?}");
}

#[test]
fn https_with_a_ca_file() {
    for ca in [false, true] {
        let server = TestServer::tls(ca, |_| Reply::json(200, json!({"ok": true})));
        let opts =
            ClientOptions { token: Some("t".into()), ca_cert: server.ca_file.clone(), ..ClientOptions::default() };
        let client = Client::with_options(server.endpoint.clone(), opts).unwrap();
        assert!(client.health().unwrap().ok, "CA:TRUE {ca}");
        assert_eq!(server.last().header("authorization"), Some("Bearer t"));
        // Without the CA file the self-signed daemon is not trusted.
        let client = Client::new(server.endpoint.clone(), None).unwrap();
        let e = client.health().unwrap_err();
        assert!(matches!(e, ClientError::Tls { .. }), "{e:?}");
    }
}

#[test]
fn a_pinned_certificate_must_still_name_the_host() {
    let server = TestServer::tls(true, |_| Reply::json(200, json!({"ok": true})));
    let Endpoint::Https { port, .. } = server.endpoint else { panic!("not https") };
    // The certificate names 127.0.0.1 only; "localhost" reaches the same listener.
    let endpoint = Endpoint::Https { host: "localhost".into(), port };
    let opts = ClientOptions { ca_cert: server.ca_file.clone(), ..ClientOptions::default() };
    let e = Client::with_options(endpoint, opts).unwrap().health().unwrap_err();
    let ClientError::Tls { source, .. } = &e else { panic!("{e:?}") };
    assert!(source.to_string().contains("not valid for name"), "{source}");
}

#[test]
fn a_bad_ca_file_is_refused_up_front() {
    let dir = tempfile::tempdir().unwrap();
    let pem = dir.path().join("empty.pem");
    std::fs::write(&pem, "not a certificate\n").unwrap();
    let opts = ClientOptions { ca_cert: Some(pem), ..ClientOptions::default() };
    let e = Client::with_options(Endpoint::parse("https://127.0.0.1:1").unwrap(), opts).unwrap_err();
    assert!(matches!(e, ClientError::CaCert { .. }), "{e:?}");
}

#[test]
fn nothing_listening_is_a_connect_error() {
    let dir = tempfile::tempdir().unwrap();
    let endpoint = Endpoint::Unix(dir.path().join("none.sock"));
    let e = Client::new(endpoint, None).unwrap().health().unwrap_err();
    assert!(e.is_unreachable(), "{e:?}");
    assert!(e.to_string().starts_with("connecting to the daemon at unix:"), "{e}");
}

#[test]
fn metrics_are_text() {
    let server = TestServer::tcp(|_| Reply::raw(200, "text/plain", b"forkvm_sandboxes 3\n".to_vec()));
    let client = Client::new(server.endpoint.clone(), None).unwrap();
    assert_eq!(client.metrics().unwrap(), "forkvm_sandboxes 3\n");
}

/// A `SnapshotInfo` of `tag`, with `extra` fields set.
fn snapshot_json(tag: &str, extra: serde_json::Value) -> serde_json::Value {
    let mut v =
        json!({"tag": tag, "dir": format!("/s/{tag}"), "created_at_unix": 3, "status": "ready", "bootable": true});
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    v
}

#[test]
fn snapshot_chain_calls() {
    let pack: Vec<u8> = (0..200_000u32).map(|i| (i * 13 % 251) as u8).collect();
    let served = pack.clone();
    let server = TestServer::tcp(move |r: &Recorded| match (r.method.as_str(), r.target.as_str()) {
        ("POST", "/v1/snapshots/head/compact") => {
            Reply::json(200, snapshot_json("flat", json!({"branched_from": "compact:head"})))
        }
        ("GET", "/v1/snapshots/head/pack") => {
            Reply::chunked(200, "application/zstd", served.chunks(60_000).map(<[u8]>::to_vec).collect())
        }
        ("POST", "/v1/snapshots/unpack") => Reply::json(
            201,
            json!({"head": "head", "imported": ["base", "head"], "reused": [], "chunks_new": 4, "chunks_present": 0,
                   "logical_bytes": 9, "pack_bytes": r.body.len(), "ms": 1.5}),
        ),
        ("GET", "/v1/snapshots/head/info") => Reply::json(
            200,
            json!({"tag": "head", "dir": "/s/head", "created_at_unix": 3, "memory_logical_bytes": 4096,
                   "memory_physical_bytes": 100, "vmstate_bytes": 10, "parent_tag": "base",
                   "parent_content_hash": "ab", "chain_depth": 1, "ancestors": ["base"], "dependents": [],
                   "branched_from": null, "status": "failed", "descendants": [], "bootable": false,
                   "problem": "parent gone", "memory_format": "chunked", "content_hash": "cd",
                   "chain_physical_bytes": 300, "chunks": 2}),
        ),
        // An older daemon: forkd's fields only.
        ("GET", "/v1/snapshots/old/info") => Reply::json(
            200,
            json!({"tag": "old", "dir": "/s/old", "created_at_unix": null, "memory_logical_bytes": 1,
                   "memory_physical_bytes": 1, "vmstate_bytes": 1, "parent_tag": null, "parent_content_hash": null,
                   "chain_depth": 0, "ancestors": [], "dependents": [], "status": "ready"}),
        ),
        _ => Reply::json(404, json!({"error": "no such route", "code": "not_found"})),
    });
    let client = Client::new(server.endpoint.clone(), None).unwrap();

    let flat = client.compact_snapshot("head", "flat").unwrap();
    assert_eq!((flat.tag.as_str(), flat.branched_from.as_deref()), ("flat", Some("compact:head")));
    let sent = server.last();
    assert_eq!(sent.json(), json!({"to": "flat"}));
    assert_eq!(sent.header("content-type"), Some("application/json"));

    let mut sink = Vec::new();
    assert_eq!(client.pack_snapshot("head", &mut sink).unwrap(), pack.len() as u64);
    assert!(sink == pack, "the pack arrived byte-identical");

    let r = client.unpack_snapshot(&mut pack.as_slice()).unwrap();
    assert_eq!((r.head.as_str(), r.imported.len(), r.pack_bytes), ("head", 2, pack.len() as u64));
    let sent = server.last();
    assert_eq!(sent.header("content-type"), Some("application/zstd"));
    assert_eq!(sent.header("transfer-encoding"), Some("chunked"), "streamed, not buffered");
    assert!(sent.body == pack, "the upload arrived byte-identical");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("head.tar.zst");
    std::fs::write(&file, &pack).unwrap();
    assert_eq!(client.unpack_snapshot_file(&file).unwrap().pack_bytes, pack.len() as u64);
    let missing = dir.path().join("none.tar.zst");
    let e = client.unpack_snapshot_file(&missing).unwrap_err();
    assert!(matches!(&e, ClientError::OpenFile { path, .. } if *path == missing), "{e:?}");

    let info = client.snapshot_info("head").unwrap();
    assert_eq!((info.bootable, info.problem.as_deref(), info.chunks), (false, Some("parent gone"), 2));
    assert_eq!((info.memory_format.as_str(), info.chain_physical_bytes), ("chunked", 300));
    let old = client.snapshot_info("old").unwrap();
    assert!(old.bootable && old.descendants.is_empty() && old.content_hash.is_none(), "{old:?}");

    let e = client.compact_snapshot("", "x").unwrap_err();
    assert!(matches!(e, ClientError::InvalidArgument { .. }), "{e:?}");
}

#[test]
fn a_diff_branch_sends_its_mode_and_parent() {
    let server = TestServer::tcp(|_| Reply::json(201, snapshot_json("d1", json!({"mode": "diff", "pause_ms": 40.0}))));
    let client = Client::new(server.endpoint.clone(), None).unwrap();
    let req = BranchSandboxRequest::diff(Some("d1".into()), Some("py".into()));
    let snap = client.branch("sb-a", &req).unwrap();
    assert_eq!((snap.mode.as_deref(), snap.pause_ms), (Some("diff"), Some(40.0)));
    let sent = server.last().json();
    assert_eq!(
        (&sent["mode"], &sent["tag"], &sent["parent_tag"], &sent["wait"]),
        (&json!("diff"), &json!("d1"), &json!("py"), &json!(true))
    );
}

#[test]
fn disk_snapshots_are_taken_and_listed() {
    let server = TestServer::tcp(|req| match req.method.as_str() {
        "POST" => Reply::json(
            201,
            json!({
                "sandbox_id": "sb-1", "seq": 7, "unchanged": false, "new_layers": 1, "seal_ms": 0.4,
                "write_ms": 12.5, "written_chunks": 3, "written_bytes": 12288, "stored_bytes": 40960, "retired": 1
            }),
        ),
        _ => Reply::json(
            200,
            json!([{ "seq": 7, "created_unix_ms": 1700000000000u64, "stored_bytes": 40960, "disks": [{
                "id": "data", "base_key": "blake3:ab", "size": 1048576, "layer_id": "00ff", "blocks": 10, "extents": 2
            }]}]),
        ),
    });
    let client = Client::new(server.endpoint.clone(), None).unwrap();
    let req = forkvm_api::DiskSnapshotRequest { keep_last: Some(5), ..Default::default() };
    let r = client.disk_snapshot("sb-1", &req).unwrap();
    assert_eq!((r.seq, r.unchanged, r.written_bytes, r.retired), (7, false, 12288, 1));
    let sent = server.last();
    assert_eq!((sent.method.as_str(), sent.target.as_str()), ("POST", "/v1/sandboxes/sb-1/disk-snapshots"));
    assert_eq!(sent.json(), json!({"keep_last": 5, "keep_hourly": null, "keep_daily": null}));
    let list = client.disk_snapshots("sb-1").unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!((list[0].seq, list[0].disks[0].id.as_str(), list[0].disks[0].blocks), (7, "data", 10));
    assert_eq!(server.last().target, "/v1/sandboxes/sb-1/disk-snapshots");
}

#[test]
fn lifecycle_calls() {
    let server = TestServer::tcp(|req| {
        if req.target.ends_with("/archive") {
            Reply::json(
                200,
                json!({"sandbox_id": "sb-1", "dir": "/s/archives/sb-1", "disk_snapshot_seq": 4, "write_ms": 80.0,
                       "total_ms": 120.0, "reason": "api"}),
            )
        } else if req.target.ends_with("/disk-fork") {
            Reply::json(201, sandbox_json("sb-new"))
        } else {
            let mut s = sandbox_json("sb-1");
            s["ttl_seconds"] = json!(30);
            s["expires_at_unix_ms"] = json!(1_700_000_030_000u64);
            Reply::json(200, s)
        }
    });
    let client = Client::new(server.endpoint.clone(), None).unwrap();
    let r = client.archive("sb-1").unwrap();
    assert_eq!((r.disk_snapshot_seq, r.reason.as_str()), (Some(4), "api"));
    assert_eq!((server.last().method.as_str(), server.last().target.as_str()), ("POST", "/v1/sandboxes/sb-1/archive"));
    let s = client.restore("sb-1", &forkvm_api::RestoreRequest { ttl_seconds: Some(30) }).unwrap();
    assert_eq!(s.expires_at_unix_ms, Some(1_700_000_030_000));
    assert_eq!(server.last().target, "/v1/sandboxes/sb-1/restore");
    assert_eq!(server.last().json(), json!({"ttl_seconds": 30}));
    let s = client.set_ttl("sb-1", 30).unwrap();
    assert_eq!(s.ttl_seconds, Some(30));
    assert_eq!(
        (server.last().target.as_str(), server.last().json()),
        ("/v1/sandboxes/sb-1/ttl", json!({"ttl_seconds": 30}))
    );
    let req = forkvm_api::DiskForkRequest { seq: Some(2), ..Default::default() };
    assert_eq!(client.disk_fork("sb-1", &req).unwrap().id, "sb-new");
    assert_eq!(server.last().target, "/v1/sandboxes/sb-1/disk-fork");
    assert_eq!(server.last().json(), json!({"seq": 2, "memory_limit_mib": null, "ttl_seconds": null, "restore": null}));
}

#[test]
fn workspace_and_console_calls_go_to_their_routes() {
    let ws = json!({
        "id": "ws-1", "name": "dev", "source_snapshot_tag": "py", "status": "running", "live_sandbox_id": "sb-1",
        "created_at_unix": 1, "last_active_unix": 2, "sandbox_id": "sb-1"
    });
    let reply = ws.clone();
    let server = TestServer::unix(move |r: &Recorded| match (r.method.as_str(), r.target.as_str()) {
        ("GET", "/v1/workspaces") => Reply::json(200, json!([reply.clone()])),
        ("DELETE", _) => Reply::empty(204),
        ("GET", t) if t.contains("/console") => Reply::raw(200, "text/plain", b"[    0.0] Linux\n".to_vec()),
        _ => Reply::json(200, reply.clone()),
    });
    let client = Client::new(server.endpoint.clone(), None).unwrap();
    let req = forkvm_api::workspaces::CreateWorkspaceRequest {
        name: "dev".into(),
        snapshot_tag: "py".into(),
        per_child_netns: false,
        memory_limit_mib: None,
    };
    assert_eq!(client.create_workspace(&req).unwrap().name, "dev");
    assert_eq!(client.list_workspaces().unwrap().len(), 1);
    assert_eq!(client.get_workspace("dev").unwrap().sandbox_id, "sb-1");
    client.suspend_workspace("dev").unwrap();
    client.resume_workspace("dev").unwrap();
    client.delete_workspace("dev").unwrap();
    assert_eq!(client.console("sb-1", Some(100)).unwrap(), "[    0.0] Linux\n");
    let seen: Vec<(String, String)> = server.requests().into_iter().map(|r| (r.method, r.target)).collect();
    let want = [
        ("POST", "/v1/workspaces"),
        ("GET", "/v1/workspaces"),
        ("GET", "/v1/workspaces/dev"),
        ("POST", "/v1/workspaces/dev/suspend"),
        ("POST", "/v1/workspaces/dev/resume"),
        ("DELETE", "/v1/workspaces/dev"),
        ("GET", "/v1/sandboxes/sb-1/console?bytes=100"),
    ];
    assert_eq!(seen, want.map(|(m, t)| (m.to_string(), t.to_string())));
}
