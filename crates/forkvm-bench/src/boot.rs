//! `forkvm bench boot --image T`: how fast a Linux sandbox is ready and answers, as one
//! JSON object.
//!
//! * `boot_to_ready_ms`: a cold boot of the template (kernel, image), from creating the
//!   VM to the agent's first answer over vsock (`--cold-runs` times; 0 to skip).
//! * `restore_to_ready_ms`: a sandbox restored from the template snapshot, to its agent's
//!   first answer (median of `--runs`); `restore_phases_us` is the host-side part.
//! * `exec_rtt_ms` (`exec true`) and `eval_rtt_ms` (`eval("1")`, templates with Python),
//!   medians of `--rtts` round trips in one sandbox.
//!
//! On PVM hosts everything the guest kernel does is emulated: cold boot, vsock handling
//! and fork+exec in the guest dominate; the host-side restore is the real cost elsewhere.

use crate::util::{exec_true_rtts, machine, median};
use anyhow::{bail, Context, Result};
use clap::Args;
use forkvm_image::progress::ProgressView;
use forkvm_sandbox::start::in_process::boot_to_agent;
use forkvm_sandbox::{ensure_template_snapshot, Artifacts, Sandbox};
use serde_json::json;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct BenchBootArgs {
    /// Template name or path.
    #[arg(long, default_value = "tiny")]
    pub image: String,
    /// Sandboxes restored (medians reported).
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Cold boots measured (each takes tens of seconds on PVM hosts).
    #[arg(long, default_value_t = 1)]
    pub cold_runs: usize,
    /// Round trips per exec/eval measurement.
    #[arg(long, default_value_t = 10)]
    pub rtts: usize,
    /// Print JSON only.
    #[arg(long)]
    pub json: bool,
}

fn round(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

pub fn run(a: BenchBootArgs) -> Result<i32> {
    if a.runs == 0 || a.rtts == 0 {
        bail!("--runs and --rtts must be at least 1");
    }
    let mut view = ProgressView::new();
    let artifacts = Artifacts::ensure(&a.image, &mut |e| view.show(&e));
    view.finish();
    let artifacts = artifacts?;
    let mut cold = Vec::new();
    for i in 0..a.cold_runs {
        let work = std::env::temp_dir().join(format!("forkvm-bench-boot-{}-{i}", std::process::id()));
        let t = Instant::now();
        let (mut vmm, _client, _console) = boot_to_agent(&artifacts, &work).context("cold boot")?;
        cold.push(t.elapsed().as_secs_f64() * 1e3);
        vmm.stop();
        let _ = std::fs::remove_dir_all(&work);
    }
    let has_python = artifacts.image.python.is_some();
    let template = ensure_template_snapshot(artifacts).context("template snapshot")?;
    let mut ready = Vec::new();
    let mut phases: Vec<Vec<(String, f64)>> = Vec::new();
    for _ in 0..a.runs {
        let sb = Sandbox::start(&template)?;
        ready.push(sb.ready_ms);
        if let Some(v) = sb.vmm() {
            phases.push(v.status().restore_phases_us);
        }
    }
    let sb = Sandbox::start(&template)?;
    let mut exec = exec_true_rtts(&sb, a.rtts)?;
    let mut eval = Vec::new();
    if has_python {
        for _ in 0..a.rtts {
            let t = Instant::now();
            sb.client.eval("1")?;
            eval.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    let mut phase_medians = serde_json::Map::new();
    if let Some(first) = phases.first() {
        for (i, (name, _)) in first.iter().enumerate() {
            let v = median(&mut phases.iter().filter_map(|p| p.get(i).map(|x| x.1)).collect::<Vec<_>>());
            phase_medians.insert(name.clone(), json!(round(v)));
        }
    }
    let out = json!({
        "bench": "boot",
        "image": template.artifacts.image.name,
        "boot_to_ready_ms": if cold.is_empty() { json!(null) } else { json!(round(median(&mut cold))) },
        "cold_runs": a.cold_runs,
        "restore_to_ready_ms": round(median(&mut ready)),
        "restore_to_ready_ms_all": ready.iter().map(|v| round(*v)).collect::<Vec<_>>(),
        "restore_phases_us": phase_medians,
        "exec_rtt_ms": round(median(&mut exec)),
        "eval_rtt_ms": if eval.is_empty() { json!(null) } else { json!(round(median(&mut eval))) },
        "runs": a.runs,
        "rtts": a.rtts,
        "note": "guest-side times (boot, vsock, exec, eval) are inflated on PVM hosts, where guest kernel code is emulated",
        "machine": machine(),
        "command": std::env::args().collect::<Vec<_>>().join(" "),
    });
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(0)
}
