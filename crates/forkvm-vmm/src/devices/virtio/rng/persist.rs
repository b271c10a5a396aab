//! Saved state of the virtio-rng device.
//!
//! The device has no state of its own beyond the negotiated features: the queue is
//! saved by the transport and the entropy source is the host's.

use super::{Rng, RngError};
use crate::devices::virtio::VirtioDevice;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RngState {
    pub acked_features: u64,
}

impl Rng {
    /// A device as it was when `state` was saved, not yet active (the transport's
    /// restore activates it with the saved queue).
    pub fn restore(state: &RngState) -> Result<Rng, RngError> {
        let mut rng = Rng::new();
        let offered = rng.device_features();
        if state.acked_features & !offered != 0 {
            return Err(RngError::RestoreFeatures { acked: state.acked_features, offered });
        }
        rng.set_acked_features(state.acked_features);
        Ok(rng)
    }
}
