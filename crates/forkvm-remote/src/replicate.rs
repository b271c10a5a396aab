//! Off-host continuous snapshots: a sandbox's vault mirrored to a remote, and brought
//! back on another host.
//!
//! Why this exists: a sandbox's disk snapshots (its vault: chunks and manifests, already
//! encrypted with the sandbox's key) protect its work from the sandbox, not from losing
//! the host. [`replicate_vault`] copies what the remote lacks of the vault — chunks first,
//! manifests last, so a remote manifest's chunks are always there — together with the
//! sandbox's key sealed with the remote key and the owner record (the template it runs
//! on). [`restore_vault`] does the reverse on another host, which can then boot the
//! newest snapshot as a disk-only fork. Manifests the host's retention removed are removed
//! from the remote too; chunks no remaining manifest needs stay (`forkvm remote-gc`
//! collects only the tags' blocks, see [`crate::gc`]).
//!
//! Remote layout under `vaults/<sandbox id>/`: `key` and `owner` (sealed with the remote
//! key, their associated data naming the sandbox), and the vault's own files as they are
//! on disk (`keycheck`, `chunks/<2 hex>/<64 hex>`, `snapshots/<seq>.snap`).

use crate::atomic_file::write_atomic;
use crate::workers::parallel;
use crate::{Remote, RemoteError, RemoteKey};
use forkvm_disk::vault::KeyStore;
use forkvm_snapshot::ChunkId;
use serde::Serialize;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// `blake3::derive_key` contexts naming a sandbox's carried key and owner record.
const KEY_NAME_CONTEXT: &str = "forkvm remote 2026 sandbox key name v1";
const OWNER_NAME_CONTEXT: &str = "forkvm remote 2026 vault owner name v1";
/// Largest owner record accepted.
const MAX_OWNER_BYTES: usize = 64 << 10;

/// One sandbox's vault on this host.
#[derive(Debug, Clone)]
pub struct VaultFiles {
    /// The sandbox's id (its key's owner name).
    pub id: String,
    /// The vault directory.
    pub dir: PathBuf,
    /// The owner record beside it (JSON).
    pub owner_json: PathBuf,
}

/// What a replication did.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ReplicateReport {
    pub sandbox_id: String,
    pub remote: String,
    pub files_uploaded: u64,
    pub files_present: u64,
    pub bytes_uploaded: u64,
    /// Disk snapshots on the remote afterwards, and the newest one's sequence number.
    pub snapshots: u64,
    pub newest_seq: Option<u64>,
    /// Remote manifests removed because the host's retention removed them.
    pub retired: u64,
    pub ms: f64,
}

/// What a restore did.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RestoreReport {
    pub sandbox_id: String,
    pub remote: String,
    pub files_fetched: u64,
    pub files_present: u64,
    pub bytes_fetched: u64,
    pub snapshots: u64,
    pub newest_seq: Option<u64>,
    /// The template tag the sandbox runs on (from its owner record).
    pub source_tag: Option<String>,
    pub ms: f64,
}

fn prefix(id: &str) -> String {
    format!("vaults/{id}")
}

fn named(context: &str, id: &str) -> ChunkId {
    ChunkId(blake3::derive_key(context, id.as_bytes()))
}

/// Whether `rel` is a vault file worth carrying: `keycheck`, a chunk, a manifest.
fn is_vault_file(rel: &str) -> bool {
    let parts: Vec<&str> = rel.split('/').collect();
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    match parts.as_slice() {
        ["keycheck"] => true,
        ["chunks", dir, name] => hex(dir, 2) && hex(name, 64) && name.starts_with(dir),
        ["snapshots", name] => {
            name.strip_suffix(".snap").is_some_and(|seq| seq.len() == 16 && seq.bytes().all(|b| b.is_ascii_digit()))
        }
        _ => false,
    }
}

fn seq_of(rel: &str) -> Option<u64> {
    rel.strip_prefix("snapshots/")?.strip_suffix(".snap")?.parse().ok()
}

/// The vault files under `dir` (relative paths), manifests last.
fn local_files(dir: &Path) -> Result<Vec<String>, RemoteError> {
    let mut out = Vec::new();
    let mut stack = vec![(dir.to_path_buf(), String::new())];
    while let Some((d, rel)) = stack.pop() {
        for e in std::fs::read_dir(&d).map_err(RemoteError::io("listing the vault", &d))?.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let r = if rel.is_empty() { name } else { format!("{rel}/{name}") };
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push((e.path(), r));
            } else if is_vault_file(&r) {
                out.push(r);
            }
        }
    }
    out.sort_by_key(|r| (r.starts_with("snapshots/"), r.clone()));
    Ok(out)
}

/// Copies what `remote` lacks of sandbox `vault.id`'s vault, its key and its owner record.
pub fn replicate_vault(
    vault: &VaultFiles,
    keys: &KeyStore,
    remote: &Remote,
    key: &RemoteKey,
) -> Result<ReplicateReport, RemoteError> {
    let started = Instant::now();
    let base = prefix(&vault.id);
    // Retention and collection hold the vault's lock exclusively: nothing is removed
    // while the files are read.
    let lock_path = vault.dir.join("lock");
    let _lock = forkvm_disk::flock::lock_file(&lock_path, libc::LOCK_SH)
        .map_err(RemoteError::io("locking the vault (has the sandbox taken a disk snapshot?)", &lock_path))?;
    let local = local_files(&vault.dir)?;
    let there: HashSet<String> = remote.list_paths(&base)?.into_iter().collect();
    let refused =
        |object: &str, reason: String| RemoteError::Refused { url: remote.url().into(), object: object.into(), reason };
    let mut bytes = 0u64;
    if !there.contains("key") {
        let carried = keys
            .export_sandbox_key(&vault.id, key.seal(), &named(KEY_NAME_CONTEXT, &vault.id))
            .map_err(|e| refused(&format!("{base}/key"), e.to_string()))?;
        bytes += carried.len() as u64;
        remote.put(&format!("{base}/key"), carried)?;
    }
    if let Ok(owner) = std::fs::read(&vault.owner_json) {
        let sealed = key
            .seal()
            .seal(&named(OWNER_NAME_CONTEXT, &vault.id), &owner)
            .map_err(|e| refused(&format!("{base}/owner"), e.to_string()))?;
        bytes += sealed.len() as u64;
        remote.put(&format!("{base}/owner"), sealed)?;
    }
    let missing: Vec<&String> = local.iter().filter(|r| !there.contains(*r)).collect();
    let (data, manifests): (Vec<&String>, Vec<&String>) = missing.iter().partition(|r| !r.starts_with("snapshots/"));
    let upload = |rel: &&String| -> Result<u64, RemoteError> {
        let path = vault.dir.join(rel.as_str());
        let body = std::fs::read(&path).map_err(RemoteError::io("reading a vault file", &path))?;
        let n = body.len() as u64;
        remote.put(&format!("{base}/{rel}"), body)?;
        Ok(n)
    };
    bytes += parallel(&data, upload)?;
    bytes += parallel(&manifests, upload)?;
    let local_snaps: HashSet<&str> = local.iter().filter(|r| r.starts_with("snapshots/")).map(|r| r.as_str()).collect();
    let mut retired = 0;
    for gone in there.iter().filter(|r| r.starts_with("snapshots/") && !local_snaps.contains(r.as_str())) {
        remote.delete(&format!("{base}/{gone}"))?;
        retired += 1;
    }
    Ok(ReplicateReport {
        sandbox_id: vault.id.clone(),
        remote: remote.url().into(),
        files_uploaded: missing.len() as u64,
        files_present: (local.len() - missing.len()) as u64,
        bytes_uploaded: bytes,
        snapshots: local_snaps.len() as u64,
        newest_seq: local_snaps.iter().filter_map(|r| seq_of(r)).max(),
        retired,
        ms: started.elapsed().as_secs_f64() * 1e3,
    })
}

/// Brings sandbox `vault.id`'s replicated vault, key and owner record onto this host
/// (only the files it lacks). The vault's own checks (its key check, every chunk
/// authenticated) apply when it is read.
pub fn restore_vault(
    vault: &VaultFiles,
    keys: &KeyStore,
    remote: &Remote,
    key: &RemoteKey,
) -> Result<RestoreReport, RemoteError> {
    let started = Instant::now();
    let base = prefix(&vault.id);
    let there = remote.list_paths(&base)?;
    if !there.iter().any(|r| r == "key") || !there.iter().any(|r| r.starts_with("snapshots/")) {
        return Err(RemoteError::NoTag { url: remote.url().into(), tag: format!("vault of sandbox {}", vault.id) });
    }
    let refused =
        |object: &str, reason: String| RemoteError::Refused { url: remote.url().into(), object: object.into(), reason };
    let get = |rel: &str| -> Result<Vec<u8>, RemoteError> {
        remote.get(&format!("{base}/{rel}"))?.ok_or_else(|| refused(&format!("{base}/{rel}"), "missing".into()))
    };
    let carried = get("key")?;
    keys.import_sandbox_key(&vault.id, key.seal(), &named(KEY_NAME_CONTEXT, &vault.id), &carried)
        .map_err(|e| refused(&format!("{base}/key"), e.to_string()))?;
    let mut bytes = carried.len() as u64;
    let mut source_tag = None;
    if there.iter().any(|r| r == "owner") {
        let sealed = get("owner")?;
        bytes += sealed.len() as u64;
        let owner = key
            .seal()
            .open(&named(OWNER_NAME_CONTEXT, &vault.id), &sealed)
            .filter(|o| o.len() <= MAX_OWNER_BYTES)
            .ok_or_else(|| refused(&format!("{base}/owner"), "it does not open under the remote key".into()))?;
        let parsed: serde_json::Value =
            serde_json::from_slice(&owner).map_err(|e| refused(&format!("{base}/owner"), e.to_string()))?;
        source_tag = parsed["source_tag"].as_str().or(parsed["template"].as_str()).map(String::from);
        write_atomic(&vault.owner_json, &owner)?;
    }
    let mut files: Vec<&String> = there.iter().filter(|r| is_vault_file(r)).collect();
    files.sort_by_key(|r| (r.starts_with("snapshots/"), r.to_string()));
    let missing: Vec<&String> = files.iter().copied().filter(|r| !vault.dir.join(r.as_str()).exists()).collect();
    std::fs::create_dir_all(&vault.dir).map_err(RemoteError::io("creating the vault", &vault.dir))?;
    let fetch = |rel: &&String| -> Result<u64, RemoteError> {
        let body = get(rel)?;
        let n = body.len() as u64;
        write_atomic(&vault.dir.join(rel.as_str()), &body)?;
        Ok(n)
    };
    let (data, manifests): (Vec<&String>, Vec<&String>) = missing.iter().partition(|r| !r.starts_with("snapshots/"));
    bytes += parallel(&data, fetch)?;
    bytes += parallel(&manifests, fetch)?;
    let lock = vault.dir.join("lock");
    if !lock.exists() {
        std::fs::write(&lock, b"").map_err(RemoteError::io("creating the vault's lock", &lock))?;
    }
    let snaps: Vec<u64> = files.iter().filter_map(|r| seq_of(r)).collect();
    Ok(RestoreReport {
        sandbox_id: vault.id.clone(),
        remote: remote.url().into(),
        files_fetched: missing.len() as u64,
        files_present: (files.len() - missing.len()) as u64,
        bytes_fetched: bytes,
        snapshots: snaps.len() as u64,
        newest_seq: snaps.iter().max().copied(),
        source_tag,
        ms: started.elapsed().as_secs_f64() * 1e3,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_vault_files_travel() {
        let hex = "ab".to_string() + &"0".repeat(62);
        assert!(is_vault_file("keycheck"));
        assert!(is_vault_file(&format!("chunks/ab/{hex}")));
        assert!(!is_vault_file(&format!("chunks/cd/{hex}")), "the directory is the name's first byte");
        assert!(is_vault_file("snapshots/0000000000000012.snap"));
        assert_eq!(seq_of("snapshots/0000000000000012.snap"), Some(12));
        for bad in ["lock", "pins/0000000000000001.x", "snapshots/12.snap", "../keycheck", "chunks/ab/../../x", ""] {
            assert!(!is_vault_file(bad), "{bad}");
        }
    }
}
