//! Compacting a running VM's layered disks: its own sealed layers that a vault snapshot
//! already holds are merged into one (`layered_disk::merge_layers`).
//!
//! Why this exists: every disk snapshot in which the guest wrote leaves one more sealed
//! layer in the VM's stack (an open file and a bitmap each), once a minute under the
//! daemon; without merging, a day-old sandbox carries ~1 440 layers. Only the VM's own
//! layers (in its disk directory) are merged, never shared ones (a tag's, a template's),
//! and only up to the newest layer the vault covers, so the vault's next snapshot
//! continues its lineage (the merge keeps that layer's id).
//!
//! The merge copies data, so it runs without the VMM's lock (other control requests are
//! served meanwhile) and without the device's (the guest's I/O goes on): the layers it
//! reads are immutable. Only the swap takes the locks, after checking the stack still
//! holds those layers. The replaced directories are then removed: snapshots that hold
//! them have their own hard links.

use super::{Vmm, VmmError};
use forkvm_snapshot::layered_disk::merge_layers;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::Mutex;

/// A disk and the newest of its layers a vault snapshot holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoveredLayer {
    /// The disk's id (serial).
    pub disk: String,
    /// The layer's id (hex).
    pub layer: String,
}

/// What compaction did to one disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskCompaction {
    /// Position among the VM's block devices.
    pub index: usize,
    /// The disk's id.
    pub id: String,
    /// Layers merged into one.
    pub merged_layers: usize,
    /// The merged layer's directory.
    pub dir: PathBuf,
    /// Sealed layers in the stack afterwards.
    pub layers_now: usize,
}

/// The layers of one disk to merge.
#[derive(Debug)]
struct Plan {
    index: usize,
    id: String,
    /// Range in the stack's sealed layers.
    range: std::ops::Range<usize>,
    dirs: Vec<PathBuf>,
    /// Their ids, to check the stack still holds them at the swap.
    ids: Vec<String>,
    merged: PathBuf,
}

/// Merges each disk's own sealed layers up to its covered layer, when there are at
/// least `min_layers` of them (see the module doc).
pub fn compact_disks(
    vmm: &Mutex<Vmm>,
    covered: &[CoveredLayer],
    min_layers: usize,
) -> Result<Vec<DiskCompaction>, VmmError> {
    let plans = vmm.lock().unwrap_or_else(|p| p.into_inner()).plan_compaction(covered, min_layers.max(2))?;
    let mut out = Vec::new();
    for plan in plans {
        if plan.merged.exists() {
            std::fs::remove_dir_all(&plan.merged)
                .map_err(|e| VmmError::Disk(format!("removing a stale {}: {e}", plan.merged.display())))?;
        }
        merge_layers(&plan.merged, &plan.dirs)
            .map_err(|e| VmmError::Disk(format!("compacting disk {}: {e}", plan.index)))?;
        let done = vmm.lock().unwrap_or_else(|p| p.into_inner()).apply_compaction(&plan);
        match done {
            Ok(c) => {
                // A sealed layer of ours like any other (`seal_disks`).
                if let Err(e) = forkvm_snapshot::layered_disk::offer_sealed_layer(&plan.merged) {
                    tracing::warn!(dir = %plan.merged.display(), error = %e, "keeping the merged layer open failed");
                }
                for dir in &plan.dirs {
                    forkvm_snapshot::layered_disk::withdraw_layer(dir);
                    if let Err(e) = std::fs::remove_dir_all(dir) {
                        tracing::warn!(dir = %dir.display(), error = %e, "removing a merged layer failed");
                    }
                }
                out.push(c);
            }
            Err(e) => {
                let _ = std::fs::remove_dir_all(&plan.merged);
                return Err(e);
            }
        }
    }
    Ok(out)
}

impl Vmm {
    /// Which layers to merge, per disk (under the VMM's lock).
    fn plan_compaction(&mut self, covered: &[CoveredLayer], min_layers: usize) -> Result<Vec<Plan>, VmmError> {
        let mut plans = Vec::new();
        let blocks = self.devices.virtio.iter().filter(|s| s.kind == "block");
        for (index, slot) in blocks.enumerate() {
            let Some(config) = self.device_config.blocks.get(index) else { continue };
            let (Some(layered), Some(cover)) = (&config.layers, covered.iter().find(|c| c.disk == config.id)) else {
                continue;
            };
            let mut transport = slot.transport.lock().unwrap_or_else(|p| p.into_inner());
            let Some(block) = transport.device_mut().as_block_mut() else { continue };
            if block.is_lazy() {
                continue;
            }
            let layers = block.sealed_layers().unwrap_or_default();
            let own = |i: usize| layers[i].0.starts_with(&layered.dir);
            let Some(last) = layers.iter().position(|(_, id)| id.to_string() == cover.layer) else { continue };
            if !own(last) {
                continue;
            }
            let mut first = last;
            while first > 0 && own(first - 1) {
                first -= 1;
            }
            if last + 1 - first < min_layers {
                continue;
            }
            let range = first..last + 1;
            plans.push(Plan {
                index,
                id: config.id.clone(),
                dirs: layers[range.clone()].iter().map(|(d, _)| d.clone()).collect(),
                ids: layers[range.clone()].iter().map(|(_, id)| id.to_string()).collect(),
                merged: layered.dir.join(format!("merged-{}", cover.layer)),
                range,
            });
        }
        Ok(plans)
    }

    /// Swaps a built merge into its disk's stack and device configuration (under the
    /// VMM's lock), if the stack still holds the planned layers.
    fn apply_compaction(&mut self, plan: &Plan) -> Result<DiskCompaction, VmmError> {
        let err = |reason: String| VmmError::Disk(format!("compacting disk {}: {reason}", plan.index));
        let slot = self.devices.virtio.iter().filter(|s| s.kind == "block").nth(plan.index);
        let slot = slot.ok_or_else(|| err("no such disk".into()))?;
        let mut transport = slot.transport.lock().unwrap_or_else(|p| p.into_inner());
        let block = transport.device_mut().as_block_mut().ok_or_else(|| err("not a block device".into()))?;
        let layers = block.sealed_layers().unwrap_or_default();
        let now: Vec<String> =
            layers.get(plan.range.clone()).unwrap_or_default().iter().map(|(_, id)| id.to_string()).collect();
        let config = self.device_config.blocks[plan.index].layers.as_mut().ok_or_else(|| err("not layered".into()))?;
        if now != plan.ids || config.sealed.len() != layers.len() {
            return Err(err("its layers changed while the merge was built".into()));
        }
        block.replace_sealed(plan.range.clone(), &plan.merged).map_err(|e| err(e.to_string()))?;
        config.sealed.splice(plan.range.clone(), [plan.merged.clone()]);
        Ok(DiskCompaction {
            index: plan.index,
            id: plan.id.clone(),
            merged_layers: plan.range.len(),
            dir: plan.merged.clone(),
            layers_now: config.sealed.len(),
        })
    }
}
