//! Emulated devices and the bus that routes vCPU port and MMIO exits to them.
//!
//! Devices here are the legacy ones a microVM needs before virtio: the 8250 serial port
//! (console and test-guest channel), the IOAPIC when KVM runs a split irqchip, and the
//! test-exit port our test guests use to end a run with a status.

pub mod attach;
pub mod bus;
pub mod console_log;
pub mod deferred;
pub mod ioapic;
pub mod irq;
pub mod serial;
pub mod virtio;

pub use bus::{BusAction, Devices, DevicesState};
