//! `archive ID` (state to the store, process gone), `unarchive ID` (the same sandbox
//! back, processes and files as they were), `archives` (what is archived), and
//! `ttl ID SECONDS` (daemon only). With `--daemon` they go through forkvmd
//! (`remote_cmd::lifecycle`), which records archived sandboxes and lists them.

use crate::backend;
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
    let r = backend::open(remote)?.archive(&a.id)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        println!("{}: archived to {} in {:.0} ms", r.sandbox_id, r.dir, r.total_ms);
    }
    Ok(0)
}

pub fn unarchive(a: UnarchiveArgs, remote: &RemoteArgs) -> Result<i32> {
    let started = std::time::Instant::now();
    let s = backend::open(remote)?.restore(&a.id, a.ttl)?;
    let ready_ms = started.elapsed().as_secs_f64() * 1e3;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        println!("{}: running again (ready in {ready_ms:.0} ms)", s.id);
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
