//! Linux tier: off-host continuous snapshots. A daemon replicating to an S3 server
//! (moto's, on loopback) ships a sandbox's disk snapshots and its template; the host is
//! then lost (daemon and VMM killed with SIGKILL, its store, run and keys directories
//! removed), and another host holding only the remote key brings the sandbox back with
//! `restore-sandbox`: every file written before the last replicated snapshot is there,
//! byte for byte; a branch the first daemon took (and pushed by itself) forks there with
//! its memory. A third host's daemon forks the replicated template from a lazy pull.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

mod common;
#[path = "common/s3_server.rs"]
mod s3_server;

use common::Env;
use s3_server::{S3Server, BUCKET};

/// Variables pointing `object_store` at `s3`, for the daemon.
fn s3_vars(s3: &S3Server, key: &Path) -> Vec<(String, String)> {
    let mut c = Command::new("true");
    s3.client_env(&mut c);
    let mut vars: Vec<(String, String)> =
        c.get_envs().filter_map(|(k, v)| Some((k.to_str()?.to_string(), v?.to_str()?.to_string()))).collect();
    vars.push(("FORKVM_REMOTE_KEY".into(), key.to_str().unwrap().into()));
    // The test's own block cache, not the host's (`~/.cache/forkvm/remote-blocks`).
    let cache = key.parent().unwrap().join("remote-blocks");
    vars.push(("FORKVM_REMOTE_CACHE".into(), cache.to_str().unwrap().into()));
    vars
}

#[test]
fn a_replicated_sandbox_comes_back_on_another_host_after_its_host_is_lost() {
    let s3 = S3Server::start();
    let url = format!("s3://{BUCKET}/cluster");
    let shared = tempfile::tempdir().unwrap();
    let key = shared.path().join("remote.key");
    let vars = s3_vars(&s3, &key);
    let var_refs: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();

    // Host A: a daemon that replicates; a sandbox that writes files, snapshotted twice.
    let mut a = Env::new();
    let keygen = a.command(&["remote-keygen", "--key-file", key.to_str().unwrap()]).output().unwrap();
    assert!(keygen.status.success(), "{}", String::from_utf8_lossy(&keygen.stderr));
    a.start_daemon_with(&["--replicate", &url, "--disk-snapshot-interval", "0"], &var_refs);
    a.ok(&["snapshot", "create", "--image", "python", "--tag", "py"]);
    a.ok(&["fork", "--tag", "py", "-n", "1"]);
    let id = a.json(&["ps", "--json"])[0]["id"].as_str().unwrap().to_string();
    let write = |name: &str, seed: u32| {
        let code = format!(
            "import os, random\nrandom.seed({seed})\nopen('/root/{name}', 'wb').write(random.randbytes(300_000))\nos.sync()"
        );
        a.ok(&["eval", &id, &code]);
    };
    write("first", 1);
    let s1 = a.json(&["disk-snapshot", &id, "--json"]);
    write("second", 2);
    a.ok(&["exec", &id, "--", "sh", "-c", "mkdir -p /root/work && echo kept > /root/work/notes && sync"]);
    let s2 = a.json(&["disk-snapshot", &id, "--json"]);
    assert!(s2["seq"].as_u64() > s1["seq"].as_u64(), "{s1} {s2}");
    let digest =
        |env: &Env, sid: &str| env.ok(&["exec", sid, "--", "sh", "-c", "cd /root && md5sum first second work/notes"]);
    let before = digest(&a, &id);
    // A branch carries the memory too (/tmp is a tmpfs): the daemon pushes it by itself.
    a.ok(&["exec", &id, "--", "sh", "-c", "echo only-in-memory > /tmp/marker"]);
    a.ok(&["branch", &id, "--tag", "mid"]);
    let deadline = Instant::now() + Duration::from_secs(180);
    while s3.keys("cluster/tags/mid").is_empty() {
        assert!(Instant::now() < deadline, "the branch did not reach the remote within 180 s");
        std::thread::sleep(Duration::from_millis(200));
    }
    // Written after the last replicated snapshot: may be lost (the recovery point).
    write("after", 3);
    let objects = s3.keys(&format!("cluster/vaults/{id}/"));
    assert!(
        objects.iter().any(|k| k.ends_with("/key")) && objects.iter().any(|k| k.contains("/snapshots/")),
        "{objects:?}"
    );
    assert!(s3.keys("cluster/tags/py").len() == 1, "the template went first");

    // The host is lost: SIGKILL for the daemon and the VMM, its directories gone.
    let run = a.dir.join("run");
    for pid in common::processes_of(&run) {
        // SAFETY: signals a process by pid.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    if let Some(mut d) = a.daemon.take() {
        let _ = d.wait();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while !common::processes_of(&run).is_empty() {
        assert!(Instant::now() < deadline, "the lost host's processes did not die");
        std::thread::sleep(Duration::from_millis(50));
    }
    for d in ["store", "run", "keys"] {
        std::fs::remove_dir_all(a.dir.join(d)).unwrap();
    }

    // Host B: nothing but the remote key.
    let b = Env::new();
    let mut restore = b.command(&["restore-sandbox", &id, "--from", &url, "--json"]);
    for (k, v) in &vars {
        restore.env(k, v);
    }
    let out = restore.output().unwrap();
    assert!(out.status.success(), "restore-sandbox: {}", String::from_utf8_lossy(&out.stderr));
    let report = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(report.contains(&format!("newest disk snapshot {}", s2["seq"])), "{report}");
    let forked: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let restored = forked["sandbox_id"].as_str().unwrap_or_else(|| panic!("{forked}")).to_string();
    let local = |args: &[&str]| {
        let out = b.command(args).output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let after = local(&["exec", &restored, "--", "sh", "-c", "cd /root && md5sum first second work/notes"]);
    assert_eq!(after, before, "every file of the last replicated snapshot, byte for byte");
    assert_eq!(local(&["exec", &restored, "--", "cat", "/root/work/notes"]), "kept\n");
    // The branch, pulled and forked here: its memory and its disks as they were.
    let mut pull = b.command(&["pull", "mid", "--from", &url, "--json"]);
    for (k, v) in &vars {
        pull.env(k, v);
    }
    let out = pull.output().unwrap();
    assert!(out.status.success(), "pull mid: {}", String::from_utf8_lossy(&out.stderr));
    let ids = |out: String| -> Vec<String> {
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v.as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap().to_string()).collect()
    };
    let running = ids(local(&["ps", "--json"]));
    local(&["fork", "--tag", "mid", "-n", "1"]);
    let branched = ids(local(&["ps", "--json"])).into_iter().find(|i| !running.contains(i)).expect("the fork of mid");
    assert_eq!(local(&["exec", &branched, "--", "cat", "/tmp/marker"]), "only-in-memory\n");
    assert_eq!(local(&["exec", &branched, "--", "sh", "-c", "cd /root && md5sum first second work/notes"]), before);
    let _ = b.command(&["kill", "--all"]).output();
    for pid in common::processes_of(&b.dir.join("run")) {
        // SAFETY: signals a process by pid.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }

    // Host C: a daemon whose store gets the template lazily (everything but its
    // memory); a sandbox forked through the daemon's spawner runs at once, its memory
    // served from the remote by a memory server the spawner forked.
    let mut c = Env::new();
    c.start_daemon_with(&[], &var_refs);
    let mut pull = c.command(&["pull", "py", "--from", &url, "--lazy", "--json"]);
    for (k, v) in &vars {
        pull.env(k, v);
    }
    let out = pull.output().unwrap();
    assert!(out.status.success(), "pull --lazy: {}", String::from_utf8_lossy(&out.stderr));
    let pulled: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(pulled["chunks_left_remote"].as_u64() > Some(100), "{pulled}");
    c.ok(&["fork", "--tag", "py", "-n", "1"]);
    let lazy_id = c.json(&["ps", "--json"])[0]["id"].as_str().unwrap().to_string();
    assert_eq!(c.ok(&["exec", &lazy_id, "--", "sh", "-c", "echo lazy $((6 * 7))"]), "lazy 42\n");
    let _ = c.command(&["kill", "--all"]).output();
    for pid in common::processes_of(&c.dir.join("run")) {
        // SAFETY: signals a process by pid.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}
