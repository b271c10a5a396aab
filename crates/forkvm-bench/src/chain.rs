//! `forkvm bench chain --depth 3`: what a diff-snapshot chain costs.
//!
//! In a private store: the template's snapshot as the base, then `--depth` links made with
//! `snapshot-diff` (each writes `--layer-mib` MiB of fresh data in the guest's warm
//! interpreter and a file), and the compacted head. Then, `--runs` rounds, each spawning
//! one sandbox from every head in turn (interleaved, so drift hits all depths alike):
//!
//! * `resolve_ms`: checking the chain (one `snapshot.json` per link) and finding the
//!   assembled image in the cache — the per-spawn price of a chain (host side);
//! * `prepare_ms`, `host_spawn_ms`: reading the snapshot once (zygote) and forking the VMM;
//! * `host_ms` = the three above: the host-side spawn cost whose growth with depth is the
//!   per-link tax (`per_link_tax_ms`, against depth 0, divided by the depth);
//! * `ready_ms`: until the sandbox answered and took its identity (guest side: inflated
//!   by emulation on PVM hosts).
//!
//! `first_spawn`: the one-time price per head (cache evicted: verify + assemble). `disk`:
//! bytes on disk of the chain's links against the same states kept as whole images, and
//! `pack`/`unpack` throughput of the whole chain (unpacked into an empty store).

use crate::util::{machine, median, r2};
use anyhow::{Context, Result};
use clap::Args;
use forkvm_sandbox::source::assembled_cache;
use forkvm_sandbox::{snapshot_diff, spawn, DiffStep, Registry, SpawnOptions, SpawnSource};
use forkvm_snapshot::chain;
use forkvm_snapshot::{ChunkStore, Store};
use serde_json::json;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct BenchChainArgs {
    /// Links above the base.
    #[arg(long, default_value_t = 3)]
    pub depth: usize,
    /// Template the base is made from.
    #[arg(long, default_value = "python")]
    pub image: String,
    /// MiB of new data each link writes in the guest.
    #[arg(long, default_value_t = 8)]
    pub layer_mib: u64,
    /// Spawn rounds (each spawns once from every head).
    #[arg(long, default_value_t = 7)]
    pub runs: usize,
    /// Print JSON only.
    #[arg(long)]
    pub json: bool,
}

/// One spawn's measurements, ms.
struct Sample {
    resolve: f64,
    prepare: f64,
    host_spawn: f64,
    ready: f64,
}

fn spawn_once(registry: &Registry, store: &Store, tag: &str) -> Result<Sample> {
    let t = Instant::now();
    let source = SpawnSource::from_tag(store, tag)?;
    let resolve = t.elapsed().as_secs_f64() * 1e3;
    let (sandboxes, timings) = spawn(registry, &source, 1, &SpawnOptions::default())?;
    let ready = sandboxes[0].ready_ms;
    for sb in &sandboxes {
        forkvm_sandbox::verbs::kill_record(registry, &sb.record)?;
    }
    Ok(Sample { resolve, prepare: timings.prepare_ms, host_spawn: timings.host_spawn_ms, ready })
}

/// Allocated bytes of the files under `dir`, each inode once (snapshots hard-link their
/// disk images and vmstate).
fn du(dir: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    fn walk(dir: &std::path::Path, seen: &mut std::collections::HashSet<(u64, u64)>) -> u64 {
        let mut total = 0;
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let Ok(m) = e.metadata() else { continue };
            if m.is_dir() {
                total += walk(&e.path(), seen);
            } else if seen.insert((m.dev(), m.ino())) {
                total += m.blocks() * 512;
            }
        }
        total
    }
    walk(dir, &mut std::collections::HashSet::new())
}

pub fn run(a: BenchChainArgs) -> Result<i32> {
    let work = std::env::temp_dir().join(format!("forkvm-bench-chain-{}", std::process::id()));
    let result = run_in(&a, &work);
    let _ = std::fs::remove_dir_all(&work);
    result
}

fn run_in(a: &BenchChainArgs, work: &std::path::Path) -> Result<i32> {
    let store = Store::open(work.join("store"));
    // The VMMs' jail shows them their registry's store only.
    let registry = Registry::open(work.join("run")).salvaging_into(store.root());
    let cache = assembled_cache();
    let template = crate::util::template_snapshot(&a.image, Some(1))?;
    forkvm_sandbox::publish_template(&store, &template, "base", &Default::default(), None)?;
    let chunks = ChunkStore::open(store.root());

    // The chain: each link a diff over the one below.
    let mut heads = vec!["base".to_string()];
    let mut links = Vec::new();
    for k in 1..=a.depth {
        let tag = format!("link{k}");
        let steps = [
            DiffStep::Exec(format!("echo {k} > /tmp/link{k}")),
            DiffStep::Eval(format!(
                "import random\nrandom.seed({k})\nlayer{k} = random.randbytes({} << 20)",
                a.layer_mib
            )),
        ];
        let before = chunks.usage()?.1;
        let r = snapshot_diff(&registry, &store, heads.last().unwrap(), &tag, &steps, &SpawnOptions::default())
            .with_context(|| format!("making {tag}"))?;
        let grew = chunks.usage()?.1.saturating_sub(before);
        links.push(json!({
            "tag": tag, "pages": r.diff.pages, "chunks_new": r.diff.chunks_new, "chunk_bytes_added": grew,
            "parent_ingested": r.parent_ingested, "diff_ms": r2(r.diff_ms), "branch_pause_ms": r2(r.branch_pause_ms),
            "total_ms": r2(r.total_ms),
        }));
        heads.push(tag);
    }
    let head = heads.last().unwrap().clone();
    let compact = chain::compact(&store, &cache, &head, "compacted")?;
    heads.push("compacted".into());

    // One-time price per head: verify and assemble with the cache evicted.
    let mut first = Vec::new();
    for tag in &heads {
        let chain = chain::resolve(&store, tag)?;
        cache.evict(chain.head().meta.content_hash.as_deref().unwrap_or_default());
        let t = Instant::now();
        let (_, stats) = cache.memory_for(&store, &chain)?;
        let stats = stats.unwrap_or_default();
        first.push(json!({
            "tag": tag, "depth": chain.depth(), "assemble_ms": r2(t.elapsed().as_secs_f64() * 1e3),
            "chunks_read": stats.chunks_read, "bytes_written": stats.bytes_written,
        }));
    }

    // Spawns, interleaved across heads.
    let mut samples: Vec<Vec<Sample>> = heads.iter().map(|_| Vec::new()).collect();
    for _ in 0..a.runs {
        for (i, tag) in heads.iter().enumerate() {
            samples[i].push(spawn_once(&registry, &store, tag).with_context(|| format!("spawning from {tag}"))?);
        }
    }
    let p50 = |v: &[Sample], f: fn(&Sample) -> f64| median(&mut v.iter().map(f).collect::<Vec<_>>());
    let host = |s: &Sample| s.resolve + s.prepare + s.host_spawn;
    let base_host = p50(&samples[0], host);
    let base_resolve = p50(&samples[0], |s| s.resolve);
    let spawn_rows: Vec<_> = heads
        .iter()
        .zip(&samples)
        .map(|(tag, v)| {
            let depth = chain::resolve(&store, tag).map(|c| c.depth()).unwrap_or(0);
            let host_ms = p50(v, host);
            json!({
                "tag": tag, "depth": depth, "runs": v.len(),
                "resolve_ms_p50": r2(p50(v, |s| s.resolve)), "prepare_ms_p50": r2(p50(v, |s| s.prepare)),
                "host_spawn_ms_p50": r2(p50(v, |s| s.host_spawn)), "host_ms_p50": r2(host_ms),
                "ready_ms_p50": r2(p50(v, |s| s.ready)),
                "per_link_tax_ms": if depth > 0 { Some(r2((host_ms - base_host) / depth as f64)) } else { None },
                "per_link_resolve_tax_ms": if depth > 0 {
                    Some(((p50(v, |s| s.resolve) - base_resolve) / depth as f64 * 1000.0).round() / 1000.0)
                } else {
                    None
                },
            })
        })
        .collect();

    // Disk: the links as diffs in the chunk store vs the same states as whole images,
    // after a garbage collection (the steady state: ingest leaves the base's memory.img
    // until then).
    chain::collect_garbage(&store)?;
    let mut chain_bytes = 0;
    let mut flat_bytes = 0;
    for tag in heads.iter().skip(1).take(a.depth) {
        let info = chain::info(&store, tag)?;
        chain_bytes += info.physical_bytes;
        let (image, _) = cache.memory_for(&store, &chain::resolve(&store, tag)?)?;
        let image_bytes = std::fs::File::open(&image).and_then(|f| forkvm_snapshot::allocated_bytes(&f)).unwrap_or(0);
        flat_bytes += image_bytes + std::fs::metadata(info.dir.join(forkvm_snapshot::VMSTATE_BIN))?.len();
    }
    let base_info = chain::info(&store, "base")?;

    // Pack the whole chain, unpack it into an empty store.
    let pack_path = work.join("chain.tar.zst");
    let packed = chain::pack(&store, &cache, &head, &pack_path)?;
    let other = Store::open(work.join("other-store"));
    other.ensure()?;
    let unpacked = chain::unpack(&other, &pack_path)?;
    let mib = |bytes: u64, ms: f64| r2(bytes as f64 / (1 << 20) as f64 / (ms / 1e3));

    for tag in &heads {
        if let Ok(c) = chain::resolve(&store, tag) {
            cache.evict(c.head().meta.content_hash.as_deref().unwrap_or_default());
        }
    }
    let report = json!({
        "bench": "chain",
        "command": format!("forkvm bench chain --depth {} --image {} --layer-mib {} --runs {} --json", a.depth, a.image, a.layer_mib, a.runs),
        "machine": machine(),
        "template": a.image,
        "mem_size_bytes": base_info.memory_bytes,
        "links": links,
        "compact": {"pages": compact.pages, "chunks_new": compact.chunks_new, "ms": r2(compact.ms)},
        "first_spawn": first,
        "spawn": spawn_rows,
        "disk": {
            "links": a.depth,
            "chain_link_bytes": chain_bytes,
            "whole_image_bytes": flat_bytes,
            "ratio": r2(chain_bytes as f64 / flat_bytes.max(1) as f64),
            "base_chunked_bytes": base_info.physical_bytes,
            "base_logical_bytes": base_info.logical_bytes,
            "store_bytes": du(store.root()),
            "store_bytes_without_disks": du(store.root()) - disk_bytes(&store),
        },
        "pack": {
            "links": packed.links.len(), "chunks": packed.chunks, "logical_bytes": packed.logical_bytes,
            "pack_bytes": packed.pack_bytes, "ms": r2(packed.ms), "mib_per_s": mib(packed.logical_bytes, packed.ms),
        },
        "unpack": {
            "imported": unpacked.imported.len(), "ms": r2(unpacked.ms), "mib_per_s": mib(unpacked.logical_bytes, unpacked.ms),
        },
    });
    if !a.json {
        for row in &spawn_rows {
            eprintln!(
                "{:<10} depth {}: host {:.2} ms (resolve {:.2}), ready {:.0} ms",
                row["tag"].as_str().unwrap_or(""),
                row["depth"],
                row["host_ms_p50"].as_f64().unwrap_or(0.0),
                row["resolve_ms_p50"].as_f64().unwrap_or(0.0),
                row["ready_ms_p50"].as_f64().unwrap_or(0.0)
            );
        }
    }
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(0)
}

/// Allocated bytes of the distinct disk images the store's snapshots hold.
fn disk_bytes(store: &Store) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut seen = std::collections::HashSet::new();
    let mut total = 0;
    for e in store.list() {
        let disk_dir = store.snapshots_dir().join(&e.tag).join(forkvm_snapshot::DISK_DIR);
        for f in std::fs::read_dir(disk_dir).into_iter().flatten().flatten() {
            if let Ok(m) = f.metadata() {
                if seen.insert((m.dev(), m.ino())) {
                    total += m.blocks() * 512;
                }
            }
        }
    }
    total
}
