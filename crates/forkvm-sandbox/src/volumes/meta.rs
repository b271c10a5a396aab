//! `volume.json`: what a volume is (its size and sealed layers) and who writes it; and
//! the volume as the CLI and the API show it.

use forkvm_api::volumes::VolumeInfo;
use serde::{Deserialize, Serialize};
use std::path::Path;

pub(super) const META_FILE: &str = "volume.json";
pub(super) const BASE_FILE: &str = "base.ext4";
/// Largest `volume.json` read (it lists layer ids: a few KiB).
const MAX_META_BYTES: u64 = 1 << 20;
/// Format of `volume.json`; another is refused by name.
const FORMAT: u32 = 1;

/// Whether `name` names a layer directory of a volume: a layer id, or a merge's
/// `<id>-m<n>`.
fn is_layer_dir_name(name: &str) -> bool {
    match name.split_once("-m") {
        None => forkvm_snapshot::is_layer_name(name),
        Some((id, n)) => {
            forkvm_snapshot::is_layer_name(id)
                && !n.is_empty()
                && n.len() <= 20
                && n.bytes().all(|b| b.is_ascii_digit())
        }
    }
}

/// A volume's `volume.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeMeta {
    pub format: u32,
    pub name: String,
    pub size_bytes: u64,
    pub created_at_unix_ms: u64,
    /// Its sealed layers, oldest first: directories `layers/<name>/`, named by the
    /// layer's id (`<id>-m<n>` for a merge, [`super::compact`]).
    pub layers: Vec<String>,
    /// The sandbox holding the writer's lease (its tops in `writers/<id>/`), if any.
    #[serde(default)]
    pub writer: Option<String>,

    /// The volume it was snapshotted from, if any.
    #[serde(default)]
    pub snapshot_of: Option<String>,
}

/// Milliseconds since the epoch.
pub(super) fn now_unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_millis() as u64
}

impl VolumeMeta {
    pub(super) fn new(name: &str, size_bytes: u64) -> VolumeMeta {
        VolumeMeta {
            format: FORMAT,
            name: name.to_string(),
            size_bytes,
            created_at_unix_ms: now_unix_ms(),
            layers: Vec::new(),
            writer: None,
            snapshot_of: None,
        }
    }

    /// Reads and checks `dir`'s `volume.json` (volume `name`'s).
    pub(super) fn read(dir: &Path, name: &str) -> Result<VolumeMeta, super::VolumeError> {
        let bad = |reason: String| super::VolumeError::Meta { name: name.to_string(), reason };
        let path = dir.join(META_FILE);
        let file = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(super::VolumeError::NotFound(name.to_string()))
            }
            Err(e) => return Err(bad(e.to_string())),
        };
        let mut text = String::new();
        use std::io::Read;
        file.take(MAX_META_BYTES).read_to_string(&mut text).map_err(|e| bad(e.to_string()))?;
        let m: VolumeMeta = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        if m.format != FORMAT {
            return Err(bad(format!("format {} (this forkvm reads {FORMAT})", m.format)));
        }
        if m.name != name {
            return Err(bad(format!("it names volume {:?}", m.name)));
        }
        if let Some(l) = m.layers.iter().find(|l| !is_layer_dir_name(l)) {
            return Err(bad(format!("{l:?} is not a layer directory name")));
        }
        Ok(m)
    }

    /// Writes it into `dir` atomically (temporary file, fsync, rename, directory fsync).
    pub(super) fn write(&self, dir: &Path) -> std::io::Result<()> {
        use std::io::Write;
        let tmp = dir.join(format!(".{META_FILE}.{}.tmp", std::process::id()));
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?)?;
        f.sync_all()?;
        std::fs::rename(&tmp, dir.join(META_FILE))?;
        std::fs::File::open(dir)?.sync_all()
    }

    /// The sealed layers' directories in volume directory `dir`, oldest first.
    pub(super) fn layer_dirs(&self, dir: &Path) -> Vec<std::path::PathBuf> {
        self.layers.iter().map(|l| dir.join("layers").join(l)).collect()
    }
}

/// The volume as `volume ls` and the API show it.
pub(super) fn info(m: &VolumeMeta, writer: Option<String>, users: Vec<String>, stored_bytes: u64) -> VolumeInfo {
    let readers = users.into_iter().filter(|u| Some(u) != writer.as_ref()).collect();
    VolumeInfo {
        name: m.name.clone(),
        size_bytes: m.size_bytes,
        created_at_unix_ms: m.created_at_unix_ms,
        layers: m.layers.len(),
        stored_bytes,
        writer,
        readers,
        snapshot_of: m.snapshot_of.clone(),
    }
}

/// Bytes allocated on the host under `dir` (not following links).
pub(super) fn stored_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let Ok(m) = e.path().symlink_metadata() else { continue };
            if m.is_dir() {
                stack.push(e.path());
            } else if m.is_file() {
                total += m.blocks() * 512;
            }
        }
    }
    total
}
