//! What the benchmarks share: medians and rounding, the machine a report ran on,
//! scratch directories that are removed whatever happens, incompressible bytes, agent
//! round trips, and template snapshots built with progress on stderr.

use anyhow::{bail, Context, Result};
use forkvm_proto::ExecRequest;
use forkvm_sandbox::{Sandbox, TemplateSnapshot};
use forkvm_vmm::host::HostKind;
use serde_json::json;
use std::time::Instant;

/// `x` rounded to two decimals, for reports.
pub fn r2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// `{p50, p99, n}` of `v` (nearest rank), in the JSON the benches print.
pub fn p50_p99(mut v: Vec<f64>) -> serde_json::Value {
    v.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| v[((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
    serde_json::json!({ "p50": r2(at(0.5)), "p99": r2(at(0.99)), "n": v.len() })
}

pub fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(|a, b| a.total_cmp(b));
    let m = values.len() / 2;
    if values.len() % 2 == 1 {
        values[m]
    } else {
        (values[m - 1] + values[m]) / 2.0
    }
}

/// The machine a report ran on: CPU model and count, memory, KVM flavour, kernel.
pub fn machine() -> serde_json::Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .unwrap_or("")
        .trim()
        .to_string();
    let mem_kib = meminfo_kib("MemTotal");
    json!({
        "cpu": model,
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "mem_gib": mem_kib / (1 << 20),
        "kvm": HostKind::detect().name(),
        "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
        "build": crate::guard::build_profile(),
    })
}

/// Field `name` of `/proc/meminfo`, in KiB (0 when it cannot be read).
pub fn meminfo_kib(name: &str) -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    meminfo
        .lines()
        .find(|l| l.split(':').next() == Some(name))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// xorshift64*: incompressible bytes without a dependency.
#[derive(Debug)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn fill(&mut self, buf: &mut [u8]) {
        for c in buf.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }
}

/// Runs `measure` in a fresh directory `<dir or temp>/forkvm-bench-<name>-<pid>`, removed
/// afterwards whatever happened.
pub fn in_scratch_dir<T>(
    dir: Option<&std::path::Path>,
    name: &str,
    measure: impl FnOnce(&std::path::Path) -> Result<T>,
) -> Result<T> {
    let root = dir.map_or_else(std::env::temp_dir, std::path::Path::to_path_buf);
    let root = root.join(format!("forkvm-bench-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
    let result = measure(&root);
    let _ = std::fs::remove_dir_all(&root);
    result
}

/// Runs `measure` with a private registry (the bench's sandboxes never mix with the
/// user's) in a scratch directory; every sandbox in it is killed afterwards, whatever
/// happened.
pub fn in_private_registry<T>(name: &str, measure: impl FnOnce(&forkvm_sandbox::Registry) -> Result<T>) -> Result<T> {
    in_scratch_dir(None, name, |root| {
        let registry = forkvm_sandbox::Registry::open(root);
        let result = measure(&registry);
        for row in registry.rows() {
            let _ = forkvm_sandbox::verbs::kill_record(&registry, &row.record);
        }
        result
    })
}

/// `n` round trips of `exec true` in `sb`, in milliseconds.
pub fn exec_true_rtts(sb: &Sandbox, n: usize) -> Result<Vec<f64>> {
    let mut rtts = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let out = sb.client.exec_collect(&ExecRequest::argv(["true"]), b"")?;
        rtts.push(t.elapsed().as_secs_f64() * 1e3);
        if out.status.code != Some(0) {
            bail!("`true` exited with {:?}", out.status);
        }
    }
    Ok(rtts)
}

/// Template `image`'s snapshot on `vcpus` vCPUs (none: the template's count), building the kernel, image and snapshot
/// if missing, with progress on stderr (the CLI's `snapshot create` and `fork --image`
/// use it too).
pub fn template_snapshot(image: &str, vcpus: Option<u8>) -> Result<TemplateSnapshot> {
    let mut view = forkvm_image::progress::ProgressView::new();
    let artifacts = forkvm_sandbox::Artifacts::ensure(image, &mut |e| view.show(&e))
        .and_then(|a| a.with_vcpus(vcpus, &mut |e| view.show(&e)));
    view.finish();
    forkvm_sandbox::ensure_template_snapshot(artifacts?).context("preparing the template snapshot")
}

/// Medians of how `sandboxes` became ready (`forkvm_sandbox::ReadyTrace`): when the
/// answered identity attempt started, its round trip, and the agent's part of it (kernel
/// calls, interpreter reseed); what is left of the round trip is the connection and the
/// guest's vsock path. Milliseconds.
pub fn ready_trace_medians(sandboxes: &[forkvm_sandbox::SpawnedSandbox]) -> serde_json::Value {
    let column = |f: &dyn Fn(&forkvm_sandbox::ReadyTrace) -> Option<f64>| {
        let mut v: Vec<f64> = sandboxes.iter().filter_map(|s| f(&s.trace)).collect();
        (!v.is_empty()).then(|| r2(median(&mut v)))
    };
    let ms = |us: u64| us as f64 / 1e3;
    json!({
        "identity_retries": column(&|t| Some(f64::from(t.retries))),
        "answered_attempt_at_ms": column(&|t| Some(t.answered_attempt_at_ms)),
        "identity_rtt_ms": column(&|t| Some(t.identity_rtt_ms)),
        "agent_kernel_ms": column(&|t| t.agent.map(|a| ms(a.kernel_us))),
        "agent_interpreter_ms": column(&|t| t.agent.map(|a| ms(a.interpreter_us))),
        "connection_and_vsock_ms": column(&|t| {
            t.agent.map(|a| t.identity_rtt_ms - ms(a.kernel_us) - ms(a.interpreter_us))
        }),
    })
}
