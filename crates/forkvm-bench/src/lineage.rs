//! `forkvm bench lineage --tag T -n N`: what the web console's data costs the daemon, as
//! one JSON object. A `forkvm daemon` started for the bench holds a parent spawned from
//! T, N children forked from it and one live branch of it; then, over `--calls`
//! requests each (p50/p99 ms): `GET /v1/lineage` (the graph the console draws: its node
//! and edge counts and body size too), `GET /v1/sandboxes` and `GET /v1/snapshots` (the
//! console's two tables, fetched beside it every 3 s), and `GET
//! /v1/sandboxes/{id}/usage` (one sparkline sample, every 2 s while a sandbox is
//! selected).
//!
//! None of these reach a guest: they are host-side costs, real on PVM hosts too
//! (PLATFORM.md). Making the tree (the fork and the branch) is guest-bound and reported
//! apart.

use crate::util::{machine, p50_p99, r2};
use anyhow::{bail, Context, Result};
use clap::Args;
use forkvm_client::api::{BranchSandboxRequest, CreateSandboxRequest, ForkSandboxRequest};
use forkvm_client::{Client, Endpoint};
use serde_json::json;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct BenchLineageArgs {
    /// Tag to spawn the parent from.
    #[arg(long)]
    pub tag: String,
    /// Children forked from the parent.
    #[arg(short = 'n', long, default_value_t = 100)]
    pub children: u32,
    /// Requests timed per route.
    #[arg(long, default_value_t = 50)]
    pub calls: usize,
    /// Print JSON only.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: BenchLineageArgs) -> Result<i32> {
    if !(1..=100).contains(&a.children) || !(1..=10_000).contains(&a.calls) {
        bail!("-n is 1..=100 and --calls 1..=10000");
    }
    let mut report = crate::api::with_bench_daemon(|socket| measure(socket, &a))?;
    report["bench"] = "lineage".into();
    report["command"] =
        format!("forkvm bench lineage --tag {} -n {} --calls {} --json", a.tag, a.children, a.calls).into();
    report["machine"] = machine();
    if !a.json {
        eprintln!(
            "{} nodes, {} edges: GET /v1/lineage p50 {} ms ({} bytes); sandboxes {} ms, snapshots {} ms, usage {} ms",
            report["nodes"],
            report["edges"],
            report["lineage_ms"]["p50"],
            report["lineage_body_bytes"],
            report["list_sandboxes_ms"]["p50"],
            report["list_snapshots_ms"]["p50"],
            report["usage_ms"]["p50"]
        );
    }
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(0)
}

/// Milliseconds of each of `n` calls of `call`.
fn timed(n: usize, mut call: impl FnMut() -> Result<()>) -> Result<Vec<f64>> {
    (0..n)
        .map(|_| {
            let t = Instant::now();
            call()?;
            Ok(t.elapsed().as_secs_f64() * 1e3)
        })
        .collect()
}

fn measure(socket: &std::path::Path, a: &BenchLineageArgs) -> Result<serde_json::Value> {
    let client = Client::new(Endpoint::Unix(socket.to_path_buf()), None)?;
    let t = Instant::now();
    let parent = client.spawn(&CreateSandboxRequest::new(&a.tag, 1))?.pop().context("the spawn gave no sandbox")?;
    let spawn_ms = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    let children = client.fork(&parent.id, &ForkSandboxRequest::new(a.children))?;
    let fork_ms = t.elapsed().as_secs_f64() * 1e3;
    let branch_tag = format!("bench-lineage-{}", std::process::id());
    let live = BranchSandboxRequest { tag: Some(branch_tag.clone()), mode: Some("live".into()), ..Default::default() };
    let t = Instant::now();
    let branched = client.branch(&parent.id, &live);
    let branch_ms = t.elapsed().as_secs_f64() * 1e3;
    let measured = branched.map_err(anyhow::Error::from).and_then(|_| {
        let graph = client.lineage()?;
        let want = children.len() + 1;
        let sandboxes = graph.nodes.iter().filter(|n| n.kind == "sandbox").count();
        if sandboxes != want {
            bail!("the lineage shows {sandboxes} sandboxes, {want} run");
        }
        let body_bytes = serde_json::to_vec(&graph)?.len();
        let lineage = timed(a.calls, || Ok(client.lineage().map(drop)?))?;
        let list_sandboxes = timed(a.calls, || Ok(client.list_sandboxes().map(drop)?))?;
        let list_snapshots = timed(a.calls, || Ok(client.list_snapshots().map(drop)?))?;
        let usage = timed(a.calls, || Ok(client.sandbox_usage(&parent.id).map(drop)?))?;
        let sample = client.sandbox_usage(&parent.id)?;
        Ok(json!({
            "children": children.len(),
            "nodes": graph.nodes.len(),
            "edges": graph.edges.len(),
            "lineage_body_bytes": body_bytes,
            "lineage_ms": p50_p99(lineage),
            "list_sandboxes_ms": p50_p99(list_sandboxes),
            "list_snapshots_ms": p50_p99(list_snapshots),
            "usage_ms": p50_p99(usage),
            "parent_usage": { "memory_mib": r2(sample.memory_bytes as f64 / (1u64 << 20) as f64), "cpu_usage_s": r2(sample.cpu_usage_usec as f64 / 1e6) },
            "guest_bound": { "spawn_parent_ms": r2(spawn_ms), "fork_children_ms": r2(fork_ms), "live_branch_ms": r2(branch_ms) },
        }))
    });
    for sb in children.iter().chain([&parent]) {
        let _ = client.kill_sandbox(&sb.id);
    }
    let _ = client.delete_snapshot(&branch_tag, false, false);
    measured
}
