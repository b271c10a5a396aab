//! `forkvm bench remote`: what moving chains through object storage costs.
//!
//! In a scratch directory: the template's snapshot as `base`, and a diff link `d1` over
//! it (`--layer-mib` MiB of fresh data written in the guest's warm interpreter). Then,
//! against `--remote` (default: a `file://` directory in the scratch directory; give an
//! `s3://` URL and the usual `AWS_*` variables for a real bucket):
//!
//! * `push`: `base` into the empty remote (every block), then `d1` (the second tag: only
//!   its own blocks travel; `dedup_ratio` = its blocks' bytes / bytes uploaded), then `d1`
//!   again (nothing but the manifest);
//! * `pull`: `d1` into an empty store with an empty block cache, `--runs` times;
//! * `first_command`: from nothing local to a sandbox's first `exec true` (pull +
//!   spawn + exec) against a spawn + exec from the local store, medians of `--runs`;
//!   and the same through a lazy pull (`pull --lazy`: everything but the memory, which
//!   the sandbox fetches as it touches it, the rest in the background), with the memory
//!   chunks the store had received by the time the command answered.
//!
//! Throughputs are host-side (real here); `ready_ms` is guest-side (emulated on PVM).

use crate::util::{machine, median, r2};
use anyhow::{Context, Result};
use clap::Args;
use forkvm_proto::ExecRequest;
use forkvm_remote::push::Progress;
use forkvm_remote::{BlockCache, PullReport, Remote, RemoteError, RemoteKey};
use forkvm_sandbox::source::assembled_cache;
use forkvm_sandbox::{snapshot_diff, spawn, DiffStep, Registry, SpawnOptions, SpawnSource};
use forkvm_snapshot::Store;
use serde_json::json;
use std::path::Path;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct BenchRemoteArgs {
    /// The remote [default: a file:// directory in the scratch directory].
    #[arg(long, value_name = "URL")]
    pub remote: Option<String>,
    /// Template the base is made from.
    #[arg(long, default_value = "python")]
    pub image: String,
    /// MiB of new data the diff link writes in the guest.
    #[arg(long, default_value_t = 8)]
    pub layer_mib: u64,
    /// Pulls into empty stores, and spawns (each way).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Print JSON only.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: BenchRemoteArgs) -> Result<i32> {
    let report = crate::util::in_scratch_dir(None, "remote", |work| run_in(&a, work))?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(0)
}

fn mib_per_s(bytes: u64, ms: f64) -> f64 {
    r2(bytes as f64 / (1 << 20) as f64 / (ms / 1e3))
}

/// Spawns one sandbox from `tag` and runs `exec true`: (spawn → ready ms, to the end of
/// the exec ms).
fn spawn_and_exec(registry: &Registry, store: &Store, tag: &str) -> Result<(f64, f64)> {
    let t = Instant::now();
    let source = SpawnSource::from_tag(store, tag)?;
    let (sandboxes, _) = spawn(registry, &source, 1, &SpawnOptions::default())?;
    let sb = &sandboxes[0];
    let out = sb.client.exec_collect(&ExecRequest::argv(["true"]), b"")?;
    let first = t.elapsed().as_secs_f64() * 1e3;
    let ready = sb.ready_ms;
    for s in &sandboxes {
        forkvm_sandbox::verbs::kill_record(registry, &s.record)?;
    }
    anyhow::ensure!(out.status.code == Some(0), "`true` exited with {:?}", out.status);
    Ok((ready, first))
}

/// `forkvm_remote::pull` or `pull_lazy`.
type Puller = fn(&Store, &str, &Remote, &RemoteKey, &BlockCache, &Progress) -> Result<PullReport, RemoteError>;

/// One run from nothing local: its pull, (pull + first command ms, ready ms), and the
/// memory chunks the store gained by the time the command answered.
struct RemoteRun {
    report: PullReport,
    first: (f64, f64),
    chunks_at_first: f64,
}

/// Memory chunk files in `store`'s chunk store.
fn chunk_files(store: &Store) -> usize {
    let dirs = std::fs::read_dir(store.root().join("chunks")).into_iter().flatten().flatten();
    dirs.filter(|d| d.path().is_dir()).map(|d| std::fs::read_dir(d.path()).into_iter().flatten().count()).sum()
}

fn run_in(a: &BenchRemoteArgs, work: &Path) -> Result<serde_json::Value> {
    let store = Store::open(work.join("store"));
    // A registry per store: a VMM's jail shows it its registry's store only.
    let registry_of = |store: &Store| {
        let name = store.root().file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        Registry::open(work.join(format!("run-{name}"))).salvaging_into(store.root())
    };
    let registry = registry_of(&store);
    let template = crate::util::template_snapshot(&a.image, Some(1))?;
    forkvm_sandbox::publish_template(&store, &template, "base", &Default::default(), None)?;
    let steps =
        [DiffStep::Eval(format!("import random\nrandom.seed(1)\nlayer = random.randbytes({} << 20)", a.layer_mib))];
    snapshot_diff(&registry, &store, "base", "d1", &steps, &SpawnOptions::default()).context("making d1")?;

    let url = a.remote.clone().unwrap_or_else(|| format!("file://{}", work.join("remote").display()));
    let remote = Remote::open(&url)?;
    let key = RemoteKey::generate(&work.join("remote.key"))?;
    let cache = assembled_cache();
    let push = |tag: &str| forkvm_remote::push(&store, &cache, tag, &remote, &key, &Progress::default());
    let base = push("base")?;
    let d1 = push("d1")?;
    let again = push("d1")?;

    // From nothing local to the first command, `--runs` times: each run pulls (whole or
    // lazily) into an empty store with an empty block cache, then spawns and execs.
    let from_remote = |name: &str, pull: Puller| -> Result<Vec<RemoteRun>> {
        (0..a.runs)
            .map(|i| {
                let other = Store::open(work.join(format!("{name}-{i}")));
                let blocks = BlockCache::new(&work.join(format!("{name}-blocks-{i}")), 1 << 30);
                let t = Instant::now();
                let report = pull(&other, "d1", &remote, &key, &blocks, &Progress::default())?;
                let pull_ms = t.elapsed().as_secs_f64() * 1e3;
                let before = chunk_files(&other);
                let (ready, first) = spawn_and_exec(&registry_of(&other), &other, "d1")?;
                let chunks_at_first = (chunk_files(&other) - before) as f64;
                Ok(RemoteRun { report, first: (pull_ms + first, ready), chunks_at_first })
            })
            .collect()
    };
    let whole = from_remote("pulled", forkvm_remote::pull)?;
    let lazy = from_remote("lazy", forkvm_remote::pull_lazy)?;
    let (pulls, remote_first): (Vec<_>, Vec<_>) = whole.into_iter().map(|r| (r.report, r.first)).unzip();
    let mut lazy_chunks_at_first: Vec<f64> = lazy.iter().map(|r| r.chunks_at_first).collect();
    let (lazy_pulls, lazy_first): (Vec<_>, Vec<_>) = lazy.into_iter().map(|r| (r.report, r.first)).unzip();
    let mut local_first = Vec::new();
    for _ in 0..a.runs {
        local_first.push(spawn_and_exec(&registry, &store, "d1")?);
    }
    let med = |v: &[(f64, f64)], f: fn(&(f64, f64)) -> f64| median(&mut v.iter().map(f).collect::<Vec<_>>());
    let pull_ms: Vec<f64> = pulls.iter().map(|p| p.ms).collect();
    let pull_p50 = median(&mut pull_ms.clone());
    let remote_p50 = med(&remote_first, |x| x.0);
    let local_p50 = med(&local_first, |x| x.1);
    let lazy_p50 = med(&lazy_first, |x| x.0);
    let lazy_pull_p50 = median(&mut lazy_pulls.iter().map(|p| p.ms).collect::<Vec<_>>());
    let d1_own: u64 = d1.bytes_uploaded;
    Ok(json!({
        "bench": "remote",
        "machine": machine(),
        "remote": if a.remote.is_some() { url.clone() } else { "file:// (scratch directory)".into() },
        "push": {
            "base": {
                "blocks": base.blocks, "logical_bytes": base.logical_bytes, "bytes_uploaded": base.bytes_uploaded,
                "ms": r2(base.ms), "logical_mib_per_s": mib_per_s(base.logical_bytes, base.ms),
                "wire_mib_per_s": mib_per_s(base.bytes_uploaded, base.ms),
            },
            "second_tag_d1": {
                "blocks": d1.blocks, "blocks_uploaded": d1.blocks_uploaded, "blocks_present": d1.blocks_present,
                "logical_bytes": d1.logical_bytes, "bytes_uploaded": d1_own, "ms": r2(d1.ms),
                "dedup_ratio": r2(d1.logical_bytes as f64 / d1_own.max(1) as f64),
            },
            "unchanged_again": { "blocks_uploaded": again.blocks_uploaded, "bytes_uploaded": again.bytes_uploaded, "ms": r2(again.ms) },
        },
        "pull_into_empty_store": {
            "runs": pulls.len(), "blocks": pulls[0].blocks, "bytes_fetched": pulls[0].bytes_fetched,
            "ms_p50": r2(pull_p50), "wire_mib_per_s": mib_per_s(pulls[0].bytes_fetched, pull_p50),
            "logical_mib_per_s": mib_per_s(d1.logical_bytes, pull_p50),
        },
        "first_command": {
            "runs": a.runs,
            "from_remote_ms_p50": r2(remote_p50),
            "from_local_store_ms_p50": r2(local_p50),
            "remote_over_local": r2(remote_p50 / local_p50),
            "ready_ms_p50_remote": r2(med(&remote_first, |x| x.1)),
            "ready_ms_p50_local": r2(med(&local_first, |x| x.0)),
            "lazy_from_remote_ms_p50": r2(lazy_p50),
            "lazy_over_local": r2(lazy_p50 / local_p50),
            "lazy_over_whole_pull": r2(lazy_p50 / remote_p50),
            "ready_ms_p50_lazy": r2(med(&lazy_first, |x| x.1)),
            "note": "from_remote = pull of the whole chain into an empty store + spawn + exec true; \
                     lazy = pull --lazy (all but the memory) + spawn + exec true, the memory fetched as touched",
        },
        "lazy_pull": {
            "ms_p50": r2(lazy_pull_p50),
            "bytes_fetched": lazy_pulls[0].bytes_fetched,
            "memory_chunks_left_remote": lazy_pulls[0].chunks_left_remote,
            "memory_chunks_local_at_first_command_p50": median(&mut lazy_chunks_at_first),
            "note": "the disks travel whole (lazy disks are not built yet); the memory chunks at the first command \
                     include those fetched ahead in the background",
        },
    }))
}
