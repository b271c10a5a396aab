//! The contract between the virtio-mmio transport and a virtio device.

use serde::{Deserialize, Serialize};
use std::sync::Arc;
use vm_memory::GuestMemoryMmap;

/// virtio device IDs (virtio 1.2 §5).
pub const TYPE_NET: u32 = 1;
pub const TYPE_BLOCK: u32 = 2;
pub const TYPE_RNG: u32 = 4;
pub const TYPE_VSOCK: u32 = 19;

/// Feature bit every modern device offers.
pub const VIRTIO_F_VERSION_1: u64 = 1 << 32;

/// How a device tells the driver that it used buffers (or that its configuration
/// changed). The transport sets the interrupt-status bits; this only delivers the edge.
pub trait Interrupt: Send + Sync + std::fmt::Debug {
    fn trigger(&self) -> std::io::Result<()>;
}

impl Interrupt for crate::devices::irq::IrqLine {
    fn trigger(&self) -> std::io::Result<()> {
        self.pulse()
    }
}

/// What the transport gives a device when the driver has set DRIVER_OK.
#[derive(Debug, Clone)]
pub struct ActivateContext {
    pub mem: GuestMemoryMmap,
    /// Trigger after adding to a used ring: the transport's implementation sets its
    /// "used buffer" interrupt-status bit and raises the interrupt line.
    pub notify_used: Arc<dyn Interrupt>,
}

/// A virtio device behind a transport.
pub trait VirtioDevice: Send + std::fmt::Debug {
    /// virtio device ID (`TYPE_*`).
    fn device_type(&self) -> u32;
    /// Maximum size of each queue, in queue order.
    fn queue_max_sizes(&self) -> &[u16];
    /// Feature bits the device offers (including `VIRTIO_F_VERSION_1`).
    fn device_features(&self) -> u64;
    /// The features the driver accepted (a subset of `device_features`).
    fn set_acked_features(&mut self, features: u64);
    /// Reads the device-specific configuration space at `offset`.
    fn read_config(&self, offset: u64, data: &mut [u8]);
    /// Writes the device-specific configuration space (most devices ignore writes).
    fn write_config(&mut self, offset: u64, data: &[u8]);
    /// Starts the device with its queues (index = queue number), set up by the driver.
    fn activate(&mut self, ctx: ActivateContext, queues: Vec<virtio_queue::Queue>) -> Result<(), ActivateError>;
    /// The driver notified queue `index` (a write to QueueNotify).
    fn queue_notify(&mut self, index: u16);
    /// The driver reset the device (status 0): stop using the queues.
    fn reset(&mut self);
    /// The live state of the queues handed over by `activate`, in queue order; empty
    /// while the device is not active. The transport saves these, since after activation
    /// only the device knows how far it has consumed each ring.
    fn queue_states(&self) -> Vec<virtio_queue::QueueState>;
    /// The device's own state (not the queues: the transport saves those).
    fn save(&self) -> VirtioDeviceState;
    /// The VM is stopping for good: release host resources now (threads, sockets, files),
    /// since a VMM process may end without running destructors.
    fn shutdown(&mut self) {}
    /// Stop touching guest memory and queues until [`resume`](Self::resume): the VM is
    /// paused (e.g. for a snapshot). Devices that only work on the vCPU thread's
    /// notifications need nothing but to hold their deferred passes (a rate limit's);
    /// devices with a backend thread must hold it.
    fn pause(&mut self) {
        if let Some(t) = self.throttle_mut() {
            t.pause();
        }
    }
    /// Undo [`pause`](Self::pause).
    fn resume(&mut self) {
        if let Some(t) = self.throttle_mut() {
            t.resume();
        }
    }
    /// The device's rate limit, for devices that take one (block, rng: single-queue
    /// devices served on notification, whose deferred pass is a notification of queue 0).
    fn throttle(&self) -> Option<&super::throttle::Throttle> {
        None
    }
    fn throttle_mut(&mut self) -> Option<&mut super::throttle::Throttle> {
        None
    }
    /// Whether the driver posted requests the device has not taken yet.
    fn has_pending(&self) -> bool {
        false
    }
    /// Whether the device may ask for passes of deferred work
    /// ([`crate::devices::deferred`]): it has a rate limit, or its restored queues still
    /// hold requests the guest will not notify again.
    fn wants_deferral(&self) -> bool {
        self.throttle().is_some_and(super::throttle::Throttle::is_limited) || self.has_pending()
    }
    /// Where the device asks for passes of deferred work (given when it wants them).
    fn set_deferral(&mut self, deferral: crate::devices::deferred::Deferral) {
        if let Some(t) = self.throttle_mut() {
            t.set_deferral(deferral);
        }
    }
    /// One pass of deferred work, on the device timer thread under the transport's lock:
    /// serve the queue as a notification would (unless paused: then once resumed).
    fn run_deferred(&mut self) {
        if self.throttle_mut().is_some_and(|t| t.may_run()) && self.has_pending() {
            self.queue_notify(0);
        }
    }
    /// How many times the device's rate limit held a request back; `None`: it has none.
    fn throttled(&self) -> Option<u64> {
        self.throttle().filter(|t| t.is_limited()).map(super::throttle::Throttle::held)
    }
    /// Whether the device's configuration changed while the VM was not running (a
    /// restore put a disk into an empty slot) and the driver must be told, once the
    /// VM's interrupts are armed. Asking clears it.
    fn take_config_change(&mut self) -> bool {
        false
    }
    /// The block device behind this trait object, for operations only disks have
    /// (sealing a layered disk's top).
    fn as_block_mut(&mut self) -> Option<&mut super::blk::Block> {
        None
    }
}

/// Per-device saved state. Each device replaces its placeholder payload with the typed
/// state struct from its own `persist.rs`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum VirtioDeviceState {
    Rng(super::rng::RngState),
    Block(super::blk::BlockState),
    Vsock(super::vsock::VsockState),
    Net(super::net::NetState),
}

impl VirtioDeviceState {
    /// The virtio device ID (`TYPE_*`) this state belongs to, so a restore can check that
    /// the saved state and the device it is given agree.
    pub fn device_type(&self) -> u32 {
        match self {
            VirtioDeviceState::Rng(_) => TYPE_RNG,
            VirtioDeviceState::Block(_) => TYPE_BLOCK,
            VirtioDeviceState::Vsock(_) => TYPE_VSOCK,
            VirtioDeviceState::Net(_) => TYPE_NET,
        }
    }
}

/// Why a device could not start with the queues the driver set up.
#[derive(Debug, thiserror::Error)]
pub enum ActivateError {
    #[error("{device} needs {want} queues, got {got}")]
    QueueCount { device: &'static str, want: usize, got: usize },
    #[error("queue {0} is not ready or not inside guest memory")]
    QueueNotReady(usize),
    #[error("queue {index}: {source}")]
    Queue { index: usize, source: virtio_queue::Error },
    #[error("starting the {device} backend: {source}")]
    Backend { device: &'static str, source: Box<dyn std::error::Error + Send + Sync> },
}
