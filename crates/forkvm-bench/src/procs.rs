//! `forkvm bench procs --tag T`: what background processes and terminals cost, through
//! the agent of one sandbox spawned from T, as one JSON object.
//!
//! * `start_ms`: a `proc_start` of `true` until the agent answers that it runs, against
//!   `exec_ms`, an exec of `true` to its end, in the same run (p50/p99 over `--starts`);
//! * `first_output_ms`: from a start of `echo` to its first byte on an attachment;
//! * `keystroke_echo_ms`: on a terminal running `cat`, one key sent on the attachment
//!   until its echo comes back (the terminal's echo and cat's), what a typist feels,
//!   p50/p99 over `--keys`; `input_call_ms`: the same key as a `proc_input` call of its
//!   own (what a REST client pays per keystroke);
//! * `output`: `--mib` MiB written by one process and read as it comes on an attachment
//!   (`mib_per_s`), against `exec_output`, the same bytes through an exec.
//! * `through_daemon`: the same keystroke echo through a `forkvm daemon` started for the
//!   bench, on the process's WebSocket (`socket_echo_ms`, what a browser terminal or an
//!   SDK's attachment feels) against a REST input call per key read back on that socket
//!   (`input_call_echo_ms`).
//!
//! Everything here crosses the guest kernel, which is emulated on PVM hosts
//! (PLATFORM.md): these are guest-side times, inflated there.

use crate::util::{machine, p50_p99, r2};
use anyhow::{bail, Context, Result};
use clap::Args;
use forkvm_client::api::{CreateSandboxRequest, StartProcessRequest, TerminalSize};
use forkvm_client::{Client, Endpoint, ProcessSocket, SocketEvent};
use forkvm_proto::{ExecRequest, ProcAttachRequest, ProcEvent, ProcStartRequest, PtySize};
use forkvm_sandbox::{spawn, Registry, SpawnOptions, SpawnSource};
use forkvm_snapshot::Store;
use serde_json::json;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct BenchProcsArgs {
    /// Tag to spawn the sandbox from.
    #[arg(long)]
    pub tag: String,
    /// Starts measured (and execs beside them).
    #[arg(long, default_value_t = 20)]
    pub starts: usize,
    /// Keys sent to a terminal.
    #[arg(long, default_value_t = 50)]
    pub keys: usize,
    /// MiB one process writes for the throughput.
    #[arg(long, default_value_t = 8)]
    pub mib: usize,
    /// Print JSON only.
    #[arg(long)]
    pub json: bool,
}

fn shell(script: &str) -> ProcStartRequest {
    ProcStartRequest { timeout_ms: Some(600_000), ..ProcStartRequest::shell(script) }
}

pub fn run(a: BenchProcsArgs) -> Result<i32> {
    if !(1..=1000).contains(&a.starts) || !(1..=1000).contains(&a.keys) || !(1..=256).contains(&a.mib) {
        bail!("--starts and --keys are 1..=1000, --mib 1..=256");
    }
    let store = Store::open_default();
    let source = SpawnSource::from_tag(&store, &a.tag)?;
    let mut report = crate::util::in_private_registry("procs", |registry| measure(registry, &source, &a))?;
    // After the library's spawn: this process forked the sandbox's VMM while it had one
    // thread, and the daemon's client adds threads.
    report["through_daemon"] = crate::api::with_bench_daemon(|socket| through_daemon(socket, &a))?;
    report["bench"] = "procs".into();
    report["command"] =
        format!("forkvm bench procs --tag {} --starts {} --keys {} --mib {} --json", a.tag, a.starts, a.keys, a.mib)
            .into();
    report["machine"] = machine();
    if !a.json {
        eprintln!(
            "start {} ms (exec {} ms), first output {} ms, keystroke echo {} ms (a call each: {} ms; through the daemon's socket {} ms, a REST call each {} ms), output {} MiB/s (p50)",
            report["start_ms"]["p50"],
            report["exec_ms"]["p50"],
            report["first_output_ms"]["p50"],
            report["keystroke_echo_ms"]["p50"],
            report["input_call_ms"]["p50"],
            report["through_daemon"]["socket_echo_ms"]["p50"],
            report["through_daemon"]["input_call_echo_ms"]["p50"],
            report["output"]["mib_per_s"]
        );
    }
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(0)
}

fn measure(registry: &Registry, source: &SpawnSource, a: &BenchProcsArgs) -> Result<serde_json::Value> {
    let (mut spawned, _) = spawn(registry, source, 1, &SpawnOptions::default()).context("spawning the sandbox")?;
    let sb = spawned.pop().context("the spawn gave no sandbox")?;
    let client = &sb.client;

    let (mut start, mut exec, mut first) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..a.starts {
        let t = Instant::now();
        client.proc_start(&shell("true")).context("starting `true`")?;
        start.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        client.exec_collect(&ExecRequest::shell("true"), b"").context("exec of `true`")?;
        exec.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        let p = client.proc_start(&shell("echo hi")).context("starting `echo`")?;
        let mut att = client.proc_attach(&ProcAttachRequest { pid: p.pid, offset: Some(0), follow: true })?;
        loop {
            match att.recv()?.context("an attachment that ended without output")? {
                ProcEvent::Stdout(_) => break,
                ProcEvent::End(_) => bail!("`echo hi` ended without output"),
                _ => {}
            }
        }
        first.push(t.elapsed().as_secs_f64() * 1e3);
    }

    // A terminal running cat: a key comes back twice (the terminal's echo, cat's line
    // only after Enter): its echo is what a typist sees.
    let mut term = shell("exec cat");
    term.pty = Some(PtySize { rows: 24, cols: 80 });
    let p = client.proc_start(&term).context("starting cat on a terminal")?;
    let mut att = client.proc_attach(&ProcAttachRequest { pid: p.pid, offset: Some(0), follow: true })?;
    let mut input = att.input()?;
    let mut echo = Vec::new();
    for i in 0..a.keys {
        let key = b'a' + (i % 26) as u8;
        let t = Instant::now();
        input.send(&[key])?;
        wait_for(&mut att, key)?;
        echo.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let mut calls = Vec::new();
    for i in 0..a.keys {
        let key = b'A' + (i % 26) as u8;
        let t = Instant::now();
        client.proc_input(p.pid, &mut &[key][..], false)?;
        calls.push(t.elapsed().as_secs_f64() * 1e3);
        wait_for(&mut att, key)?;
    }
    input.detach();
    client.signal(p.pid, 9)?;

    let bytes = (a.mib as u64) << 20;
    let t = Instant::now();
    let mut writer = shell(&format!("head -c {bytes} /dev/zero"));
    writer.ring_bytes = Some(forkvm_proto::procs::MAX_RING_BYTES);
    let p = client.proc_start(&writer).context("starting the writer")?;
    let mut att = client.proc_attach(&ProcAttachRequest { pid: p.pid, offset: Some(0), follow: true })?;
    let mut got = 0u64;
    loop {
        match att.recv()?.context("the writer's attachment ended early")? {
            ProcEvent::Stdout(b) => got += b.len() as u64,
            ProcEvent::End(_) => break,
            _ => {}
        }
    }
    let secs = t.elapsed().as_secs_f64();
    // The same bytes through an exec, in the same run.
    let t = Instant::now();
    let exec_out = client.exec_collect(&ExecRequest::shell(format!("head -c {bytes} /dev/zero")), b"")?;
    let exec_secs = t.elapsed().as_secs_f64();
    // A reader that fell more than the ring behind skips: `read` says what came.
    Ok(json!({
        "tag": source.tag,
        "start_ms": p50_p99(start),
        "exec_ms": p50_p99(exec),
        "first_output_ms": p50_p99(first),
        "keystroke_echo_ms": p50_p99(echo),
        "input_call_ms": p50_p99(calls),
        "output": { "bytes": bytes, "read": got, "seconds": r2(secs), "mib_per_s": r2(got as f64 / secs / 1048576.0) },
        "exec_output": {
            "read": exec_out.stdout.len(),
            "seconds": r2(exec_secs),
            "mib_per_s": r2(exec_out.stdout.len() as f64 / exec_secs / 1048576.0),
        },
    }))
}

/// Keystroke echo through a daemon: on the process's WebSocket, and as a REST call per
/// key read back on the socket.
fn through_daemon(socket: &std::path::Path, a: &BenchProcsArgs) -> Result<serde_json::Value> {
    let client = Client::new(Endpoint::Unix(socket.to_path_buf()), None)?;
    let sb = client.spawn(&CreateSandboxRequest::new(&a.tag, 1))?.pop().context("the spawn gave no sandbox")?;
    let req = StartProcessRequest {
        cmd: Some("exec cat".into()),
        pty: Some(TerminalSize { rows: 24, cols: 80 }),
        timeout_secs: Some(600),
        ..StartProcessRequest::default()
    };
    let p = client.start_process(&sb.id, &req).context("starting cat on a terminal through the daemon")?;
    let mut sock = client.attach_process(&sb.id, p.pid, Some(0)).context("attaching to cat's socket")?;
    let input = sock.input();
    let (mut echo, mut calls) = (Vec::new(), Vec::new());
    for i in 0..a.keys {
        let key = b'a' + (i % 26) as u8;
        let t = Instant::now();
        input.send(&[key])?;
        wait_on_socket(&mut sock, key)?;
        echo.push(t.elapsed().as_secs_f64() * 1e3);
    }
    for i in 0..a.keys {
        let key = b'A' + (i % 26) as u8;
        let t = Instant::now();
        client.process_input(&sb.id, p.pid, &mut &[key][..], false)?;
        wait_on_socket(&mut sock, key)?;
        calls.push(t.elapsed().as_secs_f64() * 1e3);
    }
    drop(sock);
    client.kill_sandbox(&sb.id)?;
    Ok(json!({ "socket_echo_ms": p50_p99(echo), "input_call_echo_ms": p50_p99(calls) }))
}

/// Reads the socket until a chunk of output holds `want`.
fn wait_on_socket(sock: &mut ProcessSocket, want: u8) -> Result<()> {
    loop {
        if let SocketEvent::Stdout(b) = sock.recv()?.context("the terminal's socket ended")? {
            if b.contains(&want) {
                return Ok(());
            }
        }
    }
}

/// Reads the attachment until a chunk of output holds `want`.
fn wait_for<S: std::io::Read + std::io::Write>(att: &mut forkvm_proto::ProcAttachment<S>, want: u8) -> Result<()> {
    loop {
        if let ProcEvent::Stdout(b) = att.recv()?.context("the terminal's attachment ended")? {
            if b.contains(&want) {
                return Ok(());
            }
        }
    }
}
