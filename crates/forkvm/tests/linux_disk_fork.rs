//! Linux tier: a disk-only fork. A new sandbox cold-boots the template on a copy of
//! another sandbox's disk snapshot: it sees the source's files, none of its processes,
//! has a new id and identity, and the two diverge. This is the one test of the tier
//! that boots a kernel (about a minute here: guest kernel code is emulated); every other
//! sandbox is a restore.

use std::path::PathBuf;
use std::process::{Command, Output};

struct Env {
    _tmp: tempfile::TempDir,
    store: PathBuf,
    run: PathBuf,
    keys: PathBuf,
}

impl Env {
    fn new() -> Env {
        let tmp = tempfile::tempdir().unwrap();
        let (store, run, keys) = (tmp.path().join("store"), tmp.path().join("run"), tmp.path().join("keys"));
        Env { _tmp: tmp, store, run, keys }
    }

    fn cmd(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_forkvm"))
            .args(args)
            .env("FORKVM_STORE", &self.store)
            .env("FORKVM_RUN", &self.run)
            .env("FORKVM_KEYS", &self.keys)
            .output()
            .unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.cmd(args);
        assert!(out.status.success(), "forkvm {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    }

    fn json(&self, args: &[&str]) -> serde_json::Value {
        serde_json::from_str(&self.ok(args)).unwrap()
    }

    fn sh(&self, id: &str, script: &str) -> String {
        self.ok(&["exec", id, "--", "sh", "-c", script])
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = self.cmd(&["kill", "--all"]);
    }
}

#[test]
fn a_disk_only_fork_boots_on_the_sources_files_with_a_new_identity_and_diverges() {
    let env = Env::new();
    env.ok(&["snapshot", "create", "--image", "tiny", "--tag", "t"]);
    let v = env.json(&["fork", "--tag", "t", "-n", "1", "--json"]);
    let src = v["sandboxes"][0]["sandbox_id"].as_str().unwrap().to_string();
    env.sh(&src, "mkdir -p /work && echo from-source > /work/notes && sync");
    // A process of the source: a disk-only fork must not have it.
    env.sh(&src, "sleep 100000 >/dev/null 2>&1 & echo $! > /work/sleeper.pid; sync");
    let snap = env.json(&["disk-snapshot", &src, "--json"]);
    let seq = snap["seq"].as_u64().unwrap();
    let src_hostname = env.sh(&src, "hostname");

    let fork = env.json(&["disk-fork", &src, "--seq", &seq.to_string(), "--json"]);
    let child = fork["sandbox_id"].as_str().unwrap().to_string();
    assert_ne!(child, src, "a new id");
    assert_eq!(env.sh(&child, "cat /work/notes"), "from-source\n", "the source's files");
    let child_hostname = env.sh(&child, "hostname");
    assert_ne!(child_hostname, src_hostname, "a new identity");
    assert!(child_hostname.contains(&child[..8]), "the hostname names the new sandbox: {child_hostname}");
    assert!(env.sh(&child, "cat /work/sleeper.pid").trim().parse::<u32>().is_ok(), "the pid file came along");
    let sleepers = |id: &str| env.sh(id, "ps -o args | grep -c '^sleep 100000$' || true").trim().to_string();
    assert_eq!(sleepers(&src), "1", "the source runs its sleeper");
    assert_eq!(sleepers(&child), "0", "the source's processes are not in a fresh boot");
    let boots = |id: &str| env.sh(id, "cat /proc/sys/kernel/random/boot_id");
    assert_ne!(boots(&child), boots(&src), "a fresh boot");

    // Both are writable and diverge.
    env.sh(&child, "echo from-child > /work/notes && sync");
    env.sh(&src, "echo source-again > /work/notes && sync");
    assert_eq!(env.sh(&child, "cat /work/notes"), "from-child\n");
    assert_eq!(env.sh(&src, "cat /work/notes"), "source-again\n");

    // The source's own disk snapshots are untouched by the fork; the fork has none yet.
    let list = env.json(&["disk-snapshots", &src, "--json"]);
    assert_eq!(list.as_array().unwrap().len(), 1);
    // A disk fork of a sandbox with no snapshot says so.
    let out = env.cmd(&["disk-fork", &child]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no disk snapshot"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
