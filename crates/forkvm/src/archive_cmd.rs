//! `archive ID` (state to the store, process gone), `unarchive ID` (the same sandbox
//! back, processes and files as they were), `archives` (what is archived), and
//! `ttl ID SECONDS` (daemon only). Each runs on a [`crate::backend::Backend`]: this
//! host's registry and store, or forkvmd with `--daemon`; both print the same shapes.

use crate::backend;
use crate::remote_cmd::RemoteArgs;
use anyhow::Result;
use clap::Args;
use forkvm_client::api::SandboxInfo;
use forkvm_sandbox::SandboxState;

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

/// The archived sandboxes: their ids (JSON), or one line each with why it was archived.
pub fn list(a: ArchivesArgs, remote: &RemoteArgs) -> Result<i32> {
    let backend = backend::open(remote)?;
    backend.sweep();
    let archived: Vec<SandboxInfo> =
        backend.list()?.into_iter().filter(|s| s.state == SandboxState::Archived.as_str()).collect();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&archived.iter().map(|s| &s.id).collect::<Vec<_>>())?);
    } else {
        for s in archived {
            println!("{}\t{}", s.id, s.reason.as_deref().unwrap_or("-"));
        }
    }
    Ok(0)
}

pub fn ttl(a: TtlArgs, remote: &RemoteArgs) -> Result<i32> {
    let s = backend::open(remote)?.set_ttl(&a.id, a.seconds)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        match s.expires_at_unix_ms {
            Some(at) => println!("{}: archived at {} (Unix ms) unless the TTL changes", s.id, at),
            None => println!("{}: no TTL", s.id),
        }
    }
    Ok(0)
}
