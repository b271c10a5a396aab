//! Interrupt lines from devices to the guest.
//!
//! With the in-kernel irqchip a line is a GSI KVM routes itself; with a split irqchip it
//! is a pin of our IOAPIC, which turns it into an MSI for the in-kernel LAPIC. Devices
//! only ever see an `IrqLine` and call `pulse`.
//!
//! Lines start disarmed: while a VM is being restored, a device rebuilt from its saved
//! state may re-raise an interrupt the saved LAPIC already holds (or that KVM cannot yet
//! take, before the vCPUs exist). The builder arms the lines once the VM is complete.

use super::ioapic::Ioapic;
use kvm_ioctls::VmFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

#[derive(Debug, Clone)]
pub enum IrqRoute {
    /// A GSI of KVM's in-kernel PIC/IOAPIC.
    Kernel { gsi: u32 },
    /// A pin of the VMM's IOAPIC (split irqchip).
    Split { ioapic: Arc<Mutex<Ioapic>>, pin: usize },
}

#[derive(Debug, Clone)]
pub struct IrqLine {
    vm: Arc<VmFd>,
    route: IrqRoute,
    armed: Arc<AtomicBool>,
}

impl IrqLine {
    /// A disarmed line; `armed` is shared by all lines of a VM.
    pub fn new(vm: Arc<VmFd>, route: IrqRoute, armed: Arc<AtomicBool>) -> IrqLine {
        IrqLine { vm, route, armed }
    }

    /// Signals one edge-triggered interrupt (dropped while disarmed).
    pub fn pulse(&self) -> std::io::Result<()> {
        if !self.armed.load(Ordering::Acquire) {
            return Ok(());
        }
        let to_io = |e: kvm_ioctls::Error| std::io::Error::from_raw_os_error(e.errno());
        match &self.route {
            IrqRoute::Kernel { gsi } => {
                self.vm.set_irq_line(*gsi, true).map_err(to_io)?;
                self.vm.set_irq_line(*gsi, false).map_err(to_io)
            }
            IrqRoute::Split { ioapic, pin } => {
                let msi = ioapic.lock().unwrap_or_else(|p| p.into_inner()).msi_for(*pin);
                match msi {
                    Some(msi) => self.vm.signal_msi(msi).map(|_| ()).map_err(to_io),
                    None => Ok(()), // masked: dropped, like a masked edge on real hardware
                }
            }
        }
    }
}

impl vm_superio::Trigger for IrqLine {
    type E = std::io::Error;
    fn trigger(&self) -> Result<(), std::io::Error> {
        self.pulse()
    }
}
