//! The API's views of snapshots and sandboxes, built from what is on disk (snapshot
//! store), the registry's rows, and what only the daemon recorded (its database).
//!
//! A snapshot's memory is either a whole `memory.img` or, in a chain, a `memory.map`
//! over the store's shared chunks; sizes and lineage come from the chain library
//! (`forkvm_snapshot::chain`), which is what the CLI reports too, so the two agree.

use crate::db::SnapshotRow;
use crate::disk::DiskSnapshots;
use forkvm_api::{SandboxInfo, SnapshotInfo, SnapshotInfoDetail};
use forkvm_sandbox::registry::SandboxRow;
use forkvm_sandbox::snapshot_view::{bootability, format_name};
use forkvm_snapshot::chain::{self, ChainError, ChainInfo};
use forkvm_snapshot::{SnapshotStatus, Store, StoreEntry, VMSTATE_BIN};

/// A snapshot as `GET /v1/snapshots` shows it ([`forkvm_sandbox::snapshot_view`], the
/// CLI's view too), with the branch mode and pause window the daemon recorded for it.
pub fn snapshot_info(store: &Store, e: &StoreEntry, row: Option<&SnapshotRow>) -> SnapshotInfo {
    let mode = row.and_then(|r| r.mode.as_deref());
    forkvm_sandbox::snapshot_view::snapshot_info(store, e, mode, row.and_then(|r| r.pause_ms))
}

/// The row the daemon keeps for a snapshot it saw.
pub fn snapshot_row(info: &SnapshotInfo) -> SnapshotRow {
    SnapshotRow {
        tag: info.tag.clone(),
        status: info.status.clone(),
        branched_from: info.branched_from.clone(),
        template: info.template.clone(),
        mode: info.mode.clone(),
        pause_ms: info.pause_ms,
        created_at_unix: info.created_at_unix,
        memory_logical_bytes: info.memory_logical_bytes,
        memory_physical_bytes: info.memory_physical_bytes,
    }
}

/// `GET /v1/snapshots/{tag}/info`: sizes and lineage from [`chain::info`] (which also
/// answers for a snapshot whose chain is broken), bootability as the list reports it.
pub fn snapshot_detail(store: &Store, e: &StoreEntry) -> Result<SnapshotInfoDetail, ChainError> {
    let i: ChainInfo = chain::info(store, &e.tag)?;
    let vmstate_bytes = std::fs::metadata(i.dir.join(VMSTATE_BIN)).map(|m| m.len()).unwrap_or(0);
    let (status, bootable, problem) = match (i.status, i.bootable) {
        (SnapshotStatus::Writing, _) => ("writing".to_string(), false, None),
        // The chain holds; the device description must too (as for the list).
        (SnapshotStatus::Ready, true) => bootability(store, &e.tag),
        (SnapshotStatus::Ready, false) => ("failed".to_string(), false, i.problem.clone()),
    };
    Ok(SnapshotInfoDetail {
        tag: i.tag,
        dir: i.dir.display().to_string(),
        created_at_unix: Some(i.created_at_unix_ms / 1000),
        memory_logical_bytes: i.memory_bytes,
        // `physical_bytes` counts the link's vmstate too; it is reported on its own.
        memory_physical_bytes: i.physical_bytes.saturating_sub(vmstate_bytes),
        vmstate_bytes,
        parent_tag: i.parent_tag,
        parent_content_hash: i.parent_content_hash,
        chain_depth: u32::try_from(i.chain_depth).unwrap_or(u32::MAX),
        ancestors: i.ancestors,
        dependents: i.dependents,
        branched_from: e.meta.branched_from.clone(),
        status,
        descendants: i.descendants,
        bootable,
        problem,
        memory_format: format_name(i.memory_format).to_string(),
        content_hash: i.content_hash,
        chain_physical_bytes: i.chain_physical_bytes,
        chunks: i.chunks,
    })
}

/// A sandbox as its registry row says ([`forkvm_sandbox::info::sandbox_info`], the
/// CLI's view too), with the outcome of the daemon's last disk snapshot of it.
pub fn sandbox_info(row: &SandboxRow, disk: &DiskSnapshots) -> SandboxInfo {
    SandboxInfo { last_disk_snapshot: disk.last(row.id()), ..forkvm_sandbox::info::sandbox_info(row) }
}
