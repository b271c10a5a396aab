//! Saved state of the virtio-net device: the negotiated features and the MAC.
//!
//! Not saved: the tap (whoever restores gives the clone a tap of its own, in its own
//! network namespace), the tap's offloads (set again from the saved features before the
//! first frame), a frame that waited for receive buffers (dropped: the sender
//! retransmits), rate-limit buckets and counters (as every device's). The queues are
//! the transport's to save.

use super::backend::{FrameEndpoint, NetRateLimits};
use super::{Net, NetError, OFFERED_FEATURES};
use crate::devices::virtio::VirtioDevice;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetState {
    pub acked_features: u64,
    pub mac: [u8; 6],
}

impl Net {
    /// A device as it was when `state` was saved, over `ep`, not yet active (the
    /// transport's restore activates it with the saved queues).
    pub fn restore(state: &NetState, ep: Arc<dyn FrameEndpoint>, limits: NetRateLimits) -> Result<Net, NetError> {
        if state.acked_features & !OFFERED_FEATURES != 0 {
            return Err(NetError::RestoreFeatures { acked: state.acked_features, offered: OFFERED_FEATURES });
        }
        let mut net = Net::new(ep, state.mac, limits)?;
        net.set_acked_features(state.acked_features);
        Ok(net)
    }
}
