//! `snapshot create|ls|rm` through the daemon. `sweep` cleans this host's store and
//! always runs locally.

use super::{RemoteArgs, Spinner};
use crate::snapshot_cmd::{SnapshotArgs, SnapshotCommand};
use anyhow::Result;
use forkvm_client::api::CreateSnapshotRequest;

pub fn snapshot(a: &SnapshotArgs, remote: &RemoteArgs) -> Result<Option<i32>> {
    if matches!(a.command, SnapshotCommand::Sweep) {
        return Ok(None);
    }
    let Some(client) = remote.client()? else { return Ok(None) };
    match &a.command {
        SnapshotCommand::Create { image, tag, limits, network, vcpus, json } => {
            let spinner = Spinner::start(format!("snapshot {tag} from template {image} (a first build takes minutes)"));
            let default_limits = limits.spawn_options().asks().then_some(forkvm_client::api::DefaultLimits {
                memory_limit_mib: limits.mem_limit_mib,
                cpu_limit_millis: limits.cpu_limit_millis,
                pids_limit: limits.pids_limit,
                io_limits: limits.io_limits(),
            });
            let req = CreateSnapshotRequest {
                tag: tag.clone(),
                template: image.clone(),
                default_limits,
                default_network: network.policy(),
                vcpus: *vcpus,
            };
            let snap = client.create_snapshot(&req)?;
            drop(spinner);
            if *json {
                println!("{}", serde_json::to_string_pretty(&snap)?);
            } else {
                println!(
                    "{tag}: {} ({} MiB of memory, template {})",
                    snap.dir,
                    snap.memory_logical_bytes >> 20,
                    snap.template.as_deref().unwrap_or(image)
                );
            }
        }
        SnapshotCommand::Ls { json } => {
            let list = client.list_snapshots()?;
            if *json {
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                for s in &list {
                    println!(
                        "{:<40} {:<8} {:<10} {:>6} MiB{}",
                        s.tag,
                        s.status,
                        s.template.as_deref().unwrap_or("-"),
                        s.memory_physical_bytes >> 20,
                        s.branched_from.as_ref().map(|b| format!("  branched from {b}")).unwrap_or_default()
                    );
                }
            }
        }
        SnapshotCommand::Rm { tag, cascade, force } => client.delete_snapshot(tag, *cascade, *force)?,
        SnapshotCommand::Sweep => return Ok(None),
    }
    Ok(Some(0))
}
