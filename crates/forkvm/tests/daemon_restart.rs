//! Linux tier, through a real `forkvm daemon`: the daemon is killed with `kill -9` in the
//! middle of a spawn and of a branch, restarted, and must leave a consistent registry,
//! controllable sandboxes, and no orphaned processes or files. Also the listener rules
//! (non-loopback TCP without a token, placeholder tokens) and graceful stop.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Daemon {
    child: Child,
    socket: PathBuf,
    /// The JSON the daemon printed after reconciling.
    reconciled: serde_json::Value,
}

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

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_forkvm"));
        c.args(args).env("FORKVM_STORE", &self.store).env("FORKVM_RUN", &self.run);
        c
    }

    fn start(&self) -> Daemon {
        let mut child = self.command(&["daemon"]).stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut reconciled = serde_json::Value::Null;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            assert!(Instant::now() < deadline, "the daemon did not start");
            let mut line = String::new();
            assert!(out.read_line(&mut line).unwrap() > 0, "the daemon exited: {:?}", child.try_wait());
            if let Some(j) = line.strip_prefix("forkvmd reconciled ") {
                reconciled = serde_json::from_str(j).unwrap();
            }
            if line.starts_with("forkvmd listening on unix:") {
                break;
            }
        }
        // Keep draining stdout so the daemon never blocks on it.
        std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
        Daemon { child, socket: self.run.join("forkvmd.sock"), reconciled }
    }

    /// Processes whose environment names this test's run directory (daemon, spawner,
    /// VMMs).
    fn processes(&self) -> Vec<i32> {
        common::processes_of(&self.run)
    }

    fn run_dirs(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(self.run.join("sandboxes"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        for pid in self.processes() {
            // SAFETY: signals a process by pid.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// One HTTP/1.1 request over the Unix socket; returns (status, body).
fn http(socket: &Path, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = UnixStream::connect(socket).unwrap_or_else(|e| panic!("connect {}: {e}", socket.display()));
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: forkvmd\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body =
        if head.to_ascii_lowercase().contains("transfer-encoding: chunked") { unchunk(rest) } else { rest.into() };
    (status, body)
}

fn unchunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        s = &rest[n + 2..];
    }
    out
}

fn json(socket: &Path, method: &str, path: &str, body: &str, want: u16) -> serde_json::Value {
    let (status, text) = http(socket, method, path, body);
    assert_eq!(status, want, "{method} {path} {body}: {text}");
    if text.is_empty() {
        serde_json::Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
    }
}

fn kill9(d: &mut Daemon) {
    d.child.kill().unwrap(); // SIGKILL
    d.child.wait().unwrap();
}

fn ids(list: &serde_json::Value) -> Vec<String> {
    let mut v: Vec<String> = list.as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap().to_string()).collect();
    v.sort();
    v
}

#[test]
fn kill_9_during_spawn_and_branch_then_restart_is_consistent() {
    let env = Env::new();
    let mut d = env.start();
    json(&d.socket, "POST", "/v1/snapshots", r#"{"tag":"py","template":"python"}"#, 201);
    let a = ids(&json(&d.socket, "POST", "/v1/sandboxes", r#"{"snapshot_tag":"py"}"#, 201))[0].clone();
    let eval = |sock: &Path, code: &str| {
        json(sock, "POST", &format!("/v1/sandboxes/{a}/eval"), &format!(r#"{{"code":"{code}"}}"#), 200)
    };
    eval(&d.socket, "marker = 'A'");

    // 1. kill -9 while a spawn of 3 waits for its guests.
    let sock = d.socket.clone();
    let spawner = std::thread::spawn(move || http(&sock, "POST", "/v1/sandboxes", r#"{"snapshot_tag":"py","n":3}"#));
    let deadline = Instant::now() + Duration::from_secs(30);
    while env.run_dirs().len() < 4 {
        assert!(Instant::now() < deadline, "the spawn never started its VMMs");
        std::thread::sleep(Duration::from_millis(5));
    }
    kill9(&mut d);
    let (status, _) = spawner.join().unwrap();
    assert_eq!(status, 0, "the interrupted request must not have been answered");
    let mut d = env.start();
    let interrupted = d.reconciled["interrupted"].as_array().unwrap().len();
    assert_eq!(interrupted, 3, "{}", d.reconciled);
    assert_eq!(d.reconciled["reattached"], serde_json::json!([a]));
    let listed = ids(&json(&d.socket, "GET", "/v1/sandboxes", "", 200));
    assert_eq!(listed, vec![a.clone()]);
    assert_eq!(env.run_dirs(), vec![a.clone()], "run directories of the interrupted spawn remain");
    assert_eq!(eval(&d.socket, "marker")["result"], "'A'", "the sandbox is still controllable");
    // Daemon, spawner, A's VMM and the init of the pid namespace it was born in (the
    // killed daemon's spawner made it; it stays while A runs); nothing else.
    let comm = |pid: i32| std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    let inits = env.processes().into_iter().filter(|p| comm(*p).trim() == "forkvm-pidns").count();
    assert_eq!((env.processes().len(), inits), (4, 1), "orphaned processes: {:?}", env.processes());

    // 2. kill -9 in the middle of a full branch (the pause writes 256 MiB).
    let sock = d.socket.clone();
    let a2 = a.clone();
    let brancher = std::thread::spawn(move || {
        http(&sock, "POST", &format!("/v1/sandboxes/{a2}/branch"), r#"{"tag":"b-full","mode":"full"}"#)
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while !env
        .store
        .join("snapshots")
        .read_dir()
        .unwrap()
        .flatten()
        .any(|e| e.file_name().to_string_lossy().starts_with("b-full"))
    {
        assert!(Instant::now() < deadline, "the branch never started");
        std::thread::sleep(Duration::from_millis(1));
    }
    kill9(&mut d);
    let _ = brancher.join();
    // 3. ... and in the middle of a live branch that was not waited for.
    let mut d = env.start();
    let b = json(
        &d.socket,
        "POST",
        &format!("/v1/sandboxes/{a}/branch"),
        r#"{"tag":"b-live","mode":"live","wait":false}"#,
        202,
    );
    assert_eq!(b["status"], "writing");
    kill9(&mut d);
    let d = env.start();
    // The VMM finishes a branch it started whatever happens to the daemon: both are
    // ready (or, had a writer died, removed); none is left half-written.
    let deadline = Instant::now() + Duration::from_secs(60);
    let snaps = loop {
        let snaps = json(&d.socket, "GET", "/v1/snapshots", "", 200);
        let arr = snaps.as_array().unwrap().clone();
        if arr.iter().all(|s| s["status"] != "writing") {
            break arr;
        }
        assert!(Instant::now() < deadline, "a branch stayed writing: {snaps}");
        std::thread::sleep(Duration::from_millis(50));
    };
    for s in &snaps {
        assert_eq!(s["status"], "ready", "{s}");
        assert_eq!(s["bootable"], true, "{s}");
    }
    let tags: Vec<&str> = snaps.iter().map(|s| s["tag"].as_str().unwrap()).collect();
    assert!(tags.contains(&"b-live"), "{tags:?}");
    let leftovers: Vec<String> = std::fs::read_dir(env.store.join("snapshots"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".partial"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    // A branch made across the crash is usable: its child has the source's state.
    let child = ids(&json(&d.socket, "POST", "/v1/sandboxes", r#"{"snapshot_tag":"b-live"}"#, 201))[0].clone();
    let v = json(&d.socket, "POST", &format!("/v1/sandboxes/{child}/eval"), r#"{"code":"marker"}"#, 200);
    assert_eq!(v["result"], "'A'");
    assert_eq!(eval(&d.socket, "marker")["result"], "'A'");
    // The database agrees with the listing after all of this.
    let info = json(&d.socket, "GET", &format!("/v1/sandboxes/{a}"), "", 200);
    assert!(info["branch_count"].as_u64().unwrap() >= 1, "{info}");

    // Everything the daemon, spawner and VMMs wrote is theirs alone: memory images,
    // disks, records, sockets, the database and audit log.
    for root in [&env.store, &env.run] {
        assert_private(root);
    }

    // 4. Graceful stop: the socket goes, the sandboxes stay.
    let mut d = d;
    // SAFETY: signals the daemon by pid.
    unsafe { libc::kill(d.child.id() as i32, libc::SIGTERM) };
    let status = d.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    assert!(!d.socket.exists());
    let d = env.start();
    let mut listed = ids(&json(&d.socket, "GET", "/v1/sandboxes", "", 200));
    let mut want = vec![a.clone(), child.clone()];
    listed.sort();
    want.sort();
    assert_eq!(listed, want);
    for id in &want {
        json(&d.socket, "DELETE", &format!("/v1/sandboxes/{id}"), "", 204);
    }
    assert!(env.run_dirs().is_empty());
}

/// No file or directory under `root` is readable or writable by group or others (a
/// directory may let them pass, mode 0711: the way sandbox uids reach their own run
/// directories and branch inboxes). Files with more than one link are hard links into
/// the image cache, shared read-only by every sandbox, and are skipped.
fn assert_private(root: &Path) {
    use std::os::unix::fs::MetadataExt;
    let mut stack = vec![root.to_path_buf()];
    let mut checked = 0;
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let Ok(meta) = std::fs::symlink_metadata(e.path()) else { continue };
            if meta.file_type().is_symlink() || (meta.is_file() && meta.nlink() > 1) {
                continue;
            }
            if meta.is_dir() {
                stack.push(e.path());
            }
            let others = if meta.is_dir() { 0o066 } else { 0o077 };
            assert_eq!(meta.mode() & others, 0, "{} is mode {:o}", e.path().display(), meta.mode() & 0o7777);
            checked += 1;
        }
    }
    assert!(checked > 10, "only {checked} files under {}", root.display());
}

#[test]
fn listener_rules_are_enforced_at_start() {
    let env = Env::new();
    let out = env.command(&["daemon", "--bind", "0.0.0.0:0"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("needs --token-file"), "{err}");
    // Loopback too: any local process, and any web page, can reach it.
    let out = env.command(&["daemon", "--bind", "127.0.0.1:0"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("needs --token-file") && err.contains("loopback too"), "{err}");
    let token = env.run.parent().unwrap().join("token");
    std::fs::write(&token, "REPLACE_ME_with_a_real_token\n").unwrap();
    let out =
        env.command(&["daemon", "--bind", "127.0.0.1:0", "--token-file", token.to_str().unwrap()]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("placeholder"));
    std::fs::write(&token, "short").unwrap();
    let out =
        env.command(&["daemon", "--bind", "127.0.0.1:0", "--token-file", token.to_str().unwrap()]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("at least 16"));
    // A second daemon on the same state directory is refused while the first runs.
    let d = env.start();
    let out = env.command(&["daemon", "--socket", env.run.join("other.sock").to_str().unwrap()]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("lock is held"), "{}", String::from_utf8_lossy(&out.stderr));
    drop(d);
}
