//! `forkvm bench watch --tag T`: what watching a directory costs, through the agent of
//! one sandbox spawned from T, as one JSON object.
//!
//! * `arm_ms`: a `watch` request until the agent reports it `armed` (inotify set up in
//!   the guest, one round trip), p50/p99 over `--watches`; `stop_ms`: ending it;
//! * `write_rtt_ms`: the host writing a new file through the agent (`write_file`), the
//!   change's own cost; `event_ms`: from the start of that write to the watch reporting
//!   its `create`, which is what a watcher waits; p50/p99 over `--changes`;
//! * `burst`: one guest command creates `--burst` files: every `create` must arrive
//!   (`events`), and `last_event_ms` is from the command's start to the last one.
//!
//! Everything here crosses the guest kernel, which is emulated on PVM hosts
//! (PLATFORM.md): these are guest-side times, inflated there.

use crate::util::{machine, p50_p99, r2};
use anyhow::{bail, Context, Result};
use clap::Args;
use forkvm_proto::{ChangeKind, ExecRequest, WatchMessage, WatchRequest, WriteFileRequest};
use forkvm_sandbox::{spawn, Registry, SpawnOptions, SpawnSource};
use forkvm_snapshot::Store;
use serde_json::json;
use std::sync::mpsc;
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct BenchWatchArgs {
    /// Tag to spawn the sandbox from.
    #[arg(long)]
    pub tag: String,
    /// Watches armed and stopped.
    #[arg(long, default_value_t = 20)]
    pub watches: usize,
    /// Files written one at a time under one watch.
    #[arg(long, default_value_t = 50)]
    pub changes: usize,
    /// Files one guest command creates at once.
    #[arg(long, default_value_t = 200)]
    pub burst: usize,
    /// Print JSON only.
    #[arg(long)]
    pub json: bool,
}

/// Longest wait for one event.
const EVENT_LIMIT: Duration = Duration::from_secs(60);

pub fn run(a: BenchWatchArgs) -> Result<i32> {
    if a.watches == 0 || a.changes == 0 || a.burst == 0 || a.burst > 10_000 || a.changes > 10_000 || a.watches > 1000 {
        bail!("--watches (1..=1000), --changes and --burst (1..=10000) must be positive counts");
    }
    let store = Store::open_default();
    let source = SpawnSource::from_tag(&store, &a.tag)?;
    let mut report = crate::util::in_private_registry("watch", |registry| measure(registry, &source, &a))?;
    report["bench"] = "watch".into();
    report["command"] = format!(
        "forkvm bench watch --tag {} --watches {} --changes {} --burst {} --json",
        a.tag, a.watches, a.changes, a.burst
    )
    .into();
    report["machine"] = machine();
    if !a.json {
        eprintln!(
            "arm {} ms, write {} ms, event {} ms (p50); burst of {}: {} events, last after {} ms",
            report["arm_ms"]["p50"],
            report["write_rtt_ms"]["p50"],
            report["event_ms"]["p50"],
            a.burst,
            report["burst"]["events"],
            report["burst"]["last_event_ms"]
        );
    }
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(0)
}

fn measure(registry: &Registry, source: &SpawnSource, a: &BenchWatchArgs) -> Result<serde_json::Value> {
    let (mut spawned, _) = spawn(registry, source, 1, &SpawnOptions::default()).context("spawning the sandbox")?;
    let sb = spawned.pop().context("the spawn gave no sandbox")?;
    let client = &sb.client;
    let dir = "/tmp/forkvm-bench-watch";
    client.exec_collect(&ExecRequest::shell(format!("rm -rf {dir} && mkdir -p {dir}")), b"")?;
    let req = WatchRequest { path: dir.into(), recursive: false };

    let (mut arm, mut stop) = (Vec::new(), Vec::new());
    for _ in 0..a.watches {
        let t = Instant::now();
        let (w, _) = client.watch(&req).context("arming a watch")?;
        arm.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        w.stop().context("stopping a watch")?;
        stop.push(t.elapsed().as_secs_f64() * 1e3);
    }

    // One watch; its messages go to this thread with their arrival times.
    let (w, _) = client.watch(&req).context("arming the watch")?;
    let (tx, rx) = mpsc::channel::<(Instant, String)>();
    let reader = std::thread::spawn(move || {
        let mut w = w;
        while let Ok(Some(m)) = w.recv() {
            if let WatchMessage::Change { kind: ChangeKind::Create, path } = m {
                if tx.send((Instant::now(), path)).is_err() {
                    break;
                }
            }
        }
    });
    let wait_for = |name: &str| -> Result<Instant> {
        loop {
            let (at, path) = rx.recv_timeout(EVENT_LIMIT).with_context(|| format!("no create event for {name}"))?;
            if path == name {
                return Ok(at);
            }
        }
    };
    let (mut write, mut event) = (Vec::new(), Vec::new());
    for i in 0..a.changes {
        let name = format!("w{i}");
        let req = WriteFileRequest { path: format!("{dir}/{name}"), mode: None, create_parents: false, owner: None };
        let t = Instant::now();
        client.write_file(&req, &mut &b"x"[..]).context("writing a file")?;
        write.push(t.elapsed().as_secs_f64() * 1e3);
        // write_file writes a temporary file and renames it: the name appears by the
        // rename (a `create` of the final name).
        event.push((wait_for(&name)? - t).as_secs_f64() * 1e3);
    }
    let t = Instant::now();
    client.exec_collect(
        &ExecRequest::shell(format!("cd {dir} && for i in $(seq 1 {}); do : > b$i; done", a.burst)),
        b"",
    )?;
    let command_ms = t.elapsed().as_secs_f64() * 1e3;
    let mut events = 0usize;
    let mut last = t;
    while events < a.burst {
        match rx.recv_timeout(Duration::from_secs(10)) {
            Ok((at, path)) if path.starts_with('b') => {
                events += 1;
                last = at;
            }
            Ok(_) => {}
            Err(_) => break,
        }
    }
    drop(rx);
    // The reader ends with the sandbox (its connection closes when the sandbox is killed).
    drop(reader);
    Ok(json!({
        "tag": source.tag,
        "arm_ms": p50_p99(arm),
        "stop_ms": p50_p99(stop),
        "write_rtt_ms": p50_p99(write),
        "event_ms": p50_p99(event),
        "burst": { "files": a.burst, "events": events, "command_ms": r2(command_ms), "last_event_ms": r2((last - t).as_secs_f64() * 1e3) },
    }))
}
