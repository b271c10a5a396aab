//! Merging a volume's layers into one once it has many and nobody has it attached.
//!
//! Why this exists: every writer session adds at least one layer (more when the writer
//! was captured while it wrote: a disk snapshot, a branch, a fork), and a sandbox that
//! attaches the volume opens every layer and checks their bitmaps on each read that
//! misses the newer ones. So when a volume that no live sandbox uses has more than
//! [`MAX_LAYERS`], its layers are merged (`layered_disk::merge_layers`: each block's
//! newest copy, the newest layer's id) into a new directory, `volume.json` is rewritten
//! to list it alone (the commit point), and the old directories are removed. Snapshots
//! of the volume and of sandboxes keep their own hard links of the old layers. A
//! volume in use is left alone: its users name its layer directories.

use super::meta::VolumeMeta;
use super::VolumeError;
use std::path::Path;

/// Layers a volume may have before it is merged when idle.
pub const MAX_LAYERS: usize = 16;

/// Merges `m`'s layers (volume directory `vol_dir`, its lock held, no live user) when
/// there are more than [`MAX_LAYERS`]; whether it did.
pub(super) fn compact(vol_dir: &Path, m: &mut VolumeMeta) -> Result<bool, VolumeError> {
    if m.layers.len() <= MAX_LAYERS {
        return Ok(false);
    }
    let name = m.name.clone();
    let err = |step: &str, reason: String| VolumeError::Layers { name: name.clone(), step: step.into(), reason };
    let last = m.layers.last().cloned().unwrap_or_default();
    let id = last.split('-').next().unwrap_or_default().to_string();
    let merged = (1u64..)
        .map(|n| format!("{id}-m{n}"))
        .find(|d| !vol_dir.join("layers").join(d).exists())
        .expect("an unused name exists");
    let dirs = m.layer_dirs(vol_dir);
    forkvm_snapshot::layered_disk::merge_layers(&vol_dir.join("layers").join(&merged), &dirs)
        .map_err(|e| err(&format!("merging {} layers", dirs.len()), e.to_string()))?;
    crate::sandbox_uid::traversable(&vol_dir.join("layers").join(&merged))
        .map_err(|e| err("opening the merged layer to VMMs", e.to_string()))?;
    let old = std::mem::replace(&mut m.layers, vec![merged]);
    m.write(vol_dir).map_err(|e| err("writing volume.json", e.to_string()))?;
    for d in old {
        if let Err(e) = std::fs::remove_dir_all(vol_dir.join("layers").join(&d)) {
            tracing::warn!(volume = %name, layer = %d, error = %e, "removing a merged layer failed");
        }
    }
    Ok(true)
}
