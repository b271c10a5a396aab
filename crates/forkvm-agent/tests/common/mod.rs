//! Shared harness for the agent integration tests: starts the real `forkvm-agent`
//! binary on a Unix socket in a temp dir (not as PID 1) and kills it on drop.
//! Set `FORKVM_AGENT_BIN` to test another build of the binary (e.g. the static one).

#![allow(dead_code)]

use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use forkvm_proto::AgentClient;

pub struct TestAgent {
    pub child: Child,
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
}

impl TestAgent {
    /// Starts the agent with a warm interpreter and recorded identity calls.
    pub fn start() -> Self {
        Self::start_with(&["--python", "python3"])
    }

    pub fn start_with(extra: &[&str]) -> Self {
        Self::start_with_env(extra, &[])
    }

    /// [`TestAgent::start_with`] with extra environment variables for the agent.
    pub fn start_with_env(extra: &[&str], env: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("agent.sock");
        // FORKVM_AGENT_BIN runs the suite against another build (e.g. the static one).
        let bin = std::env::var("FORKVM_AGENT_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_forkvm-agent").into());
        let child = Command::new(bin)
            .arg("--listen-unix")
            .arg(&socket)
            .arg("--identity-record")
            .arg(dir.path().join("identity-calls"))
            .args(extra)
            .env("FORKVM_AGENT_LOG", "error")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while UnixStream::connect(&socket).is_err() {
            assert!(Instant::now() < deadline, "agent did not listen on {}", socket.display());
            std::thread::sleep(Duration::from_millis(10));
        }
        Self { child, dir, socket }
    }

    pub fn client(&self) -> AgentClient<UnixStream> {
        AgentClient::unix(&self.socket)
    }

    pub fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }
}

impl Drop for TestAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
