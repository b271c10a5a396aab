//! Linux tier, through the CLI: diff-snapshot chains. A 3-link chain is built on the
//! python template with `snapshot-diff` (files in the guest's tmpfs and objects in its
//! warm interpreter, changed, overwritten and deleted layer by layer); children of every
//! depth, of the compacted head and of the chain shipped through `pack`/`unpack` into an
//! empty store must see exactly their head's state. Then rmi's refusal and `--force`.
//! The template boots once (cached); every sandbox is a restore.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

struct Env {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    store: PathBuf,
    run: PathBuf,
}

impl Env {
    fn new() -> Env {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        Env { store: dir.join("store"), run: dir.join("run"), dir, _tmp: tmp }
    }

    fn cmd_in(&self, store: &Path, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_forkvm"))
            .args(args)
            .env("FORKVM_STORE", store)
            .env("FORKVM_RUN", &self.run)
            .output()
            .unwrap()
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
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = self.cmd_in(&self.store, &["kill", "--all"]);
    }
}

/// The layers: (tag, shell command, Python code).
const LAYERS: [(&str, &str, &str); 3] = [
    ("l1", "echo one > /tmp/l1", "x1 = 11\nb1 = bytes((i * 7) % 251 for i in range(1_500_000))"),
    (
        "l2",
        "echo two > /tmp/l2 && echo one-changed > /tmp/l1",
        "x2 = 22\nx1 = 12\nb2 = bytes((i * 13) % 251 for i in range(1_500_000))",
    ),
    ("l3", "echo three > /tmp/l3 && rm /tmp/l2", "x3 = 33\ndel b1\nb3 = b2[::-1]"),
];

const FILE_PROBE: &str =
    "for f in /tmp/l1 /tmp/l2 /tmp/l3; do if [ -e $f ]; then echo \"$f=$(cat $f)\"; else echo \"$f=MISSING\"; fi; done";

const EVAL_PROBE: &str = "import zlib\n(globals().get('x1'), globals().get('x2'), globals().get('x3'), \
     [zlib.crc32(globals()[n]) if n in globals() else None for n in ('b1', 'b2', 'b3')])";

fn crc(mult: u32) -> u32 {
    let b: Vec<u8> = (0..1_500_000u32).map(|i| ((i * mult) % 251) as u8).collect();
    crc32fast::hash(&b)
}

/// What a child of each depth must see: (file probe output, eval probe repr).
fn expected(depth: usize) -> (String, String) {
    let (h1, h2) = (crc(7), crc(13));
    let h3 = {
        let mut b: Vec<u8> = (0..1_500_000u32).map(|i| ((i * 13) % 251) as u8).collect();
        b.reverse();
        crc32fast::hash(&b)
    };
    let (files, vars) = match depth {
        0 => (["MISSING", "MISSING", "MISSING"], "(None, None, None, [None, None, None])".to_string()),
        1 => (["one", "MISSING", "MISSING"], format!("(11, None, None, [{h1}, None, None])")),
        2 => (["one-changed", "two", "MISSING"], format!("(12, 22, None, [{h1}, {h2}, None])")),
        _ => (["one-changed", "MISSING", "three"], format!("(12, 22, 33, [None, {h2}, {h3}])")),
    };
    let files = (1..=3).zip(files).map(|(i, v)| format!("/tmp/l{i}={v}\n")).collect();
    (files, vars)
}

/// Forks 2 children of `tag` in `store`, probes each, and checks they see `depth`'s state.
fn check_children(env: &Env, store: &Path, tag: &str, depth: usize) {
    let report = env.json_in(
        store,
        &["fork", "--tag", tag, "-n", "2", "--exec", FILE_PROBE, "--eval", EVAL_PROBE, "--rm", "--json"],
    );
    let (files, vars) = expected(depth);
    let kids = report["sandboxes"].as_array().unwrap();
    assert_eq!(kids.len(), 2);
    for kid in kids {
        assert_eq!(kid["exec"]["stdout"].as_str().unwrap(), files, "files of a child of {tag} (depth {depth}): {kid}");
        assert_eq!(kid["eval"]["result"].as_str().unwrap(), vars, "memory of a child of {tag} (depth {depth}): {kid}");
    }
}

fn files_under(root: &Path) -> Vec<(PathBuf, u64)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if !p.ends_with(".lock") {
                out.push((p.clone(), e.metadata().unwrap().len()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn chain_children_see_their_heads_state_at_every_depth_and_after_pack_unpack() {
    let env = Env::new();
    env.ok(&["snapshot", "create", "--image", "python", "--tag", "base"]);
    let mut parent = "base".to_string();
    for (depth, (tag, cmd, code)) in LAYERS.iter().enumerate() {
        let r = env.json(&["snapshot-diff", "--from", &parent, "--tag", tag, "--exec", cmd, "--eval", code, "--json"]);
        assert_eq!(r["parent_tag"], parent.as_str());
        assert_eq!(r["parent_ingested"], depth == 0, "only the whole-image base is ingested: {r}");
        let pages = r["pages"].as_u64().unwrap();
        assert!(pages > 0 && pages < 65536 / 2, "a diff holds the changed pages only, not the whole 256 MiB: {r}");
        parent = tag.to_string();
    }
    let info = env.json(&["snapshot-info", "l3", "--json"]);
    assert_eq!(info["chain_depth"], 3);
    assert_eq!(info["ancestors"], serde_json::json!(["base", "l1", "l2"]));
    assert_eq!(info["bootable"], true);
    let info = env.json(&["snapshot-info", "l1", "--json"]);
    assert_eq!(info["dependents"], serde_json::json!(["l2"]));
    assert_eq!(info["descendants"], serde_json::json!(["l3", "l2"]));

    for (depth, tag) in ["base", "l1", "l2", "l3"].iter().enumerate() {
        check_children(&env, &env.store, tag, depth);
    }
    env.ok(&["snapshot-compact", "--from", "l3", "--to", "flat"]);
    assert_eq!(env.json(&["snapshot-info", "flat", "--json"])["chain_depth"], 0);
    check_children(&env, &env.store, "flat", 3);

    // Ship the chain to an empty store; a pack with one flipped byte changes nothing.
    let pack = env.dir.join("chain.tar.zst");
    let p = env.json(&["pack", "--tag", "l3", "--out", pack.to_str().unwrap(), "--json"]);
    assert_eq!(p["links"], serde_json::json!(["base", "l1", "l2", "l3"]));
    let other = env.dir.join("other-store");
    std::fs::create_dir_all(&other).unwrap();
    let bytes = std::fs::read(&pack).unwrap();
    let mut bad = bytes.clone();
    bad[bytes.len() / 2] ^= 0x10;
    let bad_pack = env.dir.join("bad.tar.zst");
    std::fs::write(&bad_pack, &bad).unwrap();
    let before = files_under(&other);
    let err = env.fails_in(&other, &["unpack", bad_pack.to_str().unwrap()]);
    assert!(err.contains("pack"), "{err}");
    assert_eq!(files_under(&other), before, "a refused pack left something in the store");
    let u = env.json_in(&other, &["unpack", pack.to_str().unwrap(), "--json"]);
    assert_eq!(u["imported"], serde_json::json!(["base", "l1", "l2", "l3"]));
    check_children(&env, &other, "l3", 3);

    // A diff branch of a running sandbox: a link over the tag it was spawned from.
    let v = env.json(&["fork", "--tag", "l1", "-n", "1", "--json"]);
    let id = v["sandboxes"][0]["sandbox_id"].as_str().unwrap().to_string();
    env.ok(&["eval", &id, "mid = 'branched'"]);
    let err = env.fails_in(&env.store, &["branch", &id, "--mode", "diff", "--parent-tag", "l2"]);
    assert!(err.contains("l1"), "{err}");
    let b = env.json(&["branch", &id, "--mode", "diff", "--tag", "l1-b", "--json"]);
    assert_eq!(
        (b["tag"].as_str(), b["mode"].as_str(), b["status"].as_str()),
        (Some("l1-b"), Some("diff"), Some("ready")),
        "{b}"
    );
    env.ok(&["kill", &id]);
    let info = env.json(&["snapshot-info", "l1-b", "--json"]);
    assert_eq!(info["ancestors"], serde_json::json!(["base", "l1"]), "{info}");
    let kid = env.json(&["fork", "--tag", "l1-b", "-n", "1", "--eval", "(mid, x1)", "--rm", "--json"]);
    assert_eq!(kid["sandboxes"][0]["eval"]["result"], "('branched', 11)", "{kid}");

    // rmi: refused while dependents exist (naming them); --force orphans them.
    let err = env.fails_in(&env.store, &["rmi", "l2"]);
    assert!(err.contains("l3") && err.contains("--cascade"), "{err}");
    env.ok(&["rmi", "l2", "--force"]);
    let info = env.json(&["snapshot-info", "l3", "--json"]);
    assert_eq!(info["bootable"], false);
    assert!(info["problem"].as_str().unwrap().contains("\"l2\""), "{info}");
    let err = env.fails_in(&env.store, &["fork", "--tag", "l3"]);
    assert!(err.contains("not bootable") && err.contains("l2"), "{err}");
    // The compacted copy does not depend on the chain.
    check_children(&env, &env.store, "flat", 3);
}
