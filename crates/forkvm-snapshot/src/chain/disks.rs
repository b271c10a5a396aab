//! A snapshot's disks as chain operations see them: plain images and layered disks
//! (a base image `disk/<file>` plus sealed layers `disk/<file>.layers/<id>/{data,bitmap}`,
//! oldest first; see [`crate::layered_disk`]).
//!
//! Sealed layers are immutable, so every operation shares them by hard link like the
//! base images. What this module adds for chains: checking that the layers a
//! `snapshot.json` lists are there and chain up ([`check_layers`], bitmap reads only),
//! taking disks over into a new snapshot directory ([`take_over`]), their allocated
//! bytes ([`allocated_bytes`]) and the extents of a layer's present blocks for packing
//! ([`layer_extents`]).

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::ChainError;
use crate::dir::DISK_DIR;
use crate::layered_disk::{Layer, LayerId, BITMAP_FILE, BLOCK_SIZE, DATA_FILE};
use crate::metadata::{DiskMeta, SnapshotMeta};
use crate::pack_archive::SparseExtents;
use crate::store::link_or_copy;

/// The disks `meta` describes.
pub(crate) fn disks_of(meta: &SnapshotMeta) -> impl Iterator<Item = &DiskMeta> {
    meta.devices.iter().flat_map(|d| d.disks.iter())
}

/// Checks every layered disk of the snapshot in `dir`: each listed layer directory
/// exists and opens as a sealed layer, is for a disk of its base's size, sits on the
/// layer listed before it (the first on the base), and its id is the name listed.
/// Reads the bitmaps (and stats the data files), never the data.
pub fn check_layers(dir: &Path, meta: &SnapshotMeta) -> Result<(), ChainError> {
    let disk_dir = dir.join(DISK_DIR);
    for d in disks_of(meta) {
        let Some(layers) = &d.layers else { continue };
        let fail = |layer: &str, reason: String| ChainError::DiskLayer {
            tag: meta.tag.clone(),
            disk: d.file.clone(),
            layer: layer.to_string(),
            reason,
        };
        let base = disk_dir.join(&d.file);
        let size = fs::metadata(&base).map_err(|e| fail("base", format!("base image {}: {e}", base.display())))?.len();
        let mut below = LayerId::BASE;
        for name in layers {
            let layer = Layer::open_sealed(&d.layer_dir(&disk_dir, name)).map_err(|e| fail(name, e.to_string()))?;
            if layer.disk_size() != size {
                let reason = format!("it is for a {}-byte disk, the base is {size} bytes", layer.disk_size());
                return Err(fail(name, reason));
            }
            if layer.parent() != below {
                let reason =
                    format!("it sits on {}, the layer listed below it is {below}: wrong order", layer.parent());
                return Err(fail(name, reason));
            }
            if layer.id().to_string() != *name {
                return Err(fail(name, format!("its id is {}: listed under the wrong name", layer.id())));
            }
            below = layer.id();
        }
    }
    Ok(())
}

/// Puts the disks `meta` lists from `src_dir/disk/` into `dst_dir/disk/` (created if
/// there are disks): base images and every listed layer's `data` and `bitmap`, hard
/// linked (copied across filesystems).
pub(crate) fn take_over(src_dir: &Path, dst_dir: &Path, meta: &SnapshotMeta) -> Result<(), ChainError> {
    let (src, dst) = (src_dir.join(DISK_DIR), dst_dir.join(DISK_DIR));
    let mut disks = disks_of(meta).peekable();
    if disks.peek().is_none() {
        return Ok(());
    }
    fs::create_dir(&dst).map_err(ChainError::io("creating disk/", &dst))?;
    for d in disks {
        let from = src.join(&d.file);
        link_or_copy(&from, &dst.join(&d.file)).map_err(ChainError::io("taking over a disk", &from))?;
        for name in d.layers.iter().flatten() {
            let (from, to) = (d.layer_dir(&src, name), d.layer_dir(&dst, name));
            fs::create_dir_all(&to).map_err(ChainError::io("creating a layer directory", &to))?;
            for file in [DATA_FILE, BITMAP_FILE] {
                let f = from.join(file);
                link_or_copy(&f, &to.join(file)).map_err(ChainError::io("taking over a disk layer", &f))?;
            }
        }
    }
    Ok(())
}

/// Bytes allocated on disk to the snapshot's disks: base images and layers (holes do
/// not count; files shared by hard link are counted for each snapshot). Unreadable files
/// count as zero.
pub fn allocated_bytes(dir: &Path, meta: &SnapshotMeta) -> u64 {
    let disk_dir = dir.join(DISK_DIR);
    let alloc = |p: &Path| fs::metadata(p).map(|m| m.blocks() * 512).unwrap_or(0);
    disks_of(meta)
        .map(|d| {
            let layers: u64 =
                d.layer_dirs(&disk_dir).iter().map(|l| alloc(&l.join(DATA_FILE)) + alloc(&l.join(BITMAP_FILE))).sum();
            alloc(&disk_dir.join(&d.file)) + layers
        })
        .sum()
}

/// The data a sealed layer holds: runs of its present blocks, as sparse-entry extents
/// over its `data` file (the disk's size).
pub(crate) fn layer_extents(layer: &Layer) -> SparseExtents {
    let size = layer.disk_size();
    let bits = layer.bitmap();
    let mut out = SparseExtents::new(size);
    let mut next = 0;
    while let Some(first) = bits.next_one(next) {
        let mut end = first + 1;
        while bits.get(end) {
            end += 1;
        }
        out.push(first * BLOCK_SIZE, (end - first) * BLOCK_SIZE);
        next = end;
    }
    out
}
