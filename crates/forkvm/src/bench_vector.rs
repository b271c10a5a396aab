//! `forkvm bench vector-state --image T`: what saving the guest's vector state costs,
//! CPU template against CPU template in one run, as one JSON object.
//!
//! For each template (on PVM hosts `pvm-compat`, the `noxsave` profile, and `pvm-xsave`,
//! where the VMM completes XSAVE/XRSTOR; on hardware KVM `host` alone):
//!
//! * `restore_to_ready_ms`: a sandbox restored from the template snapshot, to its agent's
//!   first answer (median of `--runs`);
//! * `exec_rtt_ms`: `exec true` round trips (median of `--rtts`), and the XSAVE/XRSTOR
//!   completions the VMM made per exec;
//! * `vector_check`: the guard's check (3 processes × `--switches` round trips through
//!   `sched_yield`): its result per register class and its time per switch, which is the
//!   guest's context-switch cost;
//! * with Python templates, `numpy`: one process's matmul+sum iterations per second over
//!   `--seconds`, and three processes' wrong results in the same time.
//!
//! The `pvm-compat` snapshot is made with the guard in report-only mode (it exists only to
//! be measured against) and under its own cache key.

use crate::bench_fork::{machine, median};
use crate::image_cmd::ProgressView;
use anyhow::{bail, Context, Result};
use clap::Args;
use forkvm_sandbox::template_snapshot::{ensure_template_snapshot_with, VectorGuard};
use forkvm_sandbox::vector_guard::{self, numpy_probe_code, NumpyProbe};
use forkvm_sandbox::{Artifacts, Sandbox, TemplateSnapshot};
use forkvm_vmm::arch::x86_64::cpuid::CpuTemplate;
use forkvm_vmm::host::HostKind;
use serde_json::{json, Value};
use std::time::Instant;

#[derive(Args, Debug)]
pub struct BenchVectorArgs {
    /// Template name or path (`python` adds the numpy measurements).
    #[arg(long, default_value = "python")]
    pub image: String,
    /// CPU templates to compare, comma-separated; default: by host kind.
    #[arg(long, value_delimiter = ',')]
    pub cpu: Vec<CpuTemplate>,
    /// Sandboxes restored per template (medians reported).
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// `exec true` round trips per template.
    #[arg(long, default_value_t = 10)]
    pub rtts: usize,
    /// Round trips per process of the vector check.
    #[arg(long, default_value_t = 1000)]
    pub switches: u32,
    /// Seconds of each numpy measurement.
    #[arg(long, default_value_t = 10)]
    pub seconds: u32,
}

fn round(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

/// XSAVE and XRSTOR completions the sandbox's VMM has made so far.
fn xsave_completions(sb: &Sandbox) -> u64 {
    sb.vmm().map_or(0, |v| {
        v.status().emulation_fixups.iter().filter(|(k, _)| k == "xsave" || k == "xrstor").map(|(_, n)| *n).sum()
    })
}

fn measure(template: &TemplateSnapshot, a: &BenchVectorArgs, has_python: bool) -> Result<Value> {
    let mut ready = Vec::new();
    for _ in 0..a.runs {
        ready.push(Sandbox::start(template)?.ready_ms);
    }
    let sb = Sandbox::start(template)?;
    let before = xsave_completions(&sb);
    let mut exec = crate::bench_boot::exec_true_rtts(&sb, a.rtts)?;
    let per_exec = (xsave_completions(&sb) - before) as f64 / a.rtts as f64;
    let t = Instant::now();
    let report = vector_guard::run(&sb.client, 3, a.switches).context("the vector check")?;
    let check_ms = t.elapsed().as_secs_f64() * 1e3;
    let mut out = json!({
        "restore_to_ready_ms": round(median(&mut ready)),
        "exec_rtt_ms": round(median(&mut exec)),
        "xsave_xrstor_completions_per_exec": round(per_exec),
        "vector_check": {
            "level": report.level,
            "advertised": report.advertised,
            "xcr0": report.xcr0,
            "kernel_xfeatures": report.kernel_xfeatures,
            "classes": report.classes,
            "failures": report.describe_failures(),
            "wall_ms": round(check_ms),
            "switches": 3 * a.switches,
            "ms_per_switch": round(check_ms / f64::from(3 * a.switches) * 1000.0) / 1000.0,
        },
    });
    if has_python {
        let run = |procs| -> Result<NumpyProbe> {
            let r = sb.client.eval(&numpy_probe_code(procs, a.seconds))?;
            match r.outcome {
                forkvm_proto::EvalOutcome::Value { value_repr } => {
                    NumpyProbe::parse(value_repr.as_deref().unwrap_or("")).map_err(anyhow::Error::msg)
                }
                other => bail!("the numpy probe failed: {other:?}"),
            }
        };
        let one = run(1)?;
        let three = run(3)?;
        out["numpy"] = json!({
            "one_process_iterations_per_s": round(one.iterations as f64 / f64::from(a.seconds)),
            "one_process_wrong": one.wrong,
            "three_processes_iterations": three.iterations,
            "three_processes_wrong": three.wrong,
            "seconds": a.seconds,
        });
    }
    Ok(out)
}

pub fn run(a: BenchVectorArgs) -> Result<i32> {
    if a.runs == 0 || a.rtts == 0 || a.switches == 0 || a.seconds == 0 {
        bail!("--runs, --rtts, --switches and --seconds must be at least 1");
    }
    let cpus = if a.cpu.is_empty() {
        match HostKind::detect() {
            HostKind::Pvm => vec![CpuTemplate::PvmCompat, CpuTemplate::PvmXsave],
            HostKind::Hardware => vec![CpuTemplate::Host],
        }
    } else {
        a.cpu.clone()
    };
    let mut view = ProgressView::new();
    let artifacts = Artifacts::ensure(&a.image, &mut |e| view.show(&e));
    view.finish();
    let artifacts = artifacts?;
    let has_python = artifacts.image.python.is_some();
    let mut results = serde_json::Map::new();
    for cpu in &cpus {
        let guard = if *cpu == CpuTemplate::PvmCompat { VectorGuard::ReportOnly } else { VectorGuard::Required };
        let template = ensure_template_snapshot_with(artifacts.clone(), *cpu, guard)
            .with_context(|| format!("the {cpu} template snapshot"))?;
        let mut m = measure(&template, &a, has_python).with_context(|| format!("measuring {cpu}"))?;
        m["template_boot_s"] = json!(template.boot_seconds.map(round));
        results.insert(cpu.name().to_string(), m);
    }
    let mut ratios = serde_json::Map::new();
    if let (Some(old), Some(new)) = (results.get("pvm-compat"), results.get("pvm-xsave")) {
        let ratio = |path: &[&str]| {
            let get = |v: &Value| path.iter().try_fold(v, |v, k| v.get(*k)).and_then(Value::as_f64);
            match (get(new), get(old)) {
                (Some(n), Some(o)) if o > 0.0 => json!(round(n / o)),
                _ => json!(null),
            }
        };
        ratios.insert("restore_to_ready".into(), ratio(&["restore_to_ready_ms"]));
        ratios.insert("exec_rtt".into(), ratio(&["exec_rtt_ms"]));
        ratios.insert("ms_per_switch".into(), ratio(&["vector_check", "ms_per_switch"]));
        ratios.insert("numpy_one_process_rate".into(), ratio(&["numpy", "one_process_iterations_per_s"]));
    }
    let out = json!({
        "bench": "vector-state",
        "image": artifacts.image.name,
        "templates": results,
        "ratios_pvm_xsave_over_pvm_compat": ratios,
        "note": "guest-side times are inflated on PVM hosts, where guest kernel code is emulated; numpy runs in guest user mode, at native speed",
        "machine": machine(),
        "command": std::env::args().collect::<Vec<_>>().join(" "),
    });
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(0)
}
