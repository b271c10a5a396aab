//! `forkvm bench build --from TEMPLATE`: what a Dockerfile build costs, as one JSON
//! object. Each round builds the same small Dockerfile (two RUNs, a COPY of a directory
//! of `--files` files, a COPY of one file, READY) in a fresh private store, then again
//! unchanged, then after changing the one-file COPY's source, then after changing a file
//! of the directory COPY. Medians over `--runs`, seconds:
//!
//! * `cold_s`: every step run (the base snapshot published from the cached template
//!   snapshot; the template's own boot is not in it);
//! * `cached_s`: nothing run, every step found; `cached_over_cold` their ratio;
//! * `change_last_s`: the last COPY, the last step and the tag; `change_dir_s`: from the
//!   directory COPY on;
//! * `run_step_s`, `copy_step_s`, `finish_and_publish_s`: one RUN, one directory COPY, and the rest (the
//!   base, the last step, the tag).
//! * `copy_from_step_s`: a second, two-stage Dockerfile whose last stage copies that
//!   directory out of a stage on the first build's tag (`COPY --from`, agent to agent
//!   through the host), against `copy_step_s` from the context; `two_stage_cached_s`
//!   the same build again;
//! * `prune_s`, `pruned`: `template prune` afterwards (host side: the store), and how
//!   many step snapshots it removed (those the changes above left under no tag).
//!
//! Every step forks its parent, works in the guest and takes a diff branch: the guest
//! part is emulated on PVM hosts (PLATFORM.md) and dominates these times there.

use crate::util::{machine, median, r2};
use anyhow::{bail, Result};
use clap::Args;
use forkvm_sandbox::build::{build, BuildReport, BuildRequest};
use forkvm_sandbox::Registry;
use forkvm_snapshot::Store;
use serde_json::json;
use std::path::Path;

#[derive(Args, Debug)]
pub struct BenchBuildArgs {
    /// The template FROM names.
    #[arg(long, default_value = "tiny")]
    pub from: String,
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Files in the directory the COPY step copies (4 KiB each).
    #[arg(long, default_value_t = 200)]
    pub files: usize,
}

pub fn run(a: BenchBuildArgs) -> Result<i32> {
    if a.runs == 0 || a.runs > 20 || a.files > 100_000 {
        bail!("--runs is 1..=20 and --files at most 100000");
    }
    let mut rounds = Vec::new();
    for round in 0..a.runs {
        rounds.push(crate::util::in_scratch_dir(None, &format!("build-{round}"), |dir| {
            let store = Store::open(dir.join("store"));
            let registry = Registry::open(dir.join("run")).salvaging_into(store.root());
            let result = measure(&registry, &store, dir, &a);
            for row in registry.rows() {
                let _ = forkvm_sandbox::verbs::kill_record(&registry, &row.record);
            }
            result
        })?);
    }
    let col = |k: &str| {
        let mut v: Vec<f64> = rounds.iter().filter_map(|r| r[k].as_f64()).collect();
        r2(median(&mut v))
    };
    let (cold, cached) = (col("cold_s"), col("cached_s"));
    let report = json!({
        "bench": "build",
        "command": format!("forkvm bench build --from {} --runs {} --files {}", a.from, a.runs, a.files),
        "from": a.from,
        "runs": a.runs,
        "files": a.files,
        "cold_s": cold,
        "cached_s": cached,
        "cached_over_cold": r2(cached / cold),
        "change_last_s": col("change_last_s"),
        "change_dir_s": col("change_dir_s"),
        "run_step_s": col("run_step_s"),
        "copy_step_s": col("copy_step_s"),
        "finish_and_publish_s": col("finish_and_publish_s"),
        "copy_from_step_s": col("copy_from_step_s"),
        "two_stage_cached_s": col("two_stage_cached_s"),
        "prune_s": col("prune_s"),
        "pruned": col("pruned"),
        "rounds": rounds,
        "machine": machine(),
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(0)
}

const DOCKERFILE: &str = "FROM {from}\n\
    ENV STAGE=bench\n\
    RUN echo warm > /warm\n\
    COPY src/ /app/src/\n\
    RUN ls /app/src | wc -l > /app/count\n\
    COPY last.txt /app/last.txt\n\
    READY test -f /app/count\n";

fn measure(registry: &Registry, store: &Store, dir: &Path, a: &BenchBuildArgs) -> Result<serde_json::Value> {
    let ctx = dir.join("ctx");
    std::fs::create_dir_all(ctx.join("src"))?;
    for i in 0..a.files {
        std::fs::write(ctx.join(format!("src/f{i:06}")), vec![(i % 251) as u8; 4096])?;
    }
    std::fs::write(ctx.join("last.txt"), "one\n")?;
    let req = BuildRequest {
        dockerfile: DOCKERFILE.replace("{from}", &a.from),
        context: forkvm_image::dockerfile::Context::Dir(ctx.clone()),
        build_args: Default::default(),
        tag: "bench".into(),
        replace: false,
        no_cache: false,
        start: false,
    };
    let once = || -> Result<(f64, BuildReport)> {
        let started = std::time::Instant::now();
        let r = build(registry, store, &req, &mut |_| {}, &mut |_| {})?;
        Ok((started.elapsed().as_secs_f64(), r))
    };
    let (cold_s, cold) = once()?;
    let (cached_s, cached) = once()?;
    if cached.ran != 0 {
        bail!("the unchanged build ran {} step(s)", cached.ran);
    }
    std::fs::write(ctx.join("last.txt"), "two\n")?;
    let (change_last_s, last) = once()?;
    std::fs::write(ctx.join("src/f000000"), "changed")?;
    let (change_dir_s, changed) = once()?;
    if (last.ran, changed.ran) != (1, 3) {
        bail!("the changed builds ran {} and {} step(s), not 1 and 3", last.ran, changed.ran);
    }
    let step_s = |i: usize| cold.steps[i].seconds.unwrap_or_default();
    // Two stages: the directory out of a stage on the tag just built, into a fresh one.
    let staged = BuildRequest {
        dockerfile: format!("FROM bench AS gen\nFROM {}\nCOPY --from=gen /app/src /app/src/\n", a.from),
        tag: "bench-staged".into(),
        ..req.clone()
    };
    let two_stage = build(registry, store, &staged, &mut |_| {}, &mut |_| {})?;
    let started = std::time::Instant::now();
    let again = build(registry, store, &staged, &mut |_| {}, &mut |_| {})?;
    let two_stage_cached_s = started.elapsed().as_secs_f64();
    if (two_stage.ran, again.ran) != (1, 0) {
        bail!("the two-stage builds ran {} and {} step(s), not 1 and 0", two_stage.ran, again.ran);
    }
    let started = std::time::Instant::now();
    let pruned = forkvm_sandbox::build::prune::prune(registry, store, &Default::default())?;
    let prune_s = started.elapsed().as_secs_f64();
    Ok(json!({
        "copy_from_step_s": r2(two_stage.steps[0].seconds.unwrap_or_default()),
        "two_stage_cached_s": r2(two_stage_cached_s),
        "prune_s": r2(prune_s),
        "pruned": pruned.removed.len(),
        "pruned_mib": r2(pruned.freed_bytes as f64 / (1u64 << 20) as f64),
        "cold_s": r2(cold_s),
        "cached_s": r2(cached_s),
        "change_last_s": r2(change_last_s),
        "change_dir_s": r2(change_dir_s),
        "run_step_s": r2(step_s(0)),
        "copy_step_s": r2(step_s(1)),
        "finish_and_publish_s": r2(cold_s - cold.steps.iter().filter_map(|s| s.seconds).sum::<f64>()),
    }))
}
