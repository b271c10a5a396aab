//! Salvage: what a crashed sandbox wrote after its last disk snapshot goes into its
//! vault before its run directory is removed.
//!
//! Why this exists: a sandbox's disk writes since its last disk snapshot live only in
//! its run directory (its top layer and the layers sealed since). A VMM that dies
//! without being asked to (a crash, the OOM killer, a stray SIGKILL) leaves them there,
//! and cleaning up a dead sandbox used to remove them: the platform discarded work
//! without anyone calling delete. Now the registry, when it finds a dead VMM
//! (`Registry::get`, `Registry::sweep`), first salvages: it seals the orphaned top as
//! the VMM would have (`LayerStack::seal`: the writes the guest flushed are kept, as
//! after a power cut), finds every layer of each disk (the ones it was opened on, from
//! the record, and the ones its VMM made in its own directory, chained by their parent
//! ids), and takes one more disk snapshot. `disk-fork` then boots it, or the next
//! `disk-export` shows it. A disk still restored lazily (never settled) is not salvaged:
//! part of it was never local.
//!
//! A `kill` is a deliberate delete: it removes the run directory without salvage.

use crate::disk_snapshots::{base_key, open_vault, write_owner, VaultOwner};
use crate::registry::{RecordedDisk, SandboxRecord};
use forkvm_snapshot::layered_disk::{inspect, LayerInfo};
use forkvm_snapshot::vault::{DiskInput, SnapshotInfo};
use forkvm_snapshot::{LayerId, LayerStack, Store};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Takes the disk snapshot of dead sandbox `record` that holds everything its disks
/// have. `Ok(None)` when there is nothing to salvage (no layered disk was written, or
/// the last disk snapshot already has it all).
pub fn salvage(store: &Store, record: &SandboxRecord) -> Result<Option<SnapshotInfo>, SalvageError> {
    let mut inputs = Vec::new();
    for d in &record.disks {
        // A volume's writes stay in its writer directory for the volume to take in.
        if !d.dir.is_dir() || crate::source::is_volume_slot(&d.id) {
            continue;
        }
        let layers = match disk_layers(d) {
            Ok(l) if l.is_empty() => continue,
            Ok(l) => l,
            Err(Unsalvageable::Lazy(path)) => {
                tracing::warn!(sandbox = %record.id, disk = %d.id, cache = %path.display(),
                    "not salvaging a disk still restored lazily: part of it was never local");
                continue;
            }
            Err(Unsalvageable::Other(reason)) => return Err(SalvageError::Layers { disk: d.id.clone(), reason }),
        };
        let base_key = base_key(&d.base).map_err(|source| SalvageError::Base {
            disk: d.id.clone(),
            path: d.base.clone(),
            source,
        })?;
        inputs.push(DiskInput { id: d.id.clone(), base_key, layers });
    }
    if inputs.is_empty() {
        return Ok(None);
    }
    let vault = open_vault(store, &record.id).map_err(Box::new)?;
    write_owner(store, &record.id, &VaultOwner::of(record)).map_err(SalvageError::Owner)?;
    let info = vault.snapshot(&inputs)?;
    Ok((!info.unchanged).then_some(info))
}

/// Why a dead sandbox's disk writes could not be salvaged (named by the step).
#[derive(Debug, thiserror::Error)]
pub enum SalvageError {
    #[error("disk {disk}: {reason}")]
    Layers { disk: String, reason: String },
    #[error("disk {disk}: identifying its base {}: {source}", path.display())]
    Base { disk: String, path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Vault(#[from] Box<crate::disk_snapshots::DiskSnapshotError>),
    #[error("recording the vault's owner: {0}")]
    Owner(#[source] std::io::Error),
    #[error("snapshotting the disks: {0}")]
    Snapshot(#[from] forkvm_snapshot::vault::VaultError),
}

/// Why a disk's layers cannot be put together.
pub(crate) enum Unsalvageable {
    /// A layer below the top is a lazy restore's unfinished cache.
    Lazy(PathBuf),
    Other(String),
}

impl From<String> for Unsalvageable {
    fn from(e: String) -> Unsalvageable {
        Unsalvageable::Other(e)
    }
}

/// Every sealed layer of disk `d`, oldest first, after sealing its orphaned top.
pub(crate) fn disk_layers(d: &RecordedDisk) -> Result<Vec<PathBuf>, Unsalvageable> {
    let mut index: HashMap<LayerId, (PathBuf, LayerInfo)> = HashMap::new();
    for dir in &d.sealed {
        let info = inspect(dir).map_err(|e| e.to_string())?;
        index.insert(info.id, (dir.clone(), info));
    }
    // The VM's own layers. A merge has the id of the last layer it replaced; if that
    // one was not removed, the merge wins (it is the one the stack held).
    let mut own: Vec<(PathBuf, LayerInfo)> = Vec::new();
    let entries = std::fs::read_dir(&d.dir).map_err(|e| format!("listing {}: {e}", d.dir.display()))?;
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".partial") || !path.join(forkvm_snapshot::layered_disk::BITMAP_FILE).is_file() {
            continue;
        }
        let info = inspect(&path).map_err(|e| e.to_string())?;
        own.push((path, info));
    }
    own.sort_by_key(|(p, _)| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("merged-")));
    for (path, info) in &own {
        index.insert(info.id, (path.clone(), *info));
    }
    // The head: the own layer no other own layer sits on.
    let parents: Vec<LayerId> = own.iter().map(|(_, i)| i.parent).collect();
    let heads: Vec<&(PathBuf, LayerInfo)> = own.iter().filter(|(_, i)| !parents.contains(&i.id)).collect();
    let mut head = match heads.as_slice() {
        [] => return Ok(d.sealed.clone()),
        [one] => (*one).clone(),
        many => {
            // Several: those nobody sits on that are sealed are leftovers of a merge
            // (replaced layers whose removal failed); the unsealed one is the top.
            let tops: Vec<_> = many.iter().filter(|(_, i)| !i.sealed).collect();
            match tops.as_slice() {
                [one] => (**one).clone(),
                _ => return Err(format!("{} layers could each be the top; not guessing", many.len()).into()),
            }
        }
    };
    // An empty top (nothing written since the last seal, or made by a seal that crashed)
    // adds nothing: the disk ends at its parent.
    if !head.1.sealed && head.1.blocks == 0 {
        if head.1.parent == LayerId::BASE {
            return Ok(Vec::new());
        }
        head = index.get(&head.1.parent).cloned().ok_or_else(|| format!("layer {} is missing", head.1.parent))?;
        if !head.1.sealed {
            return Err(Unsalvageable::Lazy(head.0));
        }
    }
    let below = chain(&index, head.1.parent)?;
    if !head.1.sealed {
        // Sealed as the VMM would have (its new empty top is never used).
        let mut stack = LayerStack::open(&d.base, &below, &head.0).map_err(|e| e.to_string())?;
        let spare = d.dir.join(format!("salvage-top-{}", std::process::id()));
        stack.seal(&spare).map_err(|e| e.to_string())?;
    }
    let mut all = below;
    all.push(head.0);
    Ok(all)
}

/// The sealed layers from the base up to and including layer `top`, oldest first.
fn chain(index: &HashMap<LayerId, (PathBuf, LayerInfo)>, top: LayerId) -> Result<Vec<PathBuf>, Unsalvageable> {
    let mut out = Vec::new();
    let mut at = top;
    while at != LayerId::BASE {
        let (path, info) = index.get(&at).ok_or_else(|| format!("layer {at} is missing"))?;
        if !info.sealed {
            return Err(Unsalvageable::Lazy(path.clone()));
        }
        out.push(path.clone());
        at = info.parent;
        if out.len() > index.len() {
            return Err(Unsalvageable::Other("the layers' parents form a loop".into()));
        }
    }
    out.reverse();
    Ok(out)
}

/// Whether `dir` is a run directory a salvage already failed in recently (it is kept
/// for its data; retried after a while).
pub(crate) fn failed_recently(dir: &Path) -> bool {
    let age = std::fs::metadata(dir.join(FAILED_MARKER)).and_then(|m| m.modified()).ok().and_then(|t| t.elapsed().ok());
    age.is_some_and(|a| a < RETRY_AFTER)
}

/// Claims the salvage of run directory `dir` for this process; false when another one
/// holds it (a claim older than the retry period is taken over: its holder died).
pub(crate) fn claim(dir: &Path) -> bool {
    let path = dir.join(CLAIM_MARKER);
    let stale = std::fs::metadata(&path).and_then(|m| m.modified()).ok().and_then(|t| t.elapsed().ok());
    if stale.is_some_and(|a| a > RETRY_AFTER) {
        let _ = std::fs::remove_file(&path);
    }
    std::fs::OpenOptions::new().write(true).create_new(true).open(&path).is_ok()
}

/// Records that the salvage of run directory `dir` failed (and lets go of the claim).
pub(crate) fn mark_failed(dir: &Path, error: &str) {
    let _ = std::fs::write(dir.join(FAILED_MARKER), error);
    let _ = std::fs::remove_file(dir.join(CLAIM_MARKER));
}

/// In a run directory whose salvage failed: the error.
pub(crate) const FAILED_MARKER: &str = "salvage-failed";
/// In a run directory being salvaged: claimed by one process.
pub(crate) const CLAIM_MARKER: &str = ".salvaging";
/// How long a failed salvage waits before it is tried again.
const RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(600);
