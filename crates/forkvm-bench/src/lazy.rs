//! `forkvm bench lazy-restore`: serving a restored disk's first reads eagerly, lazily,
//! and lazily with a prefetch playbook — the host-side part of restore → first exec.
//!
//! A disk of `--disk-mib` MiB of incompressible data is written through the layered
//! disk engine, sealed, and snapshotted into an encrypted vault. Then a read sequence
//! that touches `--touched-pct` % of it (clustered 64 KiB reads in a fixed order, like
//! a boot reading its binaries and libraries) is served three ways from that snapshot
//! (`vault::lazy::bench_first_reads`): **eager** decrypts the whole snapshot into a
//! local layer first; **lazy** opens a vault-backed layer and fetches each extent on
//! its first read (recording a playbook); **lazy+playbook** replays that playbook on
//! `--prefetch-threads` threads while the same reads run. All three must read the same
//! bytes. `--runs` rounds; medians reported.
//!
//! Not yet measured: the guest side (the VMM does not yet restore lazily; a disk-only
//! fork decrypts eagerly), and memory pages.

use crate::util::{machine, median};
use anyhow::Result;
use clap::Args;
use forkvm_snapshot::vault::lazy::bench_first_reads;
use forkvm_snapshot::vault::{DiskInput, SandboxKey, Vault};
use forkvm_snapshot::LayerStack;
use serde_json::json;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Args, Debug)]
pub struct BenchLazyArgs {
    /// Data written on the disk before it is snapshotted, MiB.
    #[arg(long, default_value_t = 256)]
    pub disk_mib: u64,
    /// Share of that data the first reads touch, percent.
    #[arg(long, default_value_t = 10)]
    pub touched_pct: u64,
    #[arg(long, default_value_t = 4)]
    pub prefetch_threads: usize,
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Where to work [default: the system temp directory].
    #[arg(long)]
    pub dir: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
}

/// One mode's samples over the rounds, ms.
#[derive(Default)]
struct ModeSamples {
    name: &'static str,
    setup: Vec<f64>,
    first: Vec<f64>,
    all: Vec<f64>,
    chunk_reads: u64,
}

fn ms(d: std::time::Duration) -> f64 {
    (d.as_secs_f64() * 1e5).round() / 100.0
}

pub fn run(a: BenchLazyArgs) -> Result<i32> {
    let report = crate::util::in_scratch_dir(a.dir.as_deref(), "lazy", |root| measure(&a, root))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        for r in report["modes"].as_array().into_iter().flatten() {
            println!(
                "{:>14}: ready {} ms, first read {} ms, all reads {} ms, {} chunks decrypted",
                r["mode"].as_str().unwrap_or(""),
                r["setup_ms_p50"],
                r["first_read_ms_p50"],
                r["all_reads_ms_p50"],
                r["chunk_reads"]
            );
        }
    }
    Ok(0)
}

fn measure(a: &BenchLazyArgs, root: &std::path::Path) -> Result<serde_json::Value> {
    const DISK: u64 = 4 << 30;
    let base = root.join("base.img");
    std::fs::File::create(&base)?.set_len(DISK)?;
    let mut stack = LayerStack::create(&base, &[], &root.join("top-0"))?;
    // The data: `disk_mib` MiB in 1 MiB runs spread over the disk (files of a tree).
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut buf = vec![0u8; 1 << 20];
    let mut runs_at = Vec::new();
    for i in 0..a.disk_mib {
        for c in buf.chunks_mut(8) {
            c.copy_from_slice(&next().to_le_bytes());
        }
        let at = (i * (DISK / a.disk_mib.max(1))) & !((1 << 20) - 1);
        stack.write_at(&buf, at)?;
        runs_at.push(at);
    }
    stack.flush()?;
    let sealed = stack.seal(&root.join("top-1"))?;
    let vault = Arc::new(Vault::open(&root.join("vault"), SandboxKey::from_bytes([7u8; 32]))?);
    let input = DiskInput { id: "forkvm-data".into(), base_key: "bench".into(), layers: vec![sealed.dir] };
    let seq = vault.snapshot(std::slice::from_ref(&input))?.seq;
    // The first reads: 64 KiB reads covering `touched_pct` % of the runs, in a fixed order.
    let touched = (a.disk_mib * a.touched_pct / 100).max(1);
    let mut reads = Vec::new();
    for i in 0..touched {
        let at = runs_at[((i * 7919) % a.disk_mib) as usize];
        for k in 0..16 {
            reads.push((at + k * (64 << 10), 64 << 10));
        }
    }
    let mut modes: Vec<ModeSamples> = Vec::new();
    let mut extents = 0;
    let mut entries = 0;
    for round in 0..a.runs {
        let r = bench_first_reads(
            vault.clone(),
            seq,
            "forkvm-data",
            &base,
            &reads,
            &root.join(format!("scratch-{round}")),
            a.prefetch_threads,
        )?;
        extents = r.extents;
        entries = r.playbook_entries;
        for (i, run) in r.runs.iter().enumerate() {
            if modes.len() <= i {
                modes.push(ModeSamples { name: run.name, chunk_reads: run.chunk_reads, ..ModeSamples::default() });
            }
            modes[i].setup.push(ms(run.setup));
            modes[i].first.push(ms(run.first_read));
            modes[i].all.push(ms(run.all_reads));
        }
    }
    let modes: Vec<serde_json::Value> = modes
        .into_iter()
        .map(|mut m| {
            json!({
                "mode": m.name,
                "setup_ms_p50": median(&mut m.setup),
                "first_read_ms_p50": median(&mut m.first),
                "all_reads_ms_p50": median(&mut m.all),
                "chunk_reads": m.chunk_reads,
            })
        })
        .collect();
    Ok(json!({
        "bench": "lazy-restore",
        "machine": machine(),
        "disk_data_mib": a.disk_mib,
        "touched_pct": a.touched_pct,
        "reads": reads.len(),
        "extents_in_snapshot": extents,
        "playbook_entries": entries,
        "prefetch_threads": a.prefetch_threads,
        "runs": a.runs,
        "modes": modes,
        "note": "host side only: serving the disk's first reads from an encrypted vault snapshot",
    }))
}
