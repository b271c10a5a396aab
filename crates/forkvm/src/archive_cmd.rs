//! `archive ID` (state to the store, process gone), `unarchive ID` (the same sandbox
//! back, processes and files as they were), `archives` (what is archived), and
//! `ttl ID SECONDS` (daemon only). With `--daemon` they go through forkvmd
//! (`remote_cmd::lifecycle`), which records archived sandboxes and lists them.

use crate::remote_cmd::RemoteArgs;
use anyhow::Result;
use clap::Args;
use forkvm_sandbox::archive;
use forkvm_sandbox::Registry;
use forkvm_snapshot::Store;

#[derive(Args, Debug)]
pub struct ArchiveArgs {
    /// The running sandbox.
    pub id: String,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct UnarchiveArgs {
    /// The archived sandbox.
    pub id: String,
    /// Through the daemon: its TTL from now, seconds (0: none) [default: the daemon's].
    #[arg(long)]
    pub ttl: Option<u64>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct TtlArgs {
    /// The sandbox.
    pub id: String,
    /// Archive it this many seconds from now; 0 removes its TTL.
    pub seconds: u64,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct ArchivesArgs {
    #[arg(long)]
    pub json: bool,
}

pub fn archive(a: ArchiveArgs, remote: &RemoteArgs) -> Result<i32> {
    if let Some(code) = crate::remote_cmd::archive(&a, remote)? {
        return Ok(code);
    }
    let r =
        archive::archive(&Registry::open_default(), &Store::open_default(), &a.id, forkvm_sandbox::StateReason::Api)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        println!("{}: archived to {} in {:.0} ms", r.sandbox_id, r.dir.display(), r.total_ms);
    }
    Ok(0)
}

pub fn unarchive(a: UnarchiveArgs, remote: &RemoteArgs) -> Result<i32> {
    if let Some(code) = crate::remote_cmd::unarchive(&a, remote)? {
        return Ok(code);
    }
    if a.ttl.is_some() {
        anyhow::bail!("--ttl needs the daemon (--daemon or FORKVM_DAEMON): TTLs are kept by forkvmd");
    }
    let s = archive::restore(&Registry::open_default(), &Store::open_default(), &a.id)?;
    if a.json {
        println!("{}", serde_json::json!({ "sandbox_id": s.record.id, "pid": s.record.pid, "ready_ms": s.ready_ms }));
    } else {
        println!("{}: running again (ready in {:.0} ms)", s.record.id, s.ready_ms);
    }
    Ok(0)
}

pub fn list(a: ArchivesArgs, remote: &RemoteArgs) -> Result<i32> {
    if let Some(code) = crate::remote_cmd::archives(&a, remote)? {
        return Ok(code);
    }
    let ids = archive::list(&Registry::open_default(), &Store::open_default());
    if a.json {
        println!("{}", serde_json::to_string_pretty(&ids)?);
    } else {
        for id in ids {
            println!("{id}");
        }
    }
    Ok(0)
}

pub fn ttl(a: TtlArgs, remote: &RemoteArgs) -> Result<i32> {
    match crate::remote_cmd::set_ttl(&a, remote)? {
        Some(code) => Ok(code),
        None => {
            anyhow::bail!("ttl needs the daemon (--daemon or FORKVM_DAEMON): TTLs are kept and enforced by forkvmd")
        }
    }
}
