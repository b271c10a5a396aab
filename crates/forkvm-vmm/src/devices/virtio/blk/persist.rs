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
    /// A layered disk's sealed layer ids (hex), oldest first: the disk content the
    /// guest's memory was captured with. `None` for a raw image.
    pub layers: Option<Vec<String>>,
}

impl BlockState {
    /// Whether the guest was told of an empty layered disk: a volume slot with nothing
    /// in it (capacity 0, no layers), which a restore may fill with any layered disk.
    pub fn is_empty_slot(&self) -> bool {
        self.capacity == 0 && self.layers.as_deref() == Some(&[][..])
    }
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
            layers: self.sealed_layers().map(|l| l.iter().map(|(_, id)| id.to_string()).collect()),
        }
    }

    /// Opens the image at `path` (which may differ from `state.path`: a fork gets its
    /// own copy) as the device was when `state` was saved, not yet active (the
    /// transport's restore activates it with the saved queue).
    pub fn restore(path: &Path, state: &BlockState) -> Result<Block, BlockError> {
        Block::new(path, state.read_only, &state.id)?.with_state(state)
    }

    /// Applies `state` to a device just opened (raw or layered) for a restore, refusing
    /// a disk that is not the one the guest was using: capacity, features, and for a
    /// layered disk the exact sealed layers.
    pub fn with_state(self, state: &BlockState) -> Result<Block, BlockError> {
        self.with_state_replacing(state, &[])
    }

    /// [`Block::with_state`] for a disk whose lower layers were rebuilt from a vault
    /// snapshot: its lowest layer (lazy, or the first sealed one) stands for the saved
    /// layers `replaces`. Empty `replaces` is [`Block::with_state`].
    pub fn with_state_replacing(self, state: &BlockState, replaces: &[String]) -> Result<Block, BlockError> {
        if state.is_empty_slot() && replaces.is_empty() && self.sealed_layers().is_some() {
            return self.inserted_into(state);
        }
        let given = self.sealed_layers().map(|l| {
            let ids = l.iter().map(|(_, id)| id.to_string());
            if replaces.is_empty() {
                ids.collect::<Vec<_>>()
            } else {
                // An eager rebuild is the first sealed layer; a lazy one is below them.
                let skip = usize::from(!self.is_lazy());
                replaces.iter().cloned().chain(ids.skip(skip)).collect()
            }
        });
        if given != state.layers {
            let show = |l: &Option<Vec<String>>| l.as_ref().map_or("a raw image".to_string(), |v| format!("{v:?}"));
            return Err(BlockError::RestoreLayers {
                id: state.id.clone(),
                saved: show(&state.layers),
                given: show(&given),
            });
        }
        let path = self.disk.path.clone();
        let mut block = self;
        if block.capacity() != state.capacity {
            return Err(BlockError::RestoreCapacity { path, saved: state.capacity, actual: block.capacity() });
        }
        let offered = block.device_features();
        if state.acked_features & !offered != 0 {
            return Err(BlockError::RestoreFeatures { acked: state.acked_features, offered });
        }
        block.set_acked_features(state.acked_features);
        Ok(block)
    }

    /// A disk put into an empty slot (`state` is [`BlockState::is_empty_slot`]) at a
    /// restore: the guest's driver learns its capacity from a configuration-change
    /// interrupt once the VM runs ([`Block::take_media_change`]). Its serial must be the
    /// slot's and it must offer what the driver acked (read-only is enforced by refusing
    /// writes, never by a feature the driver did not negotiate).
    fn inserted_into(mut self, state: &BlockState) -> Result<Block, BlockError> {
        if self.disk.id != state.id {
            return Err(BlockError::RestoreLayers {
                id: state.id.clone(),
                saved: "an empty volume slot".into(),
                given: format!("a disk with serial {:?}", self.disk.id),
            });
        }
        let offered = self.device_features();
        if state.acked_features & !offered != 0 {
            return Err(BlockError::RestoreFeatures { acked: state.acked_features, offered });
        }
        self.set_acked_features(state.acked_features);
        self.media_changed = self.capacity() != 0;
        Ok(self)
    }
}
