//! Linux tier: `forkvm watch` on a directory of a running sandbox (the agent's inotify
//! watch in a real guest): `armed` first, then exactly the changes a command made, in
//! order, below the directory too; a fork of the watched sandbox neither ends the
//! source's watch nor leaves the child's agent stuck on the watch it inherited.

#[path = "common/cli_env.rs"]
mod cli_env;

use cli_env::CliEnv;
use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// A running `forkvm watch`, killed when dropped; its lines arrive on `lines`.
struct Watcher {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Watcher {
    fn start(env: &CliEnv, args: &[&str]) -> Watcher {
        let mut child = env.command(args).stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Watcher { child, lines }
    }

    fn next(&self) -> serde_json::Value {
        let line = self.lines.recv_timeout(Duration::from_secs(120)).expect("a watch line within 120 s");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?}: {e}"))
    }

    fn change(&self) -> (String, String) {
        let v = self.next();
        assert_eq!(v["type"], "change", "{v}");
        (v["kind"].as_str().unwrap().to_string(), v["path"].as_str().unwrap().to_string())
    }
}

#[test]
fn a_watch_sees_exactly_the_changes_and_survives_a_fork_of_its_sandbox() {
    let env = CliEnv::new();
    env.ok(&["snapshot", "create", "--image", "tiny", "--tag", "t"]);
    let id = env.fork("--tag", "t", 1).remove(0);
    env.sh(&id, "mkdir -p /tmp/w/sub");
    let w = Watcher::start(&env, &["watch", &id, "/tmp/w", "--recursive", "--count", "7"]);
    assert_eq!(w.next(), serde_json::json!({"type": "armed", "directories": 2}));

    env.sh(&id, "cd /tmp/w && : > a && echo x >> a && mv a sub/b && rm sub/b && chmod 700 sub");
    let got: Vec<(String, String)> = (0..6).map(|_| w.change()).collect();
    let want =
        [("create", "a"), ("write", "a"), ("rename", "a"), ("create", "sub/b"), ("remove", "sub/b"), ("chmod", "sub")];
    assert_eq!(got, want.map(|(k, p)| (k.to_string(), p.to_string())));

    // A fork copies the agent with its watch thread; the child's copy of the connection
    // is reset, so the child answers, and the source's watch goes on.
    let child = env.fork("--from-sandbox", &id, 1).remove(0);
    assert_eq!(env.sh(&child, "echo child"), "child\n");
    env.sh(&id, ": > /tmp/w/after");
    assert_eq!(w.change(), ("create".to_string(), "after".to_string()));
    // --count 7 reached: the command ends by itself.
    let mut w = w;
    let status = w.child.wait().unwrap();
    assert!(status.success(), "{status}");

    // What cannot be watched is refused with the reason.
    let out = env.cmd(&["watch", &id, "/tmp/w/after"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not a directory"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
