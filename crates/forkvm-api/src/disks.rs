//! Disk snapshots, archives and the sandboxes made back from them: what the routes under
//! `/v1/sandboxes/{id}/disk-snapshots`, `/archive`, `/restore` and `/disk-fork` carry.

use crate::IoLimits;
use serde::{Deserialize, Serialize};

/// forkvm: `POST /v1/sandboxes/{id}/disk-snapshots`: take a disk snapshot now. Omitted
/// retention fields take the daemon's (`--disk-retention-keep-*`); an empty body is `{}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DiskSnapshotRequest {
    /// Keep the newest this many (0 counts as 1; the newest is always kept).
    #[serde(default)]
    pub keep_last: Option<u32>,
    /// Keep the newest snapshot of each of the last this many hours that have one.
    #[serde(default)]
    pub keep_hourly: Option<u32>,
    /// Keep the newest snapshot of each of the last this many days that have one.
    #[serde(default)]
    pub keep_daily: Option<u32>,
}

/// forkvm: what one disk snapshot did (`POST /v1/sandboxes/{id}/disk-snapshots`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct DiskSnapshotReport {
    pub sandbox_id: String,
    /// The snapshot's sequence number (the newest existing one when `unchanged`; 0 when
    /// the disks were never written and there is none).
    pub seq: u64,
    /// Nothing was written since the last snapshot: no new snapshot was made (200).
    pub unchanged: bool,
    /// Layers the seal made.
    pub new_layers: u64,
    /// Time the VMM spent sealing the disks (the only part the sandbox could notice).
    pub seal_ms: f64,
    /// Time spent encrypting and writing to the vault.
    pub write_ms: f64,
    pub written_chunks: u64,
    pub written_bytes: u64,
    /// Bytes of distinct chunks the snapshot references (its whole disk state).
    pub stored_bytes: u64,
    /// Snapshots the retention policy removed afterwards.
    pub retired: u64,
}

/// forkvm: one disk of a disk snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct DiskSnapshotDisk {
    /// The disk's serial (e.g. `data`).
    pub id: String,
    /// Content key of the base image its layers sit on.
    pub base_key: String,
    /// Disk size in bytes.
    pub size: u64,
    /// The id of the layer the snapshot captured (hex).
    pub layer_id: String,
    /// Blocks that differ from the base.
    pub blocks: u64,
    /// Runs of such blocks.
    pub extents: u64,
}

/// forkvm: one entry of `GET /v1/sandboxes/{id}/disk-snapshots` (oldest first).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct DiskSnapshotInfo {
    pub seq: u64,
    pub created_unix_ms: u64,
    /// Bytes of distinct encrypted chunks the snapshot references.
    pub stored_bytes: u64,
    pub disks: Vec<DiskSnapshotDisk>,
}

/// forkvm: the daemon's last disk snapshot attempt of a sandbox (scheduled or asked
/// for), in [`SandboxInfo::last_disk_snapshot`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LastDiskSnapshot {
    /// The newest snapshot the attempt left (`None` if it failed and none was ever taken
    /// by this daemon).
    pub seq: Option<u64>,
    /// When the attempt ended.
    pub at_unix_ms: u64,
    /// Why the attempt failed; `None` when it succeeded.
    pub error: Option<String>,
}

/// forkvm: what `POST /v1/sandboxes/{id}/archive` did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ArchiveReport {
    pub sandbox_id: String,
    /// The archive: `<store>/archives/<id>`.
    pub dir: String,
    /// The last encrypted disk snapshot taken before the process stopped, when the
    /// sandbox has a layered disk.
    pub disk_snapshot_seq: Option<u64>,
    /// Writing the archive (the sandbox was paused throughout).
    pub write_ms: f64,
    pub total_ms: f64,
    /// `api` (asked for) or `ttl` (its time to live ran out).
    pub reason: String,
}

/// forkvm: `POST /v1/sandboxes/{id}/restore`: an archived sandbox runs again, same id.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RestoreRequest {
    /// As [`CreateSandboxRequest::ttl_seconds`], counted from the restore.
    #[serde(default)]
    pub ttl_seconds: Option<u64>,
}

/// forkvm: `POST /v1/sandboxes/{id}/disk-fork`: a new sandbox cold-booted on a disk
/// snapshot of `{id}` (which may be running, archived or gone).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DiskForkRequest {
    /// The disk snapshot (default: the newest).
    #[serde(default)]
    pub seq: Option<u64>,
    #[serde(default)]
    pub memory_limit_mib: Option<u64>,
    /// forkvm: CPU limit of each sandbox's VMM, in thousandths of a CPU (1000: one CPU's
    /// worth of time per 100 ms period), 10 to 1024000; absent: the default, 1000 per vCPU + 1000 (a
    /// fork of a running sandbox: its source's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_limit_millis: Option<u32>,
    /// forkvm: tasks (threads and processes) each sandbox's VMM may have, 32 to 4194304;
    /// absent: the default, 4352 (a fork of a running sandbox: its source's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids_limit: Option<u32>,
    /// forkvm: caps on each sandbox's disk and entropy I/O (token buckets in its VMM);
    /// absent: none (a fork of a running sandbox: its source's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_limits: Option<IoLimits>,
    /// As [`CreateSandboxRequest::ttl_seconds`].
    #[serde(default)]
    pub ttl_seconds: Option<u64>,
    /// How the disk is restored (default: `lazy_playbook`).
    #[serde(default)]
    pub restore: Option<DiskRestoreMode>,
}

/// forkvm: how a disk-only fork restores its disk from the snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DiskRestoreMode {
    /// Decrypt the whole snapshot before the VM starts.
    Eager,
    /// Start at once; fetch and decrypt each block on its first read.
    Lazy,
    /// As `lazy`, and replay the template's prefetch playbook right after start.
    LazyPlaybook,
}
