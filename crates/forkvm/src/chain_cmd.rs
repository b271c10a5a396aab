//! Diff-snapshot chains on the command line: `snapshot-diff`, `snapshot-info`, `rmi`,
//! `snapshot-compact`, `pack`, `unpack` (forkd's verbs). Each prints a short line, or
//! with `--json` the library's report.

use crate::remote_cmd::RemoteArgs;
use anyhow::{bail, Result};
use clap::Args;
use forkvm_sandbox::source::assembled_cache;
use forkvm_sandbox::{DiffStep, Registry, SpawnOptions};
use forkvm_snapshot::chain::{self, RemoveMode};
use forkvm_snapshot::Store;
use serde::Serialize;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct SnapshotDiffArgs {
    /// The parent snapshot.
    #[arg(long)]
    pub from: String,
    /// The new snapshot (a diff over --from).
    #[arg(long)]
    pub tag: String,
    /// Shell command to run first (repeatable; each must exit 0).
    #[arg(long = "exec", value_name = "CMD")]
    pub exec: Vec<String>,
    /// Python for the warm interpreter, run after the commands (repeatable; must not raise).
    #[arg(long = "eval", value_name = "CODE")]
    pub eval: Vec<String>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct SnapshotInfoArgs {
    pub tag: String,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct RmiArgs {
    pub tag: String,
    /// Also delete every snapshot built on it.
    #[arg(long, conflicts_with = "force")]
    pub cascade: bool,
    /// Delete it even when snapshots are built on it (left orphaned, unbootable) or
    /// running sandboxes were spawned from it (their later branches and disk snapshots fail).
    #[arg(long)]
    pub force: bool,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct CompactArgs {
    /// The chain head to flatten.
    #[arg(long)]
    pub from: String,
    /// The new flat snapshot.
    #[arg(long)]
    pub to: String,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct PackArgs {
    /// The chain head to pack (with all its ancestors).
    #[arg(long)]
    pub tag: String,
    /// The pack to write (`.tar.zst`); refused if it exists.
    #[arg(long)]
    pub out: PathBuf,
    /// Sign the pack with this secret key (`forkvm pack-keygen`). Through a daemon, the
    /// daemon signs with its own `--pack-signing-key` instead.
    #[arg(long, value_name = "KEY")]
    pub sign: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct UnpackArgs {
    /// The pack to import.
    pub pack: PathBuf,
    /// Accept only packs signed by this public key (`KEY.pub`; repeatable). Through a
    /// daemon, the daemon's `--trust-pack-key` decides instead.
    #[arg(long, value_name = "PUBLIC_KEY")]
    pub trust: Vec<PathBuf>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct PackKeygenArgs {
    /// Where to write the secret key (refused if it exists); the public key goes to
    /// PATH.pub.
    pub path: PathBuf,
}

pub fn pack_keygen(a: PackKeygenArgs) -> Result<i32> {
    let public = forkvm_snapshot::pack_archive::signature::generate_key(&a.path)?;
    println!("secret key {} (keep it private), public key {}", a.path.display(), public.display());
    Ok(0)
}

/// Prints `report` as JSON with `--json`, else the one line `line` makes.
pub(crate) fn print<T: Serialize>(json: bool, report: &T, line: impl FnOnce() -> String) -> Result<i32> {
    if json {
        println!("{}", serde_json::to_string_pretty(report)?);
    } else {
        println!("{}", line());
    }
    Ok(0)
}

pub(crate) fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

pub fn snapshot_diff(a: SnapshotDiffArgs, remote: &RemoteArgs) -> Result<i32> {
    if let Some(code) = crate::remote_cmd::snapshot_diff(&a, remote)? {
        return Ok(code);
    }
    if a.exec.is_empty() && a.eval.is_empty() {
        bail!("snapshot-diff needs something to run: --exec CMD or --eval CODE");
    }
    let steps: Vec<DiffStep> =
        a.exec.into_iter().map(DiffStep::Exec).chain(a.eval.into_iter().map(DiffStep::Eval)).collect();
    let r = forkvm_sandbox::snapshot_diff(
        &Registry::open_default(),
        &Store::open_default(),
        &a.from,
        &a.tag,
        &steps,
        &SpawnOptions::default(),
    )?;
    print(a.json, &r, || {
        format!(
            "{}: diff over {} ({} pages, {} new in the chunk store) in {:.0} ms",
            r.diff.tag,
            a.from,
            r.diff.pages,
            mib(r.diff.bytes_stored),
            r.total_ms
        )
    })
}

pub fn snapshot_info(a: SnapshotInfoArgs, remote: &RemoteArgs) -> Result<i32> {
    if let Some(code) = crate::remote_cmd::snapshot_info(&a, remote)? {
        return Ok(code);
    }
    let i = chain::info(&Store::open_default(), &a.tag)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&i)?);
        return Ok(0);
    }
    println!("tag: {}", i.tag);
    println!("chain depth: {}", i.chain_depth);
    println!("parent_tag: {}", i.parent_tag.as_deref().unwrap_or("-"));
    println!("ancestors: {}", if i.ancestors.is_empty() { "-".into() } else { i.ancestors.join(", ") });
    let deps = if i.dependents.is_empty() {
        "-".into()
    } else {
        format!("{} (would be orphaned by `rmi`)", i.dependents.join(", "))
    };
    println!("dependents: {deps}");
    println!(
        "memory: {:?}, {} guest, {} stored by this link, {} on disk ({} for the chain)",
        i.memory_format,
        mib(i.memory_bytes),
        mib(i.logical_bytes),
        mib(i.physical_bytes),
        mib(i.chain_physical_bytes)
    );
    println!("content hash: {}", i.content_hash.as_deref().unwrap_or("-"));
    match &i.problem {
        None => println!("bootable: yes"),
        Some(p) => println!("bootable: no ({p})"),
    }
    Ok(0)
}

pub fn rmi(a: RmiArgs, remote: &RemoteArgs) -> Result<i32> {
    if let Some(code) = crate::remote_cmd::rmi(&a, remote)? {
        return Ok(code);
    }
    let mode = match (a.cascade, a.force) {
        (true, _) => RemoveMode::Cascade,
        (_, true) => RemoveMode::Force,
        _ => RemoveMode::Refuse,
    };
    let store = Store::open_default();
    // Refused for its dependents first (chain::remove says so); then for its users.
    let has_dependents = mode == RemoveMode::Refuse && !chain::info(&store, &a.tag)?.dependents.is_empty();
    if mode != RemoveMode::Force && !has_dependents {
        let mut doomed = vec![a.tag.clone()];
        if mode == RemoveMode::Cascade {
            doomed.extend(chain::info(&store, &a.tag)?.descendants);
        }
        let registry = Registry::open_default();
        for t in &doomed {
            let users = registry.spawned_from(t);
            if !users.is_empty() {
                bail!(
                    "snapshot {t:?} is in use by running sandboxes {}: their data disks read its layers, and \
                     their branches and disk snapshots need them; kill them first, or --force",
                    users.join(", ")
                );
            }
        }
    }
    let r = chain::remove(&store, &assembled_cache(), &a.tag, mode)?;
    print(a.json, &r, || {
        let mut line = format!("removed {}", r.removed.join(", "));
        if !r.orphaned.is_empty() {
            line.push_str(&format!("; orphaned {}", r.orphaned.join(", ")));
        }
        if r.chunks_removed > 0 {
            line.push_str(&format!("; {} chunks ({}) collected", r.chunks_removed, mib(r.chunk_bytes_removed)));
        }
        line
    })
}

pub fn compact(a: CompactArgs, remote: &RemoteArgs) -> Result<i32> {
    if let Some(code) = crate::remote_cmd::compact(&a, remote)? {
        return Ok(code);
    }
    let r = chain::compact(&Store::open_default(), &assembled_cache(), &a.from, &a.to)?;
    print(a.json, &r, || {
        format!("{}: flat copy of {} ({} pages, {} new chunks) in {:.0} ms", r.tag, a.from, r.pages, r.chunks_new, r.ms)
    })
}

pub fn pack(a: PackArgs, remote: &RemoteArgs) -> Result<i32> {
    if let Some(code) = crate::remote_cmd::pack(&a, remote)? {
        return Ok(code);
    }
    let key = a.sign.as_deref().map(forkvm_snapshot::pack_archive::signature::read_secret_key).transpose()?;
    let r = chain::pack_signed(&Store::open_default(), &assembled_cache(), &a.tag, &a.out, key.as_ref())?;
    print(a.json, &r, || {
        format!(
            "{}: {} ({} links, {} chunks, {} disks; {} packed into {}) in {:.0} ms",
            a.tag,
            r.path.display(),
            r.links.len(),
            r.chunks,
            r.disks,
            mib(r.logical_bytes),
            mib(r.pack_bytes),
            r.ms
        )
    })
}

pub fn unpack(a: UnpackArgs, remote: &RemoteArgs) -> Result<i32> {
    if let Some(code) = crate::remote_cmd::unpack(&a, remote)? {
        return Ok(code);
    }
    let trust = forkvm_snapshot::pack_archive::PackTrust::from_files(&a.trust)?;
    let r = chain::unpack_trusted(&Store::open_default(), &a.pack, &trust)?;
    print(a.json, &r, || {
        let mut line = format!(
            "{}: imported {}",
            r.head,
            if r.imported.is_empty() { "nothing".into() } else { r.imported.join(", ") }
        );
        if !r.reused.is_empty() {
            line.push_str(&format!("; reused {}", r.reused.join(", ")));
        }
        if let Some(key) = &r.signed_by {
            line.push_str(&format!("; signed by {key}"));
        }
        format!("{line} in {:.0} ms", r.ms)
    })
}
