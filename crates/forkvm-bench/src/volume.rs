//! `forkvm bench volume --tag T`: what volumes cost, as one JSON object. Medians over
//! `--runs`, milliseconds, all measured in one run:
//!
//! * host side: `create_ms` (a sparse file and mkfs.ext4 of `--size-mib`),
//!   `take_in_ms` (the next `volume get` after a writer was killed: its top sealed and
//!   linked into the volume), `snapshot_ms` (a new volume sharing the layers);
//! * a spawn of one sandbox from T: `spawn_ms` without a volume, `spawn_rw_ms` and
//!   `spawn_ro_ms` with one (the restore with the volume in a slot, the guest seeing its
//!   size after the configuration-change interrupt, the agent's mount), and their ratio;
//!   `kill_writer_ms` (the guest's sync, then the stop) against `kill_ms`;
//! * guest side: `write_ms`, `--write-mib` MiB of zeros written to the volume and
//!   synced, against `write_data_disk_ms`, the same to the sandbox's own data disk.
//!
//! Spawns and mounts cross the guest kernel, which is emulated on PVM hosts
//! (PLATFORM.md): those are guest-side times, inflated there. Everything runs in a
//! private registry and store, removed afterwards.

use crate::util::{machine, median, r2};
use anyhow::{bail, Context, Result};
use clap::Args;
use forkvm_proto::ExecRequest;
use forkvm_sandbox::volumes::{parse_mount, Volumes};
use forkvm_sandbox::{spawn_with, Registry, SpawnOptions, SpawnSource};
use forkvm_snapshot::Store;
use serde_json::json;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct BenchVolumeArgs {
    /// Tag to spawn the sandboxes from.
    #[arg(long)]
    pub tag: String,
    /// Rounds (each: a volume made, spawns with and without it, a write, kills).
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Volume size, MiB.
    #[arg(long, default_value_t = 4096)]
    pub size_mib: u64,
    /// MiB the writer writes to the volume (and to its own disk) each round.
    #[arg(long, default_value_t = 1)]
    pub write_mib: u64,
}

pub fn run(a: BenchVolumeArgs) -> Result<i32> {
    if a.runs == 0 || a.runs > 50 || a.write_mib > 1024 {
        bail!("--runs is 1..=50 and --write-mib at most 1024");
    }
    let source = SpawnSource::from_tag(&Store::open_default(), &a.tag)?;
    let mut report = crate::util::in_scratch_dir(None, "volume", |dir| {
        let store = Store::open(dir.join("store"));
        let registry = Registry::open(dir.join("run")).salvaging_into(store.root());
        let result = measure(&registry, &store, &source, &a);
        for row in registry.rows() {
            let _ = forkvm_sandbox::verbs::kill_record(&registry, &row.record);
        }
        result
    })?;
    report["bench"] = "volume".into();
    report["command"] = format!(
        "forkvm bench volume --tag {} --runs {} --size-mib {} --write-mib {}",
        a.tag, a.runs, a.size_mib, a.write_mib
    )
    .into();
    report["machine"] = machine();
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(0)
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

fn measure(registry: &Registry, store: &Store, source: &SpawnSource, a: &BenchVolumeArgs) -> Result<serde_json::Value> {
    let volumes = Volumes::of(store);
    let opts = SpawnOptions::default();
    let keys = [
        "create",
        "spawn",
        "kill",
        "spawn_rw",
        "write",
        "write_data_disk",
        "kill_writer",
        "take_in",
        "spawn_ro",
        "snapshot",
    ];
    let mut t: std::collections::BTreeMap<&str, Vec<f64>> = keys.iter().map(|k| (*k, Vec::new())).collect();
    let mut push = |k: &'static str, v: f64| t.get_mut(k).expect("a known key").push(v);
    for run in 0..a.runs {
        let name = format!("bench-{run}");
        let at = Instant::now();
        volumes.create(&name, a.size_mib << 20).context("creating the volume")?;
        push("create", ms(at));

        let at = Instant::now();
        let (plain, _) = spawn_with(registry, source, 1, &opts, &[]).context("spawning without a volume")?;
        push("spawn", ms(at));
        let at = Instant::now();
        forkvm_sandbox::kill_record(registry, &plain[0].record)?;
        push("kill", ms(at));

        let rw = parse_mount(&format!("{name}:/data"))?;
        let at = Instant::now();
        let (writer, _) = spawn_with(registry, source, 1, &opts, &[rw]).context("spawning the writer")?;
        push("spawn_rw", ms(at));
        for (key, path) in [("write", "/data/f"), ("write_data_disk", "/root/f")] {
            let at = Instant::now();
            let cmd = format!("head -c {} /dev/zero > {path} && sync", a.write_mib << 20);
            let out = writer[0].client.exec_collect(&ExecRequest::shell(cmd), b"")?;
            if out.status.code != Some(0) {
                bail!("writing {path} failed: {:?}", out.status);
            }
            push(key, ms(at));
        }
        let at = Instant::now();
        forkvm_sandbox::kill_record(registry, &writer[0].record)?;
        push("kill_writer", ms(at));
        let at = Instant::now();
        let info = volumes.get(registry, &name)?;
        push("take_in", ms(at));
        if info.layers == 0 {
            bail!("the writer's writes were not taken in: {info:?}");
        }

        let ro = parse_mount(&format!("{name}:/data:ro"))?;
        let at = Instant::now();
        let (reader, _) = spawn_with(registry, source, 1, &opts, &[ro]).context("spawning a reader")?;
        push("spawn_ro", ms(at));
        let size = reader[0].client.exec_collect(&ExecRequest::shell("stat -c %s /data/f".to_string()), b"")?;
        let bytes: u64 = String::from_utf8_lossy(&size.stdout).trim().parse().unwrap_or(0);
        if bytes != a.write_mib << 20 {
            bail!("the reader sees {bytes} bytes in /data/f, not {}", a.write_mib << 20);
        }
        forkvm_sandbox::kill_record(registry, &reader[0].record)?;
        let at = Instant::now();
        volumes.snapshot(registry, &name, &format!("{name}-copy"))?;
        push("snapshot", ms(at));
        volumes.remove(registry, &format!("{name}-copy"))?;
        volumes.remove(registry, &name)?;
    }
    let mut out = serde_json::Map::new();
    for (k, mut v) in t {
        out.insert(format!("{k}_ms"), json!(r2(median(&mut v))));
    }
    let get = |k: &str| out[k].as_f64().unwrap_or(0.0);
    let ratios = json!({
        "write_vs_data_disk": r2(get("write_ms") / get("write_data_disk_ms").max(1e-9)),
        "spawn_rw_vs_spawn": r2(get("spawn_rw_ms") / get("spawn_ms").max(1e-9)),
        "spawn_ro_vs_spawn": r2(get("spawn_ro_ms") / get("spawn_ms").max(1e-9)),
        "kill_writer_vs_kill": r2(get("kill_writer_ms") / get("kill_ms").max(1e-9)),
    });
    out.insert("ratios".into(), ratios);
    out.insert("runs".into(), json!(a.runs));
    Ok(serde_json::Value::Object(out))
}
