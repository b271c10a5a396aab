//! `forkvm bench forkd --tag T`: the forkd-compatible calls that cost something of
//! their own, in one run against a daemon started for the bench (docs/forkd-compat.md):
//!
//! * `branch`: a full branch, then the same with forkd's `measure_diff`, alternating:
//!   call time, pause (`pause_us`, the guest stopped) and the measurement (`diff_ms`,
//!   done after the pause); `measure_over_full` is the call-time ratio.
//! * `workspace`: create, then suspend (archive: memory, processes, disks sealed) and
//!   resume (the same sandbox restored), each round.
//!
//! Wall times hold the guest's side (emulated guest kernel on PVM hosts); the pause and
//! the measurement are host-side.

use crate::api::with_bench_daemon;
use crate::util::{machine, median, r2};
use anyhow::{bail, Result};
use clap::Args;
use forkvm_client::api::workspaces::CreateWorkspaceRequest;
use forkvm_client::api::{BranchSandboxRequest, CreateSandboxRequest};
use forkvm_client::{Client, Endpoint};
use serde_json::json;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct BenchForkdArgs {
    /// Tag to spawn from (`forkvm snapshot create --image python --tag T`).
    #[arg(long)]
    pub tag: String,
    /// Rounds (a full and a measured branch, a suspend and a resume, each).
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// Print JSON only.
    #[arg(long)]
    pub json: bool,
}

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

fn med(mut v: Vec<f64>) -> f64 {
    r2(median(&mut v))
}

fn measure(a: &BenchForkdArgs, client: &Client) -> Result<serde_json::Value> {
    let id = client.spawn(&CreateSandboxRequest::new(&a.tag, 1))?.remove(0).id;
    let (mut full_ms, mut full_pause_us, mut measured_ms, mut measured_pause_us) = (vec![], vec![], vec![], vec![]);
    let (mut diff_ms, mut diff_bytes, mut logical) = (vec![], vec![], 0);
    for i in 0..a.rounds {
        let full = BranchSandboxRequest { tag: Some(format!("bench-full-{i}")), ..BranchSandboxRequest::default() };
        let t = Instant::now();
        let snap = client.branch(&id, &full)?;
        full_ms.push(ms_since(t));
        full_pause_us.push(snap.pause_us.unwrap_or_default() as f64);
        let with_diff = BranchSandboxRequest {
            tag: Some(format!("bench-measured-{i}")),
            measure_diff: true,
            ..BranchSandboxRequest::default()
        };
        let t = Instant::now();
        let snap = client.branch(&id, &with_diff)?;
        measured_ms.push(ms_since(t));
        measured_pause_us.push(snap.pause_us.unwrap_or_default() as f64);
        let (Some(d), Some(bytes), Some(l)) = (snap.diff_ms, snap.diff_physical_bytes, snap.diff_logical_bytes) else {
            bail!("a measure_diff branch came back without diff_ms/diff_physical_bytes/diff_logical_bytes");
        };
        diff_ms.push(d as f64);
        diff_bytes.push(bytes as f64);
        logical = l;
        client.delete_snapshot(&format!("bench-full-{i}"), false, false)?;
        client.delete_snapshot(&format!("bench-measured-{i}"), false, false)?;
    }
    client.kill_sandbox(&id)?;

    let req = CreateWorkspaceRequest {
        name: "bench-ws".into(),
        snapshot_tag: a.tag.clone(),
        per_child_netns: true,
        memory_limit_mib: None,
    };
    let t = Instant::now();
    client.create_workspace(&req)?;
    let create_ms = ms_since(t);
    let (mut suspend_ms, mut resume_ms) = (vec![], vec![]);
    for _ in 0..a.rounds {
        let t = Instant::now();
        let ws = client.suspend_workspace("bench-ws")?;
        suspend_ms.push(ms_since(t));
        if ws.status != "suspended" {
            bail!("suspend left the workspace {}", ws.status);
        }
        let t = Instant::now();
        let ws = client.resume_workspace("bench-ws")?;
        resume_ms.push(ms_since(t));
        if ws.status != "running" {
            bail!("resume left the workspace {}", ws.status);
        }
    }
    client.delete_workspace("bench-ws")?;

    let (full, measured) = (med(full_ms), med(measured_ms));
    Ok(json!({
        "bench": "forkd",
        "tag": a.tag,
        "rounds": a.rounds,
        "branch": {
            "full_call_ms": full,
            "full_pause_us": med(full_pause_us),
            "measure_diff_call_ms": measured,
            "measure_diff_pause_us": med(measured_pause_us),
            "diff_ms": med(diff_ms),
            "diff_physical_bytes": med(diff_bytes),
            "diff_logical_bytes": logical,
            "measure_over_full": if full > 0.0 { json!(r2(measured / full)) } else { serde_json::Value::Null },
        },
        "workspace": {
            "create_ms": r2(create_ms),
            "suspend_ms": med(suspend_ms),
            "resume_ms": med(resume_ms),
        },
        "machine": machine(),
    }))
}

pub fn run(a: BenchForkdArgs) -> Result<i32> {
    if a.rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    let report = with_bench_daemon(|socket| {
        let client = Client::new(Endpoint::Unix(socket.to_path_buf()), None)?;
        measure(&a, &client)
    })?;
    if a.json {
        println!("{report}");
    } else {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    Ok(0)
}
