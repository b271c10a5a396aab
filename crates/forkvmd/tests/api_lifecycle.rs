//! Running sandboxes over time, through the REST API in process (no KVM): disk snapshots
//! (taken, listed, retired, one at a time per sandbox, on a schedule) against a fake VMM
//! whose control socket seals real disk layers, and the lifecycle (archive, restore, TTL,
//! idle pause and resume) against a fake control socket. Split from `api_contract.rs`
//! (the route-wide contract: auth, 400/404/409, OpenAPI) so that each file has one topic.

mod common_api;

use axum::http::StatusCode;
use common_api::{call, env, error_of, fake_running, get_json, Env, TOKEN};
use forkvm_sandbox::registry::SandboxRow;
use forkvm_sandbox::{SandboxState, StateReason};
use forkvmd::audit::AuditLog;

// --- disk snapshots ---------------------------------------------------------------------

/// The vault keys of this test process (`FORKVM_KEYS` is read by the library), set once:
/// sandbox ids differ between tests, so they can share it. In cargo's per-target scratch
/// directory under a fixed name, emptied by the next run (a static is never dropped, so a
/// directory in /tmp would be left behind).
fn test_keys() {
    static KEYS: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    KEYS.get_or_init(|| {
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("api-lifecycle-keys");
        let _ = std::fs::remove_dir_all(&dir);
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
    e.state.registry.row(id).expect("a row")
}

/// Notes sandbox `id`'s last activity at `last_activity_unix_ms`.
fn active_at(e: &Env, id: &str, last_activity_unix_ms: u64) {
    e.state.registry.touch(id, last_activity_unix_ms).unwrap();
}

#[tokio::test]
async fn archived_sandboxes_are_listed_refuse_calls_and_only_delete_removes_them() {
    let e = env();
    // An archived sandbox: its registry row and its archive on disk.
    let archive = e.state.store.root().join("archives/arch1");
    std::fs::create_dir_all(&archive).unwrap();
    std::fs::write(archive.join("archive.json"), "{}").unwrap();
    let before = forkvm_sandbox::registry::now_unix_ms();
    let record = e.state.registry.new_record("arch1", Default::default()).unwrap();
    e.state.registry.begin_in(&[&record], None, SandboxState::Archived).unwrap();
    assert!(e
        .state
        .registry
        .transition("arch1", &[SandboxState::Archived], SandboxState::Archived, Some(StateReason::Ttl))
        .unwrap());
    active_at(&e, "arch1", 5_000);

    let info: forkvm_api::SandboxInfo = get_json(&e, "/v1/sandboxes/arch1").await;
    assert_eq!((info.state.as_str(), info.reason.as_deref(), info.pid), ("archived", Some("ttl"), None));
    assert!(info.archived_at_unix_ms.is_some_and(|t| t >= before), "{info:?}");
    assert_eq!(info.last_activity_unix_ms, 5_000);
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
    assert_eq!(row_of(&e, "arch1").state.as_str(), "archived");
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
    active_at(&e, "ttl1", 1_000);
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
    e.state.registry.set_ttl("ttl1", Some(1), Some(1)).unwrap();
    let audit = AuditLog::open(&e.dir.path().join("lifecycle-audit.log")).unwrap();
    forkvmd::lifecycle::tick(&e.state, Some(&audit)).await;
    assert_eq!(row_of(&e, "ttl1").state.as_str(), "running");
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
    active_at(&e, "idle1", now - 5_000);
    active_at(&e, "busy1", now);
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

#[tokio::test]
async fn delete_with_purge_destroys_the_key_then_the_vault_unless_something_still_reads_it() {
    use forkvm_snapshot::vault::{KeyStore, Vault};
    test_keys();
    let e = env();
    let keys = KeyStore::open(&forkvm_sandbox::disk_snapshots::keys_dir()).unwrap();
    // A sandbox deleted earlier: only its vault is left (with one disk snapshot).
    let vault_dir = forkvm_sandbox::disk_snapshots::vault_dir(&e.state.store, "gone1");
    let vault = Vault::open(&vault_dir, keys.sandbox_key("gone1").unwrap()).unwrap();
    let layer = e.dir.path().join("layer");
    let mut b =
        forkvm_snapshot::layered_disk::SealedLayerBuilder::create(&layer, 1 << 20, forkvm_snapshot::LayerId::BASE)
            .unwrap();
    b.put_blocks(3, &[7u8; 4096]).unwrap();
    b.finish().unwrap();
    let input =
        forkvm_snapshot::vault::DiskInput { id: "forkvm-data".into(), base_key: "b".into(), layers: vec![layer] };
    let seq = vault.snapshot(&[input]).unwrap().seq;
    // Without purge there is nothing to delete; with it, a live reader (a lazy restore's
    // pin whose cache exists) refuses it and nothing is removed.
    let (status, _) = call(&e.app, "DELETE", "/v1/sandboxes/gone1", Some(TOKEN), "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let cache = e.dir.path().join("reader-cache");
    std::fs::create_dir_all(&cache).unwrap();
    vault.pin_while(seq, "lazy-reader", Some(&cache)).unwrap();
    let (status, text) = call(&e.app, "DELETE", "/v1/sandboxes/gone1?purge=true", Some(TOKEN), "").await;
    assert_eq!(status, StatusCode::CONFLICT, "{text}");
    assert_eq!(error_of(&text).state.as_deref(), Some("in_use"));
    assert!(text.contains("lazy-reader"), "{text}");
    assert!(vault_dir.is_dir() && keys.has_sandbox_key("gone1"));
    // Once the reader let go: the key goes, then the vault.
    vault.unpin(seq, "lazy-reader").unwrap();
    let (status, text) = call(&e.app, "DELETE", "/v1/sandboxes/gone1?purge=true", Some(TOKEN), "").await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{text}");
    assert!(!vault_dir.exists() && !keys.has_sandbox_key("gone1"));
    let (status, _) = call(&e.app, "DELETE", "/v1/sandboxes/gone1?purge=true", Some(TOKEN), "").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "nothing left");
    let (status, _) = call(&e.app, "DELETE", "/v1/sandboxes/gone1?purge=yes", Some(TOKEN), "").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

// --- reads are pure; the sweep is the one pass that cleans up ------------------------------

/// Every file under `root` but the audit log (each request appends a line to it): path,
/// size and modification time.
fn tree(root: &std::path::Path) -> Vec<(std::path::PathBuf, u64, std::time::SystemTime)> {
    let mut out = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            if m.is_dir() {
                dirs.push(e.path());
            }
            if e.file_name() != "audit.log" {
                out.push((e.path(), m.len(), m.modified().unwrap()));
            }
        }
    }
    out.sort();
    out
}

#[tokio::test]
async fn reads_of_a_dead_sandbox_change_nothing_on_disk_and_the_sweep_cleans_up() {
    let e = env();
    // A sandbox whose VMM died: its row names a process that has exited and still says
    // running, and its run directory holds a console log.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead_pid = child.id() as i32;
    child.wait().unwrap();
    fake_running(&e, "dead1", Some("py"), None);
    let mut record = e.state.registry.lookup("dead1").unwrap().0;
    record.pid = dead_pid;
    e.state.registry.write(&record).unwrap();
    std::fs::write(record.console(), "kernel panic: the reason it stopped\n").unwrap();
    // A live one beside it.
    fake_running(&e, "live1", Some("py"), None);
    let rows_before = e.state.registry.rows();

    let before = tree(e.dir.path());
    let listed: serde_json::Value = get_json(&e, "/v1/sandboxes").await;
    let ids: Vec<&str> = listed.as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["live1"], "{listed}");
    let (status, text) = call(&e.app, "GET", "/v1/sandboxes/dead1", Some(TOKEN), "").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{text}");
    assert!(text.contains("has stopped") && text.contains("the reason it stopped"), "{text}");
    for uri in ["/metrics", "/v1/sandboxes/dead1", "/v1/sandboxes", "/v1/sandboxes/live1"] {
        let (status, _) = call(&e.app, "GET", uri, Some(TOKEN), "").await;
        assert!(status == StatusCode::OK || status == StatusCode::NOT_FOUND, "{uri}: {status}");
    }
    assert_eq!(tree(e.dir.path()), before, "a read changed the disk");
    assert_eq!(e.state.registry.rows(), rows_before, "a read changed the registry");
    assert_eq!(row_of(&e, "dead1").state, SandboxState::Running);

    // The explicit pass removes the dead one's run directory and row, and nothing else.
    let swept = forkvmd::sweeper::sweep_once(&e.state);
    assert_eq!(swept.stopped, ["dead1"]);
    assert!(!record.run_dir.exists());
    assert!(e.state.registry.row("dead1").is_none());
    assert_eq!(row_of(&e, "live1").state.as_str(), "running");
    assert!(e.state.registry.get("live1").is_ok());
    let (status, text) = call(&e.app, "GET", "/v1/sandboxes/dead1", Some(TOKEN), "").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{text}");
    assert_eq!(
        forkvmd::sweeper::sweep_once(&e.state),
        forkvm_sandbox::registry::Swept::default(),
        "a second pass has nothing to do"
    );
}
