//! The API's views of snapshots and sandboxes, built from what is on disk (snapshot
//! store, run directories) and what only the daemon recorded (database rows).

use crate::db::{SandboxRow, SnapshotRow};
use forkvm_api::{SandboxInfo, SnapshotInfo, SnapshotInfoDetail};
use forkvm_sandbox::{SandboxRecord, SpawnSource};
use forkvm_snapshot::{SnapshotStatus, Store, StoreEntry, StoreError, MEMORY_IMG, VMSTATE_BIN};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

fn physical_bytes(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.blocks() * 512).unwrap_or(0)
}

fn status_name(s: SnapshotStatus) -> &'static str {
    match s {
        SnapshotStatus::Ready => "ready",
        SnapshotStatus::Writing => "writing",
    }
}

/// A snapshot as `GET /v1/snapshots` shows it: status and bootability re-checked on disk.
pub fn snapshot_info(store: &Store, e: &StoreEntry, row: Option<&SnapshotRow>) -> SnapshotInfo {
    let dir = store.snapshots_dir().join(&e.tag);
    let (status, bootable, warning) = match SpawnSource::check_tag(store, &e.tag) {
        Ok(_) => ("ready".to_string(), true, None),
        Err(forkvm_sandbox::SourceError::Store(StoreError::Writing { .. })) => ("writing".to_string(), false, None),
        Err(err) => ("failed".to_string(), false, Some(err.to_string())),
    };
    SnapshotInfo {
        tag: e.tag.clone(),
        dir: dir.display().to_string(),
        created_at_unix: e.meta.created_at_unix_ms / 1000,
        branched_from: e.meta.branched_from.clone(),
        pause_ms: row.and_then(|r| r.pause_ms),
        status,
        bootable,
        warning,
        template: e.meta.template.clone(),
        mode: row.and_then(|r| r.mode.clone()),
        memory_logical_bytes: e.meta.mem_size_bytes,
        memory_physical_bytes: physical_bytes(&dir.join(MEMORY_IMG)),
    }
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

/// `GET /v1/snapshots/{tag}/info`: sizes and lineage.
pub fn snapshot_detail(store: &Store, e: &StoreEntry) -> SnapshotInfoDetail {
    let dir = store.snapshots_dir().join(&e.tag);
    let all = store.list();
    let mut ancestors = Vec::new();
    let mut parent = e.meta.parent_tag.clone();
    while let Some(p) = parent {
        if ancestors.contains(&p) || ancestors.len() > 64 {
            break;
        }
        parent = all.iter().find(|x| x.tag == p).and_then(|x| x.meta.parent_tag.clone());
        ancestors.push(p);
    }
    ancestors.reverse();
    let dependents =
        all.iter().filter(|x| x.meta.parent_tag.as_deref() == Some(e.tag.as_str())).map(|x| x.tag.clone()).collect();
    SnapshotInfoDetail {
        tag: e.tag.clone(),
        dir: dir.display().to_string(),
        created_at_unix: Some(e.meta.created_at_unix_ms / 1000),
        memory_logical_bytes: e.meta.mem_size_bytes,
        memory_physical_bytes: physical_bytes(&dir.join(MEMORY_IMG)),
        vmstate_bytes: std::fs::metadata(dir.join(VMSTATE_BIN)).map(|m| m.len()).unwrap_or(0),
        parent_tag: e.meta.parent_tag.clone(),
        parent_content_hash: e.meta.parent_hash.clone(),
        chain_depth: ancestors.len() as u32,
        ancestors,
        dependents,
        branched_from: e.meta.branched_from.clone(),
        status: status_name(e.meta.status).to_string(),
    }
}

/// A running sandbox.
pub fn sandbox_info(r: &SandboxRecord, row: Option<&SandboxRow>) -> SandboxInfo {
    let created = r.created_at_unix_ms / 1000;
    SandboxInfo {
        id: r.id.clone(),
        snapshot_tag: r.source_tag.clone(),
        netns: None,
        guest_addr: format!("unix:{}", r.vsock().display()),
        created_at_unix: created,
        pid: Some(r.pid),
        memory_limit_mib: r.memory_limit_bytes.map(|b| b >> 20),
        has_branched: row.is_some_and(|x| x.branch_count > 0),
        last_branch_memory_path: None,
        branch_count: row.map(|x| x.branch_count).unwrap_or(0),
        state: "running".into(),
        template: r.template.clone(),
        forked_from: r.forked_from.clone(),
        last_active_unix: row.map(|x| x.last_active_unix).unwrap_or(created),
    }
}
