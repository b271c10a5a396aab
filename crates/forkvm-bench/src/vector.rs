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
//! `--rounds` rounds alternate the templates (the machine's speed drifts); medians over
//! rounds, wrong results summed. The `pvm-compat` snapshot is made with the guard in report-only mode (it exists only to
//! be measured against) and under its own cache key.

use crate::util::{machine, median};
use anyhow::{bail, Context, Result};
use clap::Args;
use forkvm_image::progress::ProgressView;
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
    /// Rounds; each measures every template once, in turn.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
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

/// One round of measurements of one template.
struct Round {
    ready_ms: Vec<f64>,
    exec_ms: Vec<f64>,
    completions_per_exec: f64,
    report: forkvm_proto::vector_check::VectorCheckReport,
    check_ms: f64,
    /// (one process's iterations per second, three processes' iterations, their wrong results)
    numpy: Option<(f64, u64, u64)>,
}

fn measure(template: &TemplateSnapshot, a: &BenchVectorArgs, has_python: bool) -> Result<Round> {
    let mut ready_ms = Vec::new();
    for _ in 0..a.runs {
        ready_ms.push(Sandbox::start(template)?.ready_ms);
    }
    let sb = Sandbox::start(template)?;
    let before = xsave_completions(&sb);
    let exec_ms = crate::util::exec_true_rtts(&sb, a.rtts)?;
    let completions_per_exec = (xsave_completions(&sb) - before) as f64 / a.rtts as f64;
    let t = Instant::now();
    let report = vector_guard::run(&sb.client, 3, a.switches).context("the vector check")?;
    let check_ms = t.elapsed().as_secs_f64() * 1e3;
    let mut numpy = None;
    if has_python {
        let run = |procs| -> Result<NumpyProbe> {
            let r = sb.client.eval(&numpy_probe_code(procs, a.seconds))?;
            match r.outcome {
                forkvm_proto::EvalOutcome::Value { value_repr } => {
                    NumpyProbe::parse(value_repr.as_deref().unwrap_or("")).map_err(anyhow::Error::from)
                }
                other => bail!("the numpy probe failed: {other:?}"),
            }
        };
        let one = run(1)?;
        let three = run(3)?;
        numpy = Some((one.iterations as f64 / f64::from(a.seconds), three.iterations, one.wrong + three.wrong));
    }
    Ok(Round { ready_ms, exec_ms, completions_per_exec, report, check_ms, numpy })
}

/// Medians over rounds (and over every sample for restore and exec), wrong results summed.
fn summarize(rounds: &[Round], a: &BenchVectorArgs) -> Value {
    let all = |f: &dyn Fn(&Round) -> Vec<f64>| median(&mut rounds.iter().flat_map(f).collect::<Vec<_>>());
    let ready = all(&|r| r.ready_ms.clone());
    let exec = all(&|r| r.exec_ms.clone());
    let per_exec = all(&|r| vec![r.completions_per_exec]);
    let switches = f64::from(3 * a.switches);
    let per_switch: Vec<f64> = rounds.iter().map(|r| r.check_ms / switches).collect();
    let last = &rounds[rounds.len() - 1].report;
    let wrong: Vec<Value> = last
        .classes
        .iter()
        .map(|c| {
            let wrong: u64 = rounds
                .iter()
                .flat_map(|r| r.report.classes.iter().filter(|x| x.class == c.class))
                .map(|x| x.wrong)
                .sum();
            json!({"class": c.class, "checked": c.checked * rounds.len() as u64, "wrong": wrong})
        })
        .collect();
    let mut out = json!({
        "restore_to_ready_ms": round(ready),
        "exec_rtt_ms": round(exec),
        "xsave_xrstor_completions_per_exec": round(per_exec),
        "vector_check": {
            "level": last.level,
            "advertised": last.advertised,
            "xcr0": last.xcr0,
            "kernel_xfeatures": last.kernel_xfeatures,
            "classes": wrong,
            "ms_per_switch": round(median(&mut per_switch.clone()) * 1000.0) / 1000.0,
            "ms_per_switch_rounds": per_switch.iter().map(|v| round(v * 1000.0) / 1000.0).collect::<Vec<_>>(),
        },
    });
    let numpy: Vec<(f64, u64, u64)> = rounds.iter().filter_map(|r| r.numpy).collect();
    if !numpy.is_empty() {
        let rates: Vec<f64> = numpy.iter().map(|n| n.0).collect();
        out["numpy"] = json!({
            "one_process_iterations_per_s": round(median(&mut rates.clone())),
            "one_process_iterations_per_s_rounds": rates.iter().map(|v| round(*v)).collect::<Vec<_>>(),
            "three_processes_iterations_rounds": numpy.iter().map(|n| n.1).collect::<Vec<_>>(),
            "wrong": numpy.iter().map(|n| n.2).sum::<u64>(),
            "seconds": a.seconds,
        });
    }
    out
}

pub fn run(a: BenchVectorArgs) -> Result<i32> {
    if a.runs == 0 || a.rtts == 0 || a.switches == 0 || a.seconds == 0 || a.rounds == 0 {
        bail!("--runs, --rtts, --switches, --seconds and --rounds must be at least 1");
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
    let mut templates = Vec::new();
    for cpu in &cpus {
        let guard = if *cpu == CpuTemplate::PvmCompat { VectorGuard::ReportOnly } else { VectorGuard::Required };
        let template = ensure_template_snapshot_with(artifacts.clone(), *cpu, guard)
            .with_context(|| format!("the {cpu} template snapshot"))?;
        templates.push((*cpu, template, Vec::new()));
    }
    // Rounds alternate the templates, so a noisy machine's drift hits both alike.
    for _ in 0..a.rounds {
        for (cpu, template, rounds) in templates.iter_mut() {
            rounds.push(measure(template, &a, has_python).with_context(|| format!("measuring {cpu}"))?);
        }
    }
    let mut results = serde_json::Map::new();
    for (cpu, template, rounds) in &templates {
        let mut m = summarize(rounds, &a);
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
