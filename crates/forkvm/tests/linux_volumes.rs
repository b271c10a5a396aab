//! Linux tier, through the CLI: volumes. A volume written in one sandbox is there in
//! the next after a kill; a read-only attach refuses writes; one writer at a time;
//! the children of a running writer get copy-on-write views that never reach the
//! volume; a volume in use is not removed. The template is booted once (cached).

#[path = "common/cli_env.rs"]
mod cli_env;

use cli_env::CliEnv;

/// The volume calls on top of the shared CLI harness.
trait VolumeEnv {
    fn fails(&self, args: &[&str]) -> String;
    fn spawn(&self, args: &[&str]) -> Vec<String>;
    fn volume(&self, name: &str) -> serde_json::Value;
}

impl VolumeEnv for CliEnv {
    /// Runs `args`, which must fail; returns stderr.
    fn fails(&self, args: &[&str]) -> String {
        let out = self.cmd(args);
        assert!(!out.status.success(), "forkvm {args:?} succeeded: {}", String::from_utf8_lossy(&out.stdout));
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    /// `fork` with `args`; the new sandboxes' ids.
    fn spawn(&self, args: &[&str]) -> Vec<String> {
        let mut all = vec!["fork"];
        all.extend_from_slice(args);
        all.push("--json");
        let v = self.json(&all);
        v["sandboxes"].as_array().unwrap().iter().map(|s| s["sandbox_id"].as_str().unwrap().to_string()).collect()
    }

    fn volume(&self, name: &str) -> serde_json::Value {
        self.json(&["volume", "get", name, "--json"])[0].clone()
    }
}

#[test]
fn a_volume_outlives_its_writer_serves_readers_and_gives_forked_children_their_own_views() {
    let env = CliEnv::new();
    env.ok(&["volume", "create", "data", "--size-mib", "64"]);
    assert!(env.fails(&["volume", "create", "data"]).contains("already exists"));
    assert!(env.fails(&["volume", "create", "../x"]).contains("invalid volume name"));
    env.ok(&["snapshot", "create", "--image", "tiny", "--tag", "t"]);
    assert!(env.fails(&["fork", "--tag", "t", "--volume", "nope:/data"]).contains("does not exist"));
    assert!(env.fails(&["fork", "--tag", "t", "-n", "2", "--volume", "data:/data"]).contains("one writer at a time"));

    // A writer writes without syncing; the kill flushes it, and the volume takes it in.
    let w = env.spawn(&["--tag", "t", "--volume", "data:/data"]).remove(0);
    let mounts = env.sh(&w, "grep ' /data ' /proc/mounts");
    assert!(mounts.contains(" ext4 rw"), "{mounts}");
    env.sh(&w, "echo one > /data/f");
    assert!(env.fails(&["fork", "--tag", "t", "--volume", "data:/data"]).contains("one writer at a time"));
    env.ok(&["kill", &w]);
    let v = env.volume("data");
    assert!(v["layers"].as_u64().unwrap() >= 1, "{v}");
    assert!(v["writer"].is_null(), "{v}");
    assert!(!env.store.join("volumes/data/writers").join(&w).exists(), "the writer's directory was taken in");

    // A reader sees it and cannot write; a new writer may come while it reads.
    let r = env.spawn(&["--tag", "t", "--volume", "data:/vol:ro"]).remove(0);
    assert_eq!(env.sh(&r, "cat /vol/f"), "one\n");
    let out = env.cmd(&["exec", &r, "--", "sh", "-c", "echo x > /vol/g"]);
    assert!(!out.status.success(), "a read-only volume took a write");
    let w2 = env.spawn(&["--tag", "t", "--volume", "data:/data"]).remove(0);
    assert_eq!(env.sh(&w2, "cat /data/f"), "one\n");
    env.sh(&w2, "echo two > /data/f && sync");

    // Children of the running writer: copy-on-write views, each its own.
    let kids = env.spawn(&["--from-sandbox", &w2, "-n", "2"]);
    for (i, k) in kids.iter().enumerate() {
        assert_eq!(env.sh(k, "cat /data/f"), "two\n");
        env.sh(k, &format!("echo kid{i} > /data/f && sync"));
    }
    assert_eq!(env.sh(&kids[0], "cat /data/f"), "kid0\n");
    assert_eq!(env.sh(&kids[1], "cat /data/f"), "kid1\n");
    assert_eq!(env.sh(&w2, "cat /data/f"), "two\n");
    for k in &kids {
        env.ok(&["kill", k]);
    }
    env.ok(&["kill", &w2]);
    let cow = env.spawn(&["--tag", "t", "--volume", "data:/data:cow"]).remove(0);
    assert_eq!(env.sh(&cow, "cat /data/f"), "two\n", "the children's writes never reached the volume");
    env.sh(&cow, "echo cow > /data/f && sync");

    // Archiving a writer releases the volume (its writes taken in); restored, the
    // sandbox has its own view again.
    let aw = env.spawn(&["--tag", "t", "--volume", "data:/data"]).remove(0);
    env.sh(&aw, "echo archived > /data/a && sync");
    env.ok(&["archive", &aw]);
    let v = env.volume("data");
    assert!(v["writer"].is_null(), "{v}");
    assert_eq!(env.sh(&cow, "cat /data/a 2>/dev/null || echo none"), "none\n", "a cow view is as of its spawn");
    env.ok(&["unarchive", &aw]);
    assert_eq!(env.sh(&aw, "cat /data/a"), "archived\n");
    env.ok(&["kill", &aw]);

    // A spawn whose mount fails gives its writer's lease back at once.
    env.ok(&["volume", "create", "bad", "--size-mib", "16"]);
    let base = env.store.join("volumes/bad/base.ext4");
    let f = std::fs::OpenOptions::new().write(true).open(&base).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &[0, 0], 1024 + 0x38).unwrap();
    for _ in 0..2 {
        let err = env.fails(&["fork", "--tag", "t", "--volume", "bad:/bad"]);
        assert!(err.contains("mounting volume bad"), "{err}");
    }
    env.ok(&["volume", "rm", "bad"]);

    // A snapshot shares the layers; a volume in use is not removed.
    env.ok(&["volume", "snapshot", "data", "data2"]);
    assert!(env.fails(&["volume", "rm", "data"]).contains("in use"));
    env.ok(&["kill", &cow, &r]);
    let again = env.spawn(&["--tag", "t", "--volume", "data2:/d:ro"]).remove(0);
    assert_eq!(env.sh(&again, "cat /d/f"), "two\n", "a cow sandbox's writes stay its own");
    env.ok(&["kill", &again]);
    env.ok(&["volume", "rm", "data"]);
    env.ok(&["volume", "rm", "data2"]);
    let left: Vec<_> = std::fs::read_dir(env.store.join("volumes")).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    let runs = std::fs::read_dir(env.run.join("sandboxes")).map(|d| d.flatten().count()).unwrap_or(0);
    assert_eq!(runs, 0, "run directories left behind");
}
