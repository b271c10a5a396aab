//! Linux tier: background processes in a real guest, through the CLI on this host and
//! through the daemon: started, listed, read from an offset while they run and again
//! after they ended, fed input, signalled; a terminal process has its controlling
//! terminal (devpts mounted on first use); `forkvm shell` runs a command on a terminal
//! and ends with its code; a fork of a sandbox carries its background processes, which
//! then run on in both, apart.

#[path = "common/cli_env.rs"]
mod cli_env;

use cli_env::CliEnv;
use std::io::Write;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// `[--daemon E] proc ARGS...`.
fn proc_argv<'a>(daemon: Option<&'a str>, args: &[&'a str]) -> Vec<&'a str> {
    let mut all: Vec<&str> = daemon.map(|d| vec!["--daemon", d]).unwrap_or_default();
    all.push("proc");
    all.extend_from_slice(args);
    all
}

/// `forkvm [--daemon E] proc ARGS...`, which must succeed; its stdout.
fn proc(env: &CliEnv, daemon: Option<&str>, args: &[&str]) -> String {
    env.ok(&proc_argv(daemon, args))
}

fn listed(env: &CliEnv, daemon: Option<&str>, id: &str, pid: &str) -> serde_json::Value {
    let all: serde_json::Value = serde_json::from_str(&proc(env, daemon, &["ls", id, "--json"])).unwrap();
    all.as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"].as_u64().map(|n| n.to_string()).as_deref() == Some(pid))
        .cloned()
        .unwrap_or_else(|| panic!("{all}"))
}

/// Waits until the process's output holds `text` (reading it whole each time).
fn wait_output(env: &CliEnv, daemon: Option<&str>, id: &str, pid: &str, text: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let out = proc(env, daemon, &["logs", id, pid]);
        if out.contains(text) {
            return out;
        }
        assert!(Instant::now() < deadline, "{text:?} never came: {out:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// What both ways check: a process that waits for input is listed, read, fed, followed
/// to its end; a signal ends another; a terminal process sees its terminal.
fn check_processes(env: &CliEnv, daemon: Option<&str>, id: &str) {
    let script = "echo one; echo oops >&2; read x; echo \"got $x\"; exit 3";
    let pid = proc(env, daemon, &["start", id, "--tag", "job", "--", "sh", "-c", script]).trim().to_string();
    let p = listed(env, daemon, id, &pid);
    assert_eq!((p["tag"].as_str(), p["running"].as_bool()), (Some("job"), Some(true)), "{p}");
    wait_output(env, daemon, id, &pid, "one\n");

    let input = proc_argv(daemon, &["input", id, &pid, "--close"]);
    let mut child = env.command(&input).stdin(Stdio::piped()).stdout(Stdio::null()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(b"hello\n").unwrap();
    assert!(child.wait().unwrap().success());

    let out = env.cmd(&proc_argv(daemon, &["logs", id, &pid, "--follow"]));
    assert_eq!(out.status.code(), Some(3), "the process's code: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!((out.stdout.as_slice(), out.stderr.as_slice()), (&b"one\ngot hello\n"[..], &b"oops\n"[..]));
    // From an offset: what followed it (stdout and stderr count together).
    let from4 = proc(env, daemon, &["logs", id, &pid, "--offset", "4", "--json"]);
    let first: serde_json::Value = serde_json::from_str(from4.lines().next().unwrap()).unwrap();
    assert_eq!(first, serde_json::json!({"type": "from", "offset": 4, "skipped": 0}));
    assert!(from4.lines().last().unwrap().contains("\"exit_code\":3"), "{from4}");

    let sleeper = proc(env, daemon, &["start", id, "--", "sleep", "600"]).trim().to_string();
    proc(env, daemon, &["kill", id, &sleeper, "--signal", "KILL"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while listed(env, daemon, id, &sleeper)["running"] == true {
        assert!(Instant::now() < deadline, "the killed process still runs");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(listed(env, daemon, id, &sleeper)["exit"]["exit_code"], 137);

    let tty = proc(env, daemon, &["start", id, "--pty", "30x100", "--", "sh", "-c", "tty; stty size"]);
    let out = wait_output(env, daemon, id, tty.trim(), "30 100");
    assert!(out.starts_with("/dev/pts/"), "{out:?}");
}

/// `forkvm shell` with a piped stdin: typed lines go to the terminal, the end of input
/// is its EOF, and the session ends with the command's code.
fn check_shell(env: &CliEnv, daemon: Option<&str>, id: &str) {
    let argv: Vec<&str> =
        daemon.map(|d| vec!["--daemon", d]).unwrap_or_default().into_iter().chain(["shell", id]).collect();
    let mut shell = env.command(&argv).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    shell.stdin.take().unwrap().write_all(b"echo $((6 * 7))\nexit 5\n").unwrap();
    let out = shell.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(5), "{}", String::from_utf8_lossy(&out.stdout));
    assert!(String::from_utf8_lossy(&out.stdout).contains("42"), "{}", String::from_utf8_lossy(&out.stdout));
}

#[test]
fn background_processes_run_on_and_are_read_fed_and_signalled_locally_and_through_the_daemon() {
    let env = CliEnv::new();
    env.ok(&["snapshot", "create", "--image", "tiny", "--tag", "t"]);
    let id = env.fork("--tag", "t", 1).remove(0);
    check_processes(&env, None, &id);

    check_shell(&env, None, &id);

    // Through the daemon, on the same sandbox (it takes over the running one); its
    // shell on the process's WebSocket.
    let templates = env.tmp.path().join("templates");
    let (_daemon, endpoint) = env.start_daemon(&templates);
    check_processes(&env, Some(&endpoint), &id);
    check_shell(&env, Some(&endpoint), &id);
    let bad = env.cmd(&["--daemon", &endpoint, "proc", "logs", &id, "999999"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("no background process has pid 999999"));
}

#[test]
fn a_fork_carries_its_sources_background_processes_which_then_run_apart() {
    let env = CliEnv::new();
    env.ok(&["snapshot", "create", "--image", "tiny", "--tag", "t"]);
    let id = env.fork("--tag", "t", 1).remove(0);
    let counter = "i=0; while true; do echo $i; i=$((i+1)); sleep 0.2; done";
    let pid = proc(&env, None, &["start", &id, "--tag", "counter", "--", "sh", "-c", counter]).trim().to_string();
    wait_output(&env, None, &id, &pid, "3\n");

    let child = env.fork("--from-sandbox", &id, 1).remove(0);
    let there = listed(&env, None, &child, &pid);
    assert_eq!((there["tag"].as_str(), there["running"].as_bool()), (Some("counter"), Some(true)), "{there}");
    let at_fork = there["output_end"].as_u64().unwrap();
    // The child's copy counts on; killing it leaves the source's running.
    let seen = there["output_end"].as_u64().unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while listed(&env, None, &child, &pid)["output_end"].as_u64().unwrap() <= seen {
        assert!(Instant::now() < deadline, "the child's copy stands still");
        std::thread::sleep(Duration::from_millis(200));
    }
    proc(&env, None, &["kill", &child, &pid, "--signal", "KILL"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while listed(&env, None, &child, &pid)["running"] == true {
        assert!(Instant::now() < deadline, "the child's copy still runs");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(listed(&env, None, &id, &pid)["running"], true, "the source's process runs on");
    // The child kept the source's output up to the fork.
    let from0 = proc(&env, None, &["logs", &child, &pid]);
    assert!(from0.starts_with("0\n1\n2\n3\n") && from0.len() as u64 >= at_fork, "{from0:?}");
}
