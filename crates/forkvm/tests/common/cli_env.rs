//! A private store, registry and key directory for one Linux-tier test that drives the
//! CLI in local mode (no daemon); every sandbox it made is killed when it is dropped.
#![allow(dead_code)] // each test binary uses its own part of it

use std::path::PathBuf;
use std::process::{Command, Output};

pub struct CliEnv {
    pub tmp: tempfile::TempDir,
    pub store: PathBuf,
    pub run: PathBuf,
    pub keys: PathBuf,
}

impl Drop for CliEnv {
    fn drop(&mut self) {
        let _ = self.cmd(&["kill", "--all"]);
    }
}

impl CliEnv {
    pub fn new() -> CliEnv {
        let tmp = tempfile::tempdir().unwrap();
        let (store, run, keys) = (tmp.path().join("store"), tmp.path().join("run"), tmp.path().join("keys"));
        CliEnv { tmp, store, run, keys }
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_forkvm"));
        c.args(args).env("FORKVM_STORE", &self.store).env("FORKVM_RUN", &self.run).env("FORKVM_KEYS", &self.keys);
        c
    }

    pub fn cmd(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }

    /// Runs `args`, which must succeed; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.cmd(args);
        assert!(out.status.success(), "forkvm {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    }

    pub fn json(&self, args: &[&str]) -> serde_json::Value {
        serde_json::from_str(&self.ok(args)).unwrap()
    }

    /// Forks `n` sandboxes (from `--tag X` or `--from-sandbox X`); returns their ids.
    pub fn fork(&self, from: &str, what: &str, n: usize) -> Vec<String> {
        let v = self.json(&["fork", from, what, "-n", &n.to_string(), "--json"]);
        v["sandboxes"].as_array().unwrap().iter().map(|s| s["sandbox_id"].as_str().unwrap().to_string()).collect()
    }

    /// Runs a shell command in sandbox `id`; returns its stdout.
    pub fn sh(&self, id: &str, script: &str) -> String {
        self.ok(&["exec", id, "--", "sh", "-c", script])
    }
}

/// A `forkvm daemon` on a Unix socket in a `CliEnv`'s run directory; killed when dropped.
pub struct Daemon(std::process::Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl CliEnv {
    /// Starts a daemon on this environment's store and run directory, templates in
    /// `templates`; returns it and its endpoint.
    pub fn start_daemon(&self, templates: &std::path::Path) -> (Daemon, String) {
        use std::io::BufRead;
        let mut child = self
            .command(&["daemon"])
            .env("FORKVM_TEMPLATES", templates)
            .env_remove("FORKVM_DAEMON")
            .env_remove("FORKVM_TOKEN")
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let endpoint = loop {
            let mut line = String::new();
            assert!(out.read_line(&mut line).unwrap() > 0, "the daemon exited");
            if let Some(a) = line.trim().strip_prefix("forkvmd listening on ") {
                break a.to_string();
            }
        };
        std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
        (Daemon(child), endpoint)
    }
}
