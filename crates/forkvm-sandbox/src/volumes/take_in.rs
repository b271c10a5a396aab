//! Taking a stopped writer's writes into its volume.
//!
//! A writer's VMM keeps its tops (and the layers it sealed: at every disk snapshot,
//! branch or fork) in `writers/<sandbox id>/`. Once that sandbox no longer runs, its
//! last top is sealed as the VMM would have sealed it (what the guest flushed is kept,
//! as after a power cut; `crate::salvage`'s chaining by parent ids), every new layer
//! is linked into `layers/<id>/`, `volume.json` is rewritten to list them (the commit
//! point), and only then is the writer directory removed. A crash at any step leaves
//! either the old volume with the writer directory still there (taken in next time)
//! or the new one.

use super::meta::{VolumeMeta, BASE_FILE};
use super::VolumeError;
use crate::registry::RecordedDisk;
use crate::salvage::{disk_layers, Unsalvageable};
use std::path::Path;

/// Takes the layers of writer `writer` of the volume in `vol_dir` into `m` (its lock held).
pub(super) fn take_in(vol_dir: &Path, m: &mut VolumeMeta, writer: &str) -> Result<(), VolumeError> {
    let name = m.name.clone();
    let layers_err = |step: &str, reason: String| VolumeError::Layers { name: name.clone(), step: step.into(), reason };
    let wdir = vol_dir.join("writers").join(writer);
    // What a VMM wrote becomes ours before anything reads it (it cannot plant links:
    // its filters deny them, and the walk never follows one).
    crate::sandbox_uid::disown_tree(&wdir)
        .map_err(|e| layers_err(&format!("taking back writer {writer}'s directory"), e.to_string()))?;
    let disk = RecordedDisk {
        id: format!("volume {name}"),
        base: vol_dir.join(BASE_FILE),
        sealed: m.layer_dirs(vol_dir),
        dir: wdir.clone(),
    };
    let all = disk_layers(&disk).map_err(|e| {
        let reason = match e {
            Unsalvageable::Lazy(p) => format!("layer {} is not sealed", p.display()),
            Unsalvageable::Other(r) => r,
        };
        layers_err(&format!("putting writer {writer}'s layers together"), reason)
    })?;
    // The volume's own layers keep their directories; the writer's are linked in.
    let own = m.layer_dirs(vol_dir);
    let mut ids = Vec::with_capacity(all.len());
    for dir in &all {
        if let Some(name) = own.contains(dir).then(|| dir.file_name()).flatten() {
            ids.push(name.to_string_lossy().into_owned());
            continue;
        }
        let info = forkvm_snapshot::layered_disk::inspect(dir)
            .map_err(|e| layers_err(&format!("reading layer {}", dir.display()), e.to_string()))?;
        let id = info.id.to_string();
        let home = vol_dir.join("layers").join(&id);
        if !home.join(forkvm_snapshot::layered_disk::BITMAP_FILE).is_file() {
            link_layer(dir, &home).map_err(|e| layers_err("linking a layer into the volume", e.to_string()))?;
        }
        ids.push(id);
    }
    let changed = ids != m.layers;
    m.layers = ids;
    if m.writer.as_deref() == Some(writer) {
        m.writer = None;
    }
    if changed || m.writer.is_none() {
        m.write(vol_dir).map_err(|e| layers_err("writing volume.json", e.to_string()))?;
    }
    if let Err(e) = std::fs::remove_dir_all(&wdir) {
        tracing::warn!(volume = %name, writer, error = %e, "removing a taken-in writer directory failed");
    }
    Ok(())
}

/// Hard-links (copies across file systems) a sealed layer's two files into `to`,
/// made under a temporary name and renamed (a half-linked layer is never listed).
pub(super) fn link_layer(from: &Path, to: &Path) -> std::io::Result<()> {
    let parent = to.parent().ok_or_else(|| std::io::Error::other("a layer path without a parent"))?;
    let name = to.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = parent.join(format!(".{name}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp)?;
    for f in [forkvm_snapshot::layered_disk::DATA_FILE, forkvm_snapshot::layered_disk::BITMAP_FILE] {
        forkvm_snapshot::link_or_copy(&from.join(f), &tmp.join(f))?;
    }
    crate::sandbox_uid::traversable(&tmp)?;
    std::fs::rename(&tmp, to)
}
