//! A template's `start` service, brought up before its snapshot is taken.
//!
//! A template such as `code-interpreter` runs a server (there, a Jupyter kernel behind
//! E2B's code-interpreter API). Starting it in every sandbox would cost each one the
//! server's whole start-up, which in a guest whose kernel is emulated is minutes. So the
//! template boot starts it once, waits until its `ready` command succeeds, and only then
//! is the snapshot taken: every sandbox restored from it has the server running and warm.
//!
//! The service runs detached (its own session, stdin from `/dev/null`, output appended to
//! [`START_LOG`]), as the template's user when it has one, so the exec that starts it
//! returns at once and the agent does not wait on its pipes.

use forkvm_image::rootfs::template::START_LOG;
use forkvm_image::rootfs::BuiltImage;
use forkvm_proto::{AgentClient, ExecRequest};
use std::io::{Read, Write};
use std::time::{Duration, Instant};

/// How long `ready` may keep failing. Generous: where the guest kernel is emulated every
/// page a process touches costs milliseconds, and the code-interpreter template's server
/// and kernel (~175 MB of Python) take over half an hour to start there (seconds elsewhere).
pub const READY_TIMEOUT: Duration = Duration::from_secs(45 * 60);

/// Pause between `ready` attempts (each attempt is itself a process start in the guest).
const READY_RETRY: Duration = Duration::from_secs(1);

/// One `ready` attempt's own limit.
const ATTEMPT_TIMEOUT_MS: u64 = 60_000;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("starting the template's service `{start}`: {detail}")]
    Start { start: String, detail: String },
    #[error(
        "the template's service did not become ready: `{ready}` kept failing for {waited:?} (last: {last}); its log {START_LOG} ends with:\n{log}"
    )]
    NotReady { ready: String, waited: Duration, last: String, log: String },
}

/// Starts `image`'s service and waits for its ready check; nothing when it has none.
/// Returns how long it took.
pub fn start_service<S: Read + Write + forkvm_proto::IdleLimit>(
    client: &AgentClient<S>,
    image: &BuiltImage,
) -> Result<Duration, StartError> {
    let Some(start) = image.start.as_deref() else { return Ok(Duration::ZERO) };
    let started = Instant::now();
    launch(client, start, image.user.as_deref())?;
    if let Some(ready) = image.ready.as_deref() {
        let check = ExecRequest::argv(["/bin/sh", "-c", ready]);
        wait_ready(client, ready, check, image.user.as_deref(), READY_TIMEOUT)?;
    }
    Ok(started.elapsed())
}

/// Starts the shell command `start` detached (its own session, output to [`START_LOG`])
/// as `user`; returns once it is launched.
pub fn launch<S: Read + Write + forkvm_proto::IdleLimit>(
    client: &AgentClient<S>,
    start: &str,
    user: Option<&str>,
) -> Result<(), StartError> {
    match run(client, &detached(start, user)) {
        Ok((0, _)) => Ok(()),
        Ok((code, out)) => Err(StartError::Start { start: start.into(), detail: format!("exit {code}: {out}") }),
        Err(detail) => Err(StartError::Start { start: start.into(), detail }),
    }
}

/// Runs `check` (named `ready` in errors) as `user` until it exits 0, once a second, for
/// at most `timeout`. Returns how long that took.
pub fn wait_ready<S: Read + Write + forkvm_proto::IdleLimit>(
    client: &AgentClient<S>,
    ready: &str,
    mut check: ExecRequest,
    user: Option<&str>,
    timeout: Duration,
) -> Result<Duration, StartError> {
    let started = Instant::now();
    check.user = user.map(str::to_string);
    check.timeout_ms = Some(ATTEMPT_TIMEOUT_MS);
    loop {
        let last = match run(client, &check) {
            Ok((0, _)) => return Ok(started.elapsed()),
            Ok((code, out)) => format!("exit {code}: {}", out.trim()),
            Err(e) => e,
        };
        if started.elapsed() > timeout {
            return Err(StartError::NotReady {
                ready: ready.into(),
                waited: started.elapsed(),
                last,
                log: log_tail(client),
            });
        }
        std::thread::sleep(READY_RETRY);
    }
}

/// The exec that launches `start` in its own session, detached from the agent's pipes.
fn detached(start: &str, user: Option<&str>) -> ExecRequest {
    // "$1" is the service's command line, handed over as an argument rather than spliced
    // into this script. In the background with its own session, so this shell returns at
    // once (busybox's setsid has no -f).
    let script = format!("setsid /bin/sh -c \"$1\" </dev/null >>{START_LOG} 2>&1 &");
    let mut req = ExecRequest::argv(["/bin/sh", "-c", &script, "forkvm-start", start]);
    req.user = user.map(str::to_string);
    req.timeout_ms = Some(ATTEMPT_TIMEOUT_MS);
    req
}

/// Runs `req`; its exit code (-1 for a signal or time-out) and its output, bounded.
fn run<S: Read + Write + forkvm_proto::IdleLimit>(
    client: &AgentClient<S>,
    req: &ExecRequest,
) -> Result<(i32, String), String> {
    let out = client.exec_collect(req, &[]).map_err(|e| e.to_string())?;
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    text.truncate(text.floor_char_boundary(2000));
    Ok((out.status.code.unwrap_or(-1), text))
}

/// The last lines of the service's log, for the error that says it never got ready.
fn log_tail<S: Read + Write + forkvm_proto::IdleLimit>(client: &AgentClient<S>) -> String {
    let req = ExecRequest::argv(["tail", "-n", "30", START_LOG]);
    match run(client, &req) {
        Ok((_, text)) => text,
        Err(e) => format!("(could not read it: {e})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_service_is_handed_over_as_an_argument_not_spliced_into_the_script() {
        let req = detached("python3 -c 'print(\"$HOME\")'; echo done", Some("user"));
        let forkvm_proto::Command::Argv(argv) = &req.command else { panic!("{:?}", req.command) };
        assert_eq!(argv[..2], ["/bin/sh", "-c"]);
        assert!(!argv[2].contains("python3"), "{}", argv[2]);
        assert_eq!(argv[4], "python3 -c 'print(\"$HOME\")'; echo done");
        assert_eq!(req.user.as_deref(), Some("user"));
    }
}
