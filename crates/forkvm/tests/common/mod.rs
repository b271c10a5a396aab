//! The harness of the Linux-tier tests that drive a real `forkvm daemon`: a private
//! store, run and key directory; the CLI through the daemon's Unix socket; the daemon
//! started and waited for; everything killed when dropped.
#![allow(dead_code)] // each test binary uses its own part of it

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};

/// Whether sandbox networks can be made here (root); says so on stderr when not.
pub fn networks_allowed() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        eprintln!("skipped: sandbox networks need root");
    }
    root
}

pub struct Env {
    pub _tmp: tempfile::TempDir,
    pub dir: PathBuf,
    pub daemon: Option<Child>,
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = self.cli(&["kill", "--all"]);
        if let Some(mut d) = self.daemon.take() {
            let _ = d.kill();
            let _ = d.wait();
        }
    }
}

impl Env {
    pub fn new() -> Env {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        Env { _tmp: tmp, dir, daemon: None }
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_forkvm"));
        c.args(args)
            .env("FORKVM_STORE", self.dir.join("store"))
            .env("FORKVM_RUN", self.dir.join("run"))
            .env("FORKVM_KEYS", self.dir.join("keys"))
            .env_remove("FORKVM_DAEMON")
            .env_remove("FORKVM_TOKEN");
        c
    }

    pub fn cli(&self, args: &[&str]) -> Output {
        let endpoint = format!("unix:{}", self.socket().display());
        self.command(&["--daemon", &endpoint]).args(args).output().unwrap()
    }

    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.cli(args);
        assert!(out.status.success(), "forkvm {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    }

    pub fn json(&self, args: &[&str]) -> serde_json::Value {
        serde_json::from_str(&self.ok(args)).unwrap()
    }

    /// The daemon's Unix socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.join("run/forkvmd.sock")
    }

    /// A client of the daemon, through its Unix socket.
    pub fn client(&self) -> forkvm_client::Client {
        forkvm_client::Client::new(forkvm_client::Endpoint::Unix(self.socket()), None).unwrap()
    }

    pub fn start_daemon(&mut self, extra: &[&str]) {
        self.start_daemon_with(extra, &[]);
    }

    /// [`Env::start_daemon`] with these variables in the daemon's environment.
    pub fn start_daemon_with(&mut self, extra: &[&str], vars: &[(&str, &str)]) {
        let mut command = self.command(&["daemon"]);
        command.args(extra).stdout(Stdio::piped());
        for (k, v) in vars {
            command.env(k, v);
        }
        let mut child = command.spawn().unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        loop {
            let mut line = String::new();
            assert!(out.read_line(&mut line).unwrap() > 0, "the daemon exited");
            if line.starts_with("forkvmd listening on unix:") {
                break;
            }
        }
        self.daemon = Some(child);
    }
}

/// Processes (not zombies) whose environment names the run directory `run`: a daemon,
/// its spawner, its VMMs.
pub fn processes_of(run: &std::path::Path) -> Vec<i32> {
    let needle = format!("FORKVM_RUN={}", run.display());
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(env) = std::fs::read(e.path().join("environ")) else { continue };
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let zombie = stat.rsplit_once(')').is_some_and(|(_, r)| r.trim_start().starts_with('Z'));
        if !zombie && env.split(|b| *b == 0).any(|v| v == needle.as_bytes()) {
            out.push(pid);
        }
    }
    out
}
