//! `exec` through the real agent binary: env, cwd, stdin, streaming, timeouts, exit
//! codes and signals.

mod common;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::TestAgent;
use forkvm_proto::ExecRequest;

const SIGKILL: i32 = 9;
const SIGTERM: i32 = 15;

#[test]
fn argv_with_env_and_cwd() {
    let agent = TestAgent::start();
    let mut req = ExecRequest::argv(["sh", "-c", "echo \"$GREETING\"; pwd; echo oops >&2; exit 3"]);
    req.env = vec![("GREETING".into(), "hello forkvm".into())];
    req.cwd = Some(agent.dir.path().display().to_string());
    let out = agent.client().exec_collect(&req, b"").unwrap();
    let expected = format!("hello forkvm\n{}\n", agent.dir.path().canonicalize().unwrap().display());
    assert_eq!(String::from_utf8_lossy(&out.stdout), expected);
    assert_eq!(out.stderr, b"oops\n");
    assert_eq!((out.status.code, out.status.signal, out.status.timed_out), (Some(3), None, false));
}

#[test]
fn shell_string_reads_large_stdin() {
    let agent = TestAgent::start();
    let input: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    let out = agent.client().exec_collect(&ExecRequest::shell("cat"), &input).unwrap();
    assert_eq!(out.status.code, Some(0));
    assert!(out.stdout == input, "cat echoed {} of {} bytes", out.stdout.len(), input.len());
    let out = agent.client().exec_collect(&ExecRequest::shell("head -c 5"), &input).unwrap();
    assert_eq!(out.stdout, &input[..5]);
}

#[test]
fn timeout_kills_the_process_group() {
    let agent = TestAgent::start();
    let mut req = ExecRequest::shell("sleep 10; echo never");
    req.timeout_ms = Some(200);
    let started = Instant::now();
    let out = agent.client().exec_collect(&req, b"").unwrap();
    assert!(out.status.timed_out);
    assert_eq!(out.status.signal, Some(SIGKILL));
    assert!(out.stdout.is_empty());
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
}

#[test]
fn signal_death_is_reported() {
    let agent = TestAgent::start();
    let out = agent.client().exec_collect(&ExecRequest::shell("kill -TERM $$"), b"").unwrap();
    assert_eq!((out.status.code, out.status.signal, out.status.timed_out), (None, Some(SIGTERM), false));
}

/// The agent blocks SIGCHLD for its reaper; a command that inherited that would sleep
/// for ever in a shell's `wait` whenever its child outlives the first `waitpid`.
#[test]
fn commands_start_with_no_signal_blocked_or_ignored() {
    let agent = TestAgent::start();
    let out = agent
        .client()
        .exec_collect(&ExecRequest::argv(["grep", "-E", "^Sig(Blk|Ign):", "/proc/self/status"]), b"")
        .unwrap();
    assert_eq!(out.status.code, Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n");
    // And the shell's own `wait` for background children returns, round after round.
    let mut req = ExecRequest::shell("for i in $(seq 200); do true & wait $! || exit 1; done; echo waited");
    req.timeout_ms = Some(60_000);
    let out = agent.client().exec_collect(&req, b"").unwrap();
    assert_eq!((out.status.timed_out, out.stdout.as_slice()), (false, &b"waited\n"[..]));
}

#[test]
fn output_streams_before_exit() {
    let agent = TestAgent::start();
    let client = agent.client();
    let (tx, rx) = mpsc::channel();
    let worker = std::thread::spawn(move || {
        let req = ExecRequest::shell("echo first; sleep 1; echo second");
        let mut on_out = |chunk: &[u8]| tx.send(chunk.to_vec()).unwrap();
        client.exec(&req, None, &mut on_out, &mut |_| {}).unwrap()
    });
    let first = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!(first, b"first\n");
    assert!(!worker.is_finished(), "the first chunk must arrive while the command still runs");
    let status = worker.join().unwrap();
    assert_eq!(status.code, Some(0));
    assert_eq!(rx.recv().unwrap(), b"second\n");
}

#[test]
fn missing_program_and_cwd_are_errors() {
    let agent = TestAgent::start();
    let err = agent.client().exec_collect(&ExecRequest::argv(["/nonexistent/prog"]), b"").unwrap_err();
    assert!(err.to_string().contains("NotFound"), "{err}");
    let mut req = ExecRequest::argv(["true"]);
    req.cwd = Some("/nonexistent-dir".into());
    assert!(agent.client().exec_collect(&req, b"x").is_err());
    // The agent still serves.
    assert_eq!(agent.client().exec_collect(&ExecRequest::argv(["true"]), b"").unwrap().status.code, Some(0));
}

#[test]
fn concurrent_execs_run_on_separate_connections() {
    let agent = TestAgent::start();
    let client = std::sync::Arc::new(agent.client());
    let started = Instant::now();
    let handles: Vec<_> = (0..4)
        .map(|i| {
            let client = client.clone();
            std::thread::spawn(move || {
                client.exec_collect(&ExecRequest::shell(format!("sleep 1; echo {i}")), b"").unwrap()
            })
        })
        .collect();
    for (i, h) in handles.into_iter().enumerate() {
        assert_eq!(h.join().unwrap().stdout, format!("{i}\n").as_bytes());
    }
    assert!(started.elapsed() < Duration::from_secs(3), "execs were serialized: {:?}", started.elapsed());
}

#[test]
fn a_started_exec_reports_its_pid_and_only_it_can_be_signalled() {
    let agent = TestAgent::start();
    let client = agent.client();
    // A pid no exec of this agent has is refused, not signalled.
    let e = client.signal(std::process::id(), SIGTERM).unwrap_err();
    assert!(e.to_string().contains("no running exec or background process has pid"), "{e}");
    let e = client.signal(1, 0).unwrap_err();
    assert!(e.to_string().contains("not a signal number"), "{e}");

    let (pid_tx, pid_rx) = mpsc::channel();
    let (out_tx, out_rx) = mpsc::channel();
    let runner = {
        let client = agent.client();
        std::thread::spawn(move || {
            let mut on_start = |pid: u32| pid_tx.send(pid).unwrap();
            let mut out = Vec::new();
            let st = client
                .exec_reporting_start(
                    &ExecRequest::shell("echo up; sleep 30 & wait"),
                    None,
                    Some(&mut on_start),
                    &mut |b| {
                        out.extend_from_slice(b);
                        let _ = out_tx.send(());
                    },
                    &mut |_| {},
                )
                .unwrap();
            (st, out)
        })
    };
    let pid = pid_rx.recv_timeout(Duration::from_secs(10)).expect("a started frame before any exit");
    // The pid is the exec's own (its argv shows once its exec has set up its stack: the
    // agent starts it with vfork semantics and may get there first).
    let cmdline = || std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cmdline().contains("sleep 30") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(cmdline().contains("sleep 30"), "{:?}", cmdline());
    // The shell's argv shows before it runs its first command: kill it only once `up`
    // came out (a CI flake killed it before the echo).
    out_rx.recv_timeout(Duration::from_secs(10)).expect("the exec's output before the kill");
    let t = Instant::now();
    client.signal(pid, SIGKILL).unwrap();
    let (st, out) = runner.join().unwrap();
    assert!(t.elapsed() < Duration::from_secs(10), "the group died at once");
    assert_eq!((st.code, st.signal), (None, Some(SIGKILL)));
    assert_eq!(out, b"up\n");
    // Once it ended, its pid is no one's to signal.
    assert!(client.signal(pid, SIGKILL).unwrap_err().to_string().contains("no running exec"));
}

#[test]
fn an_exec_runs_as_the_user_it_names_or_fails_clearly() {
    let agent = TestAgent::start();
    let mut req = ExecRequest::shell("id -u; id -g; echo $HOME $USER $LOGNAME; pwd");
    req.user = Some("no-such-user-here".into());
    let e = agent.client().exec_collect(&req, b"").unwrap_err();
    assert!(e.to_string().contains("\"no-such-user-here\" does not exist in the guest"), "{e}");

    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return; // switching users needs root, as the agent has in a guest
    }
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    let nobody: Vec<&str> =
        passwd.lines().find(|l| l.starts_with("nobody:")).expect("a nobody user").split(':').collect();
    req.user = Some("nobody".into());
    let out = agent.client().exec_collect(&req, b"").unwrap();
    let home = nobody[5];
    let cwd = if std::path::Path::new(home).is_dir() {
        home.to_string()
    } else {
        std::env::current_dir().unwrap().display().to_string()
    };
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{}\n{}\n{home} nobody nobody\n{cwd}\n", nobody[2], nobody[3]),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
