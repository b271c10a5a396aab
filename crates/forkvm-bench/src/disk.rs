//! `forkvm bench disk-snapshot`: the steady-state cost of continuous disk snapshots
//! against how fast the guest writes.
//!
//! The storage path is the real one — the layered disk engine the virtio-blk device
//! runs (`LayerStack`), sealed as the VMM seals it, and the encrypted vault the daemon
//! writes — driven from the host at a chosen write rate. (A guest here cannot write
//! fast enough to measure this: its kernel code is emulated, ~12 s per MiB.) For each
//! rate, `--intervals` rounds each write that many MiB of incompressible data at random
//! 4 KiB-aligned places (64 KiB requests, like the guest's), flush, then take a disk
//! snapshot: seal + encrypt + write the new layer's blocks + publish + retention.
//! Reported per rate, medians: the seal (the only part a running sandbox notices: its
//! disk requests wait under the device lock), the vault write, bytes written, and the
//! share of a 60 s interval the snapshot takes on one core. Then the rate's layers are
//! compacted (merged into one, as the VMM does once the vault holds them) and one more
//! interval is snapshotted: the merge's cost, and what that snapshot uploads (one
//! interval's data when the vault's lineage survives the merge).

use crate::util::{in_scratch_dir, machine, median, r2, Rng};
use anyhow::Result;
use clap::Args;
use forkvm_snapshot::vault::{DiskInput, RetentionPolicy, SandboxKey, Vault};
use forkvm_snapshot::LayerStack;
use serde_json::json;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct BenchDiskArgs {
    /// Disk size, GiB (a sandbox's data disk is 4).
    #[arg(long, default_value_t = 4)]
    pub disk_gib: u64,
    /// MiB the guest writes between two snapshots, one run per value.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32,128")]
    pub rates_mib: Vec<u64>,
    /// Snapshots per rate (the first, which also uploads nothing old, counts too).
    #[arg(long, default_value_t = 7)]
    pub intervals: usize,
    /// Where to put the scratch disk and vault [default: the system temp directory].
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Print JSON only.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: BenchDiskArgs) -> Result<i32> {
    let report = in_scratch_dir(a.dir.as_deref(), "disk", |root| measure(&a, root))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        for r in report["rates"].as_array().into_iter().flatten() {
            println!(
                "{:>4} MiB/interval: seal {} ms, vault write {} ms ({} MiB/s), {}% of a 60 s interval",
                r["write_mib_per_interval"],
                r["seal_ms_p50"],
                r["snapshot_ms_p50"],
                r["vault_mib_per_s"],
                r["share_of_60s_pct"]
            );
        }
    }
    Ok(0)
}

fn measure(a: &BenchDiskArgs, root: &std::path::Path) -> Result<serde_json::Value> {
    let size = a.disk_gib << 30;
    let mut rates = Vec::new();
    for &mib in &a.rates_mib {
        let dir = root.join(format!("rate-{mib}"));
        std::fs::create_dir_all(dir.join("layers"))?;
        let base = dir.join("base.img");
        std::fs::File::create(&base)?.set_len(size)?;
        let mut stack = LayerStack::create_lazy(&base, &[], &dir.join("layers/top-0"))?;
        let mut key = [0u8; 32];
        Rng(mib ^ 0x5eed).fill(&mut key);
        let vault = Vault::open(&dir.join("vault"), SandboxKey::from_bytes(key))?;
        let policy = RetentionPolicy { keep_last: 60, keep_hourly: 24, keep_daily: 7 };
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ mib);
        let mut buf = vec![0u8; 64 << 10];
        let (mut seal, mut snap, mut written, mut chunks) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut sealed: Vec<PathBuf> = Vec::new();
        for round in 0..a.intervals {
            let requests = (mib << 20) / buf.len() as u64;
            for _ in 0..requests {
                rng.fill(&mut buf);
                let offset = (rng.next_u64() % (size / 4096 - 16)) * 4096;
                stack.write_at(&buf, offset)?;
            }
            stack.flush()?;
            let t = Instant::now();
            let s = stack.seal(&dir.join(format!("layers/top-{}", round + 1)))?;
            seal.push(t.elapsed().as_secs_f64() * 1e3);
            sealed.push(s.dir);
            let t = Instant::now();
            let input = DiskInput { id: "forkvm-data".into(), base_key: "bench".into(), layers: sealed.clone() };
            let info = vault.snapshot(std::slice::from_ref(&input))?;
            vault.retain(&policy)?;
            snap.push(t.elapsed().as_secs_f64() * 1e3);
            written.push(info.written_bytes as f64);
            chunks.push(info.written_chunks as f64);
        }
        // Compaction (what the VMM does once enough of its layers are in the vault):
        // merge them all, swap the merge in, and take one more interval's snapshot,
        // which must upload only that interval (the vault's lineage continues).
        let layers_before = sealed.len();
        let t = Instant::now();
        let merged = dir.join("layers/merged");
        forkvm_snapshot::layered_disk::merge_layers(&merged, &sealed)?;
        stack.replace_sealed(0..sealed.len(), &merged)?;
        let compact_ms = t.elapsed().as_secs_f64() * 1e3;
        for _ in 0..(mib << 20) / buf.len() as u64 {
            rng.fill(&mut buf);
            let offset = (rng.next_u64() % (size / 4096 - 16)) * 4096;
            stack.write_at(&buf, offset)?;
        }
        stack.flush()?;
        let last = stack.seal(&dir.join("layers/top-after"))?;
        let input = DiskInput { id: "forkvm-data".into(), base_key: "bench".into(), layers: vec![merged, last.dir] };
        let after = vault.snapshot(std::slice::from_ref(&input))?;
        let snap_p50 = median(&mut snap.clone());
        let written_p50 = median(&mut written);
        rates.push(json!({
            "write_mib_per_interval": mib,
            "seal_ms_p50": r2(median(&mut seal)),
            "snapshot_ms_p50": r2(snap_p50),
            "snapshot_ms_max": r2(snap.iter().cloned().fold(0.0, f64::max)),
            "written_mib_p50": r2(written_p50 / (1 << 20) as f64),
            "written_chunks_p50": median(&mut chunks),
            "vault_mib_per_s": r2((mib as f64) / (snap_p50 / 1e3)),
            "share_of_60s_pct": r2(snap_p50 / 600.0),
            "layers_at_end": layers_before,
            "compact_ms": r2(compact_ms),
            "written_mib_after_compact": r2(after.written_bytes as f64 / (1 << 20) as f64),
        }));
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(json!({
        "bench": "disk-snapshot",
        "machine": machine(),
        "disk_gib": a.disk_gib,
        "intervals": a.intervals,
        "data": "incompressible, random 4 KiB-aligned 64 KiB writes",
        "rates": rates,
    }))
}
