//! Linux tier, through the CLI: tagged template snapshots, fork from a tag and from a
//! running sandbox, BRANCH mid-computation, identity and entropy of clones, memory
//! limits and teardown. The templates are booted once (cached); every sandbox here is a
//! restore. Each test has its own snapshot store and run directory.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// A private store and registry for one test; kills its sandboxes when dropped.
struct Env {
    _tmp: tempfile::TempDir,
    store: PathBuf,
    run: PathBuf,
}

impl Env {
    fn new() -> Env {
        let tmp = tempfile::tempdir().unwrap();
        let (store, run) = (tmp.path().join("store"), tmp.path().join("run"));
        Env { _tmp: tmp, store, run }
    }

    fn cmd(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_forkvm"))
            .args(args)
            .env("FORKVM_STORE", &self.store)
            .env("FORKVM_RUN", &self.run)
            .output()
            .unwrap()
    }

    /// Runs `args`, which must succeed; returns stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.cmd(args);
        assert!(
            out.status.success(),
            "forkvm {args:?} failed: {}\nconsoles: {}",
            String::from_utf8_lossy(&out.stderr),
            self.consoles()
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// The end of every sandbox's console log, for failure messages.
    fn consoles(&self) -> String {
        let mut out = String::new();
        for e in std::fs::read_dir(self.run.join("sandboxes")).into_iter().flatten().flatten() {
            let log = std::fs::read_to_string(e.path().join("console.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(8).collect();
            out.push_str(&format!(
                "\n--- {}:\n{}",
                e.file_name().to_string_lossy(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            ));
        }
        out
    }

    fn json(&self, args: &[&str]) -> serde_json::Value {
        serde_json::from_str(&self.ok(args)).unwrap()
    }

    /// Runs `args`, which must fail; returns stderr.
    fn fails(&self, args: &[&str]) -> String {
        let out = self.cmd(args);
        assert!(!out.status.success(), "forkvm {args:?} succeeded: {}", String::from_utf8_lossy(&out.stdout));
        String::from_utf8(out.stderr).unwrap()
    }

    fn tag(&self, image: &str, tag: &str) {
        self.ok(&["snapshot", "create", "--image", image, "--tag", tag]);
    }

    /// Forks `n` sandboxes (from `--tag X` or `--from-sandbox X`); returns their ids.
    fn fork(&self, from: &str, what: &str, n: usize) -> Vec<String> {
        let v = self.json(&["fork", from, what, "-n", &n.to_string(), "--json"]);
        v["sandboxes"].as_array().unwrap().iter().map(|s| s["sandbox_id"].as_str().unwrap().to_string()).collect()
    }

    fn eval(&self, id: &str, code: &str) -> String {
        self.ok(&["eval", id, code]).trim_end().to_string()
    }

    fn sandboxes(&self) -> Vec<String> {
        let v = self.json(&["ps", "--json"]);
        v.as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap().to_string()).collect()
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = self.cmd(&["kill", "--all"]);
    }
}

fn eval_values(report: &serde_json::Value) -> Vec<String> {
    report["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["eval"]["result"].as_str().unwrap_or_else(|| panic!("no value: {s}")).to_string())
        .collect()
}

#[test]
fn a_warm_variable_reaches_every_child_and_changes_stay_private() {
    let env = Env::new();
    env.tag("python", "py");
    let parent = env.fork("--tag", "py", 1).remove(0);
    env.eval(&parent, "shared = {'answer': 41, 'items': list(range(5))}");

    // Fork of the running sandbox: every child has the parent's interpreter state.
    let report = env.json(&["fork", "--from-sandbox", &parent, "-n", "3", "--eval", "shared['answer']", "--json"]);
    assert_eq!(eval_values(&report), ["41", "41", "41"]);
    let kids: Vec<String> =
        report["sandboxes"].as_array().unwrap().iter().map(|s| s["sandbox_id"].as_str().unwrap().into()).collect();
    env.eval(&kids[0], "shared['answer'] = 99");
    assert_eq!(env.eval(&kids[0], "shared['answer']"), "99");
    assert_eq!(env.eval(&kids[1], "shared['answer']"), "41");
    assert_eq!(env.eval(&kids[2], "shared['answer']"), "41");
    assert_eq!(env.eval(&parent, "shared['answer']"), "41");

    // Through a branch on disk, the same.
    env.ok(&["branch", &parent, "--tag", "py-shared", "--mode", "live"]);
    let report = env.json(&["fork", "--tag", "py-shared", "-n", "2", "--json"]);
    // A new image has no memory playbook yet; that spawn taught it the pages its
    // children touched, and the next spawn faults them in ahead — same state.
    assert_eq!(report["host"]["memory_prefetch_pages"], 0, "{report}");
    // One child of that spawn records again after its first call (the pages a first
    // request touches): its run directory holds the marker until then.
    let markers: Vec<std::path::PathBuf> = report["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| env.run.join("sandboxes").join(s["sandbox_id"].as_str().unwrap()).join("memory-playbook.first-call"))
        .filter(|m| m.exists())
        .collect();
    assert_eq!(markers.len(), 1, "{report}");
    let first = markers[0].parent().unwrap().file_name().unwrap().to_str().unwrap().to_string();
    assert_eq!(env.eval(&first, "len(shared['items'])"), "5");
    assert!(!markers[0].exists(), "the first call claimed the recording");
    let kids: Vec<&str> =
        report["sandboxes"].as_array().unwrap().iter().map(|s| s["sandbox_id"].as_str().unwrap()).collect();
    assert_eq!(kids.iter().map(|k| env.eval(k, "shared['items'][-1]")).collect::<Vec<_>>(), ["4", "4"]);
    let report = env.json(&["fork", "--tag", "py-shared", "-n", "2", "--eval", "shared['items'][-1]", "--json"]);
    assert_eq!(eval_values(&report), ["4", "4"]);
    assert!(report["host"]["memory_prefetch_pages"].as_u64().unwrap() > 100, "{report}");

    env.ok(&["kill", "--all"]);
    assert!(env.sandboxes().is_empty());
    assert_eq!(std::fs::read_dir(env.run.join("sandboxes")).unwrap().count(), 0, "run directories outlived sandboxes");
}

#[test]
fn clones_never_share_random_bytes_ids_or_hostnames() {
    let env = Env::new();
    env.tag("python", "py");
    // The kernel CRNG, Python's `random` and numpy's global generator were all seeded
    // before the snapshot: each clone must draw its own numbers from every one of them.
    let probe = "import os, random, socket, numpy\n\
                 '|'.join([socket.gethostname(), os.urandom(16).hex(), repr(random.random()), repr(numpy.random.rand())])";
    let shell = "hostname; head -c 16 /dev/urandom | od -An -tx1";
    let report = env.json(&["fork", "--tag", "py", "-n", "3", "--eval", probe, "--exec", shell, "--json", "--rm"]);
    let mut seen = std::collections::HashSet::new();
    for s in report["sandboxes"].as_array().unwrap() {
        let id = s["sandbox_id"].as_str().unwrap();
        let value = s["eval"]["result"].as_str().unwrap().trim_matches('\'');
        let parts: Vec<&str> = value.split('|').collect();
        assert_eq!(parts.len(), 4, "{value}");
        assert_eq!(parts[0], format!("sb-{id}"));
        let stdout = s["exec"]["stdout"].as_str().unwrap();
        let mut lines = stdout.lines();
        assert_eq!(lines.next(), Some(format!("sb-{id}").as_str()));
        let urandom = lines.next().unwrap().to_string();
        for sample in [id.to_string(), urandom, parts[1].into(), parts[2].into(), parts[3].into()] {
            assert!(seen.insert(sample.clone()), "two clones share {sample}: {report}");
        }
    }
    assert_eq!(seen.len(), 15);
    assert!(env.sandboxes().is_empty(), "--rm left sandboxes running");
}

#[test]
fn a_branch_mid_computation_resumes_in_flight_state_while_the_source_carries_on() {
    let env = Env::new();
    env.tag("python", "py");
    let source = env.fork("--tag", "py", 1).remove(0);
    env.eval(
        &source,
        "import threading, time\nstate = {'n': 0}\nbuilt = [i * i for i in range(1000)]\n\
         def work():\n    while True:\n        state['n'] += 1\n        time.sleep(0.005)\n\
         threading.Thread(target=work, daemon=True).start()",
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while env.eval(&source, "state['n']").parse::<u64>().unwrap() < 3 {
        assert!(Instant::now() < deadline, "the loop in the source does not run");
    }
    for mode in ["full", "live"] {
        let tag = format!("mid-{mode}");
        let branch = env.json(&["branch", &source, "--tag", &tag, "--mode", mode, "--json"]);
        assert_eq!(branch["status"], "ready");
        assert_eq!(branch["branched_from"], source.as_str());
        let after_branch: u64 = env.eval(&source, "state['n']").parse().unwrap();
        let child = env.fork("--tag", &tag, 1).remove(0);
        // The child resumes with the counter where the branch froze it, and the object
        // built before it.
        let seen = env.eval(&child, "(state['n'], len(built), built[999])");
        let n: u64 = seen.trim_start_matches('(').split(',').next().unwrap().parse().unwrap();
        assert!(n >= 3, "{mode}: child starts from the in-flight counter, got {seen}");
        assert!(seen.ends_with(", 1000, 998001)"), "{seen}");
        // The loop runs on in the child, and on in the source.
        let deadline = Instant::now() + Duration::from_secs(60);
        while env.eval(&child, "state['n']").parse::<u64>().unwrap() <= n {
            assert!(Instant::now() < deadline, "{mode}: the loop did not resume in the child");
        }
        while env.eval(&source, "state['n']").parse::<u64>().unwrap() <= after_branch {
            assert!(Instant::now() < deadline, "{mode}: the source stopped after the branch");
        }
        env.ok(&["kill", &child]);
    }
}

#[test]
fn branch_errors_follow_the_failure_table() {
    let env = Env::new();
    env.tag("tiny", "tiny");
    let err = env.fails(&["branch", "0123456789abcdef"]);
    assert!(err.contains("not found"), "{err}");
    let id = env.fork("--tag", "tiny", 1).remove(0);
    let err = env.fails(&["branch", &id, "--tag", "tiny"]);
    assert!(err.contains("already exists"), "{err}");
    let err = env.fails(&["branch", &id, "--tag", "../up"]);
    assert!(err.contains("invalid tag"), "{err}");
    let tags = env.json(&["snapshot", "ls", "--json"]);
    assert_eq!(tags.as_array().unwrap().len(), 1, "a refused branch left a snapshot: {tags}");
    // The default tag is per source and monotonic.
    let a = env.json(&["branch", &id, "--json"]);
    let b = env.json(&["branch", &id, "--mode", "live", "--json"]);
    assert_eq!(a["tag"], format!("branch-{id}-1"));
    assert_eq!(b["tag"], format!("branch-{id}-2"));
    // A writing snapshot cannot be forked; a missing tag is not found.
    let err = env.fails(&["fork", "--tag", "nope", "-n", "1"]);
    assert!(err.contains("not found"), "{err}");
    // The source still answers.
    assert_eq!(env.ok(&["exec", &id, "--", "echo", "alive"]), "alive\n");
}

fn cgroup_dir(name: &str) -> Option<PathBuf> {
    let root = forkvm_vmm::host::cgroup::CgroupRoot::detect().expect("a memory cgroup on this host");
    root.open(name).map(|g| g.dir().to_path_buf())
}

fn wait_gone(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while path.exists() {
        assert!(Instant::now() < deadline, "{} outlived its sandbox", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_memory_limit_holds_per_sandbox_and_teardown_leaves_nothing() {
    let env = Env::new();
    env.tag("tiny", "tiny");
    let report = env.json(&["fork", "--tag", "tiny", "-n", "2", "--mem-limit-mib", "8", "--json"]);
    let sbs = report["sandboxes"].as_array().unwrap().clone();
    let (a, b) = (sbs[0]["sandbox_id"].as_str().unwrap(), sbs[1]["sandbox_id"].as_str().unwrap());
    let pid_a = sbs[0]["pid"].as_i64().unwrap();
    let group_a = cgroup_dir(&format!("sb-{a}")).expect("sandbox cgroup");
    let procs = std::fs::read_to_string(group_a.join("cgroup.procs")).unwrap();
    assert!(procs.lines().any(|p| p == pid_a.to_string()), "VMM {pid_a} not in its cgroup: {procs:?}");
    let limit = ["memory.limit_in_bytes", "memory.max"]
        .iter()
        .find_map(|f| std::fs::read_to_string(group_a.join(f)).ok())
        .unwrap();
    assert_eq!(limit.trim(), (8u64 << 20).to_string());

    // Sandbox a writes more than its limit into guest memory (tmpfs): its VMM is killed,
    // b is untouched; what a left behind is swept.
    let _ = env.cmd(&["exec", a, "--", "sh", "-c", "head -c 30000000 /dev/zero > /tmp/fill"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while Path::new(&format!("/proc/{pid_a}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid_a}/stat")).unwrap_or_default().contains(") Z")
    {
        assert!(Instant::now() < deadline, "the VMM over its memory limit was not stopped");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(env.sandboxes(), [b.to_string()], "ps lists exactly the surviving sandbox");
    // Listing is a read; the sweep is the pass that removes what a left.
    assert!(cgroup_dir(&format!("sb-{a}")).is_some(), "ps removed the dead sandbox's cgroup");
    let swept = env.json(&["sweep", "--json"]);
    assert_eq!(swept["sandboxes"], serde_json::json!([a]), "{swept}");
    assert!(cgroup_dir(&format!("sb-{a}")).is_none(), "the dead sandbox's cgroup was not swept");
    assert_eq!(env.ok(&["exec", b, "--", "echo", "fine"]), "fine\n");

    // A clean kill removes process, sockets, run directory and cgroup.
    let run_b = env.run.join("sandboxes").join(b);
    let group_b = cgroup_dir(&format!("sb-{b}")).unwrap();
    env.ok(&["kill", b]);
    wait_gone(&run_b);
    wait_gone(&group_b);
    assert!(!Path::new(&format!("/proc/{}", sbs[1]["pid"])).exists() || env.sandboxes().is_empty());
}

#[test]
fn a_sandbox_that_cannot_start_says_why_and_leaves_nothing() {
    let env = Env::new();
    env.tag("tiny", "broken");
    let disk = env.store.join("snapshots/broken/disk/disk0.img");
    std::fs::remove_file(&disk).unwrap();
    let err = env.fails(&["fork", "--tag", "broken", "-n", "2"]);
    assert!(err.contains("restore failed") && err.contains("disk0.img"), "{err}");
    assert!(env.sandboxes().is_empty());
    let left: Vec<_> = std::fs::read_dir(env.run.join("sandboxes")).unwrap().collect();
    assert!(left.is_empty(), "a failed spawn left run directories: {left:?}");
}
