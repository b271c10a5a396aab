//! Capturing a VM's disks: sealing layered disks and placing them in a snapshot.
//!
//! A layered disk (DESIGN §5) is captured by sealing its top: the guest's writes so far
//! become an immutable layer and an empty top takes over, in O(bitmap), without copying
//! data. Everything that must see the disk as of one instant — a snapshot, a BRANCH, a
//! fork of the running VM, a continuous disk snapshot — seals first. Sealed layers are
//! immutable, so a snapshot holds them as hard links, and children share them.
//!
//! Requests run under the device's lock on the vCPU thread that queued them, so a seal
//! (which takes that lock) never splits one. A paused VM issues none at all, which is
//! what makes the seal consistent with the memory saved in the same pause.

use super::{Vmm, VmmError};
use crate::devices::virtio::blk::LazyReport;
use forkvm_snapshot::layered_disk::{offer_layer_as, offer_sealed_layer};
use forkvm_snapshot::{link_or_copy, DiskMeta, DiskReferences, LayerId, DISK_DIR};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// One layered disk after a seal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskSeal {
    /// Position among the VM's block devices.
    pub index: usize,
    /// The serial the guest sees.
    pub id: String,
    /// The base image.
    pub base: PathBuf,
    /// Every sealed layer, oldest first: (directory, id as hex).
    pub layers: Vec<(PathBuf, String)>,
    /// The layer this seal made, if the guest wrote since the last one.
    pub new_layer: Option<String>,
}

/// One lazily restored disk's state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LazyDisk {
    /// Position among the VM's block devices.
    pub index: usize,
    /// The serial the guest sees.
    pub id: String,
    #[serde(flatten)]
    pub report: LazyReport,
}

impl Vmm {
    /// Seals the top of every layered disk the guest wrote since its last seal and
    /// records the new layers in the VM's device configuration (so forks and later
    /// snapshots stack on them). Raw images are untouched. Returns every layered disk.
    pub fn seal_disks(&mut self) -> Result<Vec<DiskSeal>, VmmError> {
        let mut out = Vec::new();
        let blocks = self.devices.virtio.iter().filter(|s| s.kind == "block");
        for (index, slot) in blocks.enumerate() {
            let Some(layered) = self.device_config.blocks.get(index).and_then(|b| b.layers.clone()) else {
                continue;
            };
            let mut transport = slot.transport.lock().unwrap_or_else(|p| p.into_inner());
            let Some(block) = transport.device_mut().as_block_mut() else {
                return Err(VmmError::Disk(format!("virtio slot for disk {index} is not a block device")));
            };
            // A lazily restored disk becomes ordinary first (its cache, complete and
            // sealed, is its lowest layer from now on), so what is captured is all local.
            let settled = block.settle_lazy().map_err(|e| VmmError::Disk(format!("sealing disk {index}: {e}")))?;
            if let (Some(dir), Some(l)) = (&settled, self.device_config.blocks[index].layers.as_mut()) {
                l.sealed.insert(0, dir.clone());
                l.lazy = None;
            }
            let sealed =
                block.seal(&layered.free_top()).map_err(|e| VmmError::Disk(format!("sealing disk {index}: {e}")))?;
            // Ours now; a branch that captures them takes them over (`offer_sealed_layer`).
            for dir in settled.iter().chain(sealed.as_ref().map(|s| &s.dir)) {
                offer_sealed_layer(dir)
                    .map_err(|e| VmmError::Disk(format!("keeping sealed layer {} open: {e}", dir.display())))?;
            }
            let layers = block.sealed_layers().unwrap_or_default();
            drop(transport);
            let config = &mut self.device_config.blocks[index];
            if let (Some(s), Some(l)) = (&sealed, config.layers.as_mut()) {
                l.sealed.push(s.dir.clone());
            }
            out.push(DiskSeal {
                index,
                id: config.id.clone(),
                base: config.path.clone(),
                layers: layers.into_iter().map(|(dir, id): (PathBuf, LayerId)| (dir, id.to_string())).collect(),
                new_layer: sealed.map(|s| s.id.to_string()),
            });
        }
        Ok(out)
    }

    /// The lazily restored disks' counters (see `devices::virtio::blk::lazy`), ending
    /// their recordings first when `finish_recording` (each report then carries its
    /// first reads, for the caller to merge into the playbook).
    pub fn lazy_disks(&mut self, finish_recording: bool) -> Result<Vec<LazyDisk>, VmmError> {
        let mut out = Vec::new();
        let blocks = self.devices.virtio.iter().filter(|s| s.kind == "block");
        for (index, slot) in blocks.enumerate() {
            let mut transport = slot.transport.lock().unwrap_or_else(|p| p.into_inner());
            let Some(block) = transport.device_mut().as_block_mut() else {
                return Err(VmmError::Disk(format!("virtio slot for disk {index} is not a block device")));
            };
            if let Some(report) = block.lazy_report(finish_recording) {
                let id = self.device_config.blocks.get(index).map(|b| b.id.clone()).unwrap_or_default();
                out.push(LazyDisk { index, id, report });
            }
        }
        Ok(out)
    }

    /// Puts this VM's disks into `<staging>/disk/` (the VM is paused and `seals` is what
    /// `seal_disks` returned in this pause: each layered disk's layers and their ids):
    ///
    /// * a layered disk: its base and every sealed layer hard-linked (copied across
    ///   filesystems) as `disk<i>.img` and `disk<i>.img.layers/<id>/{data,bitmap}`;
    /// * a read-only image: hard-linked;
    /// * a writable raw image: copied, only in full mode — a live branch cannot capture
    ///   it consistently (the copy would race the resumed guest).
    pub(super) fn capture_disks(
        &self,
        staging: &Path,
        seals: &[DiskSeal],
        live: bool,
        capture: super::branch::DiskCapture,
    ) -> Result<Vec<DiskMeta>, VmmError> {
        let reference = capture == super::branch::DiskCapture::Reference;
        let mut disks = Vec::new();
        if self.device_config.blocks.is_empty() {
            return Ok(disks);
        }
        let dir = staging.join(DISK_DIR);
        std::fs::create_dir(&dir).map_err(|e| VmmError::Disk(format!("creating {}: {e}", dir.display())))?;
        let mut refs = reference.then(DiskReferences::default);
        for (i, b) in self.device_config.blocks.iter().enumerate() {
            let file = format!("disk{i}.img");
            let target = dir.join(&file);
            if b.layers.is_some() {
                let seal = seals
                    .iter()
                    .find(|s| s.index == i)
                    .ok_or_else(|| VmmError::Disk(format!("disk {i} is layered but was not sealed in this pause")))?;
                place(&b.path, &target, refs.as_mut(), &file)
                    .map_err(|e| VmmError::Disk(format!("linking the base of disk {i} ({}): {e}", b.path.display())))?;
                let mut meta = DiskMeta { file: file.clone(), read_only: b.read_only, id: b.id.clone(), layers: None };
                for (layer, id) in &seal.layers {
                    let name = format!("{file}.layers/{id}");
                    match refs.as_mut() {
                        Some(refs) => refer(refs, layer, &name)
                            .map_err(|e| VmmError::Disk(format!("referencing layer {}: {e}", layer.display())))?,
                        None => link_layer(layer, &meta.layer_dir(&dir, id))?,
                    }
                }
                meta.layers = Some(seal.layers.iter().map(|(_, id)| id.clone()).collect());
                disks.push(meta);
                continue;
            }
            if live && !b.read_only {
                return Err(VmmError::Disk(format!(
                    "disk {} is writable: a live branch cannot capture it consistently (use mode full)",
                    b.path.display()
                )));
            }
            let linked = b.read_only && place(&b.path, &target, refs.as_mut(), &file).is_ok();
            if !linked {
                std::fs::copy(&b.path, &target)
                    .map_err(|e| VmmError::Disk(format!("copying disk {}: {e}", b.path.display())))?;
            }
            disks.push(DiskMeta { file, read_only: b.read_only, id: b.id.clone(), layers: None });
        }
        if let Some(refs) = refs {
            refs.write(&dir).map_err(|e| VmmError::Disk(e.to_string()))?;
        }
        Ok(disks)
    }
}

/// Gives a forked child its own names for the layers in `sealed` that live in the
/// source's directory `source_dir`, `<child_dir>/inherited-<name>`, and updates `sealed`.
/// Shared layers (a tag's) stay. The host side linked those names before the fork
/// (`forkvm-sandbox`'s `start::running`): a branch may have taken a layer's files over,
/// and a VMM may not link a file it does not own. A layer sealed since (the fork's own)
/// is still this uid's and is linked here. Either way the child reads the files through
/// the descriptors its source offered, offered again at the new names.
pub(crate) fn inherit_layers(source_dir: &Path, sealed: &mut [PathBuf], child_dir: &Path) -> Result<(), VmmError> {
    for path in sealed.iter_mut().filter(|p| p.starts_with(source_dir)) {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let to = child_dir.join(format!("inherited-{name}"));
        if !to.exists() {
            link_layer(path, &to)?;
        }
        offer_layer_as(path, &to)
            .map_err(|e| VmmError::Disk(format!("opening the source's layer {}: {e}", path.display())))?;
        *path = to;
    }
    Ok(())
}

/// Hard-links (or copies) a sealed layer's files into `to`.
fn link_layer(from: &Path, to: &Path) -> Result<(), VmmError> {
    forkvm_snapshot::link_layer(from, to).map_err(|e| VmmError::Disk(format!("layer {}: {e}", from.display())))
}

/// Puts `from` at `to`: with references, only notes it as `name` (its absolute path);
/// else a hard link (a copy across filesystems).
fn place(from: &Path, to: &Path, refs: Option<&mut DiskReferences>, name: &str) -> std::io::Result<()> {
    match refs {
        Some(refs) => refer(refs, from, name),
        None => link_or_copy(from, to),
    }
}

/// Notes `from`'s absolute path as `name` in `refs`.
fn refer(refs: &mut DiskReferences, from: &Path, name: &str) -> std::io::Result<()> {
    refs.0.insert(name.to_string(), std::path::absolute(from)?);
    Ok(())
}
