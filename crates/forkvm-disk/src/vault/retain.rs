//! Retention: which snapshots to keep, deleting the rest and the chunks only they used.
//!
//! Why this exists: a snapshot every minute would grow the vault without bound. Every
//! manifest holds its disk's full map, so any snapshot can be deleted on its own; a
//! chunk is garbage once no remaining manifest references it.
//!
//! Order (crash-safe): under the exclusive lock, remove temp files of killed writers,
//! decide, delete the manifests, fsync `snapshots/`; only then delete unreferenced
//! chunks. A crash in between leaves
//! unreferenced chunks, which the next retain removes; never a manifest whose chunks
//! are gone.

use super::fsutil;
use super::manifest::DiskMap;
use super::store::SNAPSHOTS_DIR;
use super::{io_err, Vault, VaultError};
use crate::chunk_id::ChunkId;
use std::collections::{BTreeSet, HashSet};
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;

const HOUR_MS: u64 = 3_600_000;
const DAY_MS: u64 = 24 * HOUR_MS;

/// Which snapshots [`Vault::retain`] keeps. The newest is always kept, and so is every
/// pinned one ([`Vault::pin`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetentionPolicy {
    /// The newest this many (0 counts as 1).
    pub keep_last: u32,
    /// The newest snapshot of each of the last this many distinct hours (UTC) that have one.
    pub keep_hourly: u32,
    /// The newest snapshot of each of the last this many distinct days (UTC) that have one.
    pub keep_daily: u32,
}

/// What [`Vault::retain`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetainReport {
    /// Sequence numbers kept, ascending.
    pub kept: Vec<u64>,
    /// Sequence numbers deleted, ascending.
    pub removed: Vec<u64>,
    /// Chunk files deleted (no remaining manifest referenced them).
    pub chunks_removed: u64,
    /// Chunk files kept.
    pub chunks_kept: u64,
    /// Space freed by the deleted manifests and chunks (`st_blocks * 512`).
    pub bytes_freed: u64,
    /// Pins dropped because their holder is gone (`(seq, holder)`, see `pins`).
    pub stale_pins: Vec<(u64, String)>,
}

/// The sequence numbers `policy` keeps among `snaps` (`(seq, created_unix_ms)`).
pub(crate) fn select(snaps: &[(u64, u64)], policy: &RetentionPolicy) -> BTreeSet<u64> {
    let mut newest_first = snaps.to_vec();
    newest_first.sort_unstable_by_key(|s| std::cmp::Reverse(s.0));
    let mut keep: BTreeSet<u64> = newest_first.iter().take(policy.keep_last.max(1) as usize).map(|s| s.0).collect();
    for (period, count) in [(HOUR_MS, policy.keep_hourly), (DAY_MS, policy.keep_daily)] {
        let mut buckets = HashSet::new();
        for &(seq, ms) in &newest_first {
            if buckets.len() >= count as usize {
                break;
            }
            if buckets.insert(ms / period) {
                keep.insert(seq);
            }
        }
    }
    keep
}

impl Vault {
    /// Applies `policy`: deletes the manifests it does not keep, then every chunk no
    /// remaining manifest references. Any manifest that does not decrypt aborts it
    /// before anything is deleted.
    pub fn retain(&self, policy: &RetentionPolicy) -> Result<RetainReport, VaultError> {
        let _lock = self.lock(libc::LOCK_EX)?;
        self.remove_temps()?;
        let manifests = self.seqs()?.into_iter().map(|s| self.load(s)).collect::<Result<Vec<_>, _>>()?;
        let snaps: Vec<(u64, u64)> = manifests.iter().map(|m| (m.seq, m.created_unix_ms)).collect();
        let mut keep = select(&snaps, policy);
        // Snapshots a lazy restore still reads (see `pins`) are kept whatever the policy.
        let (pinned, stale_pins) = self.pinned_seqs()?;
        keep.extend(pinned);
        let mut report = RetainReport { stale_pins, ..RetainReport::default() };
        for &(seq, _) in &snaps {
            if keep.contains(&seq) {
                report.kept.push(seq);
                continue;
            }
            let path = self.manifest_path(seq);
            let size = fs::symlink_metadata(&path).map_or(0, |m| m.blocks() * 512);
            match fs::remove_file(&path) {
                Ok(()) => report.bytes_freed += size,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err("removing snapshot manifest", &path)(e)),
            }
            report.removed.push(seq);
        }
        fsutil::sync_dir(&self.root.join(SNAPSHOTS_DIR))?;
        let live: HashSet<ChunkId> = manifests
            .iter()
            .filter(|m| keep.contains(&m.seq))
            .flat_map(|m| m.disks.iter().flat_map(DiskMap::chunk_names))
            .collect();
        let (removed, bytes, kept) = self.chunks.gc(&live)?;
        report.chunks_removed = removed;
        report.chunks_kept = kept;
        report.bytes_freed += bytes;
        Ok(report)
    }

    /// Deletes chunks no manifest references (left by interrupted snapshots or
    /// retains). Any manifest that does not decrypt aborts it.
    pub fn gc(&self) -> Result<RetainReport, VaultError> {
        self.retain(&RetentionPolicy { keep_last: u32::MAX, keep_hourly: 0, keep_daily: 0 })
    }
}
