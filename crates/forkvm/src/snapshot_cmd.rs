//! `forkvm snapshot create|ls|rm|sweep`: tagged snapshots in the snapshot store.
//!
//! `create --image T --tag X` makes (or finds, by content hash) template T's snapshot —
//! boot, agent ready, warm-up, snapshot — and publishes it as tag X.

use crate::remote_cmd::RemoteArgs;
use anyhow::Result;
use clap::{Args, Subcommand};
use forkvm_snapshot::chain::{self, RemoveMode};
use forkvm_snapshot::Store;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct SnapshotArgs {
    #[command(subcommand)]
    pub command: SnapshotCommand,
}

#[derive(Subcommand, Debug)]
pub enum SnapshotCommand {
    /// Boot a template (once, cached), warm it up, and publish its snapshot as a tag.
    Create {
        /// Template name: built in (tiny, python) or from the template directory.
        #[arg(long)]
        image: String,
        /// The new tag.
        #[arg(long)]
        tag: String,
        /// The tag's default limits for the sandboxes spawned from it (a spawn may ask
        /// for others).
        #[command(flatten)]
        limits: crate::limit_args::LimitArgs,
        /// The tag's default egress policy for the sandboxes spawned from it (a spawn may
        /// ask for another; spawning from a tag with one needs the daemon).
        #[command(flatten)]
        network: crate::network_cmd::NetworkArgs,
        /// vCPUs of the tag's sandboxes (the template boots on that many once, cached; a
        /// sandbox keeps its snapshot's count); default: the template's `vcpus`, else 1.
        #[arg(long)]
        vcpus: Option<u8>,
        #[arg(long)]
        json: bool,
    },
    /// List the tags in the store.
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Delete a tag (refused while other snapshots are built on it; same as `rmi`).
    Rm {
        tag: String,
        /// Also delete every snapshot built on it.
        #[arg(long, conflicts_with = "force")]
        cascade: bool,
        /// Leave the snapshots built on it orphaned (unbootable).
        #[arg(long)]
        force: bool,
    },
    /// Remove what crashed writers left (`.partial` directories, `writing` snapshots of
    /// dead writers, staging directories) and chunks no snapshot references.
    Sweep,
}

pub fn run(a: SnapshotArgs, remote: &RemoteArgs) -> Result<i32> {
    if let Some(code) = crate::remote_cmd::snapshot(&a, remote)? {
        return Ok(code);
    }
    let store = Store::open_default();
    match a.command {
        SnapshotCommand::Create { image, tag, limits, network, vcpus, json } => {
            // Refuse a bad or taken tag, or bad limits, before a (possibly minutes-long)
            // template boot.
            store.check_free(&tag)?;
            let defaults = limits.spawn_options();
            let policy = network.policy();
            forkvm_sandbox::check_tag_defaults(&defaults, policy.as_ref())?;
            let started = Instant::now();
            let template = forkvm_bench::util::template_snapshot(&image, vcpus)?;
            let snap = forkvm_sandbox::publish_template(&store, &template, &tag, &defaults, policy.as_ref())?;
            let report = serde_json::json!({
                "tag": tag, "dir": snap.path, "template": image, "template_key": template.key,
                "booted": template.boot_seconds.is_some(), "boot_seconds": template.boot_seconds,
                "mem_size_bytes": snap.meta.mem_size_bytes,
                "vcpus": snap.meta.vcpu_count,
                "memory_bytes_allocated": snap.meta.memory_bytes_allocated,
                "default_limits": snap.meta.default_limits,
                "default_network": snap.meta.default_network,
                "total_ms": (started.elapsed().as_secs_f64() * 1e4).round() / 10.0,
            });
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                println!(
                    "{tag}: {} ({} MiB of memory, {} vCPU(s), template {image})",
                    snap.path.display(),
                    snap.meta.mem_size_bytes >> 20,
                    snap.meta.vcpu_count
                );
            }
        }
        SnapshotCommand::Ls { json } => {
            let entries = store.list();
            if json {
                let rows: Vec<_> = entries
                    .iter()
                    .map(|e| {
                        serde_json::json!({
                            "tag": e.tag, "status": e.meta.status, "template": e.meta.template,
                            "branched_from": e.meta.branched_from, "created_at_unix_ms": e.meta.created_at_unix_ms,
                            "mem_size_bytes": e.meta.mem_size_bytes,
                            "memory_bytes_allocated": e.meta.memory_bytes_allocated,
                        })
                    })
                    .collect();
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                for e in &entries {
                    let status = serde_json::to_value(e.meta.status)?;
                    println!(
                        "{:<40} {:<8} {:<10} {:>6} MiB{}",
                        e.tag,
                        status.as_str().unwrap_or(""),
                        e.meta.template.as_deref().unwrap_or("-"),
                        e.meta.memory_bytes_allocated >> 20,
                        e.meta.branched_from.as_ref().map(|b| format!("  branched from {b}")).unwrap_or_default()
                    );
                }
            }
        }
        SnapshotCommand::Rm { tag, cascade, force } => {
            let mode = match (cascade, force) {
                (true, _) => RemoveMode::Cascade,
                (_, true) => RemoveMode::Force,
                _ => RemoveMode::Refuse,
            };
            chain::remove(&store, &forkvm_sandbox::source::assembled_cache(), &tag, mode)?;
        }
        SnapshotCommand::Sweep => {
            for name in store.sweep() {
                println!("removed {name}");
            }
            let gc = chain::collect_garbage(&store)?;
            if gc.removed > 0 {
                println!("removed {} unreferenced chunks ({} bytes)", gc.removed, gc.removed_bytes);
            }
        }
    }
    Ok(0)
}
