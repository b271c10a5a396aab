//! `forkvm bench checkpoint --tag T`: what checkpoints and rewinds cost, as one JSON
//! object, from one run of a `forkvm daemon` started for the bench:
//!
//! - checkpoints of an **idle** sandbox, one every `--gap-ms`: the guest's pause
//!   (p50/p99), the bytes each adds to the store, the whole call;
//! - checkpoints of a sandbox that rewrites `--dirty-mib` of memory (numpy, in place,
//!   every byte changed) before each: the same, and bytes stored against bytes dirtied;
//! - rewinding the sandbox in place to a checkpoint, against spawning a sandbox from T
//!   (both to the agent's first answer);
//! - what a checkpoint after every call (`after_exec`) adds to an `eval` call as its
//!   client sees it: the call answers at the checkpoint's pause, and the writing goes on
//!   during the `--call-gap-ms` before the next call (an agent's think time).
//!
//! The pause and the store's bytes are host-side (real here); the dirtying and the
//! rewind's guest readiness run guest code, emulated on PVM hosts (PLATFORM.md).

use crate::util::{machine, median, p50_p99, r2};
use anyhow::{bail, Context, Result};
use clap::Args;
use forkvm_client::api::{CheckpointInfo, CreateSandboxRequest, RewindRequest};
use forkvm_client::{Client, Endpoint};
use serde_json::json;
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct BenchCheckpointArgs {
    /// Tag to spawn the sandbox from (a python template's, for numpy).
    #[arg(long, default_value = "py")]
    pub tag: String,
    /// Checkpoints taken in each phase.
    #[arg(long, default_value_t = 20)]
    pub checkpoints: usize,
    /// Time between the idle checkpoints.
    #[arg(long, default_value_t = 200)]
    pub gap_ms: u64,
    /// Memory rewritten before each checkpoint of the second phase (0: skip it).
    #[arg(long, default_value_t = 8)]
    pub dirty_mib: u64,
    /// Rewinds timed (and spawns from the tag beside them).
    #[arg(long, default_value_t = 5)]
    pub rewinds: usize,
    /// Calls timed with and without a checkpoint after each (0: skip them).
    #[arg(long, default_value_t = 10)]
    pub calls: usize,
    /// Time between those calls (an agent's think time).
    #[arg(long, default_value_t = 1000)]
    pub call_gap_ms: u64,
    /// Print JSON only.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: BenchCheckpointArgs) -> Result<i32> {
    if !(2..=1000).contains(&a.checkpoints) || !(1..=50).contains(&a.rewinds) || a.dirty_mib > 1024 || a.calls > 200 {
        bail!("--checkpoints is 2..=1000, --rewinds 1..=50, --dirty-mib at most 1024, --calls at most 200");
    }
    let mut report = crate::api::with_bench_daemon(|socket| measure(socket, &a))?;
    report["bench"] = "checkpoint".into();
    report["command"] = format!(
        "forkvm bench checkpoint --tag {} --checkpoints {} --gap-ms {} --dirty-mib {} --rewinds {} --calls {} --call-gap-ms {} --json",
        a.tag, a.checkpoints, a.gap_ms, a.dirty_mib, a.rewinds, a.calls, a.call_gap_ms
    )
    .into();
    report["machine"] = machine();
    if !a.json {
        eprintln!(
            "idle: pause p50 {} ms, {} KiB/checkpoint; dirty {} MiB: pause p50 {} ms, stored/dirtied {}; rewind p50 {} ms vs spawn {} ms; eval {} ms, with a checkpoint after it {} ms",
            report["idle"]["pause_ms"]["p50"],
            report["idle"]["kib_stored_p50"],
            a.dirty_mib,
            report["dirty"]["pause_ms"]["p50"],
            report["dirty"]["stored_over_dirtied"],
            report["rewind_ms"]["p50"],
            report["spawn_from_tag_ms"]["p50"],
            report["after_exec"]["call_ms"]["p50"],
            report["after_exec"]["call_with_checkpoint_ms"]["p50"],
        );
    }
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(0)
}

/// The pause, bytes and call time of a phase's checkpoints.
fn phase(taken: &[CheckpointInfo]) -> serde_json::Value {
    let mut kib: Vec<f64> = taken.iter().map(|c| c.bytes_stored as f64 / 1024.0).collect();
    json!({
        "pause_ms": p50_p99(taken.iter().map(|c| c.pause_ms).collect()),
        "total_ms": p50_p99(taken.iter().map(|c| c.total_ms).collect()),
        "kib_stored_p50": r2(median(&mut kib)),
        "kib_stored_each": kib.iter().map(|k| r2(*k)).collect::<Vec<_>>(),
    })
}

fn measure(socket: &std::path::Path, a: &BenchCheckpointArgs) -> Result<serde_json::Value> {
    let client = Client::new(Endpoint::Unix(socket.to_path_buf()), None)?;
    let sb = client.spawn(&CreateSandboxRequest::new(&a.tag, 1))?.pop().context("the spawn gave no sandbox")?;
    let measured = (|| {
        let eval = |code: &str| -> Result<()> {
            let r = client.eval(&sb.id, code)?;
            match r.error {
                Some(e) => bail!("eval {code:?} in the sandbox: {e}"),
                None => Ok(()),
            }
        };
        let mut idle = Vec::new();
        for _ in 0..a.checkpoints {
            std::thread::sleep(Duration::from_millis(a.gap_ms));
            idle.push(client.checkpoint(&sb.id, Some("idle"))?);
        }
        let mut dirty = Vec::new();
        let mut prefault_ms = 0.0;
        if a.dirty_mib > 0 {
            let t = Instant::now();
            eval(&format!(
                "import numpy as np\n_d = np.random.default_rng(1).integers(0, 256, {} << 20, dtype=np.uint8)",
                a.dirty_mib
            ))?;
            prefault_ms = t.elapsed().as_secs_f64() * 1e3;
            client.checkpoint(&sb.id, Some("after the buffer"))?;
            for _ in 0..a.checkpoints {
                // Every byte changes, in place: no page is new, none repeats another.
                eval("np.add(_d, 1, out=_d); None")?;
                dirty.push(client.checkpoint(&sb.id, Some("dirty"))?);
            }
        }
        let target = idle.last().context("no checkpoint")?.seq;
        let mut rewind_ms = Vec::new();
        let mut spawn_ms = Vec::new();
        for _ in 0..a.rewinds {
            let t = Instant::now();
            client.rewind(&sb.id, &RewindRequest { seq: Some(target), ago_seconds: None })?;
            rewind_ms.push(t.elapsed().as_secs_f64() * 1e3);
            let t = Instant::now();
            let spawned = client.spawn(&CreateSandboxRequest::new(&a.tag, 1))?;
            spawn_ms.push(t.elapsed().as_secs_f64() * 1e3);
            for s in spawned {
                let _ = client.kill_sandbox(&s.id);
            }
        }
        let after_exec = calls(&client, &sb.id, a)?;
        let dirtied = (a.dirty_mib << 20) as f64;
        let mut stored: Vec<f64> = dirty.iter().map(|c| c.bytes_stored as f64).collect();
        let stored_p50 = median(&mut stored);
        let (rewind_p50, spawn_p50) = (median(&mut rewind_ms.clone()), median(&mut spawn_ms.clone()));
        Ok(json!({
            "idle": phase(&idle),
            "dirty": {
                "mib_dirtied_each": a.dirty_mib,
                "pause_ms": if dirty.is_empty() { json!(null) } else { p50_p99(dirty.iter().map(|c| c.pause_ms).collect()) },
                "total_ms": if dirty.is_empty() { json!(null) } else { p50_p99(dirty.iter().map(|c| c.total_ms).collect()) },
                "kib_stored_p50": r2(stored_p50 / 1024.0),
                "stored_over_dirtied": if dirty.is_empty() { json!(null) } else { json!(r2(stored_p50 / dirtied)) },
                "guest_prefault_ms": r2(prefault_ms),
            },
            "rewind_ms": p50_p99(rewind_ms),
            "spawn_from_tag_ms": p50_p99(spawn_ms),
            "rewind_over_spawn": r2(rewind_p50 / spawn_p50),
            "after_exec": after_exec,
        }))
    })();
    let _ = client.kill_sandbox(&sb.id);
    measured
}

/// `eval("None")` timed `a.calls` times without a checkpoint policy, then with
/// `after_exec` (each call `a.call_gap_ms` after the previous one answered).
fn calls(client: &Client, id: &str, a: &BenchCheckpointArgs) -> Result<serde_json::Value> {
    if a.calls == 0 {
        return Ok(json!(null));
    }
    let time_calls = || -> Result<Vec<f64>> {
        let mut ms = Vec::new();
        for _ in 0..a.calls {
            std::thread::sleep(Duration::from_millis(a.call_gap_ms));
            let t = Instant::now();
            client.eval(id, "None")?;
            ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
        Ok(ms)
    };
    let mut policy = client.checkpoints(id)?.policy;
    let plain = time_calls()?;
    policy.after_exec = true;
    client.set_checkpoint_policy(id, &policy)?;
    let with = time_calls();
    policy.after_exec = false;
    client.set_checkpoint_policy(id, &policy)?;
    let with = with?;
    let list = client.checkpoints(id)?.checkpoints;
    let made: Vec<&CheckpointInfo> = list.iter().filter(|c| c.trigger == "exec").collect();
    if made.len() < a.calls.min(policy.keep as usize) {
        bail!("{} calls made {} checkpoints after them", a.calls, made.len());
    }
    let (p, w) = (median(&mut plain.clone()), median(&mut with.clone()));
    Ok(json!({
        "gap_ms": a.call_gap_ms,
        "call_ms": p50_p99(plain),
        "call_with_checkpoint_ms": p50_p99(with),
        "added_ms_p50": r2(w - p),
        "checkpoint_total_ms": p50_p99(made.iter().map(|c| c.total_ms).collect()),
    }))
}
