//! `forkvm bench density -n 1000`: how many live Linux sandboxes one host holds, and what
//! they cost it. N sandboxes are spawned from one tag in batches (each batch ready and
//! answering an eval before the next is spawned, as a fan-out service would grow), then
//! every one of them answers again at once, then all sit idle for `--idle-s` seconds while
//! the host's memory and CPU are read, then all are killed and the host is checked for
//! anything they left behind (processes, run directories, cgroups, registry rows).
//!
//! * `host_cpu_ms_per_child`: this process's CPU during the spawns (zygote fork loop,
//!   registry, cgroups, readiness) plus the median VMM's own threads (restore, devices;
//!   not its vCPU, which is the guest's work) per child;
//! * `memory`: the host's `MemAvailable` drop with all N idle (everything they cost it:
//!   private guest pages, page tables, KVM's own, VMM heaps), the PSS summed over the
//!   VMMs, the median PSS / private per VMM, and the growth of the kernel's own memory
//!   that no PSS shows (`kernel_mib`: page tables, KVM's page tables, stacks, slab,
//!   vmalloc, per-CPU);
//! * `idle`: the CPU the N idle sandboxes took over the window (their VMM processes, all
//!   threads) in percent of one core, split per child into the guests' (vCPU threads:
//!   guest kernel code, emulated on PVM hosts) and the VMMs' own threads, and the whole
//!   host's busy share meanwhile;
//! * `kill_ms`, `left_behind`: the run fails if anything is left.

use crate::procstat::{mem_usage, process_cpu_us, vmm_cpu_us};
use crate::spawn::{eval_all, source_tag};
use crate::util::{machine, median, meminfo_kib, r2};
use anyhow::{bail, Context, Result};
use clap::Args;
use forkvm_sandbox::{spawn, Registry, SpawnOptions, SpawnSource, SpawnedSandbox};
use forkvm_snapshot::Store;
use serde_json::json;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct BenchDensityArgs {
    /// Sandboxes to hold at once.
    #[arg(short = 'n', long, default_value_t = 1000)]
    pub count: usize,
    /// Sandboxes per spawn call.
    #[arg(long, default_value_t = 100)]
    pub batch: usize,
    /// Tag to spawn from; without one, the warm parent of `--template` (`bench spawn`'s).
    #[arg(long)]
    pub tag: Option<String>,
    /// Template of the warm parent when no `--tag` is given.
    #[arg(long, default_value = "python")]
    pub template: String,
    /// Python code each sandbox evaluates after its batch is ready and again once all
    /// are (every answer must be the same).
    #[arg(long, default_value = "int(numpy.arange(1000).sum())")]
    pub eval: String,
    /// Seconds all N sit idle while the host's CPU is measured.
    #[arg(long, default_value_t = 60)]
    pub idle_s: u64,
    /// Print JSON only.
    #[arg(long)]
    pub json: bool,
}

/// `/proc/meminfo` fields of the kernel's own memory the sandboxes grow (outside any
/// process's PSS): page tables of the VMMs, KVM's (secondary) page tables, kernel stacks
/// of their threads, slab, vmalloc (KVM's larger allocations; it also holds the kernel
/// stacks `KernelStack` counts), and per-CPU memory (each cgroup's counters).
const KERNEL_MEMORY: [&str; 6] = ["PageTables", "SecPageTables", "KernelStack", "Slab", "VmallocUsed", "Percpu"];

/// The sandboxes spawned so far; dropped, it kills every one of them (a failed run
/// leaves nothing behind either).
struct Fleet<'r> {
    registry: &'r Registry,
    sandboxes: Vec<SpawnedSandbox>,
}

impl Fleet<'_> {
    /// Kills every sandbox, 16 at a time; returns how many kills failed.
    fn kill_all(&mut self) -> usize {
        let registry = self.registry;
        let killed = forkvm_sandbox::parallel::map(&self.sandboxes, 16, |sb| {
            forkvm_sandbox::verbs::kill_record(registry, &sb.record).is_ok()
        });
        self.sandboxes.clear();
        killed.into_iter().filter(|k| *k != Some(true)).count()
    }
}

impl Drop for Fleet<'_> {
    fn drop(&mut self) {
        self.kill_all();
    }
}

/// The host's CPU counters from `/proc/stat`: (busy, all) in clock ticks.
fn host_cpu_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = stat.lines().find(|l| l.starts_with("cpu ")) else { return (0, 0) };
    let v: Vec<u64> = line.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal (guest time is inside user).
    let all: u64 = v.iter().take(8).sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    (all - idle, all)
}

/// The CPU the VMMs of a fleet have used so far, summed, in microseconds.
#[derive(Debug, Clone, Copy, Default)]
struct FleetCpu {
    /// Their vCPU threads: the guests' own work (emulated kernel code on PVM hosts).
    guests_us: f64,
    /// Their other threads: devices, control, what they reaped.
    vmm_threads_us: f64,
}

impl FleetCpu {
    fn read(sandboxes: &[SpawnedSandbox]) -> FleetCpu {
        sandboxes.iter().filter_map(|s| vmm_cpu_us(s.record.pid).ok()).fold(FleetCpu::default(), |sum, c| FleetCpu {
            guests_us: sum.guests_us + c.vcpu_us,
            vmm_threads_us: sum.vmm_threads_us + c.host_us,
        })
    }

    /// What was used since `earlier`.
    fn since(self, earlier: FleetCpu) -> FleetCpu {
        FleetCpu {
            guests_us: self.guests_us - earlier.guests_us,
            vmm_threads_us: self.vmm_threads_us - earlier.vmm_threads_us,
        }
    }
}

/// What `sandboxes` left on the host after their kill: live VMM processes, run
/// directories, cgroups and registry rows.
fn left_behind(registry: &Registry, records: &[forkvm_sandbox::SandboxRecord]) -> serde_json::Value {
    let cgroups = forkvm_vmm::host::cgroup::CgroupRoot::detect().ok();
    let processes = records.iter().filter(|r| forkvm_sandbox::registry::vmm_alive(r.pid)).count();
    let run_dirs = records.iter().filter(|r| r.run_dir.exists()).count();
    let groups = records
        .iter()
        .filter(|r| matches!((&r.cgroup, &cgroups), (Some(name), Some(root)) if root.open(name).is_some()))
        .count();
    json!({ "processes": processes, "run_dirs": run_dirs, "cgroups": groups, "rows": registry.rows().len() })
}

pub fn run(a: BenchDensityArgs) -> Result<i32> {
    if a.count == 0 || a.batch == 0 {
        bail!("-n and --batch must be at least 1");
    }
    let store = Store::open_default();
    let tag = source_tag(a.tag.as_deref(), &a.template, 1, &store)?;
    let source = SpawnSource::from_tag(&store, &tag)?;
    let run_root = std::env::temp_dir().join(format!("forkvm-bench-density-{}", std::process::id()));
    let registry = Registry::open(&run_root);
    let result = measure(&a, &tag, &source, &registry);
    let _ = std::fs::remove_dir_all(&run_root);
    let report = result?;
    if !a.json {
        let f = |k: &str| report[k].as_f64().unwrap_or(f64::NAN);
        eprintln!(
            "{} sandboxes from {tag}: all spawned and answering in {:.1} s, host CPU {:.2} ms a child",
            a.count,
            f("all_spawned_ms") / 1e3,
            f("host_cpu_ms_per_child")
        );
        eprintln!(
            "  idle: host memory {:.0} MiB in all ({:.2} MiB a sandbox), CPU {:.1}% of one core",
            report["memory"]["host_used_mib"].as_f64().unwrap_or(f64::NAN),
            report["memory"]["host_used_mib_per_child"].as_f64().unwrap_or(f64::NAN),
            report["idle"]["sandboxes_cpu_pct_of_one_core"].as_f64().unwrap_or(f64::NAN)
        );
    }
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(0)
}

fn measure(a: &BenchDensityArgs, tag: &str, source: &SpawnSource, registry: &Registry) -> Result<serde_json::Value> {
    let quiet = a.json || !std::io::stderr().is_terminal();
    let available_before_kib = meminfo_kib("MemAvailable");
    let kernel_before: Vec<u64> = KERNEL_MEMORY.iter().map(|k| meminfo_kib(k)).collect();
    let mut fleet = Fleet { registry, sandboxes: Vec::with_capacity(a.count) };
    let started = Instant::now();
    let cpu_before = process_cpu_us();
    let mut batches = Vec::new();
    while fleet.sandboxes.len() < a.count {
        let n = a.batch.min(a.count - fleet.sandboxes.len());
        let t = Instant::now();
        let (sandboxes, _) = spawn(registry, source, n, &SpawnOptions::default())
            .with_context(|| format!("spawning sandboxes {}..{}", fleet.sandboxes.len(), fleet.sandboxes.len() + n))?;
        let first = fleet.sandboxes.len();
        fleet.sandboxes.extend(sandboxes);
        eval_all(&fleet.sandboxes[first..], &a.eval, t)
            .with_context(|| format!("the eval in sandboxes {first}..{}", first + n))?;
        batches.push(r2(t.elapsed().as_secs_f64()));
        if !quiet {
            eprintln!("{} of {} ready ({:.0} s)", fleet.sandboxes.len(), a.count, started.elapsed().as_secs_f64());
        }
    }
    let spawn_cpu_us = process_cpu_us() - cpu_before;
    let all_spawned_ms = started.elapsed().as_secs_f64() * 1e3;
    let mut vmm_host_us: Vec<f64> =
        fleet.sandboxes.iter().filter_map(|s| vmm_cpu_us(s.record.pid).ok()).map(|c| c.host_us).collect();
    let vmm_host_ms = median(&mut vmm_host_us) / 1e3;

    let again = Instant::now();
    let (all_answer_ms, value) = eval_all(&fleet.sandboxes, &a.eval, again).context("the eval in all at once")?;

    // Settle, then the idle window.
    std::thread::sleep(Duration::from_secs(5));
    let (busy0, all0) = host_cpu_ticks();
    let fleet0 = FleetCpu::read(&fleet.sandboxes);
    let window = Instant::now();
    std::thread::sleep(Duration::from_secs(a.idle_s));
    let window_us = window.elapsed().as_secs_f64() * 1e6;
    let idle = FleetCpu::read(&fleet.sandboxes).since(fleet0);
    let fleet_us = idle.guests_us + idle.vmm_threads_us;
    let (busy1, all1) = host_cpu_ticks();
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) as f64;
    let host_busy_pct_of_one_core =
        if all1 > all0 { (busy1 - busy0) as f64 / (all1 - all0) as f64 * cpus * 100.0 } else { 0.0 };

    let available_idle_kib = meminfo_kib("MemAvailable");
    let kernel_mib: serde_json::Map<String, serde_json::Value> = KERNEL_MEMORY
        .iter()
        .zip(&kernel_before)
        .map(|(k, before)| (k.to_string(), json!(r2((meminfo_kib(k) as f64 - *before as f64) / 1024.0))))
        .collect();
    let usage: Vec<_> = fleet.sandboxes.iter().filter_map(|s| mem_usage(s.record.pid).ok()).collect();
    let pss_total_kib: u64 = usage.iter().map(|m| m.pss_kib).sum();
    let mut pss: Vec<f64> = usage.iter().map(|m| m.pss_kib as f64).collect();
    let mut private: Vec<f64> = usage.iter().map(|m| m.private_kib as f64).collect();
    let host_used_mib = available_before_kib.saturating_sub(available_idle_kib) as f64 / 1024.0;

    let records: Vec<_> = fleet.sandboxes.iter().map(|s| s.record.clone()).collect();
    let killing = Instant::now();
    let failed_kills = fleet.kill_all();
    let kill_ms = killing.elapsed().as_secs_f64() * 1e3;
    let left = left_behind(registry, &records);
    let leaked: u64 = ["processes", "run_dirs", "cgroups", "rows"].iter().map(|k| left[k].as_u64().unwrap_or(0)).sum();
    if failed_kills > 0 || leaked > 0 {
        bail!("{failed_kills} kills failed; left behind after killing all: {left}");
    }
    let n = a.count as f64;
    Ok(json!({
        "bench": "density",
        "command": format!("forkvm bench density -n {} --batch {} --tag {tag} --idle-s {} --json", a.count, a.batch, a.idle_s),
        "machine": machine(),
        "tag": tag,
        "template": source.template(),
        "n": a.count,
        "batch": a.batch,
        "batch_ready_s": batches,
        "all_spawned_ms": r2(all_spawned_ms),
        "host_spawn_process_cpu_ms_per_child": r2(spawn_cpu_us / n / 1e3),
        "vmm_host_cpu_ms_per_child": r2(vmm_host_ms),
        "host_cpu_ms_per_child": r2(spawn_cpu_us / n / 1e3 + vmm_host_ms),
        "all_answer_again_ms": r2(all_answer_ms),
        "eval": a.eval,
        "eval_value": value,
        "memory": {
            "host_used_mib": r2(host_used_mib),
            "host_used_mib_per_child": r2(host_used_mib / n),
            "pss_total_mib": r2(pss_total_kib as f64 / 1024.0),
            "pss_kib_per_child": median(&mut pss),
            "private_kib_per_child": median(&mut private),
            "kernel_mib": kernel_mib,
        },
        "idle": {
            "seconds": r2(window_us / 1e6),
            "sandboxes_cpu_pct_of_one_core": r2(fleet_us / window_us * 100.0),
            "sandboxes_cpu_us_per_child_per_s": r2(fleet_us / n / (window_us / 1e6)),
            "guest_vcpu_us_per_child_per_s": r2(idle.guests_us / n / (window_us / 1e6)),
            "vmm_threads_us_per_child_per_s": r2(idle.vmm_threads_us / n / (window_us / 1e6)),
            "host_busy_pct_of_one_core": r2(host_busy_pct_of_one_core),
        },
        "kill_ms": r2(kill_ms),
        "left_behind": left,
    }))
}
