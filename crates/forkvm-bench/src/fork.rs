//! `forkvm bench fork`: fan-out of a warmed test guest against cold boots, one JSON object.
//!
//! The parent VM boots the `monitor` test guest, which fills all of its memory above
//! 2 MiB with a pattern natively in ring 3 (its "warm-up"), then answers on COM1; it is
//! snapshotted. Each run forks N children from that snapshot through one zygote, pings
//! each child on its serial port and waits for every `pong`. The same N are then booted
//! cold (fresh boot + the same fill) in the same invocation, for the ratio; cold guests
//! share no memory, so only as many run at once as fit in RAM (`cold_max_concurrent`).
//!
//! Host-side numbers (spawn, restore phases, memory) are real on any host; guest-side
//! time is inflated on PVM hosts only where the guest runs ring-0 code (here: the serial
//! interrupt and halt paths, a few instructions per request).

use crate::procstat::{mem_usage, MemUsage};
use crate::util::{machine, median};
use anyhow::{bail, Context, Result};
use clap::Args;
use forkvm_testguest::{monitor, TestGuest, IMAGE_BASE};
use forkvm_vmm::arch::x86_64::cpuid::CpuTemplate;
use forkvm_vmm::control::{serve_until_exit, ControlClient};
use forkvm_vmm::devices::serial::ConsoleOut;
use forkvm_vmm::host::open_kvm;
use forkvm_vmm::host::process::fork_and_run;
use forkvm_vmm::vmm::SnapshotReport;
use forkvm_vmm::vstate::irqchip::IrqchipMode;
use forkvm_vmm::zygote::{ChildSpec, Zygote};
use forkvm_vmm::{BootConfig, Payload};
use serde_json::json;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct BenchForkArgs {
    /// Children per run.
    #[arg(short = 'n', long, default_value_t = 100)]
    pub count: usize,
    /// Guest memory of the parent (and so of every child).
    #[arg(long, default_value_t = 512)]
    pub mem_mib: u64,
    /// Fork runs; the JSON reports medians.
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Cold-boot runs of the same N.
    #[arg(long, default_value_t = 1)]
    pub cold_runs: usize,
    /// Work directory (snapshot, sockets); default: a fresh directory under /tmp.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Interrupt controller of the parent, and so of every child: split (LAPIC in KVM,
    /// IOAPIC in the VMM) or kernel (KVM's full irqchip and PIT; slow to create on PVM).
    #[arg(long, default_value = "split")]
    pub irqchip: IrqchipMode,
    /// vCPUs of the parent, and so of every child (the others sleep in the guest).
    #[arg(long, default_value_t = 1)]
    pub vcpus: u8,
    /// Print JSON only.
    #[arg(long)]
    pub json: bool,
}

const FILL_BASE: u64 = 2 << 20;
const SEED: u64 = 0x5eed_f00d;
const ANSWER_TIMEOUT: Duration = Duration::from_secs(120);

/// The machine the parent (and every cold guest) is: memory, interrupt controller, vCPUs.
#[derive(Debug, Clone, Copy)]
struct Shape {
    mem_mib: u64,
    irqchip: IrqchipMode,
    vcpus: u8,
}

fn monitor_config(shape: Shape, console: ConsoleOut) -> BootConfig {
    let mem_size = shape.mem_mib << 20;
    BootConfig {
        mem_size,
        vcpu_count: shape.vcpus,
        irqchip: shape.irqchip,
        cpu_template: CpuTemplate::for_this_host(),
        payload: Payload::Flat {
            name: TestGuest::Monitor.name().into(),
            image: TestGuest::Monitor.image().to_vec(),
            image_base: IMAGE_BASE,
            args: vec![FILL_BASE, mem_size - FILL_BASE, SEED],
        },
        console,
        devices: Default::default(),
        start_paused: false,
    }
}

/// Forks a process that boots the monitor guest and serves `socket` (if any).
fn spawn_cold(shape: Shape, stream: UnixStream, socket: Option<PathBuf>) -> Result<i32> {
    let pid = fork_and_run(false, move || {
        let run = || -> Result<()> {
            let kvm = open_kvm()?;
            let input = stream.try_clone()?;
            let vmm = forkvm_vmm::boot(&kvm, monitor_config(shape, ConsoleOut::new(None, Some(stream))))?;
            vmm.forward_input(input)?;
            serve_until_exit(vmm, socket.as_deref())?;
            Ok(())
        };
        match run() {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("cold child: {e:#}");
                70
            }
        }
    })?;
    Ok(pid)
}

/// Waits until every stream has produced `needle`; returns each one's time in ms.
fn wait_all(streams: &mut [UnixStream], needle: &[u8], start: Instant, pids: &[i32]) -> Result<Vec<f64>> {
    let mut seen: Vec<Vec<u8>> = vec![Vec::new(); streams.len()];
    let mut done: Vec<Option<f64>> = vec![None; streams.len()];
    let deadline = Instant::now() + ANSWER_TIMEOUT;
    while done.iter().any(|d| d.is_none()) {
        let mut fds: Vec<libc::pollfd> = streams
            .iter()
            .zip(&done)
            .filter(|(_, d)| d.is_none())
            .map(|(s, _)| libc::pollfd { fd: s.as_raw_fd(), events: libc::POLLIN, revents: 0 })
            .collect();
        // SAFETY: `fds` is a valid array of pollfd of the given length.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 100) };
        if n < 0 {
            bail!("poll: {}", std::io::Error::last_os_error());
        }
        if Instant::now() > deadline {
            let missing: Vec<i32> = done.iter().zip(pids).filter(|(d, _)| d.is_none()).map(|(_, p)| *p).collect();
            bail!("{} children did not answer within {ANSWER_TIMEOUT:?} (pids {missing:?})", missing.len());
        }
        for pfd in fds.iter().filter(|p| p.revents != 0) {
            let i = streams.iter().position(|s| s.as_raw_fd() == pfd.fd).expect("polled fd is ours");
            let mut buf = [0u8; 512];
            match streams[i].read(&mut buf) {
                Ok(0) => bail!(
                    "child pid {} closed its console before answering: {:?}",
                    pids[i],
                    String::from_utf8_lossy(&seen[i])
                ),
                Ok(k) => seen[i].extend_from_slice(&buf[..k]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => bail!("reading child pid {}: {e}", pids[i]),
            }
            if seen[i].windows(needle.len()).any(|w| w == needle) {
                done[i] = Some(start.elapsed().as_secs_f64() * 1e3);
            }
        }
    }
    Ok(done.into_iter().map(|d| d.unwrap_or_default()).collect())
}

fn kill_all(pids: &[i32]) {
    for &pid in pids {
        // SAFETY: signalling and reaping our own children.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    for &pid in pids {
        let mut status = 0;
        // SAFETY: as above.
        unsafe { libc::waitpid(pid, &mut status, 0) };
    }
}

/// Boots the parent, waits for its warm-up, snapshots it; returns (warm ms, snapshot report).
fn make_parent_snapshot(dir: &Path, shape: Shape) -> Result<(f64, SnapshotReport, PathBuf)> {
    let (mut ours, theirs) = UnixStream::pair()?;
    let socket = dir.join("parent.sock");
    let t = Instant::now();
    let pid = spawn_cold(shape, theirs, Some(socket.clone()))?;
    wait_all(std::slice::from_mut(&mut ours), b"ready\n", t, &[pid]).context("parent warm-up")?;
    let warm_ms = t.elapsed().as_secs_f64() * 1e3;
    let snap_dir = dir.join("parent-snapshot");
    let mut client = ControlClient::connect(&socket)?;
    let report = client.snapshot(&snap_dir).context("snapshotting the parent")?;
    let _ = client.shutdown();
    let mut status = 0;
    // SAFETY: reaping our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    Ok((warm_ms, report, snap_dir))
}

struct ForkRun {
    ready_ms: f64,
    first_ms: f64,
    spawn_ms: f64,
    prepare_ms: f64,
    mem: Vec<MemUsage>,
    phases: Vec<(String, f64)>,
}

fn fork_run(snap: &Path, dir: &Path, n: usize) -> Result<ForkRun> {
    let t_prepare = Instant::now();
    let zygote = Zygote::new(snap)?;
    let prepare_ms = t_prepare.elapsed().as_secs_f64() * 1e3;
    let mut streams = Vec::new();
    let mut pids = Vec::new();
    let start = Instant::now();
    for i in 0..n {
        let (mut ours, theirs) = UnixStream::pair()?;
        ours.write_all(&monitor::ping())?; // waits in the socket until the child reads it
        let spec = ChildSpec {
            socket: Some(dir.join(format!("child-{i}.sock"))),
            console_log: None,
            console_stream: Some(theirs),
            detach: false,
            devices: Default::default(),
            labels: Default::default(),
            owned: Default::default(),
            memory_source: None,
        };
        pids.push(zygote.spawn(spec)?);
        streams.push(ours);
    }
    let spawn_ms = start.elapsed().as_secs_f64() * 1e3;
    let result = (|| {
        let mut times = wait_all(&mut streams, b"pong\n", start, &pids)?;
        let ready_ms = times.iter().cloned().fold(0.0, f64::max);
        let first_ms = times.iter().cloned().fold(f64::MAX, f64::min);
        times.clear();
        let mem = pids.iter().map(|&p| mem_usage(p)).collect::<Result<Vec<_>>>()?;
        let phases = ControlClient::connect(&dir.join("child-0.sock"))?.status()?.restore_phases_us;
        Ok(ForkRun { ready_ms, first_ms, spawn_ms, prepare_ms, mem, phases })
    })();
    kill_all(&pids);
    result
}

/// How many cold guests of `mem_mib` fit in memory at once (each touches all of it).
fn cold_concurrency(n: usize, mem_mib: u64) -> usize {
    let avail_kib = crate::util::meminfo_kib("MemAvailable");
    let fit = (avail_kib * 7 / 10 / (mem_mib * 1024)) as usize;
    fit.clamp(1, n)
}

/// N cold boots, at most `window` alive at a time (each one is killed once it has
/// answered, and the next starts): cold guests cannot share memory, so 100 of 512 MiB
/// do not fit at once. Returns ms until the last answered.
fn cold_run(n: usize, shape: Shape, window: usize) -> Result<f64> {
    let start = Instant::now();
    let mut started = 0;
    let mut answered = 0;
    let mut alive: Vec<(UnixStream, i32, Vec<u8>)> = Vec::new();
    let deadline = Instant::now() + ANSWER_TIMEOUT * 4;
    let result = (|| {
        while answered < n {
            while alive.len() < window && started < n {
                let (mut ours, theirs) = UnixStream::pair()?;
                ours.write_all(&monitor::ping())?;
                alive.push((ours, spawn_cold(shape, theirs, None)?, Vec::new()));
                started += 1;
            }
            let mut fds: Vec<libc::pollfd> = alive
                .iter()
                .map(|(s, _, _)| libc::pollfd { fd: s.as_raw_fd(), events: libc::POLLIN, revents: 0 })
                .collect();
            // SAFETY: `fds` is a valid array of pollfd of the given length.
            if unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 100) } < 0 {
                bail!("poll: {}", std::io::Error::last_os_error());
            }
            if Instant::now() > deadline {
                bail!("cold boots did not all answer within {:?}", ANSWER_TIMEOUT * 4);
            }
            let mut finished = Vec::new();
            for (i, _) in fds.iter().enumerate().filter(|(_, p)| p.revents != 0) {
                let (stream, pid, seen) = &mut alive[i];
                let mut buf = [0u8; 512];
                match stream.read(&mut buf) {
                    Ok(0) => bail!("cold guest pid {pid} closed its console before answering"),
                    Ok(k) => seen.extend_from_slice(&buf[..k]),
                    Err(_) => {}
                }
                if seen.windows(5).any(|w| w == b"pong\n") {
                    finished.push(i);
                }
            }
            for i in finished.into_iter().rev() {
                let (_, pid, _) = alive.remove(i);
                kill_all(&[pid]);
                answered += 1;
            }
        }
        Ok(start.elapsed().as_secs_f64() * 1e3)
    })();
    kill_all(&alive.iter().map(|(_, p, _)| *p).collect::<Vec<_>>());
    result
}

pub fn run(a: BenchForkArgs) -> Result<i32> {
    if a.count == 0 || a.runs == 0 {
        bail!("-n and --runs must be at least 1");
    }
    if a.vcpus == 0 || a.vcpus > forkvm_testguest::MAX_VCPUS {
        bail!("--vcpus {}: the monitor guest runs on 1 to {} vCPUs", a.vcpus, forkvm_testguest::MAX_VCPUS);
    }
    open_kvm()?;
    let tmp;
    let dir = match &a.dir {
        Some(d) => {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
            d.clone()
        }
        None => {
            tmp = tempdir()?;
            tmp.clone()
        }
    };
    let shape = Shape { mem_mib: a.mem_mib, irqchip: a.irqchip, vcpus: a.vcpus };
    let (parent_warm_ms, snapshot, snap_dir) = make_parent_snapshot(&dir, shape)?;
    // One child alone: restore-to-first-answer without contention.
    let mut single = Vec::new();
    let mut runs = Vec::new();
    for _ in 0..a.runs {
        single.push(fork_run(&snap_dir, &dir, 1)?);
        runs.push(fork_run(&snap_dir, &dir, a.count)?);
    }
    let window = cold_concurrency(a.count, a.mem_mib);
    let mut cold: Vec<f64> = (0..a.cold_runs).map(|_| cold_run(a.count, shape, window)).collect::<Result<_>>()?;
    let med = |f: &dyn Fn(&ForkRun) -> f64| median(&mut runs.iter().map(f).collect::<Vec<_>>());
    let ready_ms = med(&|r| r.ready_ms);
    let mem_med = |f: fn(&MemUsage) -> u64| {
        median(
            &mut runs
                .iter()
                .map(|r| median(&mut r.mem.iter().map(|m| f(m) as f64).collect::<Vec<_>>()))
                .collect::<Vec<_>>(),
        )
    };
    let phases = median_phases(&single);
    let phases_loaded = median_phases(&runs);
    let cold_ready_ms = median(&mut cold);
    let spawn_ms = med(&|r| r.spawn_ms);
    let dominant_step = if spawn_ms > ready_ms / 2.0 {
        format!("the zygote's fork() loop: {spawn_ms:.1} ms of {ready_ms:.1} ms (fork() costs ~0.5 ms on this host)")
    } else {
        let top =
            phases_loaded.iter().max_by(|a, b| a.1.as_f64().unwrap_or(0.0).total_cmp(&b.1.as_f64().unwrap_or(0.0)));
        format!("restore step {:?}", top.map(|t| t.0.as_str()).unwrap_or("?"))
    };
    let round = |v: f64| (v * 100.0).round() / 100.0;
    let out = json!({
        "bench": "fork",
        "n": a.count,
        "mem_mib": a.mem_mib,
        "vcpus": a.vcpus,
        "runs": a.runs,
        "guest": "monitor (test guest; fills memory above 2 MiB in ring 3, answers ping on COM1)",
        "children_ready_ms": round(ready_ms),
        "children_ready_ms_all": runs.iter().map(|r| round(r.ready_ms)).collect::<Vec<_>>(),
        "per_child_ms": round(ready_ms / a.count as f64),
        "host_spawn_ms": round(med(&|r| r.spawn_ms)),
        "host_spawn_per_child_ms": round(med(&|r| r.spawn_ms) / a.count as f64),
        "first_child_ready_ms": round(med(&|r| r.first_ms)),
        "single_restore_ready_ms": round(median(&mut single.iter().map(|r| r.ready_ms).collect::<Vec<_>>())),
        "prepare_ms": round(med(&|r| r.prepare_ms)),
        "irqchip": a.irqchip.name(),
        "restore_phases_us": phases,
        "restore_phases_us_under_load": phases_loaded,
        "private_kib_per_child": mem_med(|m| m.private_kib),
        "pss_kib_per_child": mem_med(|m| m.pss_kib),
        "rss_kib_per_child": mem_med(|m| m.rss_kib),
        "dominant_step": dominant_step,
        "cold_ready_ms": round(cold_ready_ms),
        "cold_runs": a.cold_runs,
        "cold_max_concurrent": window,
        "speedup": round(cold_ready_ms / ready_ms),
        "parent_warm_ms": round(parent_warm_ms),
        "snapshot": snapshot,
        "machine": machine(),
        "command": std::env::args().collect::<Vec<_>>().join(" "),
    });
    if !a.json {
        eprintln!("forkvm bench fork: {} children of a {} MiB guest, {} runs", a.count, a.mem_mib, a.runs);
    }
    println!("{}", serde_json::to_string_pretty(&out)?);
    if a.dir.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(0)
}

/// Median of each restore phase over runs (child 0 of each run).
fn median_phases(runs: &[ForkRun]) -> serde_json::Map<String, serde_json::Value> {
    let mut phases = serde_json::Map::new();
    if let Some(first) = runs.first() {
        for (i, (name, _)) in first.phases.iter().enumerate() {
            let v = median(&mut runs.iter().filter_map(|r| r.phases.get(i).map(|p| p.1)).collect::<Vec<_>>());
            phases.insert(name.clone(), json!((v * 10.0).round() / 10.0));
        }
    }
    phases
}

fn tempdir() -> Result<PathBuf> {
    let d = std::env::temp_dir().join(format!("forkvm-bench-{}", std::process::id()));
    std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
    Ok(d)
}
