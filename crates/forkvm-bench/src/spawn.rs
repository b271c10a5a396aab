//! `forkvm bench spawn -n 100`: the README's main job. Builds what it needs (kernel,
//! image, a warm `python` parent snapshot; all cached by content hash), forks N Linux
//! sandboxes from it, each until it answered a numpy eval (optionally a shell command), and
//! compares with cold boots of the same template in the same run. `--tag T` spawns from
//! an existing tag instead. A progress bar shows on a terminal.
//!
//! * `host_spawn_ms`: wall time of the zygote's loop forking the N VMM processes (the
//!   children that already run compete with it for the CPUs); `host_spawn_cpu_ms_per_child`
//!   the zygote's CPU time per child in that loop.
//! * `host_restore_ms_per_child`: the host-side CPU work of one restore (VM, memory,
//!   devices, vCPUs, irqchip, threads), median over the children, as each VMM measured it:
//!   wall time (`host_restore_phases_us` per step; includes waiting for a CPU while the
//!   other sandboxes run) and the restoring thread's CPU time (`host_restore_cpu_ms_per_child`).
//! * `all_identified_ms`: until every sandbox's agent answered and took its identity;
//!   `ready_trace` how (`util::ready_trace_medians`).
//! * `all_ready_ms`: until every sandbox also answered one eval in its warm interpreter
//!   (`--eval`, by default a numpy sum; every answer checked equal).
//! * `all_commands_ms`: with `--cmd`, then that shell command in every sandbox (exec, 16
//!   at a time), until the last exited 0 with the same output as the first.
//! * `pss_kib_per_child`, `private_kib_per_child`: medians over the VMM processes.
//! * `cold_boot_ms`: cold boots of the template (kernel boot → agent → warm-up → first
//!   eval), `--cold` of them (each takes 35–100 s on PVM hosts, so the default is 1), and
//!   the speedup per sandbox: cold boot / (all_ready / N).

use crate::util::{machine, median};
use anyhow::{bail, Context, Result};
use clap::Args;
use forkvm_sandbox::start::in_process::boot_to_agent;
use forkvm_sandbox::{spawn, Artifacts, Registry, SpawnOptions, SpawnSource};
use forkvm_snapshot::Store;
use forkvm_vmm::control::ControlClient;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use std::io::IsTerminal;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct BenchSpawnArgs {
    /// Sandboxes to spawn.
    #[arg(short = 'n', long, default_value_t = 100)]
    pub count: usize,
    /// Tag to spawn from; without one, the warm parent of `--template` (made and kept in
    /// the store as `bench-<template>-<key>` the first time).
    #[arg(long)]
    pub tag: Option<String>,
    /// Template of the warm parent when no `--tag` is given.
    #[arg(long, default_value = "python")]
    pub template: String,
    /// vCPUs of the warm parent when no `--tag` is given (a tag has its own).
    #[arg(long, default_value_t = 1, conflicts_with = "tag")]
    pub vcpus: u8,
    /// A shell command to run in every sandbox once all are ready (a new process in each:
    /// on hosts that emulate the guest kernel, seconds each).
    #[arg(long, default_value = "")]
    pub cmd: String,
    /// Python code every sandbox evaluates in its warm interpreter (numpy already imported)
    /// to count as ready; every answer must be the same.
    #[arg(long, default_value = "int(numpy.arange(1000).sum())")]
    pub eval: String,
    /// Cold boots of the tag's template to compare with.
    #[arg(long, default_value_t = 1)]
    pub cold: usize,
    /// Print JSON only.
    #[arg(long)]
    pub json: bool,
    /// Start the VMMs without their seccomp filters (to measure what the filters cost).
    #[arg(long)]
    pub no_seccomp: bool,
    /// Start the VMMs outside their jail (to measure what entering it costs).
    #[arg(long)]
    pub no_jail: bool,
}

fn r1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// The tag to spawn from: `tag`, else the warm parent of `template` on `vcpus`, published
/// under a name holding its content key (so a changed template makes a new one).
pub(crate) fn source_tag(tag: Option<&str>, template: &str, vcpus: u8, store: &Store) -> Result<String> {
    if let Some(tag) = tag {
        return Ok(tag.to_string());
    }
    let name = template;
    let template = crate::util::template_snapshot(name, Some(vcpus))?;
    let tag = format!("bench-{name}-{}", &template.key[..template.key.len().min(12)]);
    if store.lookup(&tag).is_err() {
        forkvm_sandbox::publish_template(store, &template, &tag, &Default::default(), None)
            .with_context(|| format!("publishing the warm parent as tag {tag}"))?;
    }
    Ok(tag)
}

/// A bar on stderr counting sandboxes through a step, if stderr is a terminal.
fn step_bar(n: usize, what: &str) -> Option<ProgressBar> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = ProgressBar::new(n as u64);
    let style = ProgressStyle::with_template(&format!("{what:<9} [{{bar:40}}] {{pos}}/{{len}} {{elapsed_precise}}"))
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    bar.set_style(style);
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    Some(bar)
}

/// Runs `cmd` in every sandbox, 16 at a time; every one must exit 0 with the first's
/// output. Returns the time the last one finished and that output.
fn run_everywhere(sandboxes: &[forkvm_sandbox::SpawnedSandbox], cmd: &str) -> Result<(f64, String)> {
    let started = Instant::now();
    let req = forkvm_proto::ExecRequest { timeout_ms: Some(600_000), ..forkvm_proto::ExecRequest::shell(cmd) };
    let (first, failures) = same_from_all(sandboxes, "command", |sb| match sb.client.exec_collect(&req, b"") {
        Ok(o) if o.status.code == Some(0) => Ok(String::from_utf8_lossy(&o.stdout).into_owned()),
        Ok(o) => Err(format!("{}: {:?}: {}", sb.record.id, o.status, String::from_utf8_lossy(&o.stderr))),
        Err(e) => Err(format!("{}: {e}", sb.record.id)),
    });
    let elapsed = started.elapsed().as_secs_f64() * 1e3;
    if !failures.is_empty() {
        bail!("{} sandboxes failed `{cmd}`: {}", failures.len(), failures.join("; "));
    }
    Ok((elapsed, first))
}

/// Evaluates `code` in every sandbox, 16 at a time; every one must answer the first's
/// value. Returns the time every one answered and that value.
pub(crate) fn eval_all(
    sandboxes: &[forkvm_sandbox::SpawnedSandbox],
    code: &str,
    started: Instant,
) -> Result<(f64, String)> {
    let (first, failures) = same_from_all(sandboxes, "ready", |sb| match sb.client.eval(code) {
        Ok(r) => match r.outcome {
            forkvm_proto::EvalOutcome::Value { value_repr } => Ok(value_repr.unwrap_or_default()),
            other => Err(format!("{}: {other:?}", sb.record.id)),
        },
        Err(e) => Err(format!("{}: {e}", sb.record.id)),
    });
    let elapsed = started.elapsed().as_secs_f64() * 1e3;
    if !failures.is_empty() {
        bail!("{} sandboxes failed the eval `{code}`: {}", failures.len(), failures.join("; "));
    }
    Ok((elapsed, first))
}

/// Asks every sandbox (16 at a time, a bar named `what` counting the answers on a
/// terminal) and checks they all answered the same: the first answer, and every failure
/// or answer that differs from it.
fn same_from_all(
    sandboxes: &[forkvm_sandbox::SpawnedSandbox],
    what: &str,
    ask: impl Fn(&forkvm_sandbox::SpawnedSandbox) -> Result<String, String> + Sync,
) -> (String, Vec<String>) {
    let bar = step_bar(sandboxes.len(), what);
    let answers = forkvm_sandbox::parallel::map(sandboxes, 16, |sb| {
        let answer = ask(sb);
        if let Some(b) = &bar {
            b.inc(1);
        }
        answer
    });
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let mut first: Option<String> = None;
    let mut failures = Vec::new();
    for answer in answers {
        match answer.unwrap_or_else(|| Err(format!("a {what} worker panicked"))) {
            Ok(text) if first.as_ref().is_none_or(|f| *f == text) => first = Some(text),
            Ok(text) => failures.push(format!("answer {text:?} differs from {:?}", first.clone().unwrap_or_default())),
            Err(e) => failures.push(e),
        }
    }
    (first.unwrap_or_default(), failures)
}

/// Whether the sandboxes get a network, and if so, the network pool filled first (up to
/// `count` slots, at most two minutes): what a daemon that has been up a while offers a
/// spawn. Set `FORKVM_NET_POOL` to the fan-out to measure a spawn that takes only
/// ready slots, `FORKVM_NETWORK=off` (another template key) to measure one without.
fn prepare_network(quiet: bool, count: usize) -> serde_json::Value {
    use forkvm_sandbox::network::{available, pool};
    if !available() {
        return json!({ "on": false });
    }
    pool::start();
    let want = pool::target().min(count);
    let started = Instant::now();
    while pool::ready() < want && started.elapsed() < std::time::Duration::from_secs(120) {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    if !quiet {
        eprintln!("network pool: {} of {want} slots ready", pool::ready());
    }
    json!({ "on": true, "pool_target": pool::target(), "pool_ready": pool::ready() })
}

pub fn run(a: BenchSpawnArgs) -> Result<i32> {
    let store = Store::open_default();
    let tag = source_tag(a.tag.as_deref(), &a.template, a.vcpus, &store)?;
    let source = SpawnSource::from_tag(&store, &tag)?;
    let template = source.template().map(String::from);
    let vcpus = source.meta.vcpu_count;
    // A private registry: the bench's sandboxes never mix with the user's.
    let run_root = std::env::temp_dir().join(format!("forkvm-bench-spawn-{}", std::process::id()));
    let mut registry = Registry::open(&run_root);
    if a.no_seccomp {
        registry = registry.without_seccomp();
    }
    if a.no_jail {
        registry = registry.without_jail();
    }
    let quiet = a.json || !std::io::stderr().is_terminal();
    let network = prepare_network(quiet, a.count);
    if !quiet {
        eprintln!("spawning {} sandboxes from {tag}", a.count);
    }
    let cpu_before = crate::procstat::process_cpu_us();
    let started = Instant::now();
    let (sandboxes, timings) = spawn(&registry, &source, a.count, &SpawnOptions::default())?;
    let ready = eval_all(&sandboxes, &a.eval, started);
    // Every thread of this process (the spawn, readiness with each sandbox's DNS, the
    // network pool refilling) and the programs it ran (`nft`); not the VMMs.
    let process_cpu_us = crate::procstat::process_cpu_us() - cpu_before;
    let commands = match (&ready, a.cmd.trim().is_empty()) {
        (Ok(_), false) => Some(run_everywhere(&sandboxes, &a.cmd)),
        _ => None,
    };
    let mut pss = Vec::new();
    let mut private = Vec::new();
    for sb in &sandboxes {
        if let Ok(m) = crate::procstat::mem_usage(sb.record.pid) {
            pss.push(m.pss_kib as f64);
            private.push(m.private_kib as f64);
        }
    }
    // Host-side CPU of each restore, step by step, as its VMM measured it.
    let mut restore_us: Vec<f64> = Vec::new();
    let mut restore_cpu_us: Vec<f64> = Vec::new();
    let mut phase_us: Vec<(String, Vec<f64>)> = Vec::new();
    let mut phase_cpu_us: Vec<(String, Vec<f64>)> = Vec::new();
    for sb in &sandboxes {
        let Ok(mut ctl) = ControlClient::connect(&sb.record.control_socket()) else { continue };
        let Ok(status) = ctl.status() else { continue };
        restore_us.push(status.restore_phases_us.iter().map(|(_, us)| us).sum());
        if let Some(cpu) = status.restore_cpu_us {
            restore_cpu_us.push(cpu);
        }
        collect_steps(&mut phase_us, status.restore_phases_us);
        collect_steps(&mut phase_cpu_us, status.restore_phases_cpu_us);
    }
    let first_ready_ms = sandboxes.iter().map(|s| s.ready_ms).fold(f64::INFINITY, f64::min);
    let ready_trace = crate::util::ready_trace_medians(&sandboxes);
    for sb in &sandboxes {
        let _ = forkvm_sandbox::verbs::kill_record(&registry, &sb.record);
    }
    let _ = std::fs::remove_dir_all(&run_root);
    let (all_ready_ms, eval_value) = ready?;
    let commands = commands.transpose()?;

    let mut cold = Vec::new();
    if a.cold > 0 {
        let Some(name) = &template else { bail!("tag {tag} does not name its template; use --cold 0") };
        let artifacts = Artifacts::ensure(name, &mut |_| {})?;
        let bar = step_bar(a.cold, "cold boot");
        for i in 0..a.cold {
            let work = std::env::temp_dir().join(format!("forkvm-bench-spawn-cold-{}-{i}", std::process::id()));
            let t = Instant::now();
            let (mut vmm, client, _console) = boot_to_agent(&artifacts, &work).context("cold boot")?;
            if let Some(code) = &artifacts.image.warmup_eval {
                client.eval(code).context("cold boot warm-up")?;
            }
            client.eval(&a.eval).context("cold boot eval")?;
            cold.push(t.elapsed().as_secs_f64() * 1e3);
            vmm.stop();
            let _ = std::fs::remove_dir_all(&work);
            if let Some(b) = &bar {
                b.inc(1);
            }
        }
        if let Some(b) = bar {
            b.finish_and_clear();
        }
    }
    let cold_ms = if cold.is_empty() { None } else { Some(median(&mut cold.clone())) };
    let n = a.count as f64;
    let report = json!({
        "bench": "spawn",
        "command": format!(
            "forkvm bench spawn -n {} --tag {tag} --cold {}{}{} --json",
            a.count,
            a.cold,
            if a.no_seccomp { " --no-seccomp" } else { "" },
            if a.no_jail { " --no-jail" } else { "" }
        ),
        "seccomp": !a.no_seccomp,
        "jail": !a.no_jail,
        "machine": machine(),
        "tag": tag,
        "template": template,
        "vcpus": vcpus,
        "n": a.count,
        "prepare_ms": r1(timings.prepare_ms),
        "host_spawn_ms": r1(timings.host_spawn_ms),
        "host_spawn_ms_per_child": (timings.host_spawn_ms / n * 1000.0).round() / 1000.0,
        "host_spawn_cpu_ms_per_child": (timings.host_spawn_cpu_ms / n * 1000.0).round() / 1000.0,
        "host_process_cpu_ms_per_child": (process_cpu_us / n).round() / 1000.0,
        "network": network,
        "host_restore_ms_per_child": (median(&mut restore_us) / 10.0).round() / 100.0,
        "host_restore_cpu_ms_per_child": (median(&mut restore_cpu_us) / 10.0).round() / 100.0,
        "host_restore_phases_us": step_medians(phase_us),
        "host_restore_phases_cpu_us": step_medians(phase_cpu_us),
        "memory_prefetch_pages": timings.memory_prefetch_pages,
        "first_ready_ms": r1(first_ready_ms),
        "ready_trace": ready_trace,
        "all_identified_ms": r1(timings.all_ready_ms),
        "all_ready_ms": r1(all_ready_ms),
        "eval": a.eval,
        "eval_value": eval_value,
        "cmd": (!a.cmd.trim().is_empty()).then_some(&a.cmd),
        "all_commands_ms": commands.as_ref().map(|(ms, _)| r1(*ms)),
        "command_output": commands.as_ref().map(|(_, out)| out.trim_end()),
        "pss_kib_per_child": median(&mut pss),
        "private_kib_per_child": median(&mut private),
        "cold_boots": cold.len(),
        "cold_boot_ms": cold.iter().map(|c| r1(*c)).collect::<Vec<_>>(),
        "cold_boot_median_ms": cold_ms.map(r1),
        "speedup_per_sandbox": cold_ms.map(|c| r1(c / (all_ready_ms / n))),
        "speedup_first_sandbox": cold_ms.map(|c| r1(c / first_ready_ms)),
    });
    if !a.json {
        let f = |k: &str| report[k].as_f64().unwrap_or(f64::NAN);
        eprintln!("{} sandboxes from {tag} ({}):", a.count, template.as_deref().unwrap_or("?"));
        eprintln!(
            "  host side   fork loop {:.1} ms ({:.2} ms CPU a child), restore {:.2} ms CPU a child, {:.0} KiB private a child",
            timings.host_spawn_ms, f("host_spawn_cpu_ms_per_child"), f("host_restore_cpu_ms_per_child"), f("private_kib_per_child")
        );
        eprintln!(
            "  guest side  first ready {:.0} ms, all answered `{}` = {} in {:.0} ms{}",
            first_ready_ms,
            a.eval,
            eval_value,
            all_ready_ms,
            commands.as_ref().map(|(ms, _)| format!(", `{}` in all {:.0} ms", a.cmd, ms)).unwrap_or_default()
        );
        if let Some(c) = cold_ms {
            eprintln!(
                "  cold boot   {:.0} ms each: a fork is {:.0}x faster to its first answer, {:.0}x per sandbox over all {}",
                c, c / first_ready_ms, c / (all_ready_ms / n), a.count
            );
        }
    }
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(0)
}

/// Adds one VMM's restore steps to `into` (each step's values over the VMMs).
fn collect_steps(into: &mut Vec<(String, Vec<f64>)>, steps: Vec<(String, f64)>) {
    for (name, us) in steps {
        match into.iter_mut().find(|(n, _)| *n == name) {
            Some((_, v)) => v.push(us),
            None => into.push((name, vec![us])),
        }
    }
}

/// Each step's median, rounded to a microsecond.
fn step_medians(steps: Vec<(String, Vec<f64>)>) -> serde_json::Map<String, serde_json::Value> {
    steps.into_iter().map(|(name, mut v)| (name, json!(median(&mut v).round()))).collect()
}
