//! virtio devices over the virtio-mmio transport (virtio 1.x, "modern" layout).
//!
//! Each device implements [`VirtioDevice`]; the MMIO transport (`mmio.rs`) owns the
//! register window, feature negotiation and queue setup, and hands the device its
//! queues when the driver sets DRIVER_OK. Devices raise interrupts through an
//! [`Interrupt`], which on a real VM is an [`IrqLine`](crate::devices::irq::IrqLine) and
//! in unit tests a counter. Every device folder holds `mod.rs` (constants, errors),
//! `device.rs`, `persist.rs` and `metrics.rs`; queue logic is kept apart from I/O glue
//! so it can be tested without KVM.

pub mod device;

pub mod backend_thread;
pub use device::{ActivateContext, ActivateError, Interrupt, VirtioDevice, VirtioDeviceState};
pub mod blk;
pub mod mmio;
pub mod net;
pub mod ratelimit;
pub mod rng;
#[cfg(test)]
mod test_ring;
#[cfg(test)]
mod test_utils;
pub mod throttle;
pub mod vsock;
