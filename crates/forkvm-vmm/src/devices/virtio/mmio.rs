//! The virtio-mmio transport (virtio 1.2 §4.2, version 2 "modern" register layout).
//!
//! The guest finds each device as a 512-byte MMIO window announced on the kernel command
//! line. This module owns everything in that window that is not device-specific: feature
//! negotiation, the device-status state machine, virtqueue configuration and the
//! interrupt-status register. When the driver sets DRIVER_OK the configured queues are
//! handed to the device ([`VirtioDevice::activate`]); from then on the device owns them.
//!
//! Everything here is reachable by the guest, so nothing panics: bad offsets, widths or
//! out-of-order status writes are logged (rate-limited) and ignored.

pub mod persist;
mod queue_regs;
#[cfg(test)]
mod tests;

use super::ratelimit::LogLimiter;
use super::{ActivateContext, ActivateError, Interrupt, VirtioDevice};
use queue_regs::{set_high, set_low, Ring};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use virtio_bindings::virtio_config::{
    VIRTIO_CONFIG_S_ACKNOWLEDGE, VIRTIO_CONFIG_S_DRIVER, VIRTIO_CONFIG_S_DRIVER_OK, VIRTIO_CONFIG_S_FAILED,
    VIRTIO_CONFIG_S_FEATURES_OK, VIRTIO_CONFIG_S_NEEDS_RESET,
};
use virtio_bindings::virtio_mmio as reg;
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryMmap;

pub use persist::{MmioTransportState, QueueSnapshot};

/// "virt" in little endian.
pub const MMIO_MAGIC_VALUE: u32 = 0x7472_6976;
/// The modern (virtio 1.x) register layout.
pub const MMIO_VERSION: u32 = 2;
/// Our vendor ID: "fkvm" in little endian.
pub const MMIO_VENDOR_ID: u32 = u32::from_le_bytes(*b"fkvm");
/// Size of the register window, config space included.
pub const MMIO_WINDOW_SIZE: u64 = 0x200;
/// Where the device-specific configuration space starts.
pub const MMIO_CONFIG_OFFSET: u64 = reg::VIRTIO_MMIO_CONFIG as u64;

/// Interrupt-status bit: the device used buffers.
pub const INT_USED_RING: u32 = reg::VIRTIO_MMIO_INT_VRING;
/// Interrupt-status bit: the configuration changed (or the device needs a reset).
pub const INT_CONFIG: u32 = reg::VIRTIO_MMIO_INT_CONFIG;

const S_ACKNOWLEDGE: u32 = VIRTIO_CONFIG_S_ACKNOWLEDGE;
const S_DRIVER: u32 = VIRTIO_CONFIG_S_DRIVER;
const S_FEATURES_OK: u32 = VIRTIO_CONFIG_S_FEATURES_OK;
const S_DRIVER_OK: u32 = VIRTIO_CONFIG_S_DRIVER_OK;
const S_NEEDS_RESET: u32 = VIRTIO_CONFIG_S_NEEDS_RESET;
const S_FAILED: u32 = VIRTIO_CONFIG_S_FAILED;
/// Every status bit the spec defines.
const S_ALL: u32 = S_ACKNOWLEDGE | S_DRIVER | S_FEATURES_OK | S_DRIVER_OK | S_NEEDS_RESET | S_FAILED;

/// The feature bit that makes a queue use `used_event`/`avail_event`.
const F_EVENT_IDX: u64 = 1 << VIRTIO_RING_F_EVENT_IDX;

#[derive(Debug, thiserror::Error)]
pub enum MmioError {
    #[error("device {0} has an invalid maximum queue size")]
    CreateQueue(u32, #[source] virtio_queue::Error),
    #[error("saved state is for device type {saved}, the device given is type {actual}")]
    DeviceTypeMismatch { saved: u32, actual: u32 },
    #[error("saved state has {saved} queues, the device has {actual}")]
    QueueCountMismatch { saved: usize, actual: usize },
    #[error("saved queue {index} is invalid: {reason}")]
    InvalidQueue { index: usize, reason: String },
    #[error("saved acked features {acked:#x} are not a subset of the offered {offered:#x}")]
    UnofferedFeatures { acked: u64, offered: u64 },
    #[error("saved device status {0:#x} is not a state the transport can reach")]
    InvalidStatus(u32),
    #[error("saved interrupt status {0:#x} has unknown bits")]
    InvalidInterruptStatus(u32),
    #[error("activating the restored device: {0}")]
    ActivateDevice(#[source] ActivateError),
}

/// Delivers a device's used-buffer notification: sets the interrupt-status bit the
/// driver reads, then raises the line.
#[derive(Debug)]
struct UsedRingNotifier {
    interrupt_status: Arc<AtomicU32>,
    line: Arc<dyn Interrupt>,
}

impl Interrupt for UsedRingNotifier {
    fn trigger(&self) -> std::io::Result<()> {
        self.interrupt_status.fetch_or(INT_USED_RING, Ordering::SeqCst);
        self.line.trigger()
    }
}

/// One virtio device behind its virtio-mmio register window.
#[derive(Debug)]
pub struct MmioTransport {
    device: Box<dyn VirtioDevice>,
    mem: GuestMemoryMmap,
    interrupt: Arc<dyn Interrupt>,
    interrupt_status: Arc<AtomicU32>,
    status: u32,
    device_features_sel: u32,
    driver_features_sel: u32,
    driver_features: u64,
    /// The driver acked a feature bit above 63 (none is ever offered).
    acked_beyond_64: bool,
    queue_sel: u32,
    /// The driver's queue configuration. After activation the device owns the live
    /// queues; these copies still answer register reads.
    queues: Vec<Queue>,
    config_generation: u32,
    activated: bool,
    log_limit: LogLimiter,
}

impl MmioTransport {
    /// Wraps `device`, reset (status 0). A device whose maximum queue sizes are not
    /// powers of two in 1..=32768 is a programming error; such queues are left out and
    /// logged, and the driver will see QueueNumMax 0 for them.
    pub fn new(device: Box<dyn VirtioDevice>, mem: GuestMemoryMmap, interrupt: Arc<dyn Interrupt>) -> MmioTransport {
        let queues = device
            .queue_max_sizes()
            .iter()
            .filter_map(|&max| match Queue::new(max) {
                Ok(q) => Some(q),
                Err(e) => {
                    tracing::error!(device_type = device.device_type(), max, error = %e, "invalid queue size");
                    None
                }
            })
            .collect();
        MmioTransport {
            device,
            mem,
            interrupt,
            interrupt_status: Arc::new(AtomicU32::new(0)),
            status: 0,
            device_features_sel: 0,
            driver_features_sel: 0,
            driver_features: 0,
            acked_beyond_64: false,
            queue_sel: 0,
            queues,
            config_generation: 0,
            activated: false,
            log_limit: LogLimiter::default(),
        }
    }

    /// Tells the driver the device's configuration changed (virtio 1.2 §4.2.2.1): a
    /// new configuration generation, the CONFIG bit in the interrupt status, the line
    /// raised. A driver that has not finished initialising reads the configuration
    /// afresh anyway.
    pub fn notify_config_change(&mut self) -> std::io::Result<()> {
        self.config_generation = self.config_generation.wrapping_add(1);
        self.interrupt_status.fetch_or(INT_CONFIG, Ordering::SeqCst);
        self.interrupt.trigger()
    }

    /// The device behind this transport.
    pub fn device(&self) -> &dyn VirtioDevice {
        self.device.as_ref()
    }

    pub fn device_mut(&mut self) -> &mut dyn VirtioDevice {
        self.device.as_mut()
    }

    /// Whether the driver set DRIVER_OK and the device accepted its queues.
    pub fn is_activated(&self) -> bool {
        self.activated
    }

    /// The device-status register.
    pub fn status(&self) -> u32 {
        self.status
    }

    /// A guest read of `data.len()` bytes at `offset` in the window.
    pub fn read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if offset >= MMIO_CONFIG_OFFSET {
            self.device.read_config(offset - MMIO_CONFIG_OFFSET, data);
            return;
        }
        if data.len() != 4 || offset & 3 != 0 {
            self.guest_error(offset, data.len(), "register read with bad width or alignment");
            return;
        }
        let value = match offset as u32 {
            reg::VIRTIO_MMIO_MAGIC_VALUE => MMIO_MAGIC_VALUE,
            reg::VIRTIO_MMIO_VERSION => MMIO_VERSION,
            reg::VIRTIO_MMIO_DEVICE_ID => self.device.device_type(),
            reg::VIRTIO_MMIO_VENDOR_ID => MMIO_VENDOR_ID,
            reg::VIRTIO_MMIO_DEVICE_FEATURES => match self.device_features_sel {
                0 => self.device.device_features() as u32,
                1 => (self.device.device_features() >> 32) as u32,
                _ => 0,
            },
            reg::VIRTIO_MMIO_QUEUE_NUM_MAX => self.selected_queue().map_or(0, |q| u32::from(q.max_size())),
            reg::VIRTIO_MMIO_QUEUE_READY => self.selected_queue().map_or(0, |q| u32::from(q.ready())),
            reg::VIRTIO_MMIO_INTERRUPT_STATUS => self.interrupt_status.load(Ordering::SeqCst),
            reg::VIRTIO_MMIO_STATUS => self.status,
            reg::VIRTIO_MMIO_CONFIG_GENERATION => self.config_generation,
            // No shared-memory regions: a length of all ones means "absent".
            reg::VIRTIO_MMIO_SHM_LEN_LOW | reg::VIRTIO_MMIO_SHM_LEN_HIGH => u32::MAX,
            reg::VIRTIO_MMIO_SHM_BASE_LOW | reg::VIRTIO_MMIO_SHM_BASE_HIGH => u32::MAX,
            _ => {
                self.guest_error(offset, data.len(), "read of a write-only or unknown register");
                0
            }
        };
        data.copy_from_slice(&value.to_le_bytes());
    }

    /// A guest write of `data` at `offset` in the window.
    pub fn write(&mut self, offset: u64, data: &[u8]) {
        if offset >= MMIO_CONFIG_OFFSET {
            self.device.write_config(offset - MMIO_CONFIG_OFFSET, data);
            return;
        }
        let Ok(bytes) = <[u8; 4]>::try_from(data) else {
            self.guest_error(offset, data.len(), "register write with bad width");
            return;
        };
        if offset & 3 != 0 {
            self.guest_error(offset, data.len(), "unaligned register write");
            return;
        }
        let value = u32::from_le_bytes(bytes);
        match offset as u32 {
            reg::VIRTIO_MMIO_DEVICE_FEATURES_SEL => self.device_features_sel = value,
            reg::VIRTIO_MMIO_DRIVER_FEATURES_SEL => self.driver_features_sel = value,
            reg::VIRTIO_MMIO_DRIVER_FEATURES => self.write_driver_features(offset, value),
            reg::VIRTIO_MMIO_QUEUE_SEL => self.queue_sel = value,
            reg::VIRTIO_MMIO_QUEUE_NUM => self.configure_queue(offset, |q| q.try_set_size(value as u16).is_ok()),
            reg::VIRTIO_MMIO_QUEUE_READY => self.configure_queue(offset, |q| {
                q.set_ready(value == 1);
                true
            }),
            reg::VIRTIO_MMIO_QUEUE_DESC_LOW => self.configure_queue(offset, |q| set_low(q, Ring::Desc, value)),
            reg::VIRTIO_MMIO_QUEUE_DESC_HIGH => self.configure_queue(offset, |q| set_high(q, Ring::Desc, value)),
            reg::VIRTIO_MMIO_QUEUE_AVAIL_LOW => self.configure_queue(offset, |q| set_low(q, Ring::Avail, value)),
            reg::VIRTIO_MMIO_QUEUE_AVAIL_HIGH => self.configure_queue(offset, |q| set_high(q, Ring::Avail, value)),
            reg::VIRTIO_MMIO_QUEUE_USED_LOW => self.configure_queue(offset, |q| set_low(q, Ring::Used, value)),
            reg::VIRTIO_MMIO_QUEUE_USED_HIGH => self.configure_queue(offset, |q| set_high(q, Ring::Used, value)),
            reg::VIRTIO_MMIO_QUEUE_NOTIFY => self.notify(offset, value),
            reg::VIRTIO_MMIO_INTERRUPT_ACK => {
                self.interrupt_status.fetch_and(!value, Ordering::SeqCst);
            }
            reg::VIRTIO_MMIO_STATUS => self.write_status(value),
            reg::VIRTIO_MMIO_SHM_SEL => {}
            _ => self.guest_error(offset, data.len(), "write to a read-only or unknown register"),
        }
    }

    fn selected_queue(&self) -> Option<&Queue> {
        self.queues.get(self.queue_sel as usize)
    }

    fn write_driver_features(&mut self, offset: u64, value: u32) {
        if self.status & S_DRIVER == 0 || self.status & S_FEATURES_OK != 0 {
            self.guest_error(offset, 4, "driver features written outside feature negotiation");
            return;
        }
        match self.driver_features_sel {
            0 => self.driver_features = (self.driver_features & !0xffff_ffff) | u64::from(value),
            1 => self.driver_features = (self.driver_features & 0xffff_ffff) | (u64::from(value) << 32),
            // No feature bits exist above 63: acking any of them is acking unoffered ones.
            _ => self.acked_beyond_64 |= value != 0,
        }
    }

    /// Applies `f` to the selected queue, only while the driver may configure queues:
    /// after FEATURES_OK, before DRIVER_OK, and while the queue is not ready (except for
    /// the QueueReady write itself).
    fn configure_queue(&mut self, offset: u64, f: impl FnOnce(&mut Queue) -> bool) {
        let configuring = self.status & S_FEATURES_OK != 0 && self.status & S_DRIVER_OK == 0;
        let is_ready_write = offset == u64::from(reg::VIRTIO_MMIO_QUEUE_READY);
        let index = self.queue_sel as usize;
        let accepted = match self.queues.get_mut(index) {
            Some(q) if configuring && (is_ready_write || !q.ready()) => f(q),
            _ => false,
        };
        if !accepted {
            self.guest_error(offset, 4, "queue configuration write refused (wrong state, queue or value)");
        }
    }

    fn notify(&mut self, offset: u64, value: u32) {
        let index = value & 0xffff;
        if !self.activated || index as usize >= self.queues.len() {
            self.guest_error(offset, 4, "notify of an inactive device or unknown queue");
            return;
        }
        self.device.queue_notify(index as u16);
    }

    fn write_status(&mut self, value: u32) {
        if value == 0 {
            self.reset();
            return;
        }
        let old = self.status & !S_NEEDS_RESET;
        let new = value & !S_NEEDS_RESET;
        let ordered = (new & S_DRIVER == 0 || new & S_ACKNOWLEDGE != 0)
            && (new & S_FEATURES_OK == 0 || new & S_DRIVER != 0)
            && (new & S_DRIVER_OK == 0 || new & S_FEATURES_OK != 0);
        if new & !S_ALL != 0 || new & old != old || !ordered {
            self.guest_error(u64::from(reg::VIRTIO_MMIO_STATUS), 4, "status write out of order");
            return;
        }
        let added = new & !old;
        let mut status = new | (self.status & S_NEEDS_RESET);
        if added & S_FEATURES_OK != 0 && !self.accept_features() {
            // The driver reads FEATURES_OK back and gives up when it is clear.
            status &= !(S_FEATURES_OK | S_DRIVER_OK);
        }
        self.status = status;
        if self.status & added & S_DRIVER_OK != 0 {
            if let Err(reason) = self.activate() {
                if let Some(suppressed) = self.log_limit.allow() {
                    tracing::warn!(device_type = self.device.device_type(), %reason, suppressed, "activation failed");
                }
                self.status |= S_NEEDS_RESET;
                self.interrupt_status.fetch_or(INT_CONFIG, Ordering::SeqCst);
                self.raise();
            }
        }
    }

    /// Checks the features the driver acked; tells the device if they are acceptable.
    fn accept_features(&mut self) -> bool {
        let offered = self.device.device_features();
        let acked = self.driver_features;
        if acked & !offered != 0 || self.acked_beyond_64 || acked & super::device::VIRTIO_F_VERSION_1 == 0 {
            if let Some(suppressed) = self.log_limit.allow() {
                tracing::warn!(acked, offered, suppressed, "refusing FEATURES_OK: unoffered features or no VERSION_1");
            }
            return false;
        }
        self.device.set_acked_features(acked);
        true
    }

    fn activate(&mut self) -> Result<(), ActivateError> {
        let queues = self.device_queues()?;
        self.activate_with(queues)
    }

    /// Copies of the configured queues for the device; all must be ready and lie in
    /// guest memory.
    fn device_queues(&self) -> Result<Vec<Queue>, ActivateError> {
        let event_idx = self.driver_features & F_EVENT_IDX != 0;
        let mut out = Vec::with_capacity(self.queues.len());
        for (index, q) in self.queues.iter().enumerate() {
            if !q.ready() || !q.is_valid(&self.mem) {
                return Err(ActivateError::QueueNotReady(index));
            }
            let mut copy = Queue::try_from(q.state()).map_err(|source| ActivateError::Queue { index, source })?;
            copy.set_event_idx(event_idx);
            out.push(copy);
        }
        Ok(out)
    }

    fn activate_with(&mut self, queues: Vec<Queue>) -> Result<(), ActivateError> {
        let notify_used = Arc::new(UsedRingNotifier {
            interrupt_status: self.interrupt_status.clone(),
            line: self.interrupt.clone(),
        });
        let ctx = ActivateContext { mem: self.mem.clone(), notify_used };
        self.device.activate(ctx, queues)?;
        self.activated = true;
        Ok(())
    }

    /// Status 0: the device forgets the driver and its queues.
    fn reset(&mut self) {
        self.device.reset();
        self.queues.iter_mut().for_each(QueueT::reset);
        self.activated = false;
        self.status = 0;
        self.device_features_sel = 0;
        self.driver_features_sel = 0;
        self.driver_features = 0;
        self.acked_beyond_64 = false;
        self.queue_sel = 0;
        self.interrupt_status.store(0, Ordering::SeqCst);
    }

    fn raise(&mut self) {
        if let Err(e) = self.interrupt.trigger() {
            if let Some(suppressed) = self.log_limit.allow() {
                tracing::warn!(error = %e, suppressed, "raising the virtio-mmio interrupt failed");
            }
        }
    }

    fn guest_error(&mut self, offset: u64, len: usize, what: &'static str) {
        if let Some(suppressed) = self.log_limit.allow() {
            tracing::warn!(device_type = self.device.device_type(), offset, len, suppressed, "virtio-mmio: {what}");
        }
    }
}
