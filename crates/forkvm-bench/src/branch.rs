//! `forkvm bench branch`: the pause window of BRANCH, full vs live, while the guest
//! dirties its memory.
//!
//! For each memory size and mode, a `dirty` test guest (one word per page rewritten in a
//! loop over all of its memory, natively in ring 3) is booted in this process and
//! branched `--runs` times into the store directory (tmpfs by default). Each branch is
//! removed once complete, so large guests do not fill the disk. Reported: the pause
//! window (pause request → vCPUs running again) p50/p90 (`--gap-ms` apart), the time until the call
//! returned (live with `wait: false`: as soon as the source runs again), and the time
//! until the snapshot was complete.

use crate::util::machine;
use anyhow::{bail, Context, Result};
use clap::Args;
use forkvm_testguest::{TestGuest, DIRTY_GEN_ADDR, IMAGE_BASE};
use forkvm_vmm::arch::x86_64::cpuid::CpuTemplate;
use forkvm_vmm::devices::serial::ConsoleOut;
use forkvm_vmm::host::open_kvm;
use forkvm_vmm::vmm::{BranchMode, BranchRequest};
use forkvm_vmm::vstate::irqchip::IrqchipMode;
use forkvm_vmm::{BootConfig, Payload, Vmm};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use vm_memory::{Bytes, GuestAddress};

#[derive(Args, Debug)]
pub struct BenchBranchArgs {
    /// Guest memory sizes, MiB, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "512,1536")]
    pub mem_mib: Vec<u64>,
    /// Modes, comma-separated: full, live.
    #[arg(long, value_delimiter = ',', default_value = "full,live")]
    pub mode: Vec<BranchMode>,
    /// vCPU counts, comma-separated: every vCPU of the guest dirties memory.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub vcpus: Vec<u8>,
    /// Branches per (size, mode, vCPUs).
    #[arg(long, default_value_t = 20)]
    pub runs: usize,
    /// Pause between one branch being complete and the next (the guest keeps dirtying).
    #[arg(long, default_value_t = 500)]
    pub gap_ms: u64,
    /// Where branches are written (default: a directory under /dev/shm, tmpfs).
    #[arg(long)]
    pub store: Option<PathBuf>,
    /// Print JSON only.
    #[arg(long)]
    pub json: bool,
    /// Leave this process unfiltered. By default it puts itself under a VMM's seccomp
    /// filters before it boots the guest, as a sandbox's VMM does, so the pause includes
    /// what they cost.
    #[arg(long)]
    pub no_seccomp: bool,
}

/// The dirty range starts above the guest image, its arguments and page tables.
const DIRTY_BASE: u64 = 4 << 20;

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn stats(mut v: Vec<f64>) -> serde_json::Value {
    v.sort_by(|a, b| a.total_cmp(b));
    let r = |x: f64| (x * 1000.0).round() / 1000.0;
    json!({ "p50": r(percentile(&v, 0.5)), "p90": r(percentile(&v, 0.9)), "max": r(*v.last().unwrap_or(&0.0)), "n": v.len() })
}

fn generation(vmm: &Vmm) -> u64 {
    vmm.memory().read_obj::<u64>(GuestAddress(DIRTY_GEN_ADDR)).unwrap_or(0)
}

fn boot_dirty(mem_mib: u64, vcpus: u8) -> Result<Vmm> {
    let mem = mem_mib << 20;
    let kvm = open_kvm()?;
    let vmm = forkvm_vmm::boot(
        &kvm,
        BootConfig {
            mem_size: mem,
            vcpu_count: vcpus,
            irqchip: IrqchipMode::Split,
            cpu_template: CpuTemplate::for_this_host(),
            payload: Payload::Flat {
                name: "dirty".into(),
                image: TestGuest::Dirty.image().to_vec(),
                image_base: IMAGE_BASE,
                args: vec![DIRTY_BASE, mem - 2 * DIRTY_BASE],
            },
            console: ConsoleOut::new(None, None),
            devices: Default::default(),
            start_paused: false,
        },
    )?;
    // Two full passes: every page of the range is now private, dirty guest memory.
    let deadline = Instant::now() + Duration::from_secs(60);
    while generation(&vmm) < 2 {
        if Instant::now() > deadline {
            bail!("the dirty guest did not complete two passes over {mem_mib} MiB in 60 s");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(vmm)
}

fn wait_ready(dir: &Path) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(300);
    while forkvm_snapshot::SnapshotDir::open(dir).is_err() {
        if !dir.exists() {
            bail!("the live branch {} failed and was removed", dir.display());
        }
        if Instant::now() > deadline {
            bail!("the live branch {} was not ready after 300 s", dir.display());
        }
        std::thread::sleep(Duration::from_micros(500));
    }
    Ok(())
}

fn one_config(
    store: &Path,
    mem_mib: u64,
    vcpus: u8,
    mode: BranchMode,
    runs: usize,
    gap: Duration,
) -> Result<serde_json::Value> {
    let mut vmm = boot_dirty(mem_mib, vcpus)?;
    let (g0, t0) = (generation(&vmm), Instant::now());
    std::thread::sleep(Duration::from_millis(200));
    let passes_per_s = (generation(&vmm) - g0) as f64 / t0.elapsed().as_secs_f64();
    let (mut pause, mut ret, mut complete, mut allocated) = (Vec::new(), Vec::new(), Vec::new(), 0);
    let mut phases: Vec<(String, Vec<f64>)> = Vec::new();
    let mut huge_kib = Vec::new();
    for i in 0..runs {
        let tag = format!("bench-{mem_mib}-{mode:?}-{i}").to_lowercase();
        let wait = mode == BranchMode::Full;
        huge_kib.push(anon_huge_kib());
        let started = Instant::now();
        let r = vmm
            .branch(&BranchRequest {
                store: store.to_path_buf(),
                tag: Some(tag),
                mode,
                wait,
                disks: Default::default(),
                default_limits: None,
                default_network: None,
            })
            .with_context(|| format!("branch {i} of {mem_mib} MiB ({mode:?})"))?;
        if mode == BranchMode::Live {
            wait_ready(&r.dir)?;
        }
        complete.push(started.elapsed().as_secs_f64() * 1e3);
        pause.push(r.pause_ms);
        for (name, ms) in &r.phases_ms {
            match phases.iter_mut().find(|(n, _)| n == name) {
                Some((_, v)) => v.push(*ms),
                None => phases.push((name.clone(), vec![*ms])),
            }
        }
        ret.push(r.return_ms);
        allocated = forkvm_snapshot::SnapshotDir::open(&r.dir)?.meta.memory_bytes_allocated;
        std::fs::remove_dir_all(&r.dir).with_context(|| format!("removing {}", r.dir.display()))?;
        // Let the guest dirty its memory again before the next branch.
        std::thread::sleep(gap);
    }
    vmm.stop();
    Ok(json!({
        "mem_mib": mem_mib,
        "vcpus": vcpus,
        "mode": mode,
        "wait": mode == BranchMode::Full,
        "first_pause_ms": (pause.first().copied().unwrap_or(0.0) * 1000.0).round() / 1000.0,
        "anon_huge_kib_before_first_and_last": [huge_kib.first(), huge_kib.last()],
        "pause_ms": stats(pause),
        "pause_phases_p50_ms": phases
            .into_iter()
            .map(|(n, mut v)| {
                v.sort_by(|a, b| a.total_cmp(b));
                (n, json!((percentile(&v, 0.5) * 1000.0).round() / 1000.0))
            })
            .collect::<serde_json::Map<_, _>>(),
        "return_ms": stats(ret),
        "complete_ms": stats(complete),
        "memory_bytes_allocated": allocated,
        "guest_passes_per_s": (passes_per_s * 10.0).round() / 10.0,
    }))
}

/// Transparent huge pages of this process (the guest memory): a live branch's `fork()`
/// is cheap over huge pages, and copy-on-write after it splits the ones the guest writes.
fn anon_huge_kib() -> u64 {
    let text = std::fs::read_to_string("/proc/self/smaps_rollup").unwrap_or_default();
    text.lines()
        .find(|l| l.starts_with("AnonHugePages:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn fs_type(path: &Path) -> String {
    let out = std::process::Command::new("stat").args(["-f", "-c", "%T"]).arg(path).output();
    out.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string()).unwrap_or_default()
}

pub fn run(a: BenchBranchArgs) -> Result<i32> {
    if a.runs == 0 {
        bail!("--runs must be at least 1");
    }
    if let Some(v) = a.vcpus.iter().find(|&&v| v == 0 || v > forkvm_testguest::MAX_VCPUS) {
        bail!("--vcpus {v}: the dirty guest runs on 1 to {} vCPUs", forkvm_testguest::MAX_VCPUS);
    }
    let store = match &a.store {
        Some(s) => s.clone(),
        None => {
            let shm = Path::new("/dev/shm");
            let base = if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() };
            base.join(format!("forkvm-bench-branch-{}", std::process::id()))
        }
    };
    std::fs::create_dir_all(&store).with_context(|| format!("creating {}", store.display()))?;
    let machine = machine();
    // Before the filters: it runs `stat`, and a VMM may not start programs.
    let fs = fs_type(&store);
    if !a.no_seccomp {
        forkvm_vmm::host::seccomp::enforce().context("putting the bench under the VMM's seccomp filters")?;
    }
    let mut results = Vec::new();
    for &mem in &a.mem_mib {
        for &mode in &a.mode {
            for &vcpus in &a.vcpus {
                let r = one_config(&store, mem, vcpus, mode, a.runs, Duration::from_millis(a.gap_ms));
                if a.store.is_none() {
                    // Our own scratch store: leave nothing behind, also on failure.
                    if r.is_err() {
                        let _ = std::fs::remove_dir_all(&store);
                    }
                }
                let r = r?;
                if !a.json {
                    eprintln!(
                        "{mem:>5} MiB {:<4} x{vcpus}: pause p50 {:.2} ms p90 {:.2} ms, returned p50 {:.2} ms, complete p50 {:.1} ms",
                        format!("{mode:?}").to_lowercase(),
                        r["pause_ms"]["p50"].as_f64().unwrap_or(0.0),
                        r["pause_ms"]["p90"].as_f64().unwrap_or(0.0),
                        r["return_ms"]["p50"].as_f64().unwrap_or(0.0),
                        r["complete_ms"]["p50"].as_f64().unwrap_or(0.0),
                    );
                }
                results.push(r);
            }
        }
    }
    if a.store.is_none() {
        let _ = std::fs::remove_dir_all(&store);
    }
    let report = json!({
        "bench": "branch",
        "command": format!(
            "forkvm bench branch --mem-mib {} --vcpus {} --mode {} --runs {} --gap-ms {}{} --json",
            a.mem_mib.iter().map(|m| m.to_string()).collect::<Vec<_>>().join(","),
            a.vcpus.iter().map(|m| m.to_string()).collect::<Vec<_>>().join(","),
            a.mode.iter().map(|m| format!("{m:?}").to_lowercase()).collect::<Vec<_>>().join(","),
            a.runs,
            a.gap_ms,
            if a.no_seccomp { " --no-seccomp" } else { "" }
        ),
        "machine": machine,
        "seccomp": !a.no_seccomp,
        "store": store,
        "store_fs": fs,
        "results": results,
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(0)
}
