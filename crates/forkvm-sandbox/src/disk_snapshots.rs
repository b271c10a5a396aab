//! Continuous, encrypted, incremental snapshots of a sandbox's disks (seed `004_*`).
//!
//! A disk snapshot is two steps. The sandbox's VMM seals its layered disks' tops (a
//! consistent cut, taken under the device lock without pausing the vCPUs: O(bitmap)),
//! then this process writes the blocks of every layer not yet in the sandbox's vault
//! into it, encrypted with the sandbox's own key (`forkvm_snapshot::vault`). The
//! manifest's rename is the commit point: a snapshot killed at any moment before it
//! leaves the previous one as the newest, and the next snapshot picks up every layer the
//! killed one missed. A retention policy then drops old snapshots (never the newest).
//!
//! Keys live apart from the data: the vault is `<store>/vault/<sandbox id>/`, the keys
//! are under [`keys_dir`] (`$FORKVM_KEYS`, else `~/.config/forkvm/keys`), wrapped by a
//! host key there. Nothing in the store is plaintext guest data.
//!
//! The daemon takes one per sandbox every interval (`forkvm daemon
//! --disk-snapshot-interval`); `forkvm disk-snapshot ID` takes one now.

use crate::registry::Registry;
use crate::verbs::{call, LifecycleError};
use forkvm_snapshot::vault::{DiskInput, KeyStore, RetentionPolicy, SnapshotInfo, Vault, VaultError};
use forkvm_snapshot::Store;
use forkvm_vmm::vmm::disks::DiskSeal;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Retention when none is given: the last 60 (an hour at one a minute), one per hour
/// for a day, one per day for a week.
pub const DEFAULT_RETENTION: RetentionPolicy = RetentionPolicy { keep_last: 60, keep_hourly: 24, keep_daily: 7 };

#[derive(Debug, thiserror::Error)]
pub enum DiskSnapshotError {
    #[error(transparent)]
    Lifecycle(#[from] LifecycleError),
    #[error("sandbox {0} has no layered disk to snapshot")]
    NoLayeredDisk(String),
    #[error("sandbox {id}: identifying the base image {path} of disk {disk}: {source}")]
    Base { id: String, disk: String, path: PathBuf, source: std::io::Error },
    #[error("sandbox {id}: {source}")]
    Vault { id: String, source: VaultError },
    #[error("sandbox {id}: its disk snapshots are still needed by {} (its archive: delete it first; lazy restores from it let go at their first disk snapshot)", readers.join(", "))]
    InUse { id: String, readers: Vec<String> },
}

impl DiskSnapshotError {
    /// The API code: `not_found`, `bad_request`, `conflict`, `internal`, ...
    pub fn code(&self) -> forkvm_api::ErrorCode {
        match self {
            DiskSnapshotError::Lifecycle(e) => e.code(),
            DiskSnapshotError::NoLayeredDisk(_) => forkvm_api::ErrorCode::BadRequest,
            DiskSnapshotError::InUse { .. } => forkvm_api::ErrorCode::Conflict,
            DiskSnapshotError::Vault { source, .. }
                if source.kind() == forkvm_snapshot::vault::VaultErrorKind::NotFound =>
            {
                forkvm_api::ErrorCode::NotFound
            }
            _ => forkvm_api::ErrorCode::Internal,
        }
    }
}

/// What one disk snapshot did.
#[derive(Debug, Clone, Serialize)]
pub struct DiskSnapshotReport {
    pub sandbox_id: String,
    /// The snapshot's sequence number (the newest existing one when `unchanged`).
    pub seq: u64,
    /// Nothing was written since the last snapshot: no new snapshot was made.
    pub unchanged: bool,
    /// Layers the seal made (0 when the guest wrote nothing since the last seal).
    pub new_layers: usize,
    /// Time the VMM spent sealing (the only part the sandbox could notice).
    pub seal_ms: f64,
    /// Time spent encrypting and writing to the vault, including the final syncs.
    pub write_ms: f64,
    pub written_chunks: u64,
    pub written_bytes: u64,
    /// Bytes of distinct chunks the snapshot references (its whole disk state).
    pub stored_bytes: u64,
    /// Snapshots the retention policy removed afterwards.
    pub retired: usize,
    /// The VM's own sealed layers merged into one afterwards (0 below the threshold).
    pub compacted_layers: usize,
}

/// The directory of the host key and the wrapped per-sandbox keys:
/// `$FORKVM_KEYS`, else `$HOME/.config/forkvm/keys` — never inside the store.
pub fn keys_dir() -> PathBuf {
    forkvm_snapshot::vault::default_keys_dir()
}

/// Where sandbox `id`'s vault lives in `store`.
pub fn vault_dir(store: &Store, id: &str) -> PathBuf {
    store.root().join("vault").join(id)
}

/// What a vault's snapshots are of, kept beside it (not secret: names only), so a
/// disk-only fork can boot the right template after the sandbox is gone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct VaultOwner {
    pub template: Option<String>,
    pub source_tag: Option<String>,
    /// The sandbox's vCPUs, which a disk-only fork boots with too (absent from a record
    /// written before vCPUs counted: one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vcpus: Option<u8>,
}

/// Where the owner record of sandbox `id`'s vault lives in `store`.
pub fn owner_path(store: &Store, id: &str) -> PathBuf {
    store.root().join("vault").join(format!("{id}.owner.json"))
}

impl VaultOwner {
    /// The owner record of sandbox `record`'s vault.
    pub fn of(record: &crate::registry::SandboxRecord) -> VaultOwner {
        VaultOwner {
            template: record.template.clone(),
            source_tag: record.source_tag.clone(),
            vcpus: (record.vcpus > 1).then_some(record.vcpus),
        }
    }
}

/// Records what sandbox `id`'s vault holds snapshots of (see [`VaultOwner`]).
pub fn write_owner(store: &Store, id: &str, owner: &VaultOwner) -> std::io::Result<()> {
    let path = owner_path(store, id);
    if read_owner(store, id).as_ref() == Some(owner) {
        return Ok(());
    }
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(owner).expect("serializes"))?;
    std::fs::rename(&tmp, &path)
}

/// The owner record of sandbox `id`'s vault, if it has one.
pub fn read_owner(store: &Store, id: &str) -> Option<VaultOwner> {
    std::fs::read(owner_path(store, id)).ok().and_then(|b| serde_json::from_slice(&b).ok())
}

/// Opens sandbox `id`'s vault with its key (created on first use).
pub fn open_vault(store: &Store, id: &str) -> Result<Vault, DiskSnapshotError> {
    let vault_err = |source| DiskSnapshotError::Vault { id: id.to_string(), source };
    let keys = KeyStore::open(&keys_dir()).map_err(vault_err)?;
    let key = keys.sandbox_key(id).map_err(vault_err)?;
    Vault::open(&vault_dir(store, id), key).map_err(vault_err)
}

/// Takes one disk snapshot of running sandbox `id` now, then applies `retention`.
pub fn take(
    registry: &Registry,
    store: &Store,
    id: &str,
    retention: &RetentionPolicy,
) -> Result<DiskSnapshotReport, DiskSnapshotError> {
    let record = registry.get(id).map_err(LifecycleError::from)?;
    let sealing = Instant::now();
    let seals: Vec<DiskSeal> = call(&record, |c| c.seal_disks())?;
    let seal_ms = sealing.elapsed().as_secs_f64() * 1e3;
    if seals.is_empty() {
        return Err(DiskSnapshotError::NoLayeredDisk(id.to_string()));
    }
    let mut disks = Vec::new();
    for s in &seals {
        // A disk nothing was ever written to is its base: nothing to keep. A volume's
        // writes are the volume's (`volumes`), not this sandbox's.
        if s.layers.is_empty() || crate::source::is_volume_slot(&s.id) {
            continue;
        }
        let base_key = base_key(&s.base).map_err(|source| DiskSnapshotError::Base {
            id: id.to_string(),
            disk: s.id.clone(),
            path: s.base.clone(),
            source,
        })?;
        disks.push(DiskInput { id: s.id.clone(), base_key, layers: s.layers.iter().map(|(d, _)| d.clone()).collect() });
    }
    let mut vault = open_vault(store, id)?;
    if let Some(pause) = test_stall() {
        vault.stall_each_chunk(pause);
    }
    let vault_err = |source| DiskSnapshotError::Vault { id: id.to_string(), source };
    write_owner(store, id, &VaultOwner::of(&record)).map_err(|e| {
        vault_err(VaultError::Io { step: "recording the vault's owner", path: owner_path(store, id), source: e })
    })?;
    let writing = Instant::now();
    let info = if disks.is_empty() {
        latest_or_empty(&vault).map_err(vault_err)?
    } else {
        vault.snapshot(&disks).map_err(vault_err)?
    };
    let write_ms = writing.elapsed().as_secs_f64() * 1e3;
    let retired = if info.unchanged { 0 } else { vault.retain(retention).map_err(vault_err)?.removed.len() };
    let compacted_layers = if info.unchanged { 0 } else { compact(&record, &info) };
    Ok(DiskSnapshotReport {
        sandbox_id: id.to_string(),
        seq: info.seq,
        unchanged: info.unchanged,
        new_layers: seals.iter().filter(|s| s.new_layer.is_some()).count(),
        seal_ms,
        write_ms,
        written_chunks: info.written_chunks,
        written_bytes: info.written_bytes,
        stored_bytes: info.stored_bytes,
        retired,
        compacted_layers,
    })
}

/// Sealed layers the VM keeps before it merges those the vault holds into one
/// (`FORKVM_COMPACT_LAYERS`, at least 2).
pub const DEFAULT_COMPACT_LAYERS: usize = 16;

fn compact_threshold() -> usize {
    std::env::var("FORKVM_COMPACT_LAYERS").ok().and_then(|v| v.parse().ok()).unwrap_or(DEFAULT_COMPACT_LAYERS).max(2)
}

/// Has the VMM merge its own layers that snapshot `info` now holds (`vmm::compact`);
/// returns how many were merged. Best effort: a failure is logged, the snapshot stands.
fn compact(record: &crate::registry::SandboxRecord, info: &SnapshotInfo) -> usize {
    use forkvm_vmm::vmm::compact::CoveredLayer;
    let covered = info.disks.iter().map(|d| CoveredLayer { disk: d.id.clone(), layer: d.layer_id.clone() }).collect();
    match call(record, |c| c.compact_disks(covered, compact_threshold())) {
        Ok(done) => done.iter().map(|c| c.merged_layers).sum(),
        Err(e) => {
            tracing::warn!(sandbox = %record.id, error = %e, "compacting the disk layers failed");
            0
        }
    }
}

/// Crash tests' hook: `FORKVM_DISK_SNAPSHOT_STALL_MS=N` (honoured only with
/// `FORKVM_FAULT_INJECTION=1`) pauses N ms after each chunk written, so a SIGKILL can
/// land mid-write whatever the disk's speed.
fn test_stall() -> Option<std::time::Duration> {
    if std::env::var("FORKVM_FAULT_INJECTION").ok().as_deref() != Some("1") {
        return None;
    }
    let ms: u64 = std::env::var("FORKVM_DISK_SNAPSHOT_STALL_MS").ok()?.parse().ok()?;
    Some(std::time::Duration::from_millis(ms))
}

/// The newest snapshot as an unchanged report, for a sandbox whose disks were never
/// written (seq 0 when there is none).
fn latest_or_empty(vault: &Vault) -> Result<SnapshotInfo, VaultError> {
    let newest = vault.list()?.into_iter().max_by_key(|s| s.seq);
    Ok(newest.map_or(
        SnapshotInfo {
            seq: 0,
            created_unix_ms: 0,
            unchanged: true,
            disks: Vec::new(),
            stored_bytes: 0,
            written_chunks: 0,
            written_bytes: 0,
        },
        |s| SnapshotInfo { unchanged: true, written_chunks: 0, written_bytes: 0, ..s },
    ))
}

/// Names a base image by its content: BLAKE3 over its size and its allocated extents
/// (found with SEEK_DATA/SEEK_HOLE, so a sparse 4 GiB blank disk costs its few MiB).
pub fn base_key(path: &Path) -> std::io::Result<String> {
    use std::io::{Read, Seek, SeekFrom};
    use std::os::fd::AsRawFd;
    let mut file = std::fs::File::open(path)?;
    let size = file.metadata()?.len();
    let mut h = blake3::Hasher::new();
    h.update(b"forkvm base v1\n");
    h.update(&size.to_le_bytes());
    let mut pos = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    while pos < size {
        // SAFETY: lseek on an fd we own.
        let data = unsafe { libc::lseek(file.as_raw_fd(), pos as libc::off_t, libc::SEEK_DATA) };
        if data < 0 {
            break; // ENXIO: only a hole remains.
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(file.as_raw_fd(), data, libc::SEEK_HOLE) };
        let (start, end) = (data as u64, (hole.max(data) as u64).min(size));
        file.seek(SeekFrom::Start(start))?;
        let mut left = end - start;
        while left > 0 {
            let n = left.min(buf.len() as u64) as usize;
            file.read_exact(&mut buf[..n])?;
            // Zeros hash like a hole would not: skip all-zero pieces so the key depends
            // on content, not on how the file happens to be allocated.
            if buf[..n].iter().any(|&b| b != 0) {
                h.update(&(start + (end - start - left)).to_le_bytes());
                h.update(&buf[..n]);
            }
            left -= n as u64;
        }
        pos = end;
    }
    Ok(format!("blake3:{}", h.finalize().to_hex()))
}

/// What [`purge`] removed.
#[derive(Debug, Clone, Serialize)]
pub struct PurgeReport {
    pub sandbox_id: String,
    /// Its wrapped key was deleted (crypto-shredding whatever copy of the vault remains).
    pub key_removed: bool,
    /// Its vault directory was deleted.
    pub vault_removed: bool,
}

/// Destroys sandbox `id`'s disk snapshots: its key first (the vault is unreadable from
/// then on, wherever a copy of it is), then its vault and owner record. Refused while a
/// live pin holds one of its snapshots: its archive (delete that first), or another
/// sandbox restoring lazily from it (which lets go at its first disk snapshot, within a
/// minute under the daemon).
/// Ok, with nothing removed, when there is nothing to remove.
pub fn purge(store: &Store, id: &str) -> Result<PurgeReport, DiskSnapshotError> {
    let vault_err = |source| DiskSnapshotError::Vault { id: id.to_string(), source };
    forkvm_snapshot::vault::validate_name("sandbox id", id).map_err(vault_err)?;
    let dir = vault_dir(store, id);
    let readers = forkvm_snapshot::vault::pins::live_holders(&dir).map_err(vault_err)?;
    if !readers.is_empty() {
        return Err(DiskSnapshotError::InUse { id: id.to_string(), readers });
    }
    let keys = KeyStore::open(&keys_dir()).map_err(vault_err)?;
    let key_removed = keys.has_sandbox_key(id);
    keys.remove_sandbox_key(id).map_err(vault_err)?;
    let vault_removed = dir.exists();
    match std::fs::remove_dir_all(&dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(vault_err(VaultError::Io { step: "removing the vault", path: dir, source: e }))
        }
        _ => {}
    }
    let _ = std::fs::remove_file(owner_path(store, id));
    Ok(PurgeReport { sandbox_id: id.to_string(), key_removed, vault_removed })
}

/// The sandbox's disk snapshots, oldest first.
pub fn list(store: &Store, id: &str) -> Result<Vec<SnapshotInfo>, DiskSnapshotError> {
    let vault = open_vault(store, id)?;
    let mut all = vault.list().map_err(|source| DiskSnapshotError::Vault { id: id.to_string(), source })?;
    all.sort_by_key(|s| s.seq);
    Ok(all)
}

/// Writes disk `disk` of snapshot `seq` of sandbox `id` as a flat raw image at `out`
/// (its base overlaid with the snapshot's blocks), for inspection or use elsewhere.
pub fn export(store: &Store, id: &str, seq: u64, disk: &str, base: &Path, out: &Path) -> Result<(), DiskSnapshotError> {
    let vault = open_vault(store, id)?;
    vault.export_raw(seq, disk, base, out).map_err(|source| DiskSnapshotError::Vault { id: id.to_string(), source })
}

#[cfg(test)]
mod tests {
    use super::VaultOwner;

    #[test]
    fn an_owner_record_keeps_the_vcpus_and_reads_older_records_as_one() {
        let two = VaultOwner { template: Some("tiny".into()), source_tag: None, vcpus: Some(2) };
        let text = serde_json::to_string(&two).unwrap();
        assert_eq!(serde_json::from_str::<VaultOwner>(&text).unwrap(), two);
        let older: VaultOwner = serde_json::from_str(r#"{"template":"tiny","source_tag":"t"}"#).unwrap();
        assert_eq!(older.vcpus, None, "a record from before vCPUs counted boots one");
        let one = VaultOwner { vcpus: None, ..two };
        assert!(!serde_json::to_string(&one).unwrap().contains("vcpus"), "one vCPU is written as before");
    }
}
