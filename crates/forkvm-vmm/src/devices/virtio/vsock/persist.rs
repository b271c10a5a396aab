//! Saved state of the vsock device.
//!
//! Only the guest CID and the negotiated features are saved. Streams are **not**: their
//! host sockets belong to the process that took the snapshot. A restored device
//! therefore starts with no streams and, as soon as it is activated, puts a
//! `VIRTIO_VSOCK_EVENT_TRANSPORT_RESET` on the event queue; the guest driver then
//! resets every socket it had open (virtio 1.2 §5.10.6.6) and applications reconnect.
//! A host-initiated stream must likewise be reopened by the host client.

use super::device::Vsock;
use super::VsockError;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// What a snapshot keeps of a vsock device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VsockState {
    pub guest_cid: u64,
    pub acked_features: u64,
}

impl Vsock {
    /// The device's saved state.
    pub fn state(&self) -> VsockState {
        VsockState { guest_cid: self.guest_cid(), acked_features: self.acked_features() }
    }

    /// Rebuilds a device from `state`, listening on `uds_path` (which may differ from
    /// the snapshotted VM's, e.g. one path per forked child). The snapshot bytes are
    /// untrusted: the CID and features are checked. Once activated, the device posts a
    /// transport-reset event (see the module doc).
    pub fn restore(state: &VsockState, uds_path: PathBuf) -> Result<Vsock, VsockError> {
        let mut vsock = Vsock::new(state.guest_cid, uds_path)?;
        let offered = vsock.offered_features();
        if state.acked_features & !offered != 0 {
            return Err(VsockError::RestoreFeatures { acked: state.acked_features, offered });
        }
        vsock.set_restored(state.acked_features);
        Ok(vsock)
    }
}
