//! `push`, `pull`, `remote-keygen`, `remote-tags`, `remote-rm`, `remote-gc`, `remote-locks`,
//! `remote-unlock`: the store's chains in object storage
//! (`forkvm-remote`). A remote is a URL (`s3://bucket/prefix`, `gs://…`, `az://…`,
//! `file:///dir`), from `--to`/`--from` or `$FORKVM_REMOTE`; its key is `--key-file`,
//! `$FORKVM_REMOTE_KEY` or `remote.key` in the vault's keys directory.
//!
//! They act on this host's store directly (a daemon's sandboxes fork from a pulled tag
//! like from any other).

use crate::chain_cmd::{mib, print};
use anyhow::{Context, Result};
use clap::Args;
use forkvm_remote::push::Progress;
use forkvm_remote::{Remote, RemoteKey};
use forkvm_sandbox::replication::host_block_cache;
use forkvm_sandbox::source::assembled_cache;
use forkvm_snapshot::Store;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Environment variable naming the default remote.
const REMOTE_ENV: &str = "FORKVM_REMOTE";

#[derive(Args, Debug)]
pub struct RemoteOpts {
    /// The remote key (32 bytes, 0600) [default: $FORKVM_REMOTE_KEY, else remote.key in the keys directory].
    #[arg(long, value_name = "FILE")]
    pub key_file: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct PushArgs {
    /// The snapshot (template or branch) whose chain to push.
    pub tag: String,
    /// The remote URL [default: $FORKVM_REMOTE].
    #[arg(long, value_name = "URL")]
    pub to: Option<String>,
    #[command(flatten)]
    pub opts: RemoteOpts,
}

#[derive(Args, Debug)]
pub struct PullArgs {
    /// The tag to bring into this host's store.
    pub tag: String,
    /// The remote URL [default: $FORKVM_REMOTE].
    #[arg(long, value_name = "URL")]
    pub from: Option<String>,
    /// Leave the memory on the remote: sandboxes spawned from the tag start at once and
    /// fetch the memory they touch while they run (the rest follows in the background).
    #[arg(long)]
    pub lazy: bool,
    #[command(flatten)]
    pub opts: RemoteOpts,
}

#[derive(Args, Debug)]
pub struct RemoteKeygenArgs {
    /// Where to write it [default: $FORKVM_REMOTE_KEY, else remote.key in the keys directory].
    #[arg(long, value_name = "FILE")]
    pub key_file: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct RemoteTagsArgs {
    /// The remote URL [default: $FORKVM_REMOTE].
    #[arg(long, value_name = "URL")]
    pub from: Option<String>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct RemoteRmArgs {
    /// The tag whose manifest to remove (its blocks go at the next remote-gc).
    pub tag: String,
    /// The remote URL [default: $FORKVM_REMOTE].
    #[arg(long, value_name = "URL")]
    pub from: Option<String>,
}

#[derive(Args, Debug)]
pub struct RemoteGcArgs {
    /// The remote URL [default: $FORKVM_REMOTE].
    #[arg(long, value_name = "URL")]
    pub from: Option<String>,
    /// Keep unreferenced blocks younger than this (a cut-off push resumes with them):
    /// seconds, or with s/m/h/d.
    #[arg(long, value_name = "AGE", default_value = "1d")]
    pub min_age: String,
    /// Count what would go; delete nothing.
    #[arg(long)]
    pub dry_run: bool,
    #[command(flatten)]
    pub opts: RemoteOpts,
}

#[derive(Args, Debug)]
pub struct RemoteUnlockArgs {
    /// The lock's name, as remote-locks lists it (`shared-<16 hex>` or `exclusive-<16 hex>`).
    pub name: String,
    /// The remote URL [default: $FORKVM_REMOTE].
    #[arg(long, value_name = "URL")]
    pub from: Option<String>,
}

fn open(url: Option<&str>) -> Result<Remote> {
    let url = match url {
        Some(u) => u.to_string(),
        None => std::env::var(REMOTE_ENV)
            .ok()
            .filter(|u| !u.is_empty())
            .context("no remote: give --to/--from URL or set FORKVM_REMOTE (s3://bucket/prefix, file:///dir)")?,
    };
    Ok(Remote::open(&url)?)
}

fn key(opts: &RemoteOpts) -> Result<RemoteKey> {
    Ok(RemoteKey::load(&opts.key_file.clone().unwrap_or_else(RemoteKey::default_path))?)
}

/// Runs `work` with a progress bar on a terminal (not with --json).
fn with_progress<T: Send>(json: bool, verb: &str, work: impl FnOnce(&Progress) -> T + Send) -> T {
    let progress = Progress::default();
    if json || !std::io::stderr().is_terminal() {
        return work(&progress);
    }
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg} {bar:30} {pos}/{len} blocks, {prefix}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message(verb.to_string());
    let done = std::sync::atomic::AtomicBool::new(false);
    let out = std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                bar.set_length(progress.blocks.load(Ordering::Relaxed));
                bar.set_position(progress.moved.load(Ordering::Relaxed));
                bar.set_prefix(format!("{:.1} MiB", progress.bytes.load(Ordering::Relaxed) as f64 / 1048576.0));
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let out = work(&progress);
        done.store(true, Ordering::Relaxed);
        out
    });
    bar.finish_and_clear();
    out
}

pub fn push(a: PushArgs) -> Result<i32> {
    let (remote, key) = (open(a.to.as_deref())?, key(&a.opts)?);
    let store = Store::open_default();
    let r = with_progress(a.opts.json, "pushing", |p| {
        forkvm_remote::push(&store, &assembled_cache(), &a.tag, &remote, &key, p)
    })?;
    print(a.opts.json, &r, || {
        format!(
            "{} → {}: {} links, {} blocks ({} uploaded, {} already there), {} sent in {:.0} ms",
            r.tag,
            r.remote,
            r.links.len(),
            r.blocks,
            r.blocks_uploaded,
            r.blocks_present + r.blocks_repeated,
            mib(r.bytes_uploaded),
            r.ms
        )
    })
}

pub fn pull(a: PullArgs) -> Result<i32> {
    let (remote, key) = (open(a.from.as_deref())?, key(&a.opts)?);
    let store = Store::open_default();
    let cache = host_block_cache();
    let pull = if a.lazy { forkvm_remote::pull_lazy } else { forkvm_remote::pull };
    let r = with_progress(a.opts.json, "pulling", |p| pull(&store, &a.tag, &remote, &key, &cache, p))?;
    print(a.opts.json, &r, || {
        let lazy = match r.chunks_left_remote {
            0 => String::new(),
            n => format!("; {n} memory chunks left on the remote, fetched by its sandboxes as they run"),
        };
        format!(
            "{} ← {}: imported {}; {} blocks ({} fetched, {} cached, {} in the store), {} received in {:.0} ms{lazy}",
            r.tag,
            r.remote,
            if r.imported.is_empty() { "nothing new".into() } else { r.imported.join(", ") },
            r.blocks,
            r.blocks_fetched,
            r.blocks_cached,
            r.blocks_local,
            mib(r.bytes_fetched),
            r.ms
        )
    })
}

pub fn keygen(a: RemoteKeygenArgs) -> Result<i32> {
    let path = a.key_file.unwrap_or_else(RemoteKey::default_path);
    RemoteKey::generate(&path)?;
    println!("remote key {} (0600): copy it to every host that shares the remote", path.display());
    Ok(0)
}

pub fn tags(a: RemoteTagsArgs) -> Result<i32> {
    let remote = open(a.from.as_deref())?;
    let tags = remote.tags()?;
    print(a.json, &tags, || tags.join("\n"))
}

pub fn rm(a: RemoteRmArgs) -> Result<i32> {
    let remote = open(a.from.as_deref())?;
    forkvm_remote::gc::remove_tag(&remote, &a.tag)?;
    println!("{} removed from {} (its blocks go at the next remote-gc)", a.tag, remote.url());
    Ok(0)
}

pub fn gc(a: RemoteGcArgs) -> Result<i32> {
    let (remote, key) = (open(a.from.as_deref())?, key(&a.opts)?);
    let min_age = crate::checkpoint_cmd::parse_duration(&a.min_age)
        .and_then(|s| Ok(Duration::try_from_secs_f64(s)?))
        .context("--min-age")?;
    let r = forkvm_remote::gc::collect(&remote, &key, min_age, a.dry_run)?;
    print(a.opts.json, &r, || {
        format!(
            "{}: {} blocks, {} named by {} tags, {} younger than {}; {} {} unreferenced blocks ({}) in {:.0} ms",
            r.remote,
            r.blocks,
            r.blocks_referenced,
            r.tags,
            r.blocks_young,
            a.min_age,
            if r.dry_run { "would delete" } else { "deleted" },
            r.blocks_deleted,
            mib(r.bytes_deleted),
            r.ms
        )
    })
}

/// A lock's holder in one phrase: `push d1 on host "a" (pid 7)`.
fn holder(l: &forkvm_remote::lock::LockInfo) -> String {
    match (&l.purpose, &l.host, l.pid) {
        (Some(p), Some(h), Some(pid)) => format!("{p} on host {h:?} (pid {pid})"),
        _ => "unreadable".into(),
    }
}

pub fn locks(a: RemoteTagsArgs) -> Result<i32> {
    let remote = open(a.from.as_deref())?;
    let locks = forkvm_remote::lock::list_locks(&remote)?;
    print(a.json, &locks, || {
        if locks.is_empty() {
            return format!("{}: no locks", remote.url());
        }
        let lines: Vec<String> = locks
            .iter()
            .map(|l| {
                let stale = if l.stale { ", stale (ignored)" } else { "" };
                format!("{}  {}, refreshed {} s ago{stale}", l.name, holder(l), l.age_s)
            })
            .collect();
        lines.join("\n")
    })
}

pub fn unlock(a: RemoteUnlockArgs) -> Result<i32> {
    let remote = open(a.from.as_deref())?;
    let l = forkvm_remote::lock::break_lock(&remote, &a.name)?;
    println!("{} removed from {} ({}, refreshed {} s ago)", l.name, remote.url(), holder(&l), l.age_s);
    Ok(0)
}

#[derive(Args, Debug)]
pub struct ReplicateArgs {
    /// The sandbox whose vault (disk snapshots) to ship.
    pub id: String,
    /// The remote URL [default: $FORKVM_REMOTE].
    #[arg(long, value_name = "URL")]
    pub to: Option<String>,
    #[command(flatten)]
    pub opts: RemoteOpts,
}

#[derive(Args, Debug)]
pub struct RestoreSandboxArgs {
    /// The remote URL [default: $FORKVM_REMOTE].
    #[arg(long, value_name = "URL")]
    pub from: Option<String>,
    /// The remote key [default: $FORKVM_REMOTE_KEY, else remote.key in the keys directory].
    #[arg(long, value_name = "FILE")]
    pub key_file: Option<PathBuf>,
    /// Only bring the vault (and the template) to this host; boot nothing.
    #[arg(long)]
    pub no_start: bool,
    #[command(flatten)]
    pub fork: crate::disk_cmd::DiskForkArgs,
}

fn replication(url: Option<&str>, key_file: Option<&PathBuf>) -> Result<forkvm_sandbox::replication::Replication> {
    let remote = open(url)?;
    let key = key_file.cloned().unwrap_or_else(RemoteKey::default_path);
    Ok(forkvm_sandbox::replication::Replication::open(remote.url(), &key)?)
}

pub fn replicate(a: ReplicateArgs) -> Result<i32> {
    let r = replication(a.to.as_deref(), a.opts.key_file.as_ref())?.replicate(&Store::open_default(), &a.id)?;
    print(a.opts.json, &r, || {
        format!(
            "{} → {}: {} files uploaded ({}), {} there already; {} snapshots there, newest {}",
            r.sandbox_id,
            r.remote,
            r.files_uploaded,
            mib(r.bytes_uploaded),
            r.files_present,
            r.snapshots,
            r.newest_seq.map(|s| s.to_string()).unwrap_or_else(|| "none".into())
        )
    })
}

pub fn restore_sandbox(a: RestoreSandboxArgs, remote_args: &crate::remote_cmd::RemoteArgs) -> Result<i32> {
    let rep = replication(a.from.as_deref(), a.key_file.as_ref())?;
    let r = rep.restore(&Store::open_default(), &a.fork.id, &host_block_cache())?;
    let line = format!(
        "{} ← {}: {} files fetched ({}), {} here already; newest disk snapshot {} of {}",
        r.sandbox_id,
        r.remote,
        r.files_fetched,
        mib(r.bytes_fetched),
        r.files_present,
        r.newest_seq.map(|s| s.to_string()).unwrap_or_else(|| "none".into()),
        r.snapshots
    );
    if a.no_start {
        return print(a.fork.json, &r, || line);
    }
    eprintln!("{line}");
    crate::disk_cmd::fork(a.fork, remote_args)
}
