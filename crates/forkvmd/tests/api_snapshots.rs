//! Snapshot chains through the REST API, in process (no KVM): info, delete with
//! dependents, compact, pack/unpack, and the checks a diff branch makes on its parent
//! before anything is written. They run on synthetic snapshots built with the chain
//! library itself: a base and two diffs over it. Split from `api_contract.rs` (the
//! route-wide contract: auth, 400/404/409, OpenAPI) so that each file has one topic.

mod common_api;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use common_api::{call, env, error_of, fake_running, get_json, Env, TOKEN};
use forkvm_snapshot::chain;
use forkvm_snapshot::{SnapshotDir, Store};
use tower::ServiceExt;

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
        .header("host", "127.0.0.1:8889")
        .body(Body::from(body))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let (status, headers) = (resp.status(), resp.headers().clone());
    let bytes = axum::body::to_bytes(resp.into_body(), 64 << 20).await.unwrap();
    (status, headers, bytes.to_vec())
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
        chain::write_diff(store, &e.state.cache, &parent_chain, &staged, tag, None).unwrap();
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
        assert_eq!(error_of(&text).code.as_str(), "bad_request");
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
async fn a_daemon_that_trusts_keys_refuses_other_packs_before_writing_anything() {
    use forkvm_snapshot::pack_archive::signature::{generate_key, read_secret_key};
    use forkvm_snapshot::pack_archive::PackTrust;
    use forkvmd::state::PackPolicy;
    let e = env();
    build_chain(&e);
    let keys = e.dir.path().join("keys");
    std::fs::create_dir(&keys).unwrap();
    let public = generate_key(&keys.join("signer")).unwrap();
    let (_, _, unsigned) = call_bytes(&e.app, "GET", "/v1/snapshots/head/pack", Vec::new()).await;
    e.state.set_pack_policy(PackPolicy {
        key: Some(read_secret_key(&keys.join("signer")).unwrap()),
        ..Default::default()
    });
    let (status, _, signed) = call_bytes(&e.app, "GET", "/v1/snapshots/head/pack", Vec::new()).await;
    assert_eq!(status, StatusCode::OK);

    let strict = env();
    strict.state.store.ensure().unwrap();
    let trust = PackTrust::from_files(std::slice::from_ref(&public)).unwrap();
    strict.state.set_pack_policy(PackPolicy { trust, key: None });
    let before = store_files(&strict.state.store);
    let (status, _, body) = call_bytes(&strict.app, "POST", "/v1/snapshots/unpack", unsigned).await;
    let text = String::from_utf8_lossy(&body);
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    assert!(error_of(&text).error.contains("not signed"), "{text}");
    assert_eq!(store_files(&strict.state.store), before, "a refused pack changed the store");
    let (status, _, body) = call_bytes(&strict.app, "POST", "/v1/snapshots/unpack", signed).await;
    assert_eq!(status, StatusCode::CREATED, "{}", String::from_utf8_lossy(&body));
    let r: forkvm_api::UnpackResponse = serde_json::from_slice(&body).unwrap();
    let key = std::fs::read_to_string(&public).unwrap();
    assert!(key.trim().ends_with(r.signed_by.as_deref().unwrap()), "{r:?}");
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

#[tokio::test]
async fn deleting_a_snapshot_running_sandboxes_came_from_needs_force() {
    let e = env();
    e.state.store.ensure().unwrap();
    write_image_snapshot(&e.state.store.tag_dir("used").unwrap(), "used", &memory(3));
    forkvmd::reconcile::reconcile(&e.state);
    fake_running(&e, "user1", Some("used"), None);
    let (status, text) = call(&e.app, "DELETE", "/v1/snapshots/used", Some(TOKEN), "").await;
    assert_eq!(status, StatusCode::CONFLICT, "{text}");
    let err = error_of(&text);
    assert_eq!(err.state.as_deref(), Some("in_use"), "{text}");
    assert!(err.error.contains("user1") && err.error.contains("force"), "{text}");
    assert!(e.state.store.snapshots_dir().join("used").is_dir(), "refused: nothing deleted");
    // Cascade checks every snapshot it would delete; force deletes it anyway.
    let (status, _) = call(&e.app, "DELETE", "/v1/snapshots/used?cascade=true", Some(TOKEN), "").await;
    assert_eq!(status, StatusCode::CONFLICT);
    let (status, text) = call(&e.app, "DELETE", "/v1/snapshots/used?force=true", Some(TOKEN), "").await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{text}");
    assert!(!e.state.store.snapshots_dir().join("used").exists());
}
