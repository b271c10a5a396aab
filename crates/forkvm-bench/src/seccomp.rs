//! `forkvm bench seccomp`: what a VMM's seccomp filters cost, seccompiler's one-chain
//! layout against the call-number tree VMMs run, in one run, as one JSON object.
//!
//! * `install_us`: installing each thread kind's filter on a fresh process (a forked
//!   child, as each VMM is), median of `--runs`;
//! * `vmm_us`: what a VMM child installs before it runs guest code — the process's
//!   filters (the chain layout needs a second one to answer `clone3` with ENOSYS), then a vCPU filter and `--device-threads` device
//!   filters, each on a thread of its own;
//! * `ioctl_ns`: one `ioctl` through the filters of a vCPU thread (`KVM_RUN` on a closed
//!   descriptor, so the kernel answers EBADF right after the filters): every VM exit
//!   pays this once, and the action cache cannot answer an `ioctl`;
//! * `instructions`: each program's length.
//!
//! Host-side costs, real on any host (no guest runs).

use crate::util::{machine, median, r2};
use anyhow::{bail, Context, Result};
use clap::Args;
use forkvm_vmm::host::seccomp::{self, BpfProgram, Layout, ThreadKind};
use serde_json::{json, Map, Value};
use std::time::Instant;

#[derive(Args, Debug)]
pub struct BenchSeccompArgs {
    /// Forked children per measurement (medians reported).
    #[arg(long, default_value_t = 21)]
    pub runs: usize,
    /// Device threads a VMM starts (each installs the device filter).
    #[arg(long, default_value_t = 2)]
    pub device_threads: usize,
    /// `ioctl` calls timed per child.
    #[arg(long, default_value_t = 20_000)]
    pub calls: u32,
    /// Print JSON only (this benchmark prints nothing else; accepted like the others').
    #[arg(long)]
    pub json: bool,
}

/// `KVM_RUN`, `_IO(KVMIO, 0x80)`.
const KVM_RUN: libc::c_ulong = 0xae80;

struct Programs {
    /// What a VMM installs on its process, in order.
    process: Vec<BpfProgram>,
    kinds: Vec<(ThreadKind, BpfProgram)>,
}

impl Programs {
    fn of(&self, kind: ThreadKind) -> &BpfProgram {
        &self.kinds.iter().find(|(k, _)| *k == kind).expect("every kind compiled").1
    }
}

fn programs(layout: Layout) -> Result<Programs> {
    let kinds =
        ThreadKind::ALL.into_iter().map(|k| Ok((k, seccomp::program(k, layout)?))).collect::<Result<Vec<_>>>()?;
    Ok(Programs { process: seccomp::process_programs(layout)?, kinds })
}

pub fn run(args: BenchSeccompArgs) -> Result<i32> {
    if args.runs == 0 {
        bail!("--runs must be at least 1");
    }
    let layouts = [("chain", programs(Layout::Chain)?), ("tree", programs(Layout::Tree)?)];

    let mut install = Map::new();
    let mut instructions = Map::new();
    for kind in ThreadKind::ALL {
        let mut per_layout = Map::new();
        let mut lens = Map::new();
        let mut medians = Vec::new();
        for (name, p) in &layouts {
            let program = p.of(kind);
            let us = median_of(args.runs, || in_child(|| timed(|| install_one(kind, program))))?;
            per_layout.insert(name.to_string(), json!(r2(us)));
            lens.insert(name.to_string(), json!(program.len()));
            medians.push(us);
        }
        per_layout.insert("chain_over_tree".into(), json!(r2(medians[0] / medians[1])));
        install.insert(kind.name().into(), Value::Object(per_layout));
        instructions.insert(kind.name().into(), Value::Object(lens));
    }

    let mut vmm = Map::new();
    let mut ioctl = Map::new();
    let mut vmm_medians = Vec::new();
    let mut ioctl_medians = Vec::new();
    let none = median_of(args.runs, || in_child(|| Ok(ioctl_ns(args.calls))))?;
    ioctl.insert("no_filter".into(), json!(r2(none)));
    for (name, p) in &layouts {
        let us = median_of(args.runs, || in_child(|| install_vmm_stack(p, args.device_threads)))?;
        vmm.insert(name.to_string(), json!(r2(us)));
        vmm_medians.push(us);
        let ns = median_of(args.runs, || {
            in_child(|| {
                install_vcpu_stack(p)?;
                Ok(ioctl_ns(args.calls))
            })
        })?;
        ioctl.insert(name.to_string(), json!(r2(ns)));
        ioctl_medians.push(ns);
    }
    vmm.insert("chain_over_tree".into(), json!(r2(vmm_medians[0] / vmm_medians[1])));
    ioctl.insert("chain_over_tree".into(), json!(r2(ioctl_medians[0] / ioctl_medians[1])));

    let report = json!({
        "bench": "seccomp",
        "machine": machine(),
        "runs": args.runs,
        "device_threads": args.device_threads,
        "install_us": install,
        "vmm_us": vmm,
        "ioctl_ns": ioctl,
        "instructions": instructions,
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(0)
}

fn install_one(kind: ThreadKind, program: &BpfProgram) -> Result<()> {
    seccomp::install(kind, program).with_context(|| format!("installing the {} filter", kind.name()))
}

/// The filters a VMM child installs before it runs guest code, in microseconds: the
/// process's on its main thread, then each vCPU and device thread's on a thread of its
/// own (only the installs are timed, not the threads' start).
fn install_vmm_stack(p: &Programs, device_threads: usize) -> Result<f64> {
    let mut us = timed(|| install_process(p))?;
    let kinds = std::iter::once(ThreadKind::Vcpu).chain(std::iter::repeat_n(ThreadKind::Device, device_threads));
    for kind in kinds {
        let program = p.of(kind).clone();
        us += std::thread::spawn(move || timed(|| install_one(kind, &program)))
            .join()
            .map_err(|_| anyhow::anyhow!("a {} thread panicked", kind.name()))??;
    }
    Ok(us)
}

/// The filters a vCPU thread runs under.
fn install_vcpu_stack(p: &Programs) -> Result<()> {
    install_process(p)?;
    install_one(ThreadKind::Vcpu, p.of(ThreadKind::Vcpu))
}

fn install_process(p: &Programs) -> Result<()> {
    p.process.iter().try_for_each(|program| install_one(ThreadKind::Control, program))
}

/// Microseconds `f` took.
fn timed(f: impl FnOnce() -> Result<()>) -> Result<f64> {
    let t = Instant::now();
    f()?;
    Ok(t.elapsed().as_secs_f64() * 1e6)
}

/// Nanoseconds per `ioctl(-1, KVM_RUN)`, which the filters allow and the kernel refuses.
fn ioctl_ns(calls: u32) -> f64 {
    let t = Instant::now();
    for _ in 0..calls {
        // SAFETY: an ioctl on descriptor -1: the kernel answers EBADF and reads nothing.
        unsafe { libc::ioctl(-1, KVM_RUN) };
    }
    t.elapsed().as_secs_f64() * 1e9 / f64::from(calls.max(1))
}

fn median_of(runs: usize, mut one: impl FnMut() -> Result<f64>) -> Result<f64> {
    let mut values = (0..runs).map(|_| one()).collect::<Result<Vec<_>>>()?;
    Ok(median(&mut values))
}

/// Runs `measure` in a forked child (a filter cannot be taken off a process) and returns
/// the number it measured.
fn in_child(measure: impl FnOnce() -> Result<f64>) -> Result<f64> {
    let mut fds = [0; 2];
    // SAFETY: pipe writes two descriptors into the array.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error()).context("making the result pipe");
    }
    // SAFETY: the benchmark runs single-threaded here; the child measures, writes 8 bytes
    // and leaves through `_exit` without running the parent's destructors.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(std::io::Error::last_os_error()).context("forking a measuring child");
    }
    if pid == 0 {
        let bits = match measure() {
            Ok(v) => v.to_bits(),
            Err(e) => {
                eprintln!("forkvm bench seccomp: {e:#}");
                f64::NAN.to_bits()
            }
        };
        // SAFETY: writes 8 bytes from a local to the pipe, then ends the child.
        unsafe {
            libc::write(fds[1], bits.to_ne_bytes().as_ptr().cast(), 8);
            libc::_exit(0);
        }
    }
    let mut buf = [0u8; 8];
    let mut status = 0;
    // SAFETY: closes our copy of the write end, reads up to 8 bytes into a local buffer,
    // closes the read end and reaps the child forked above.
    let got = unsafe {
        libc::close(fds[1]);
        let n = libc::read(fds[0], buf.as_mut_ptr().cast(), 8);
        libc::close(fds[0]);
        libc::waitpid(pid, &mut status, 0);
        n
    };
    let v = f64::from_bits(u64::from_ne_bytes(buf));
    if got != 8 || v.is_nan() {
        if libc::WIFSIGNALED(status) {
            bail!("the measuring child was killed by signal {}", libc::WTERMSIG(status));
        }
        bail!("the measuring child failed (see its message above)");
    }
    Ok(v)
}
