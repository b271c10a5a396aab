//! The warm interpreter: ONE long-lived Python process, started at agent startup, that
//! runs `eval` requests in a persistent globals dict (so a warmed `import numpy` costs
//! nothing later). Evals are serialized by a mutex; no fork/exec per eval.
//!
//! Channel: two pipes passed as inherited fds named in `FORKVM_EVAL_FDS` (not stdin or
//! stdout, so user prints and `input()` cannot corrupt it); messages are a 4-byte
//! big-endian length + payload, code in, JSON out (see `driver.py`). If the interpreter
//! dies, the eval reports an `Interpreter` error and the next eval starts a new one.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use forkvm_proto::{AgentError, ErrorKind, EvalOutcome, EvalResponse};
use serde::Deserialize;

use crate::reaper::Reaper;

/// The driver script, embedded so the guest image needs nothing but python.
const DRIVER: &str = include_str!("driver.py");

/// Largest result accepted from the driver.
const MAX_RESULT: usize = 64 << 20;

/// A failed interpreter start, by step.
#[derive(Debug, thiserror::Error)]
pub enum InterpError {
    /// Creating a channel pipe failed.
    #[error("creating the eval pipe: {0}")]
    Pipe(io::Error),
    /// Spawning python failed.
    #[error("spawning {python}: {source}")]
    Spawn { python: String, source: io::Error },
}

struct Running {
    to_py: File,
    from_py: File,
    pid: u32,
}

/// The warm interpreter handle shared by all connections.
pub struct Interp {
    python: PathBuf,
    reaper: Arc<Reaper>,
    running: Mutex<Option<Running>>,
}

impl std::fmt::Debug for Interp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Interp").field("python", &self.python).finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
struct DriverResult {
    ok: bool,
    #[serde(default)]
    value_repr: Option<String>,
    #[serde(default)]
    exception: String,
    #[serde(default)]
    traceback: String,
    #[serde(default)]
    stdout: String,
    #[serde(default)]
    stderr: String,
}

fn pipe() -> Result<(OwnedFd, OwnedFd), InterpError> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(InterpError::Pipe(io::Error::last_os_error()));
    }
    // SAFETY: pipe2 succeeded, so both fds are fresh and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

impl Interp {
    /// Starts the interpreter now, so it is warm before the first eval.
    pub fn start(python: PathBuf, reaper: Arc<Reaper>) -> Result<Self, InterpError> {
        let interp = Self { python, reaper, running: Mutex::new(None) };
        let running = interp.spawn()?;
        *interp.running.lock().unwrap_or_else(|e| e.into_inner()) = Some(running);
        Ok(interp)
    }

    fn spawn(&self) -> Result<Running, InterpError> {
        let (req_r, req_w) = pipe()?;
        let (res_r, res_w) = pipe()?;
        let (child_r, child_w) = (req_r.as_raw_fd(), res_w.as_raw_fd());
        let mut cmd = Command::new(&self.python);
        cmd.arg("-u").arg("-c").arg(DRIVER).env("FORKVM_EVAL_FDS", format!("{child_r},{child_w}"));
        cmd.stdin(Stdio::null());
        // SAFETY: the closure only calls fcntl, which is async-signal-safe, on two fds
        // that are open in the forked child; it clears CLOEXEC so python inherits them.
        unsafe {
            cmd.pre_exec(move || {
                for fd in [child_r, child_w] {
                    if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                        return Err(io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let python = self.python.display().to_string();
        let child = self
            .reaper
            .spawn(&mut cmd, Box::new(move |status| tracing::warn!(python, status, "warm interpreter exited")))
            .map_err(|source| InterpError::Spawn { python: self.python.display().to_string(), source })?;
        tracing::info!(pid = child.id(), python = %self.python.display(), "warm interpreter started");
        // The child's ends (req_r, res_w) close here in the agent when dropped.
        drop((req_r, res_w));
        Ok(Running { to_py: File::from(req_w), from_py: File::from(res_r), pid: child.id() })
    }

    /// Runs `code`, restarting the interpreter first if the previous one died.
    pub fn eval(&self, code: &str) -> Result<EvalResponse, AgentError> {
        let mut guard = self.running.lock().unwrap_or_else(|e| e.into_inner());
        if guard.is_none() {
            let running = self
                .spawn()
                .map_err(|e| AgentError::new(ErrorKind::Interpreter, format!("restarting the interpreter: {e}")))?;
            *guard = Some(running);
        }
        let Some(running) = guard.as_mut() else {
            return Err(AgentError::new(ErrorKind::Interpreter, "interpreter unavailable"));
        };
        match roundtrip(running, code) {
            Ok(r) => Ok(r),
            Err(e) => {
                let pid = running.pid;
                *guard = None;
                Err(AgentError::new(ErrorKind::Interpreter, format!("warm interpreter (pid {pid}): {e}")))
            }
        }
    }
}

fn roundtrip(running: &mut Running, code: &str) -> io::Result<EvalResponse> {
    let len = u32::try_from(code.len()).map_err(|_| io::Error::other("code larger than 4 GiB"))?;
    let mut msg = Vec::with_capacity(4 + code.len());
    msg.extend_from_slice(&len.to_be_bytes());
    msg.extend_from_slice(code.as_bytes());
    running.to_py.write_all(&msg).map_err(|e| io::Error::new(e.kind(), format!("sending code: {e}")))?;
    let mut len = [0u8; 4];
    running.from_py.read_exact(&mut len).map_err(|e| io::Error::new(e.kind(), format!("reading result: {e}")))?;
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_RESULT {
        return Err(io::Error::other(format!("result of {len} bytes exceeds {MAX_RESULT}")));
    }
    let mut body = vec![0u8; len];
    running.from_py.read_exact(&mut body).map_err(|e| io::Error::new(e.kind(), format!("reading result: {e}")))?;
    let r: DriverResult =
        serde_json::from_slice(&body).map_err(|e| io::Error::other(format!("decoding result JSON: {e}")))?;
    let outcome = if r.ok {
        EvalOutcome::Value { value_repr: r.value_repr }
    } else {
        EvalOutcome::Exception { exception: r.exception, traceback: r.traceback }
    };
    Ok(EvalResponse { outcome, stdout: r.stdout, stderr: r.stderr })
}
