//! Linux tier: the lifecycle through a real `forkvm daemon` with real sandboxes.
//! `--idle-pause 1s` pauses a sandbox nobody uses and the next exec resumes it
//! transparently; a TTL of 2 s archives a sandbox (never deletes it): it is listed as
//! `archived` (reason `ttl`), also after a daemon restart, and a restore brings it back
//! with its files; a manual archive and restore does the same; delete removes the archive.

use std::time::{Duration, Instant};

mod common;

use common::Env;

impl Env {
    fn sandbox(&self, id: &str) -> serde_json::Value {
        let ps = self.json(&["ps", "--json"]);
        ps.as_array().unwrap().iter().find(|s| s["id"] == id).cloned().unwrap_or(serde_json::Value::Null)
    }

    /// Waits up to `secs` for sandbox `id` to be in `state`; its view then.
    fn wait_for(&self, id: &str, state: &str, secs: u64) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let s = self.sandbox(id);
            if s["state"] == state {
                return s;
            }
            assert!(Instant::now() < deadline, "{id} not {state} after {secs} s: {s}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn stop_daemon(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            // SAFETY: signals our own child by pid.
            unsafe { libc::kill(d.id() as i32, libc::SIGTERM) };
            let _ = d.wait();
        }
    }
}

fn exec(env: &Env, id: &str, cmd: &str) -> String {
    env.ok(&["exec", id, "--", "sh", "-c", cmd])
}

#[test]
fn idle_sandboxes_pause_and_resume_and_ttls_archive_without_deleting() {
    let mut env = Env::new();
    env.start_daemon(&["--idle-pause", "1s", "--disk-snapshot-interval", "0"]);
    env.ok(&["snapshot", "create", "--image", "python", "--tag", "py"]);
    env.ok(&["fork", "--tag", "py", "-n", "2"]);
    let ps = env.json(&["ps", "--json"]);
    let a = ps[0]["id"].as_str().unwrap().to_string();
    let b = ps[1]["id"].as_str().unwrap().to_string();
    exec(&env, &a, "echo kept-a > /root/a.txt && sync");
    exec(&env, &b, "echo kept-b > /root/b.txt && sync");

    // Idle for a second: paused, reason idle. An exec resumes it before it runs.
    let paused = env.wait_for(&a, "paused", 20);
    assert_eq!(paused["reason"], "idle", "{paused}");
    // The CLI without the daemon reads the same registry row: paused, for idleness.
    let out = env.command(&["ps", "--json"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let local: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let here = local.as_array().unwrap().iter().find(|s| s["id"] == a.as_str()).cloned().unwrap_or_default();
    assert_eq!((here["state"].as_str(), here["reason"].as_str()), (Some("paused"), Some("idle")), "{local}");
    // The same command both times (an external program costs ~0.5 s more in the
    // emulated guest than a shell builtin: comparing two commands misleads).
    let started = Instant::now();
    assert_eq!(exec(&env, &a, "cat /root/a.txt"), "kept-a\n");
    eprintln!("exec `cat` on a paused sandbox (resume included): {:?}", started.elapsed());
    let started = Instant::now();
    assert_eq!(exec(&env, &a, "cat /root/a.txt"), "kept-a\n");
    eprintln!("exec `cat` on a running sandbox: {:?}", started.elapsed());
    let s = env.sandbox(&a);
    assert!(s["state"] == "running" || s["state"] == "paused", "{s}");
    assert!(s["last_activity_unix_ms"].as_u64().unwrap() > paused["last_activity_unix_ms"].as_u64().unwrap(), "{s}");

    // A TTL of 2 s archives B (paused or not by then); nothing is deleted.
    let t = env.json(&["ttl", &b, "2", "--json"]);
    assert_eq!(t["ttl_seconds"], 2, "{t}");
    let archived = env.wait_for(&b, "archived", 60);
    assert_eq!((archived["reason"].as_str(), archived["pid"].as_i64()), (Some("ttl"), None), "{archived}");
    assert!(env.dir.join(format!("store/archives/{b}/snapshot.json")).is_file());
    assert!(!env.dir.join(format!("run/sandboxes/{b}")).exists(), "its VMM stopped");
    // The tick logs the archive once it is done, a moment after the row says archived.
    let logged = |audit: &str| {
        audit.lines().any(|l| l.contains("\"event\":\"archive\"") && l.contains(&b) && l.contains("\"ttl\""))
    };
    let deadline = Instant::now() + std::time::Duration::from_secs(10);
    let audit = loop {
        let audit = std::fs::read_to_string(env.dir.join("store/forkvmd/audit.log")).unwrap();
        if logged(&audit) || Instant::now() > deadline {
            break audit;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert!(logged(&audit), "{audit}");
    let out = env.cli(&["exec", &b, "--", "true"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("archived"));

    // Recorded: a restarted daemon still lists it archived.
    env.stop_daemon();
    env.start_daemon(&["--idle-pause", "1s", "--disk-snapshot-interval", "0"]);
    assert_eq!(env.sandbox(&b)["state"], "archived");
    assert_eq!(env.json(&["archives", "--json"]), serde_json::json!([b.clone()]));

    // Restore: same id, its file, running (the spent TTL is not re-armed).
    let started = Instant::now();
    let r = env.json(&["unarchive", &b, "--json"]);
    eprintln!("restore through the daemon: {:?}", started.elapsed());
    assert_eq!((r["id"].as_str(), r["ttl_seconds"].as_u64()), (Some(b.as_str()), None), "{r}");
    assert_eq!(exec(&env, &b, "cat /root/b.txt"), "kept-b\n");

    // A manual archive and restore of A keeps its file too; archiving twice is refused.
    let rep = env.json(&["archive", &a, "--json"]);
    assert_eq!(rep["reason"], "api", "{rep}");
    let out = env.cli(&["archive", &a]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("archived"));
    env.ok(&["unarchive", &a]);
    assert_eq!(exec(&env, &a, "cat /root/a.txt"), "kept-a\n");
    let out = env.cli(&["unarchive", &a]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("running"));

    // Delete is what removes an archive.
    env.ok(&["archive", &a]);
    env.ok(&["kill", &a]);
    assert!(!env.dir.join(format!("store/archives/{a}")).exists());
    assert!(env.sandbox(&a).is_null());
}
