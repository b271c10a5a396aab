//! `forkvm bench guard`: flags a regression of a spawn's host-side cost per child before
//! it lands. Host CPU per child once grew 2–3× (and a template's memory playbook came to
//! map all of its memory into every child) without anyone noticing; the guard spawns the
//! `python` template's warm parent (`bench spawn`'s, made the first time) and compares
//! its per-child figures with the ceilings of a baseline file (`bench/guard.json`).
//!
//! Host-side figures only (CPU time, memory, pages): guest-side times on PVM hosts are
//! emulated and too noisy to guard. A figure fails only when it is over its ceiling in
//! both of two runs, so one noisy run does not fail it; a spawn of one sandbox before
//! them teaches the template's memory playbook where it has none yet, so both runs
//! replay it. Each run is a `bench spawn` process of its own, as a user's first spawn is
//! (a process that already spawned forks more page tables). Ceilings are per build
//! profile (a debug build does more work per call).

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Deserialize;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct BenchGuardArgs {
    /// The ceilings: a JSON file with `n`, `tolerance` and, per build profile, the baseline
    /// of each guarded figure.
    #[arg(long, default_value = "bench/guard.json")]
    pub baseline: PathBuf,
    /// Print JSON only.
    #[arg(long)]
    pub json: bool,
}

/// The baseline file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Baseline {
    /// Where the baselines came from (machine, commit, command); for readers.
    #[serde(default)]
    #[allow(dead_code)]
    about: String,
    /// Sandboxes per run.
    n: usize,
    /// How far over its baseline a figure may go.
    tolerance: f64,
    /// Per build profile (`debug`, `release`): figure of `bench spawn`'s report → baseline.
    profiles: BTreeMap<String, BTreeMap<String, f64>>,
}

/// The build profile of this binary, as the baseline file names it.
pub(crate) fn build_profile() -> &'static str {
    if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    }
}

/// `forkvm bench spawn -n N --cold 0 --json` of the python template's warm parent, run
/// by this same binary in a process of its own; its report.
fn spawn_report(n: usize) -> Result<serde_json::Value> {
    let exe = std::env::current_exe().context("finding this forkvm binary")?;
    let out = std::process::Command::new(&exe)
        .args(["bench", "spawn", "-n", &n.to_string(), "--template", "python", "--cold", "0", "--json"])
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("running {} bench spawn", exe.display()))?;
    if !out.status.success() {
        bail!("bench spawn -n {n} failed ({})", out.status);
    }
    serde_json::from_slice(&out.stdout).context("parsing bench spawn's report")
}

/// The figures of `report` the baseline guards, by name; a missing one is an error (the
/// report changed and the guard would silently guard nothing).
fn figures(report: &serde_json::Value, guarded: &BTreeMap<String, f64>) -> Result<BTreeMap<String, f64>> {
    guarded
        .keys()
        .map(|k| {
            let v = report[k.as_str()].as_f64().with_context(|| format!("bench spawn's report has no figure {k:?}"))?;
            Ok((k.clone(), v))
        })
        .collect()
}

/// The figures over `limit` in every run.
fn over_in_every_run(runs: &[BTreeMap<String, f64>], limits: &BTreeMap<String, f64>) -> Vec<String> {
    limits
        .iter()
        .filter(|(k, limit)| runs.iter().all(|r| r.get(*k).is_some_and(|v| v > limit)))
        .map(|(k, _)| k.clone())
        .collect()
}

pub fn run(a: BenchGuardArgs) -> Result<i32> {
    let text = std::fs::read_to_string(&a.baseline).with_context(|| format!("reading {}", a.baseline.display()))?;
    let baseline: Baseline =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", a.baseline.display()))?;
    if baseline.n == 0 || baseline.tolerance.is_nan() || baseline.tolerance < 1.0 {
        bail!("{}: n must be at least 1 and tolerance at least 1.0", a.baseline.display());
    }
    let profile = build_profile();
    let Some(base) = baseline.profiles.get(profile) else {
        bail!("{} has no baselines for a {profile} build", a.baseline.display());
    };
    let limits: BTreeMap<String, f64> = base.iter().map(|(k, v)| (k.clone(), v * baseline.tolerance)).collect();
    spawn_report(1).context("the spawn that teaches the memory playbook")?;
    let mut runs = Vec::new();
    for run in 1..=2 {
        let report = spawn_report(baseline.n).with_context(|| format!("guard run {run}"))?;
        runs.push(figures(&report, base)?);
    }
    let regressed = over_in_every_run(&runs, &limits);
    let report = json!({
        "bench": "guard",
        "baseline": a.baseline.display().to_string(),
        "profile": profile,
        "machine": crate::util::machine(),
        "n": baseline.n,
        "tolerance": baseline.tolerance,
        "baselines": base,
        "limits": limits,
        "runs": runs,
        "regressed": regressed,
    });
    if !a.json {
        for k in limits.keys() {
            let seen: Vec<String> = runs.iter().map(|r| format!("{:.3}", r[k])).collect();
            let verdict = if regressed.contains(k) { "REGRESSED" } else { "ok" };
            eprintln!(
                "{k:<34} baseline {:>10.3}  limit {:>10.3}  runs {}  {verdict}",
                base[k],
                limits[k],
                seen.join(" ")
            );
        }
    }
    println!("{}", serde_json::to_string_pretty(&report)?);
    if !regressed.is_empty() {
        eprintln!("bench guard: over the ceilings of {} in both runs: {}", a.baseline.display(), regressed.join(", "));
        return Ok(1);
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figs(pairs: &[(&str, f64)]) -> BTreeMap<String, f64> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn a_figure_regresses_only_when_over_its_limit_in_every_run() {
        let limits = figs(&[("cpu", 2.0), ("kib", 100.0)]);
        let runs = [figs(&[("cpu", 2.5), ("kib", 150.0)]), figs(&[("cpu", 1.5), ("kib", 120.0)])];
        assert_eq!(over_in_every_run(&runs, &limits), ["kib"]);
        let calm = [figs(&[("cpu", 2.0), ("kib", 100.0)])];
        assert!(over_in_every_run(&calm, &limits).is_empty(), "at the limit is not over it");
    }

    #[test]
    fn a_guarded_figure_missing_from_the_report_is_an_error() {
        let report = json!({ "cpu": 1.0 });
        assert_eq!(figures(&report, &figs(&[("cpu", 1.0)])).unwrap(), figs(&[("cpu", 1.0)]));
        let e = figures(&report, &figs(&[("gone", 1.0)])).unwrap_err();
        assert!(e.to_string().contains("\"gone\""), "{e}");
    }

    #[test]
    fn the_committed_baseline_parses_and_guards_figures_bench_spawn_reports() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../bench/guard.json");
        let b: Baseline = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        assert!(b.n >= 1 && b.tolerance >= 1.0);
        for profile in ["debug", "release"] {
            let base = &b.profiles[profile];
            assert!(!base.is_empty(), "{profile}");
            for (k, v) in base {
                assert!(*v > 0.0, "{profile}: {k} = {v}");
                // Names `bench spawn` writes into its report.
                assert!(include_str!("spawn.rs").contains(&format!("\"{k}\"")), "{k} is not a bench spawn figure");
            }
        }
    }
}
