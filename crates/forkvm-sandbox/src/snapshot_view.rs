//! The API's view of a snapshot in the store ([`forkvm_api::SnapshotInfo`]), so that a
//! branch made by the CLI and one made through the daemon print the same object. The
//! daemon adds what only it recorded (the branch mode and pause window of snapshots it
//! made earlier, from its database).
//!
//! A snapshot's memory is either a whole `memory.img` or, in a chain, a `memory.map`
//! over the store's shared chunks.

use crate::source::{SourceError, SpawnSource};
use forkvm_api::SnapshotInfo;
use forkvm_snapshot::chain::ChainError;
use forkvm_snapshot::{MemoryFormat, Store, StoreEntry, StoreError, MEMORY_IMG};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

fn physical_bytes(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.blocks() * 512).unwrap_or(0)
}

/// Whether `tag` can be spawned from, as the list and the detail both report it:
/// (`status`, `bootable`, why not).
pub fn bootability(store: &Store, tag: &str) -> (String, bool, Option<String>) {
    match SpawnSource::check_tag(store, tag) {
        Ok(_) => ("ready".to_string(), true, None),
        Err(SourceError::Store(StoreError::Writing { .. }))
        | Err(SourceError::Chain(ChainError::Store(StoreError::Writing { .. }))) => {
            ("writing".to_string(), false, None)
        }
        Err(err) => ("failed".to_string(), false, Some(err.to_string())),
    }
}

/// The API's name of a memory format.
pub fn format_name(f: MemoryFormat) -> &'static str {
    match f {
        MemoryFormat::Image => "image",
        MemoryFormat::Chunked => "chunked",
    }
}

/// Snapshot `e` as `GET /v1/snapshots` shows it, status and bootability re-checked on
/// disk, with the branch `mode` and `pause_ms` that made it when known. The memory's size
/// on disk is cheap here (no chunk is looked at): a whole image's allocated blocks, or
/// what a chunked snapshot added to the chunk store when it was made.
pub fn snapshot_info(store: &Store, e: &StoreEntry, mode: Option<&str>, pause_ms: Option<f64>) -> SnapshotInfo {
    let dir = store.snapshots_dir().join(&e.tag);
    let (status, bootable, warning) = bootability(store, &e.tag);
    let memory_physical_bytes = match e.meta.memory_format {
        MemoryFormat::Image => physical_bytes(&dir.join(MEMORY_IMG)),
        MemoryFormat::Chunked => e.meta.memory_bytes_allocated,
    };
    let mut info = SnapshotInfo {
        tag: e.tag.clone(),
        dir: dir.display().to_string(),
        created_at_unix: e.meta.created_at_unix_ms / 1000,
        branched_from: e.meta.branched_from.clone(),
        pause_ms: None,
        pause_us: None,
        diff_ms: None,
        diff_physical_bytes: None,
        diff_logical_bytes: None,
        status,
        bootable,
        warning,
        template: e.meta.template.clone(),
        mode: mode.map(String::from),
        memory_logical_bytes: e.meta.mem_size_bytes,
        memory_physical_bytes,
        default_limits: e.meta.default_limits.map(|d| forkvm_api::DefaultLimits {
            memory_limit_mib: d.memory_limit_bytes.map(|b| b >> 20),
            cpu_limit_millis: d.cpu_millis,
            pids_limit: d.pids_max,
            io_limits: d.io,
        }),
        default_network: e.meta.default_network.clone(),
        vcpus: Some(e.meta.vcpu_count),
    };
    info.set_pause(pause_ms);
    info
}

/// Snapshot `tag` of `store` as [`snapshot_info`] shows it, if the store has it.
pub fn tag_info(store: &Store, tag: &str, mode: Option<&str>, pause_ms: Option<f64>) -> Option<SnapshotInfo> {
    let entry = store.entry(tag)?;
    Some(snapshot_info(store, &entry, mode, pause_ms))
}
