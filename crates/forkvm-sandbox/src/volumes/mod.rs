//! Volumes: named ext4 disks that outlive any sandbox and attach to many.
//!
//! Why this exists: a sandbox's own disk goes with it, and a template is read-only; a
//! dataset, a cache or a repository checkout that several sandboxes (and later runs)
//! share needs a disk of its own. A volume is a layered disk (DESIGN §5) kept in the
//! store, `<store>/volumes/<name>/`:
//!
//! - `volume.json`: its size, its sealed layers (oldest first) and its writer's lease;
//! - `base.ext4`: a blank, sparse ext4 made by `mkfs.ext4` at `create`;
//! - `layers/<id>/`: its sealed layers, immutable, hard-linked into every snapshot and
//!   every `volume snapshot` that holds them;
//! - `writers/<sandbox id>/`: the writable tops of the one sandbox that writes it.
//!
//! It reaches a sandbox through one of the empty volume slots every Linux sandbox boots
//! with (`crate::source::VOLUME_SLOTS`): a restore puts the volume into the slot, the
//! guest's driver learns its size from a configuration-change interrupt, and the agent
//! mounts it ([`attach`]). One sandbox at a time writes a volume; the others read it
//! read-only or through a private copy-on-write top that is thrown away with them.
//! A writer's layers stay in its writer directory when it stops, is killed or crashes;
//! the volume takes them in ([`take_in`]) the next time it is attached, listed or
//! snapshotted, so no step of a stop has to succeed for the writes to be kept. An idle
//! volume with many layers has them merged ([`compact`]).

pub mod attach;
mod compact;
mod meta;
mod take_in;

pub use attach::{check_mount, parse_mount, AttachMode, VolumeMount};
pub use compact::MAX_LAYERS;
pub use forkvm_api::volumes::VolumeInfo;
pub use meta::VolumeMeta;

use crate::registry::Registry;
use crate::state::SandboxState;
use forkvm_snapshot::Store;
use std::fs::File;
use std::path::{Path, PathBuf};
use take_in::take_in;

/// Smallest volume: room for ext4's metadata and a little data.
pub const MIN_VOLUME_BYTES: u64 = 16 << 20;
/// Largest volume: what a layered disk can be.
pub const MAX_VOLUME_BYTES: u64 = forkvm_snapshot::layered_disk::MAX_DISK_BYTES;
/// A volume's size when none is given.
pub const DEFAULT_VOLUME_BYTES: u64 = 4 << 30;
/// mkfs.ext4 options: like the data disk's (lazy, sparse, journalled, no reserve).
const MKFS_ARGS: &[&str] = &["-q", "-F", "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard"];

#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("invalid volume name {name:?}: {reason}")]
    Name { name: String, reason: String },
    #[error("volume {0} does not exist")]
    NotFound(String),
    #[error("volume {0} already exists")]
    Exists(String),
    #[error(
        "volume size {0} bytes is outside {MIN_VOLUME_BYTES}..={MAX_VOLUME_BYTES} (16 MiB to 1 TiB), in whole MiB"
    )]
    Size(u64),
    #[error("volume {name} is attached writable to sandbox {writer}: one writer at a time (attach it ro or cow)")]
    Busy { name: String, writer: String },
    #[error("volume {name} is in use by sandbox(es) {}; kill them first", .users.join(", "))]
    InUse { name: String, users: Vec<String> },
    #[error("volume {name}: {step}: {source}")]
    Io { name: String, step: String, source: std::io::Error },
    #[error("volume {name}: {step}: {reason}")]
    Layers { name: String, step: String, reason: String },
    #[error("volume {name}: volume.json is unreadable: {reason}")]
    Meta { name: String, reason: String },
    #[error("making volume {name}'s file system: {reason}")]
    Mkfs { name: String, reason: String },
    #[error("{0}")]
    Attach(String),
}

impl VolumeError {
    pub fn code(&self) -> forkvm_api::ErrorCode {
        use forkvm_api::ErrorCode;
        match self {
            VolumeError::Name { .. } | VolumeError::Size(_) | VolumeError::Attach(_) => ErrorCode::BadRequest,
            VolumeError::NotFound(_) => ErrorCode::NotFound,
            VolumeError::Exists(_) | VolumeError::Busy { .. } | VolumeError::InUse { .. } => ErrorCode::Conflict,
            _ => ErrorCode::Internal,
        }
    }
}

/// The volumes of one store.
#[derive(Debug, Clone)]
pub struct Volumes {
    root: PathBuf,
}

/// `<store>/volumes`.
fn volumes_root(store_root: &Path) -> PathBuf {
    store_root.join("volumes")
}

/// Whether `dir` is sandbox `id`'s writer directory of some volume of the store at
/// `store_root` (the one disk directory of a sandbox outside its run directory).
pub fn is_writer_dir(store_root: &Path, dir: &Path, id: &str) -> bool {
    let Ok(rest) = dir.strip_prefix(volumes_root(store_root)) else { return false };
    let parts: Vec<_> = rest.components().collect();
    match parts.as_slice() {
        [std::path::Component::Normal(name), std::path::Component::Normal(w), std::path::Component::Normal(sb)] => {
            check_name(&name.to_string_lossy()).is_ok() && *w == "writers" && *sb == id
        }
        _ => false,
    }
}

/// The volume naming rule: a tag's (1 to 128 ASCII letters, digits, `.`, `_`, `-`).
pub fn check_name(name: &str) -> Result<(), VolumeError> {
    forkvm_snapshot::validate_tag(name).map_err(|e| VolumeError::Name { name: name.to_string(), reason: e.to_string() })
}

impl Volumes {
    pub fn of(store: &Store) -> Volumes {
        Volumes { root: volumes_root(store.root()) }
    }

    /// Volume `name`'s directory (the name checked).
    fn dir(&self, name: &str) -> Result<PathBuf, VolumeError> {
        check_name(name)?;
        Ok(self.root.join(name))
    }

    /// Holds volume `name`'s lock (state changes: a lease, a take-in, a removal).
    fn lock(&self, name: &str) -> Result<File, VolumeError> {
        let dir = self.dir(name)?;
        if !dir.join(meta::META_FILE).is_file() {
            return Err(VolumeError::NotFound(name.to_string()));
        }
        forkvm_snapshot::flock::lock_file(&dir.join(".lock"), libc::LOCK_EX).map_err(io(name, "taking its lock"))
    }

    /// Makes volume `name` of `size_bytes` (whole MiB): a blank ext4, no layers.
    pub fn create(&self, name: &str, size_bytes: u64) -> Result<VolumeInfo, VolumeError> {
        let dir = self.dir(name)?;
        if !(MIN_VOLUME_BYTES..=MAX_VOLUME_BYTES).contains(&size_bytes) || !size_bytes.is_multiple_of(1 << 20) {
            return Err(VolumeError::Size(size_bytes));
        }
        std::fs::create_dir_all(&self.root).map_err(io(name, "creating the volumes directory"))?;
        crate::sandbox_uid::traversable(&self.root).map_err(io(name, "opening the volumes directory to VMMs"))?;
        // Built beside, renamed into place: a volume exists whole or not at all.
        let partial = self.root.join(format!(".{name}.{}.partial", std::process::id()));
        let _ = std::fs::remove_dir_all(&partial);
        let made = self.make(name, &partial, size_bytes);
        let placed = made.and_then(|m| match std::fs::rename(&partial, &dir) {
            Ok(()) => Ok(m),
            Err(e) if dir.exists() || e.raw_os_error() == Some(libc::ENOTEMPTY) => {
                Err(VolumeError::Exists(name.to_string()))
            }
            Err(e) => Err(io(name, "publishing it")(e)),
        });
        if placed.is_err() {
            let _ = std::fs::remove_dir_all(&partial);
        }
        let m = placed?;
        Ok(meta::info(&m, None, Vec::new(), 0))
    }

    fn make(&self, name: &str, dir: &Path, size_bytes: u64) -> Result<VolumeMeta, VolumeError> {
        if self.root.join(name).exists() {
            return Err(VolumeError::Exists(name.to_string()));
        }
        make_dirs(dir, name)?;
        let base = dir.join(meta::BASE_FILE);
        let file = File::create(&base).map_err(io(name, "creating its base image"))?;
        file.set_len(size_bytes).map_err(io(name, "sizing its base image"))?;
        drop(file);
        let out = std::process::Command::new("mkfs.ext4")
            .args(MKFS_ARGS)
            .arg(&base)
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| VolumeError::Mkfs { name: name.to_string(), reason: format!("running mkfs.ext4: {e}") })?;
        if !out.status.success() {
            let reason = format!("mkfs.ext4 {}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
            return Err(VolumeError::Mkfs { name: name.to_string(), reason });
        }
        File::open(&base).and_then(|f| f.sync_all()).map_err(io(name, "syncing its base image"))?;
        let m = VolumeMeta::new(name, size_bytes);
        m.write(dir).map_err(io(name, "writing volume.json"))?;
        Ok(m)
    }

    /// Volume `name` as it is now, its stopped writer's layers taken in first.
    pub fn get(&self, registry: &Registry, name: &str) -> Result<VolumeInfo, VolumeError> {
        let _lock = self.lock(name)?;
        let (m, writer) = self.settled(registry, name)?;
        let users = self.users(registry, name);
        let stored = meta::stored_bytes(&self.root.join(name));
        Ok(meta::info(&m, writer, users, stored))
    }

    /// Every volume, by name.
    pub fn list(&self, registry: &Registry) -> Result<Vec<VolumeInfo>, VolumeError> {
        let Ok(entries) = std::fs::read_dir(&self.root) else { return Ok(Vec::new()) };
        let mut names: Vec<String> = entries
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| check_name(n).is_ok() && self.root.join(n).join(meta::META_FILE).is_file())
            .collect();
        names.sort();
        names.iter().map(|n| self.get(registry, n)).collect()
    }

    /// Removes volume `name`, refused while a live sandbox has it attached.
    pub fn remove(&self, registry: &Registry, name: &str) -> Result<(), VolumeError> {
        let _lock = self.lock(name)?;
        let m = self.read(name)?;
        let mut users = self.users(registry, name);
        if let Some(w) = live_writer(registry, &m) {
            users.push(w);
        }
        users.sort();
        users.dedup();
        if !users.is_empty() {
            return Err(VolumeError::InUse { name: name.to_string(), users });
        }
        let dir = self.root.join(name);
        let doomed = self.root.join(format!(".{name}.{}.removing", std::process::id()));
        std::fs::rename(&dir, &doomed).map_err(io(name, "moving it aside"))?;
        std::fs::remove_dir_all(&doomed).map_err(io(name, "removing its files"))
    }

    /// A new volume `to` holding `from`'s data as of now: its layers, a stopped writer's
    /// taken in first (a running writer's writes are not in until it stops). The layers
    /// are hard-linked, nothing is copied; the two diverge.
    pub fn snapshot(&self, registry: &Registry, from: &str, to: &str) -> Result<VolumeInfo, VolumeError> {
        let to_dir = self.dir(to)?;
        let _lock = self.lock(from)?;
        let (m, writer) = self.settled(registry, from)?;
        if let Some(w) = writer {
            // Its tops are in use; what it sealed so far is taken without stopping it.
            tracing::info!(volume = from, writer = %w, "snapshotting a volume while its writer runs: its committed layers only");
        }
        if to_dir.exists() {
            return Err(VolumeError::Exists(to.to_string()));
        }
        let from_dir = self.root.join(from);
        let partial = self.root.join(format!(".{to}.{}.partial", std::process::id()));
        let _ = std::fs::remove_dir_all(&partial);
        let made = (|| {
            make_dirs(&partial, to)?;
            forkvm_snapshot::link_or_copy(&from_dir.join(meta::BASE_FILE), &partial.join(meta::BASE_FILE))
                .map_err(io(to, "linking the base image"))?;
            for id in &m.layers {
                take_in::link_layer(&from_dir.join("layers").join(id), &partial.join("layers").join(id))
                    .map_err(io(to, "linking a layer"))?;
            }
            let mut new = VolumeMeta::new(to, m.size_bytes);
            new.layers = m.layers.clone();
            new.snapshot_of = Some(from.to_string());
            new.write(&partial).map_err(io(to, "writing volume.json"))?;
            std::fs::rename(&partial, &to_dir).map_err(|e| {
                if to_dir.exists() {
                    VolumeError::Exists(to.to_string())
                } else {
                    io(to, "publishing it")(e)
                }
            })?;
            Ok(new)
        })();
        if made.is_err() {
            let _ = std::fs::remove_dir_all(&partial);
        }
        Ok(meta::info(&made?, None, Vec::new(), meta::stored_bytes(&to_dir)))
    }

    fn read(&self, name: &str) -> Result<VolumeMeta, VolumeError> {
        VolumeMeta::read(&self.dir(name)?, name)
    }

    /// Volume `name`'s meta after taking in the layers of every writer that no longer
    /// runs (under its lock, held by the caller), and its live writer, if any.
    fn settled(&self, registry: &Registry, name: &str) -> Result<(VolumeMeta, Option<String>), VolumeError> {
        let dir = self.root.join(name);
        let mut m = self.read(name)?;
        let live = live_writer(registry, &m);
        let Ok(entries) = std::fs::read_dir(dir.join("writers")) else { return Ok((m, live)) };
        let mut stale: Vec<String> = entries
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|id| Some(id) != live.as_ref())
            .collect();
        stale.sort();
        for id in stale {
            take_in(&dir, &mut m, &id)?;
        }
        if m.writer.is_some() && live.is_none() {
            m.writer = None;
            m.write(&dir).map_err(io(name, "writing volume.json"))?;
        }
        if live.is_none() && m.layers.len() > MAX_LAYERS && self.users(registry, name).is_empty() {
            compact::compact(&dir, &mut m)?;
        }
        Ok((m, live))
    }

    /// Live sandboxes (other than a writer) whose disks read volume `name`.
    fn users(&self, registry: &Registry, name: &str) -> Vec<String> {
        let base = self.root.join(name).join(meta::BASE_FILE);
        registry.list().into_iter().filter(|r| r.disks.iter().any(|d| d.base == base)).map(|r| r.id).collect()
    }
}

/// The sandbox holding `m`'s writer lease, if it still has a VMM or is starting one.
/// A lease is only taken for a sandbox whose row exists (`starting`), so a lease
/// without a row is stale: its spawn failed, or the sandbox was killed.
fn live_writer(registry: &Registry, m: &VolumeMeta) -> Option<String> {
    let id = m.writer.as_deref()?;
    let row = registry.row(id)?;
    let live = match row.state {
        SandboxState::Archived => false,
        s if s.is_starting() => true,
        _ => registry.lookup(id).is_ok_and(|(_, alive)| alive),
    };
    live.then(|| id.to_string())
}

/// A new volume `name`'s directory `dir` and its `layers/` and `writers/`, each one
/// VMMs may pass through (0711).
fn make_dirs(dir: &Path, name: &str) -> Result<(), VolumeError> {
    for d in [dir.to_path_buf(), dir.join("layers"), dir.join("writers")] {
        std::fs::create_dir_all(&d).map_err(io(name, "creating its directories"))?;
        crate::sandbox_uid::traversable(&d).map_err(io(name, "opening its directories to VMMs"))?;
    }
    Ok(())
}

fn io(name: &str, step: &str) -> impl FnOnce(std::io::Error) -> VolumeError {
    let (name, step) = (name.to_string(), step.to_string());
    move |source| VolumeError::Io { name, step, source }
}

#[cfg(test)]
mod tests;
