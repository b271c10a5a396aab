//! Linux tier, through the CLI: chains in object storage. A real S3-compatible server
//! (moto's server mode, on loopback, started and stopped here) is the remote. A python
//! template and a diff link over it are pushed, pulled into empty stores and forked;
//! only what a side lacks travels; a stalled server, a push killed half-way, a flipped
//! or swapped object and a full block cache are each met with completion or a clear
//! refusal that leaves the store as it was, and so is a manifest rolled back to an older
//! push. A lazy pull forks before its memory is here, fetching what the guest touches.
//! A removed tag's own blocks are collected, under the remote's lock, and only they.
//! The template boots once (cached); every
//! sandbox is a restore.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

#[path = "common/s3_server.rs"]
mod s3_server;

use s3_server::{S3Server, BUCKET};

struct Env {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    store: PathBuf,
    run: PathBuf,
    key: PathBuf,
    s3: S3Server,
}

impl Env {
    fn new() -> Env {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let s3 = S3Server::start();
        let env =
            Env { store: dir.join("store"), run: dir.join("run"), key: dir.join("remote.key"), dir, s3, _tmp: tmp };
        env.ok(&["remote-keygen", "--key-file", env.key.to_str().unwrap()]);
        env
    }

    fn url(&self, prefix: &str) -> String {
        format!("s3://{BUCKET}/{prefix}")
    }

    fn command_in(&self, store: &Path, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_forkvm"));
        c.args(args)
            .env("FORKVM_STORE", store)
            .env("FORKVM_RUN", &self.run)
            .env("FORKVM_REMOTE_KEY", &self.key)
            .env(
                "FORKVM_REMOTE_CACHE",
                self.dir.join(format!("cache-of-{}", store.file_name().unwrap().to_str().unwrap())),
            )
            .env_remove("FORKVM_KEYS");
        self.s3.client_env(&mut c);
        c
    }

    fn cmd_in(&self, store: &Path, args: &[&str]) -> Output {
        self.command_in(store, args).output().unwrap()
    }

    fn ok_in(&self, store: &Path, args: &[&str]) -> String {
        let out = self.cmd_in(store, args);
        assert!(
            out.status.success(),
            "forkvm {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        self.ok_in(&self.store, args)
    }

    fn json_in(&self, store: &Path, args: &[&str]) -> serde_json::Value {
        serde_json::from_str(&self.ok_in(store, args)).unwrap()
    }

    fn json(&self, args: &[&str]) -> serde_json::Value {
        self.json_in(&self.store, args)
    }

    fn fails_in(&self, store: &Path, args: &[&str]) -> String {
        let out = self.cmd_in(store, args);
        assert!(!out.status.success(), "forkvm {args:?} succeeded: {}", String::from_utf8_lossy(&out.stdout));
        String::from_utf8(out.stderr).unwrap()
    }

    fn push(&self, tag: &str, prefix: &str) -> serde_json::Value {
        self.json(&["push", tag, "--to", &self.url(prefix), "--json"])
    }

    fn pull_in(&self, store: &Path, tag: &str, prefix: &str) -> serde_json::Value {
        self.json_in(store, &["pull", tag, "--from", &self.url(prefix), "--json"])
    }

    /// The base template and a diff link over it, in the first store.
    fn chain(&self) {
        self.ok(&["snapshot", "create", "--image", "python", "--tag", "base"]);
        self.ok(&[
            "snapshot-diff",
            "--from",
            "base",
            "--tag",
            "d1",
            "--exec",
            "echo remote > /tmp/r",
            "--eval",
            "r = 6 * 7",
        ]);
    }

    /// A child of `tag` in `store` sees the link's file and value.
    fn check_child(&self, store: &Path, tag: &str) {
        let r = self.json_in(
            store,
            &["fork", "--tag", tag, "-n", "1", "--exec", "cat /tmp/r", "--eval", "r", "--rm", "--json"],
        );
        let kid = &r["sandboxes"][0];
        assert_eq!(kid["exec"]["stdout"], "remote\n", "{r}");
        assert_eq!(kid["eval"]["result"], "42", "{r}");
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        for store in [self.store.clone(), self.dir.join("other"), self.dir.join("third"), self.dir.join("lazy")] {
            let _ = self.cmd_in(&store, &["kill", "--all"]);
        }
    }
}

fn n(v: &serde_json::Value, field: &str) -> u64 {
    v[field].as_u64().unwrap_or_else(|| panic!("{field} in {v}"))
}

fn files_under(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if !p.ends_with(".lock") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn a_chain_pushed_to_s3_is_pulled_into_empty_stores_moving_only_what_is_missing() {
    let env = Env::new();
    env.chain();
    let base = env.push("base", "p");
    assert_eq!(n(&base, "blocks_uploaded"), n(&base, "blocks"), "an empty remote gets every block: {base}");
    assert!(n(&base, "bytes_uploaded") < n(&base, "logical_bytes"), "blocks are compressed: {base}");
    // The link shares the template's blocks: only its own travel.
    let d1 = env.push("d1", "p");
    assert_eq!(d1["links"], serde_json::json!(["base", "d1"]));
    assert!(n(&d1, "blocks_present") >= n(&base, "blocks") - 2, "the template's blocks are not sent again: {d1}");
    assert!(n(&d1, "bytes_uploaded") * 10 < n(&base, "bytes_uploaded"), "dedup across tags: {d1}");
    eprintln!(
        "push: base {} blocks in {:.0} ms; d1 uploaded {} of {} blocks, {} of {} bytes",
        n(&base, "blocks"),
        base["ms"].as_f64().unwrap(),
        n(&d1, "blocks_uploaded"),
        n(&d1, "blocks"),
        n(&d1, "bytes_uploaded"),
        n(&base, "bytes_uploaded")
    );
    assert_eq!(n(&env.push("d1", "p"), "blocks_uploaded"), 0, "a second push sends nothing");
    let tags = env.json(&["remote-tags", "--from", &env.url("p"), "--json"]);
    assert_eq!(tags, serde_json::json!(["base", "d1"]));
    let objects = env.s3.keys("p/");
    assert!(objects.iter().all(|k| k.starts_with("p/chunks/") || k.starts_with("p/tags/")), "{objects:?}");
    for key in objects.iter().filter(|k| k.starts_with("p/chunks/")).take(20) {
        let body = env.s3.get(key);
        assert!(body.starts_with(b"FKVMSCH1"), "{key} is sealed");
    }

    // An empty store: everything travels, the chain forks.
    let other = env.dir.join("other");
    let pulled = env.pull_in(&other, "d1", "p");
    assert_eq!(pulled["imported"], serde_json::json!(["base", "d1"]), "{pulled}");
    assert_eq!(n(&pulled, "blocks_fetched"), n(&pulled, "blocks"), "{pulled}");
    env.check_child(&other, "d1");
    // A store with the template: the link's memory only (and disks, from the cache).
    let third = env.dir.join("third");
    env.pull_in(&third, "base", "p");
    let link = env.pull_in(&third, "d1", "p");
    assert_eq!(
        (link["imported"].clone(), link["reused"].clone()),
        (serde_json::json!(["d1"]), serde_json::json!(["base"]))
    );
    assert!(n(&link, "blocks_local") > 0, "the template's memory is not fetched again: {link}");
    assert!(n(&link, "bytes_fetched") * 10 < n(&pulled, "bytes_fetched"), "{link}");
    eprintln!(
        "pull: d1 into an empty store {} blocks ({} bytes) in {:.0} ms; over the template {} fetched ({} bytes), \
         {} cached, {} in the store",
        n(&pulled, "blocks"),
        n(&pulled, "bytes_fetched"),
        pulled["ms"].as_f64().unwrap(),
        n(&link, "blocks_fetched"),
        n(&link, "bytes_fetched"),
        n(&link, "blocks_cached"),
        n(&link, "blocks_local")
    );
    env.check_child(&third, "d1");
    lazy_pull_forks_before_the_memory_is_here(&env, n(&pulled, "bytes_fetched"));

    let err = env.fails_in(&third, &["pull", "nope", "--from", &env.url("p")]);
    assert!(err.contains("no tag \"nope\""), "{err}");
    let other_key = env.dir.join("other.key");
    env.ok(&["remote-keygen", "--key-file", other_key.to_str().unwrap()]);
    let fresh = env.dir.join("fresh");
    let err = env.fails_in(&fresh, &["pull", "d1", "--from", &env.url("p"), "--key-file", other_key.to_str().unwrap()]);
    assert!(err.contains("does not open under the remote key"), "another key: {err}");
    assert!(files_under(&fresh.join("snapshots")).is_empty());
    collect_after_removing_a_tag(&env, n(&d1, "blocks_uploaded"));
}

/// A collection with every tag in place deletes nothing; once `d1` is removed it deletes
/// exactly the blocks `d1`'s push added, and `base` still pulls whole (every block
/// re-hashed) into an empty store.
fn collect_after_removing_a_tag(env: &Env, d1_own_blocks: u64) {
    let url = env.url("p");
    let gc = |extra: &[&str]| {
        let mut args = vec!["remote-gc", "--from", url.as_str(), "--json"];
        args.extend_from_slice(extra);
        env.json(&args)
    };
    let r = gc(&["--min-age", "0s"]);
    assert_eq!((n(&r, "blocks_deleted"), n(&r, "blocks_referenced")), (0, n(&r, "blocks")), "{r}");
    env.ok(&["remote-rm", "d1", "--from", &env.url("p")]);
    let err = env.fails_in(&env.store, &["remote-rm", "d1", "--from", &env.url("p")]);
    assert!(err.contains("no tag \"d1\""), "{err}");
    let r = gc(&[]);
    assert_eq!((n(&r, "blocks_deleted"), n(&r, "blocks_young")), (0, d1_own_blocks), "a day's grace by default: {r}");
    let dry = gc(&["--min-age", "0s", "--dry-run"]);
    assert_eq!(n(&dry, "blocks_deleted"), d1_own_blocks, "{dry}");
    let r = gc(&["--min-age", "0s"]);
    assert_eq!(n(&r, "blocks_deleted"), d1_own_blocks, "{r}");
    // Counted again by a listing of our own (the test's S3 helper reads one page only).
    let again = gc(&["--min-age", "0s", "--dry-run"]);
    assert_eq!((n(&again, "blocks"), n(&again, "blocks_deleted")), (n(&r, "blocks") - d1_own_blocks, 0), "{again}");
    assert!(env.s3.keys("p/locks/").is_empty(), "the collection's lock is gone");
    eprintln!(
        "remote-gc: {d1_own_blocks} of {} blocks deleted in {:.0} ms",
        n(&r, "blocks"),
        r["ms"].as_f64().unwrap()
    );
    let after = env.pull_in(&env.dir.join("after-gc"), "base", "p");
    assert_eq!(n(&after, "blocks_fetched"), n(&after, "blocks"), "{after}");
}

/// `pull --lazy` into an empty store brings everything but the memory; a sandbox forks
/// from it at once and fetches the memory it touches (then, by default, the rest in the
/// background, after which the tag is an ordinary local one).
fn lazy_pull_forks_before_the_memory_is_here(env: &Env, whole_pull_bytes: u64) {
    let lazy = env.dir.join("lazy");
    let pulled = env.json_in(&lazy, &["pull", "d1", "--from", &env.url("p"), "--lazy", "--json"]);
    let left = n(&pulled, "chunks_left_remote");
    assert!(left > 100, "the memory stays on the remote: {pulled}");
    assert!(n(&pulled, "bytes_fetched") < whole_pull_bytes, "{pulled}");
    let record = lazy.join("remote-lazy").join("d1.json");
    assert!(record.is_file(), "{pulled}");
    let chunks_in = || files_under(&lazy.join("chunks")).len() as u64;
    let before = chunks_in();

    // Only what the guest touches (nothing fetched ahead): the first command answers on
    // a fraction of the memory.
    let started = Instant::now();
    let out = env
        .command_in(&lazy, &["fork", "--tag", "d1", "-n", "1", "--exec", "cat /tmp/r", "--eval", "r", "--rm", "--json"])
        .env("FORKVM_LAZY_AHEAD", "0")
        .output()
        .unwrap();
    let first_ms = started.elapsed().as_secs_f64() * 1e3;
    assert!(out.status.success(), "lazy fork: {}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["sandboxes"][0]["exec"]["stdout"], "remote\n", "{r}");
    assert_eq!(r["sandboxes"][0]["eval"]["result"], "42", "{r}");
    let touched = chunks_in() - before;
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(lazy.join("snapshots/d1/snapshot.json")).unwrap()).unwrap();
    let image = n(&meta, "mem_size_bytes");
    // A chunk is at most a 64 KiB window.
    let touched_bytes = touched << 16;
    assert!(touched > 0 && touched < left, "fetched {touched} of the {left} chunks left on the remote");
    // (Here ~61 MiB of a 256 MiB image: a third leaves room for the guest's noise.)
    assert!(touched_bytes * 3 < image, "fetched {touched_bytes} bytes of a {image}-byte image");
    eprintln!(
        "lazy: pull {} bytes ({left} chunks left remote) in {:.0} ms; fork + first command {first_ms:.0} ms \
         fetching {touched} chunks (≤ {} MiB of a {} MiB image; {:.0}% of the chunks left)",
        n(&pulled, "bytes_fetched"),
        pulled["ms"].as_f64().unwrap(),
        touched_bytes >> 20,
        image >> 20,
        100.0 * touched as f64 / left as f64
    );

    // Fetching ahead (the default): the memory completes while the sandbox runs, and
    // then the tag is local: its record goes, later forks map its assembled image.
    let t0 = Instant::now();
    let started = env.json_in(&lazy, &["fork", "--tag", "d1", "-n", "1", "--json"]);
    let id = started["sandboxes"][0]["id"].as_str().expect("a sandbox id").to_string();
    let deadline = Instant::now() + Duration::from_secs(300);
    while record.exists() {
        assert!(Instant::now() < deadline, "the memory never completed: {} of {left} chunks", chunks_in() - before);
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(chunks_in() - before, left, "every chunk arrived, once");
    eprintln!("lazy: the memory completed {:.0} ms after the fork began", t0.elapsed().as_secs_f64() * 1e3);
    env.ok_in(&lazy, &["kill", &id]);
    env.check_child(&lazy, "d1");
}

#[test]
fn a_stalled_server_a_killed_push_tampered_objects_and_a_full_cache_lose_nothing() {
    let env = Env::new();
    env.chain();
    // A push cut off half-way leaves no tag; the next one sends only what is missing.
    let mut push = env
        .command_in(&env.store, &["push", "d1", "--to", &env.url("k"), "--json"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while env.s3.keys("k/chunks/").len() < 100 {
        assert!(Instant::now() < deadline && push.try_wait().unwrap().is_none(), "the push ended before 100 blocks");
        std::thread::sleep(Duration::from_millis(20));
    }
    push.kill().unwrap();
    push.wait().unwrap();
    assert!(env.s3.keys("k/tags/").is_empty(), "no manifest before every block is up");
    // Its lock is left behind, fresh: a collection must not run before it goes stale.
    let err = env.fails_in(&env.store, &["remote-gc", "--from", &env.url("k"), "--min-age", "0s"]);
    assert!(err.contains("push d1 on host") && err.contains("locks/shared-"), "{err}");
    // An operator who knows the pusher is dead lists its lock and breaks it by name.
    let locks: serde_json::Value =
        serde_json::from_str(&env.ok_in(&env.store, &["remote-locks", "--from", &env.url("k"), "--json"])).unwrap();
    let locks = locks.as_array().unwrap();
    assert_eq!(locks.len(), 1, "{locks:?}");
    assert_eq!((locks[0]["kind"].as_str(), locks[0]["purpose"].as_str()), (Some("shared"), Some("push d1")));
    assert_eq!(locks[0]["stale"], false);
    let name = locks[0]["name"].as_str().unwrap();
    let err = env.fails_in(&env.store, &["remote-unlock", "../tags/d1", "--from", &env.url("k")]);
    assert!(err.contains("not a lock's name"), "{err}");
    env.ok_in(&env.store, &["remote-unlock", name, "--from", &env.url("k")]);
    assert!(env.s3.keys("k/locks/").is_empty());
    let dry: serde_json::Value = serde_json::from_str(
        &env.ok_in(&env.store, &["remote-gc", "--from", &env.url("k"), "--min-age", "0s", "--dry-run", "--json"]),
    )
    .unwrap();
    assert_eq!(dry["dry_run"], true, "the collection runs once the lock is broken: {dry}");
    let resumed = env.push("d1", "k");
    assert!(n(&resumed, "blocks_present") >= 100, "{resumed}");
    assert!(n(&resumed, "blocks_uploaded") < n(&resumed, "blocks"), "{resumed}");

    // The server stops answering mid-push (SIGSTOP) for 3 s: the push waits it out.
    let mut push = env
        .command_in(&env.store, &["push", "d1", "--to", &env.url("s"), "--json"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while env.s3.keys("s/chunks/").len() < 50 {
        assert!(Instant::now() < deadline, "the push did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    env.s3.signal("-STOP");
    std::thread::sleep(Duration::from_secs(3));
    env.s3.signal("-CONT");
    assert!(push.wait().unwrap().success(), "the push completes after the stall");

    // A flipped byte in a block, and a manifest swapped for another tag's: refused,
    // the store untouched.
    let fresh = env.dir.join("other");
    let before = files_under(&fresh);
    let chunks = env.s3.keys("k/chunks/");
    let victim = &chunks[chunks.len() / 2];
    let good = env.s3.get(victim);
    let mut bad = good.clone();
    let at = bad.len() - 5;
    bad[at] ^= 1;
    env.s3.put(victim, &bad);
    let err = env.fails_in(&fresh, &["pull", "d1", "--from", &env.url("k")]);
    assert!(err.contains(victim.trim_start_matches("k/")) && err.contains("refused"), "{err}");
    assert_eq!(files_under(&fresh), before, "a refused pull left something in the store");
    env.s3.put(victim, &good);
    env.push("base", "k");
    let base_manifest = env.s3.get("k/tags/base");
    let d1_manifest = env.s3.get("k/tags/d1");
    env.s3.put("k/tags/d1", &base_manifest);
    let err = env.fails_in(&fresh, &["pull", "d1", "--from", &env.url("k")]);
    assert!(err.contains("tags/d1 refused"), "{err}");
    assert_eq!(files_under(&fresh), before);
    env.s3.put("k/tags/d1", &d1_manifest);

    // A cache far smaller than the chain: blocks are evicted, the pull completes.
    let small = 4u64 << 20;
    let r = env
        .command_in(&fresh, &["pull", "d1", "--from", &env.url("k"), "--json"])
        .env("FORKVM_REMOTE_CACHE_BYTES", small.to_string())
        .output()
        .unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let cached: u64 = files_under(&env.dir.join("cache-of-other")).iter().map(|p| p.metadata().unwrap().len()).sum();
    assert!(cached > 0 && cached <= small, "the cache holds {cached} bytes, at most {small}");
    env.check_child(&fresh, "d1");

    // A remote rolled back: d1's older manifest put back after this host pulled a newer
    // push of it is refused, though the tag is installed here.
    let older = env.s3.get("k/tags/d1");
    env.push("d1", "k");
    env.pull_in(&fresh, "d1", "k");
    env.s3.put("k/tags/d1", &older);
    let err = env.fails_in(&fresh, &["pull", "d1", "--from", &env.url("k")]);
    assert!(err.contains("tags/d1 refused") && err.contains("rolled back"), "{err}");
}
