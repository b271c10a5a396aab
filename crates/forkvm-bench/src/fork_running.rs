//! `forkvm bench fork-running -n 1,10,100 --tag T`: a running sandbox forked straight into
//! N children (no disk round trip), against the products that sell "fork a running VM"
//! (Mitos, Morph Infinibranch, Unikraft Cloud). Nobody has published these numbers for
//! 100 children, so each is measured, for each N, in one run:
//!
//! * `source_pause_ms`: how long the source's vCPUs stood still, as its VMM measured it;
//! * `call_ms`: the fork call, host side, until every child's VMM had been forked;
//! * `host_cpu_ms_per_child`: host CPU of the fork, per child: the source VMM's threads
//!   other than its vCPUs (and the processes it reaped), each child VMM's threads other
//!   than its vCPUs, and this process (registry, cgroups, readiness); each of the three
//!   in `host_cpu_ms_per_child_by_process`;
//! * `guest_cpu_ms_per_child`: the children's vCPU threads until all were ready (the
//!   guest's work after the fork, which PVM hosts emulate);
//! * `first_ready_ms` / `all_ready_ms`: until the first / every child's agent answered and
//!   took its identity; `all_eval_ms`: until every child also answered an eval;
//! * `ready_trace`: medians of how the children became ready (`util::ready_trace_medians`):
//!   when the identity attempt that was answered started, its round trip, and the
//!   agent's part of it;
//! * `pss_kib_per_child` / `private_kib_per_child`: medians over the children once ready.
//!
//! The source is spawned from the tag once and keeps running; the children of each N are
//! killed before the next.

use crate::procstat::{mem_usage, vmm_cpu_us, VmmCpu};
use crate::spawn::eval_all;
use crate::util::{machine, median, r2, ready_trace_medians};
use anyhow::{bail, Context, Result};
use clap::Args;
use forkvm_sandbox::{fork_running, spawn, Registry, SpawnOptions, SpawnSource, SpawnedSandbox};
use forkvm_snapshot::Store;
use serde_json::json;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct BenchForkRunningArgs {
    /// Children per fork, comma-separated (each measured in turn).
    #[arg(short = 'n', long, value_delimiter = ',', default_values_t = [1usize, 10, 100])]
    pub count: Vec<usize>,
    /// Tag to spawn the running source from.
    #[arg(long)]
    pub tag: String,
    /// Python code every child evaluates once ready (every answer must be the same).
    #[arg(long, default_value = "sum(range(1000))")]
    pub eval: String,
    /// Print JSON only.
    #[arg(long)]
    pub json: bool,
}

/// The most children one fork may ask for here (a bound on the loop, not on forkvm).
const MAX_CHILDREN: usize = 200;

pub fn run(a: BenchForkRunningArgs) -> Result<i32> {
    if a.count.is_empty() || a.count.iter().any(|&n| n == 0 || n > MAX_CHILDREN) {
        bail!("-n takes counts from 1 to {MAX_CHILDREN}, comma-separated");
    }
    let store = Store::open_default();
    let source = SpawnSource::from_tag(&store, &a.tag)?;
    let runs = crate::util::in_private_registry("fork-running", |registry| measure_all(registry, &source, &a))?;
    let report = json!({
        "bench": "fork-running",
        "command": format!(
            "forkvm bench fork-running -n {} --tag {} --json",
            a.count.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(","),
            a.tag
        ),
        "machine": machine(),
        "tag": a.tag,
        "template": source.template(),
        "vcpus": source.meta.vcpu_count,
        "eval": a.eval,
        "runs": runs,
    });
    if !a.json {
        for r in &runs {
            eprintln!(
                "fork into {:>3}: source paused {:>6.2} ms, call {:>7.1} ms, host CPU {:.2} ms a child, all ready {:>7.0} ms, PSS {:.0} KiB a child",
                r["n"], f(r, "source_pause_ms"), f(r, "call_ms"), f(r, "host_cpu_ms_per_child"), f(r, "all_ready_ms"), f(r, "pss_kib_per_child")
            );
        }
    }
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(0)
}

fn f(v: &serde_json::Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or(f64::NAN)
}

/// Spawns the source, then forks it into each N in turn.
fn measure_all(registry: &Registry, source: &SpawnSource, a: &BenchForkRunningArgs) -> Result<Vec<serde_json::Value>> {
    let (mut spawned, _) = spawn(registry, source, 1, &SpawnOptions::default()).context("spawning the source")?;
    let parent = spawned.pop().context("the spawn gave no sandbox")?;
    // The source has settled (its first call's pages are in) before it is forked.
    eval_all(std::slice::from_ref(&parent), &a.eval, Instant::now()).context("the source's first eval")?;
    let mut runs = Vec::new();
    for &n in &a.count {
        runs.push(measure_one(registry, &parent, n, &a.eval).with_context(|| format!("forking into {n}"))?);
    }
    Ok(runs)
}

fn measure_one(registry: &Registry, parent: &SpawnedSandbox, n: usize, eval: &str) -> Result<serde_json::Value> {
    let source_before = vmm_cpu_us(parent.record.pid)?;
    let own_before = crate::procstat::process_cpu_us();
    let started = Instant::now();
    let (children, pause_ms) = fork_running(registry, &parent.record.id, n, &SpawnOptions::default())?;
    let call_ms = started.elapsed().as_secs_f64() * 1e3;
    let own_us = crate::procstat::process_cpu_us() - own_before;
    let source_after = vmm_cpu_us(parent.record.pid)?;
    let children_cpu: Vec<VmmCpu> = children.iter().filter_map(|c| vmm_cpu_us(c.record.pid).ok()).collect();
    if children_cpu.len() != n {
        bail!("{} of {n} children's VMMs could not be read", n - children_cpu.len());
    }
    eval_all(&children, eval, started)?;
    let all_eval_ms = started.elapsed().as_secs_f64() * 1e3;
    let mut pss = Vec::new();
    let mut private = Vec::new();
    for c in &children {
        let m = mem_usage(c.record.pid)?;
        pss.push(m.pss_kib as f64);
        private.push(m.private_kib as f64);
    }
    let source_us = source_after.host_us - source_before.host_us;
    let children_us: f64 = children_cpu.iter().map(|c| c.host_us).sum();
    let host_us = source_us + children_us + own_us;
    let guest_us: f64 = children_cpu.iter().map(|c| c.vcpu_us).sum();
    let ready: Vec<f64> = children.iter().map(|c| c.ready_ms).collect();
    let trace = ready_trace_medians(&children);
    let first_ready = ready.iter().copied().fold(f64::INFINITY, f64::min);
    let all_ready = ready.iter().copied().fold(0.0, f64::max);
    for c in &children {
        forkvm_sandbox::verbs::kill_record(registry, &c.record)
            .with_context(|| format!("killing child {}", c.record.id))?;
    }
    let nf = n as f64;
    Ok(json!({
        "n": n,
        "source_pause_ms": r2(pause_ms),
        "call_ms": r2(call_ms),
        "host_cpu_ms_per_child": r2(host_us / nf / 1e3),
        "host_cpu_ms_per_child_by_process": {
            "source_vmm": r2(source_us / nf / 1e3),
            "child_vmm": r2(children_us / nf / 1e3),
            "library": r2(own_us / nf / 1e3),
        },
        "guest_cpu_ms_per_child": r2(guest_us / nf / 1e3),
        "first_ready_ms": r2(first_ready),
        "all_ready_ms": r2(all_ready),
        "all_eval_ms": r2(all_eval_ms),
        "ready_trace": trace,
        "pss_kib_per_child": median(&mut pss),
        "private_kib_per_child": median(&mut private),
    }))
}
