//! Disk snapshots on the command line: `disk-snapshot ID` takes one now,
//! `disk-snapshots ID` lists a sandbox's, `disk-export` writes one out as a raw image,
//! `disk-fork ID` boots a new sandbox on one (a disk-only fork).
//! (The daemon takes them continuously; see `forkvm_sandbox::disk_snapshots`.) With
//! `--daemon`, `disk-snapshot` and `disk-snapshots` go through the daemon's API
//! (`remote_cmd::disk`), so a snapshot it asks for waits for the daemon's own.

use crate::remote_cmd::RemoteArgs;
use anyhow::{bail, Context, Result};
use clap::Args;
use forkvm_sandbox::disk_snapshots::{self, DEFAULT_RETENTION};
use forkvm_sandbox::start::disk::DiskRestore;
use forkvm_sandbox::Registry;
use forkvm_snapshot::vault::{RetentionPolicy, SnapshotInfo};
use forkvm_snapshot::Store;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct DiskSnapshotArgs {
    /// The running sandbox.
    pub id: String,
    /// Keep the newest N snapshots (and the hourly/daily ones below) [default: 60; with
    /// --daemon, the daemon's --disk-retention-keep-last].
    #[arg(long)]
    pub keep_last: Option<u32>,
    /// Also keep the newest of each of the last N hours [default: 24, or the daemon's].
    #[arg(long)]
    pub keep_hourly: Option<u32>,
    /// Also keep the newest of each of the last N days [default: 7, or the daemon's].
    #[arg(long)]
    pub keep_daily: Option<u32>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct DiskSnapshotsArgs {
    /// The sandbox (running or not: its vault outlives it).
    pub id: String,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct DiskForkArgs {
    /// The sandbox whose disk snapshot to boot (running, archived or gone).
    pub id: String,
    /// The snapshot's sequence number [default: the newest].
    #[arg(long)]
    pub seq: Option<u64>,
    #[command(flatten)]
    pub limits: crate::limit_args::LimitArgs,
    /// How the disk is restored: `lazy-playbook` (fetch on first read, replay the
    /// template's playbook), `lazy` (fetch on first read) or `eager` (decrypt it all first).
    #[arg(long, value_enum, default_value = "lazy-playbook")]
    pub restore: RestoreArg,
    #[arg(long)]
    pub json: bool,
}

/// `--restore` of `disk-fork`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestoreArg {
    Eager,
    Lazy,
    LazyPlaybook,
}

impl From<RestoreArg> for DiskRestore {
    fn from(a: RestoreArg) -> DiskRestore {
        match a {
            RestoreArg::Eager => DiskRestore::Eager,
            RestoreArg::Lazy => DiskRestore::Lazy,
            RestoreArg::LazyPlaybook => DiskRestore::LazyPlaybook,
        }
    }
}

#[derive(Args, Debug)]
pub struct DiskExportArgs {
    /// The sandbox whose snapshot to export.
    pub id: String,
    /// The snapshot's sequence number [default: the newest].
    #[arg(long)]
    pub seq: Option<u64>,
    /// Which disk (its serial).
    #[arg(long, default_value = forkvm_sandbox::source::DATA_DISK_ID)]
    pub disk: String,
    /// The base image the disk's layers sit on [default: the blank data-disk base in
    /// the image cache]; it must be the one the snapshot names.
    #[arg(long)]
    pub base: Option<PathBuf>,
    /// The raw image to write (refused if it exists).
    #[arg(long)]
    pub out: PathBuf,
}

pub fn snapshot(a: DiskSnapshotArgs, remote: &RemoteArgs) -> Result<i32> {
    if let Some(code) = crate::remote_cmd::disk_snapshot(&a, remote)? {
        return Ok(code);
    }
    let d = DEFAULT_RETENTION;
    let policy = RetentionPolicy {
        keep_last: a.keep_last.unwrap_or(d.keep_last),
        keep_hourly: a.keep_hourly.unwrap_or(d.keep_hourly),
        keep_daily: a.keep_daily.unwrap_or(d.keep_daily),
    };
    let r = disk_snapshots::take(&Registry::open_default(), &Store::open_default(), &a.id, &policy)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        println!(
            "{}",
            report_line(&r.sandbox_id, r.seq, r.unchanged, r.written_chunks, r.written_bytes, r.seal_ms, r.write_ms)
        );
    }
    Ok(0)
}

/// The line `disk-snapshot` prints (locally or through the daemon).
pub fn report_line(
    id: &str,
    seq: u64,
    unchanged: bool,
    chunks: u64,
    bytes: u64,
    seal_ms: f64,
    write_ms: f64,
) -> String {
    if unchanged {
        return format!("{id}: nothing written since disk snapshot {seq}");
    }
    format!(
        "{id}: disk snapshot {seq} ({chunks} chunks, {:.1} MiB written; sealed in {seal_ms:.1} ms, written in {write_ms:.0} ms)",
        bytes as f64 / (1 << 20) as f64,
    )
}

/// A snapshot as the API shows it (`--json` prints the same shape locally and remotely).
pub fn info_view(s: &SnapshotInfo) -> forkvm_client::api::DiskSnapshotInfo {
    forkvm_client::api::DiskSnapshotInfo {
        seq: s.seq,
        created_unix_ms: s.created_unix_ms,
        stored_bytes: s.stored_bytes,
        disks: s
            .disks
            .iter()
            .map(|d| forkvm_client::api::DiskSnapshotDisk {
                id: d.id.clone(),
                base_key: d.base_key.clone(),
                size: d.size,
                layer_id: d.layer_id.clone(),
                blocks: d.blocks,
                extents: d.extents,
            })
            .collect(),
    }
}

/// Prints a list of disk snapshots (table or `--json`).
pub fn print_list(all: &[forkvm_client::api::DiskSnapshotInfo], json: bool) -> Result<i32> {
    if json {
        println!("{}", serde_json::to_string_pretty(all)?);
        return Ok(0);
    }
    for s in all {
        let blocks: u64 = s.disks.iter().map(|d| d.blocks).sum();
        println!(
            "{:>6}  {}  {} blocks  {:.1} MiB stored",
            s.seq,
            s.created_unix_ms,
            blocks,
            s.stored_bytes as f64 / (1 << 20) as f64
        );
    }
    Ok(0)
}

pub fn list(a: DiskSnapshotsArgs, remote: &RemoteArgs) -> Result<i32> {
    if let Some(code) = crate::remote_cmd::disk_snapshots(&a, remote)? {
        return Ok(code);
    }
    let all = disk_snapshots::list(&Store::open_default(), &a.id)?;
    print_list(&all.iter().map(info_view).collect::<Vec<_>>(), a.json)
}

pub fn fork(a: DiskForkArgs, remote: &RemoteArgs) -> Result<i32> {
    if let Some(code) = crate::remote_cmd::disk_fork(&a, remote)? {
        return Ok(code);
    }
    let opts = a.limits.spawn_options();
    let f = forkvm_sandbox::start::disk::fork_from_disk(
        &Registry::open_default(),
        &Store::open_default(),
        &a.id,
        a.seq,
        a.restore.into(),
        &opts,
    )?;
    let s = &f.sandbox;
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "sandbox_id": s.record.id,
                "pid": s.record.pid,
                "ready_ms": s.ready_ms,
                "forked_from": a.id,
                "restore": f.restore.name(),
                "restore_ms": f.restore_ms,
                "lazy_disks": f.lazy,
            })
        );
    } else {
        println!(
            "{} (booted on {}'s disk in {:.1} s; {} restore took {:.1} ms)",
            s.record.id,
            a.id,
            s.ready_ms / 1e3,
            f.restore.name(),
            f.restore_ms
        );
    }
    Ok(0)
}

pub fn export(a: DiskExportArgs, remote: &RemoteArgs) -> Result<i32> {
    remote.refuse_local("disk-export", "run it on the daemon's host without --daemon (it reads the local vault)")?;
    let store = Store::open_default();
    let all = disk_snapshots::list(&store, &a.id)?;
    let snap = match a.seq {
        Some(seq) => {
            all.iter().find(|s| s.seq == seq).with_context(|| format!("{} has no disk snapshot {seq}", a.id))?
        }
        None => all.last().with_context(|| format!("{} has no disk snapshot", a.id))?,
    };
    let Some(disk) = snap.disks.iter().find(|d| d.id == a.disk) else {
        bail!("disk snapshot {} of {} has no disk {:?}", snap.seq, a.id, a.disk);
    };
    let base = match a.base {
        Some(b) => b,
        None => forkvm_image::rootfs::ensure_scratch_disk(&forkvm_image::kernel::cache_dir())?,
    };
    let key = disk_snapshots::base_key(&base).with_context(|| format!("reading the base {}", base.display()))?;
    if key != disk.base_key {
        bail!(
            "{} is not the base disk {} of snapshot {} sits on ({} != {})",
            base.display(),
            a.disk,
            snap.seq,
            key,
            disk.base_key
        );
    }
    disk_snapshots::export(&store, &a.id, snap.seq, &a.disk, &base, &a.out)?;
    println!("{}", a.out.display());
    Ok(0)
}
