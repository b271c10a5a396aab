//! Interrupt lines from devices to the guest.
//!
//! With the in-kernel irqchip a line is a GSI KVM routes itself; with a split irqchip it
//! is a pin of our IOAPIC, which turns it into an MSI for the in-kernel LAPIC. Devices
//! only ever see an `IrqLine` and call `pulse`.

use super::ioapic::Ioapic;
use kvm_ioctls::VmFd;
use std::sync::{Arc, Mutex};

#[derive(Debug, Clone)]
pub enum IrqLine {
    /// A GSI of KVM's in-kernel PIC/IOAPIC.
    Kernel { vm: Arc<VmFd>, gsi: u32 },
    /// A pin of the VMM's IOAPIC (split irqchip).
    Split { vm: Arc<VmFd>, ioapic: Arc<Mutex<Ioapic>>, pin: usize },
}

impl IrqLine {
    /// Signals one edge-triggered interrupt.
    pub fn pulse(&self) -> std::io::Result<()> {
        let to_io = |e: kvm_ioctls::Error| std::io::Error::from_raw_os_error(e.errno());
        match self {
            IrqLine::Kernel { vm, gsi } => {
                vm.set_irq_line(*gsi, true).map_err(to_io)?;
                vm.set_irq_line(*gsi, false).map_err(to_io)
            }
            IrqLine::Split { vm, ioapic, pin } => {
                let msi = ioapic.lock().unwrap_or_else(|p| p.into_inner()).msi_for(*pin);
                match msi {
                    Some(msi) => vm.signal_msi(msi).map(|_| ()).map_err(to_io),
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
