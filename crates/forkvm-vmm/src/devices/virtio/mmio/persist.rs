//! Saving and restoring a virtio-mmio transport.
//!
//! A snapshot must capture exactly what the guest driver believes about the device:
//! status, negotiated features, queue addresses and ring positions, pending interrupt
//! bits. The state is untrusted input when it comes back (snapshot files can be edited),
//! so [`MmioTransport::restore`] checks it against the device and guest memory before
//! any queue is used, and rebuilds — never patches — the transport.

use super::{MmioError, MmioTransport, INT_CONFIG, INT_USED_RING, S_ALL, S_DRIVER_OK, S_FEATURES_OK};
use crate::devices::virtio::device::VIRTIO_F_VERSION_1;
use crate::devices::virtio::ratelimit::LogLimiter;
use crate::devices::virtio::{Interrupt, VirtioDevice, VirtioDeviceState};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use virtio_queue::{Queue, QueueState, QueueT};
use vm_memory::GuestMemoryMmap;

/// One virtqueue, as the driver configured it and as far as the device got.
/// (`virtio_queue::QueueState` has the same fields but no serde support.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueSnapshot {
    pub max_size: u16,
    pub size: u16,
    pub ready: bool,
    pub desc_table: u64,
    pub avail_ring: u64,
    pub used_ring: u64,
    pub next_avail: u16,
    pub next_used: u16,
    pub event_idx_enabled: bool,
}

impl From<QueueState> for QueueSnapshot {
    fn from(s: QueueState) -> Self {
        QueueSnapshot {
            max_size: s.max_size,
            size: s.size,
            ready: s.ready,
            desc_table: s.desc_table,
            avail_ring: s.avail_ring,
            used_ring: s.used_ring,
            next_avail: s.next_avail,
            next_used: s.next_used,
            event_idx_enabled: s.event_idx_enabled,
        }
    }
}

impl From<QueueSnapshot> for QueueState {
    fn from(s: QueueSnapshot) -> Self {
        QueueState {
            max_size: s.max_size,
            next_avail: s.next_avail,
            next_used: s.next_used,
            event_idx_enabled: s.event_idx_enabled,
            size: s.size,
            ready: s.ready,
            desc_table: s.desc_table,
            avail_ring: s.avail_ring,
            used_ring: s.used_ring,
        }
    }
}

/// Everything the transport knows, plus the device's own state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MmioTransportState {
    pub device_type: u32,
    pub status: u32,
    pub device_features_sel: u32,
    pub driver_features_sel: u32,
    /// Features the driver wrote (accepted by the device once FEATURES_OK is set).
    pub driver_features: u64,
    pub acked_beyond_64: bool,
    pub queue_sel: u32,
    pub interrupt_status: u32,
    pub config_generation: u32,
    pub activated: bool,
    pub queues: Vec<QueueSnapshot>,
    pub device: VirtioDeviceState,
}

impl MmioTransport {
    /// The transport's state. After activation the ring positions come from the device,
    /// which owns the live queues.
    pub fn save(&self) -> MmioTransportState {
        let live = if self.activated { self.device.queue_states() } else { Vec::new() };
        let queues = self
            .queues
            .iter()
            .enumerate()
            .map(|(i, q)| QueueSnapshot::from(live.get(i).copied().unwrap_or_else(|| q.state())))
            .collect();
        if self.activated && live.len() != self.queues.len() {
            tracing::error!(
                device_type = self.device.device_type(),
                live = live.len(),
                queues = self.queues.len(),
                "active device reported the wrong number of queue states; saving the configured ones"
            );
        }
        MmioTransportState {
            device_type: self.device.device_type(),
            status: self.status,
            device_features_sel: self.device_features_sel,
            driver_features_sel: self.driver_features_sel,
            driver_features: self.driver_features,
            acked_beyond_64: self.acked_beyond_64,
            queue_sel: self.queue_sel,
            interrupt_status: self.interrupt_status.load(Ordering::SeqCst),
            config_generation: self.config_generation,
            activated: self.activated,
            queues,
            device: self.device.save(),
        }
    }

    /// Rebuilds a transport from `state` around `device` (already restored from
    /// `state.device` by the caller). If the device was active, its queues are rebuilt
    /// and it is activated again; it must not have been activated by the caller.
    pub fn restore(
        state: &MmioTransportState,
        device: Box<dyn VirtioDevice>,
        mem: GuestMemoryMmap,
        interrupt: Arc<dyn Interrupt>,
    ) -> Result<MmioTransport, MmioError> {
        let actual = device.device_type();
        for saved in [state.device_type, state.device.device_type()] {
            if saved != actual {
                return Err(MmioError::DeviceTypeMismatch { saved, actual });
            }
        }
        let queues = restore_queues(state, device.as_ref(), &mem)?;
        check_status(state)?;
        let offered = device.device_features();
        let acked = state.driver_features;
        let negotiated = state.status & S_FEATURES_OK != 0;
        if negotiated && (acked & !offered != 0 || acked & VIRTIO_F_VERSION_1 == 0 || state.acked_beyond_64) {
            return Err(MmioError::UnofferedFeatures { acked, offered });
        }
        if state.interrupt_status & !(INT_USED_RING | INT_CONFIG) != 0 {
            return Err(MmioError::InvalidInterruptStatus(state.interrupt_status));
        }

        let mut transport = MmioTransport {
            device,
            mem,
            interrupt,
            interrupt_status: Arc::new(AtomicU32::new(state.interrupt_status)),
            status: state.status,
            device_features_sel: state.device_features_sel,
            driver_features_sel: state.driver_features_sel,
            driver_features: acked,
            acked_beyond_64: state.acked_beyond_64,
            queue_sel: state.queue_sel,
            queues,
            config_generation: state.config_generation,
            activated: false,
            log_limit: LogLimiter::default(),
        };
        if negotiated {
            transport.device.set_acked_features(acked);
        }
        if state.activated {
            let live = transport.device_queues().map_err(MmioError::ActivateDevice)?;
            transport.activate_with(live).map_err(MmioError::ActivateDevice)?;
        }
        Ok(transport)
    }
}

/// Validates the saved queues against the device's maximum sizes and guest memory.
fn restore_queues(
    state: &MmioTransportState,
    device: &dyn VirtioDevice,
    mem: &GuestMemoryMmap,
) -> Result<Vec<Queue>, MmioError> {
    let max_sizes = device.queue_max_sizes();
    if state.queues.len() != max_sizes.len() {
        return Err(MmioError::QueueCountMismatch { saved: state.queues.len(), actual: max_sizes.len() });
    }
    let invalid = |index: usize, reason: String| MmioError::InvalidQueue { index, reason };
    let mut queues = Vec::with_capacity(max_sizes.len());
    for (index, (saved, &max)) in state.queues.iter().zip(max_sizes).enumerate() {
        if saved.max_size != max {
            return Err(invalid(index, format!("max size {} but the device offers {max}", saved.max_size)));
        }
        // Checks size (power of two, <= max) and ring alignment.
        let queue = Queue::try_from(QueueState::from(*saved)).map_err(|e| invalid(index, e.to_string()))?;
        if (saved.ready || state.activated) && !queue.is_valid(mem) {
            return Err(invalid(index, "rings are not inside guest memory".to_string()));
        }
        queues.push(queue);
    }
    Ok(queues)
}

/// The status must be one the state machine can reach, and "activated" must agree
/// with it.
fn check_status(state: &MmioTransportState) -> Result<(), MmioError> {
    use super::{S_ACKNOWLEDGE, S_DRIVER, S_NEEDS_RESET};
    let s = state.status;
    let ordered = (s & S_DRIVER == 0 || s & S_ACKNOWLEDGE != 0)
        && (s & S_FEATURES_OK == 0 || s & S_DRIVER != 0)
        && (s & S_DRIVER_OK == 0 || s & S_FEATURES_OK != 0);
    // DRIVER_OK without NEEDS_RESET means the device accepted its queues, and only then.
    let activated_ok = state.activated == (s & S_DRIVER_OK != 0 && s & S_NEEDS_RESET == 0);
    if s & !S_ALL != 0 || !ordered || !activated_ok {
        return Err(MmioError::InvalidStatus(s));
    }
    Ok(())
}
