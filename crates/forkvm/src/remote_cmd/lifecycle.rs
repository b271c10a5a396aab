//! Lifecycle verbs through the daemon: `archives`, `disk-fork ID` and `ttl ID SECONDS`
//! (daemon only: TTLs are the daemon's). `archive` and `unarchive` run on a backend.

use super::{RemoteArgs, Spinner};
use crate::archive_cmd::{ArchivesArgs, TtlArgs};
use crate::disk_cmd::DiskForkArgs;
use anyhow::Result;
use forkvm_client::api::{DiskForkRequest, DiskRestoreMode};

pub fn archives(a: &ArchivesArgs, remote: &RemoteArgs) -> Result<Option<i32>> {
    let Some(client) = remote.client()? else { return Ok(None) };
    let archived: Vec<_> = client
        .list_sandboxes()?
        .into_iter()
        .filter(|s| s.state == forkvm_sandbox::SandboxState::Archived.as_str())
        .collect();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&archived.iter().map(|s| &s.id).collect::<Vec<_>>())?);
    } else {
        for s in archived {
            println!("{}\t{}", s.id, s.reason.as_deref().unwrap_or("-"));
        }
    }
    Ok(Some(0))
}

pub fn disk_fork(a: &DiskForkArgs, remote: &RemoteArgs) -> Result<Option<i32>> {
    let Some(client) = remote.client()? else { return Ok(None) };
    let started = std::time::Instant::now();
    let restore = match a.restore {
        crate::disk_cmd::RestoreArg::Eager => DiskRestoreMode::Eager,
        crate::disk_cmd::RestoreArg::Lazy => DiskRestoreMode::Lazy,
        crate::disk_cmd::RestoreArg::LazyPlaybook => DiskRestoreMode::LazyPlaybook,
    };
    let req =
        DiskForkRequest { seq: a.seq, memory_limit_mib: a.mem_limit_mib, ttl_seconds: None, restore: Some(restore) };
    let s = {
        let _spinner = Spinner::start(format!("booting a new sandbox on {}'s disk", a.id));
        client.disk_fork(&a.id, &req)?
    };
    let ready_ms = started.elapsed().as_secs_f64() * 1e3;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        println!("{} (booted on {}'s disk in {:.1} s)", s.id, a.id, ready_ms / 1e3);
    }
    Ok(Some(0))
}

pub fn set_ttl(a: &TtlArgs, remote: &RemoteArgs) -> Result<Option<i32>> {
    let Some(client) = remote.client()? else { return Ok(None) };
    let s = client.set_ttl(&a.id, a.seconds)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        match s.expires_at_unix_ms {
            Some(at) => println!("{}: archived at {} (Unix ms) unless the TTL changes", s.id, at),
            None => println!("{}: no TTL", s.id),
        }
    }
    Ok(Some(0))
}
