//! Linux tier: a disk-only fork. A new sandbox cold-boots the template on a copy of
//! another sandbox's disk snapshot: it sees the source's files, none of its processes,
//! has a new id and identity, and the two diverge. This is the one test of the tier
//! that boots a kernel (about a minute here: guest kernel code is emulated); every other
//! sandbox is a restore.
//!
//! The fork restores its disk lazily (the default): the test checks the boot read
//! through the lazy layer, that the playbook learned from it, and that the fork's own
//! first disk snapshot — which settles the lazy layer into an ordinary one — holds the
//! source's files (exported and read from the host with `debugfs`).

#[path = "common/disk_image.rs"]
mod disk_image;

use disk_image::{fsck, read_in_image};
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
    env.sh(&src, "mkdir -p /work && echo from-source > /work/notes && echo kept-by-source > /work/kept && sync");
    // A process of the source: a disk-only fork must not have it.
    env.sh(&src, "sleep 100000 >/dev/null 2>&1 & echo $! > /work/sleeper.pid; sync");
    let snap = env.json(&["disk-snapshot", &src, "--json"]);
    let seq = snap["seq"].as_u64().unwrap();
    let src_hostname = env.sh(&src, "hostname");

    let fork = env.json(&["disk-fork", &src, "--seq", &seq.to_string(), "--json"]);
    let child = fork["sandbox_id"].as_str().unwrap().to_string();
    assert_ne!(child, src, "a new id");
    assert_eq!(fork["restore"], "lazy_playbook", "{fork}");
    let lazy = &fork["lazy_disks"][0];
    assert_eq!(lazy["id"], "forkvm-data", "{fork}");
    let reads = lazy["hits"].as_u64().unwrap() + lazy["misses"].as_u64().unwrap() + lazy["waits"].as_u64().unwrap();
    assert!(reads > 0, "the boot read its disk through the lazy layer: {fork}");
    assert!(lazy["misses"].as_u64().unwrap() > 0, "no playbook yet in a new store: first reads fetch: {fork}");
    assert!(lazy.get("first_reads").is_none(), "the first reads went into the playbook, not the answer: {fork}");
    // Started by root, the VMM reads the source's vault under a uid of its own.
    let pid = fork["pid"].as_u64().unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uid: u32 = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    if std::fs::metadata("/proc/self").is_ok_and(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0) {
        assert!((0x7FFC0000..0x7FFD0000).contains(&uid), "the lazily restoring VMM runs as uid {uid}");
    }
    let saved = lazy["recording"]["saved_to"].as_str().expect("the recording was saved");
    assert!(std::path::Path::new(saved).starts_with(&env.store), "{saved}");
    assert!(std::fs::metadata(saved).unwrap().len() > 0, "the playbook {saved} exists");
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

    // The fork's first disk snapshot settles its lazy layer: fetches the rest, makes it
    // an ordinary layer, and captures the whole disk — the source's files included.
    let own = env.json(&["disk-snapshot", &child, "--json"]);
    let own_seq = own["seq"].as_u64().unwrap();
    assert_eq!(
        env.sh(&child, "cat /work/kept /work/notes"),
        "kept-by-source\nfrom-child\n",
        "still reads after settling"
    );
    let image = env.store.parent().unwrap().join("child-export.img");
    env.ok(&["disk-export", &child, "--seq", &own_seq.to_string(), "--out", image.to_str().unwrap()]);
    fsck(&image);
    assert_eq!(read_in_image(&image, "/upper/work/kept").as_deref(), Some(&b"kept-by-source\n"[..]));
    assert_eq!(read_in_image(&image, "/upper/work/notes").as_deref(), Some(&b"from-child\n"[..]));
}
