//! `forkvm bench memory-prefetch`: restore → ready → first exec of a sandbox spawned
//! from a template snapshot, without and with its memory playbook, from a warm and from
//! a cold host page cache.
//!
//! A spawn maps the snapshot's `memory.img` copy-on-write and the guest faults its pages
//! in as it runs. With a playbook (`vstate::memory_playbook`) the zygote has the kernel
//! read the pages earlier restores touched ahead (`WILLNEED`), and the child maps them
//! on a background thread as its vCPU starts. Each round spawns one sandbox per mode
//! (`FORKVM_MEMORY_PREFETCH=0` for "none"), runs `true` in it, and kills it. "Cold"
//! drops the host's clean page cache first (`/proc/sys/vm/drop_caches`, needs root):
//! what a restore meets after a host reboot or an unarchive. A first spawn, not
//! measured, teaches the playbook. The real spawn path (zygote, VMM processes, agent)
//! runs in a scratch run directory.

use crate::util::in_scratch_dir;
use crate::util::{machine, median};
use anyhow::{bail, Context, Result};
use clap::Args;
use forkvm_proto::ExecRequest;
use forkvm_sandbox::{ensure_template_snapshot, spawn, Artifacts, Registry, SpawnOptions, SpawnSource};
use serde_json::json;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct BenchMemoryArgs {
    /// The template whose snapshot to spawn from.
    #[arg(long, default_value = "tiny")]
    pub template: String,
    /// Rounds (each spawns once per mode).
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Skip the cold-cache modes.
    #[arg(long)]
    pub warm_only: bool,
    /// Where to work [default: the system temp directory].
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Mode {
    cold: bool,
    prefetch: bool,
}

impl Mode {
    fn name(self) -> &'static str {
        match (self.cold, self.prefetch) {
            (false, false) => "warm_none",
            (false, true) => "warm_playbook",
            (true, false) => "cold_none",
            (true, true) => "cold_playbook",
        }
    }
}

/// One spawn's measurements.
#[derive(Debug, Clone, Copy)]
struct Sample {
    mode: Mode,
    ready_ms: f64,
    exec_ms: f64,
    pages: u64,
}

fn drop_caches() -> Result<()> {
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "1").context("dropping the page cache (needs root)")
}

pub fn run(a: BenchMemoryArgs) -> Result<i32> {
    if a.runs == 0 {
        bail!("--runs must be at least 1");
    }
    let cold = !a.warm_only;
    if cold {
        drop_caches().context("--warm-only skips the cold modes")?;
    }
    let artifacts = Artifacts::ensure(&a.template, &mut |_| {}).context("the template's artefacts")?;
    let template = ensure_template_snapshot(artifacts).context("the template snapshot")?;
    let source = SpawnSource::from_template(&template)?;
    in_scratch_dir(a.dir.as_deref(), "memory-prefetch", |root| {
        let registry = Registry::open(root.join("run"));
        let once = |mode: Mode| -> Result<(f64, f64, u64)> {
            if mode.cold {
                drop_caches()?;
            }
            // SAFETY: the bench is single-threaded here (spawn forks from it).
            unsafe { std::env::set_var("FORKVM_MEMORY_PREFETCH", if mode.prefetch { "1" } else { "0" }) };
            let started = Instant::now();
            let (sbs, timings) = spawn(&registry, &source, 1, &SpawnOptions::default())?;
            let ready_ms = started.elapsed().as_secs_f64() * 1e3;
            let t = Instant::now();
            let out = sbs[0].client.exec_collect(&ExecRequest::argv(["true"]), b"")?;
            let exec_ms = t.elapsed().as_secs_f64() * 1e3;
            // What the CLI and the daemon do after a call: the spawn's first call teaches.
            forkvm_sandbox::memory_playbook::learn_after_first_call(&sbs[0].record);
            forkvm_sandbox::kill_record(&registry, &sbs[0].record)?;
            if out.status.code != Some(0) {
                bail!("`true` exited with {:?}", out.status);
            }
            Ok((ready_ms, exec_ms, timings.memory_prefetch_pages))
        };
        // Teaches the playbook (a template's first spawn records it).
        once(Mode { cold: false, prefetch: true })?;
        let mut modes = vec![Mode { cold: false, prefetch: false }, Mode { cold: false, prefetch: true }];
        if cold {
            modes.extend([Mode { cold: true, prefetch: false }, Mode { cold: true, prefetch: true }]);
        }
        let mut results: Vec<Sample> = Vec::new();
        for round in 0..a.runs {
            for &m in &modes {
                let (ready, exec, pages) = once(m).with_context(|| format!("round {round}, {}", m.name()))?;
                eprintln!(
                    "round {round} {:>13}: ready {ready:>7.1} ms, first exec {exec:>6.1} ms, {pages} pages prefetched",
                    m.name()
                );
                results.push(Sample { mode: m, ready_ms: ready, exec_ms: exec, pages });
            }
        }
        let mut out = serde_json::Map::new();
        out.insert("bench".into(), json!("memory-prefetch"));
        out.insert("template".into(), json!(a.template));
        for &m in &modes {
            let of = |f: &dyn Fn(&Sample) -> f64| {
                let mut v: Vec<f64> = results.iter().filter(|r| r.mode == m).map(f).collect();
                (median(&mut v) * 10.0).round() / 10.0
            };
            out.insert(
                m.name().into(),
                json!({
                    "spawn_to_ready_ms": of(&|r| r.ready_ms),
                    "first_exec_ms": of(&|r| r.exec_ms),
                    "spawn_to_first_exec_ms": of(&|r| r.ready_ms + r.exec_ms),
                    "pages_prefetched": of(&|r| r.pages as f64),
                    "ready_ms_all": results.iter().filter(|r| r.mode == m).map(|r| (r.ready_ms * 10.0).round() / 10.0).collect::<Vec<_>>(),
                }),
            );
        }
        out.insert("runs".into(), json!(a.runs));
        out.insert(
            "note".into(),
            json!(
                "guest-side times; the guest's page faults are host work, but its kernel code is emulated on PVM hosts"
            ),
        );
        out.insert("machine".into(), machine());
        out.insert("command".into(), json!(std::env::args().collect::<Vec<_>>().join(" ")));
        println!("{}", serde_json::to_string_pretty(&out)?);
        Ok(0)
    })
}
