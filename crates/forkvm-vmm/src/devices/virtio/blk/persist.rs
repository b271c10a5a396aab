//! Saved state of a virtio-blk device.
//!
//! The image's contents are not state: they live in the file (or, with layered disks,
//! in the sealed layers). What is saved is what the guest was told — capacity,
//! read-only, serial, negotiated features — so a restore can refuse an image that no
//! longer matches what the guest's driver believes.

use super::{Block, BlockError};
use crate::devices::virtio::VirtioDevice;
use serde::{Deserialize, Serialize};
use std::path::Path;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockState {
    /// Where the image was when saved (informational: restore is given the path).
    pub path: String,
    pub read_only: bool,
    pub id: String,
    /// In 512-byte sectors.
    pub capacity: u64,
    pub acked_features: u64,
}

impl Block {
    /// The device's state.
    pub fn state(&self) -> BlockState {
        BlockState {
            path: self.disk.path.display().to_string(),
            read_only: self.disk.read_only,
            id: self.disk.id.clone(),
            capacity: self.disk.capacity,
            acked_features: self.acked_features,
        }
    }

    /// Opens the image at `path` (which may differ from `state.path`: a fork gets its
    /// own copy) as the device was when `state` was saved, not yet active (the
    /// transport's restore activates it with the saved queue).
    pub fn restore(path: &Path, state: &BlockState) -> Result<Block, BlockError> {
        let mut block = Block::new(path, state.read_only, &state.id)?;
        if block.capacity() != state.capacity {
            return Err(BlockError::RestoreCapacity {
                path: path.to_path_buf(),
                saved: state.capacity,
                actual: block.capacity(),
            });
        }
        let offered = block.device_features();
        if state.acked_features & !offered != 0 {
            return Err(BlockError::RestoreFeatures { acked: state.acked_features, offered });
        }
        block.set_acked_features(state.acked_features);
        Ok(block)
    }
}
