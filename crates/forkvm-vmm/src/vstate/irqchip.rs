//! Interrupt controllers and the PIT, in either of the two shapes KVM offers.
//!
//! * `Kernel`: KVM emulates the PICs, the IOAPIC, the LAPICs and (with `KVM_CREATE_PIT2`)
//!   the PIT. What a Linux guest expects, but creating it costs ~16 ms + 5 ms on PVM hosts.
//! * `Split`: KVM emulates only the LAPICs (0.17 ms); the IOAPIC lives in the VMM
//!   (`devices::ioapic`) and delivers interrupts as MSIs. There is no PIC and no PIT:
//!   the guest uses the LAPIC timer and kvm-clock. This is what the fork path uses.
//!
//! The mode is chosen at boot and recorded in the snapshot; a restore uses the same mode.

use kvm_bindings::{
    kvm_enable_cap, kvm_irqchip, kvm_pit_config, kvm_pit_state2, KVM_CAP_SPLIT_IRQCHIP, KVM_IRQCHIP_IOAPIC,
    KVM_IRQCHIP_PIC_MASTER, KVM_IRQCHIP_PIC_SLAVE, KVM_PIT_SPEAKER_DUMMY,
};
use kvm_ioctls::VmFd;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Number of IOAPIC pins (and GSIs reserved for them in split mode).
pub const IOAPIC_PINS: usize = 24;

#[derive(Debug, thiserror::Error)]
pub enum IrqchipError {
    #[error("irqchip: {step}: {source}")]
    Kvm { step: &'static str, source: kvm_ioctls::Error },
    #[error("irqchip: snapshot holds {found} irqchip state but this VM uses {mode}")]
    ModeMismatch { found: &'static str, mode: IrqchipMode },
}

fn kvm(step: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> IrqchipError {
    move |source| IrqchipError::Kvm { step, source }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IrqchipMode {
    Kernel,
    Split,
}

impl IrqchipMode {
    pub fn name(self) -> &'static str {
        match self {
            IrqchipMode::Kernel => "kernel",
            IrqchipMode::Split => "split",
        }
    }

    /// Creates the interrupt controllers (and PIT) on a VM that has no vCPUs yet.
    pub fn create(self, vm: &VmFd) -> Result<(), IrqchipError> {
        match self {
            IrqchipMode::Kernel => {
                vm.create_irq_chip().map_err(kvm("KVM_CREATE_IRQCHIP"))?;
                let pit = kvm_pit_config { flags: KVM_PIT_SPEAKER_DUMMY, ..Default::default() };
                vm.create_pit2(pit).map_err(kvm("KVM_CREATE_PIT2"))
            }
            IrqchipMode::Split => {
                let mut cap = kvm_enable_cap { cap: KVM_CAP_SPLIT_IRQCHIP, ..Default::default() };
                cap.args[0] = IOAPIC_PINS as u64;
                vm.enable_cap(&cap).map_err(kvm("KVM_ENABLE_CAP(SPLIT_IRQCHIP)"))
            }
        }
    }
}

impl fmt::Display for IrqchipMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for IrqchipMode {
    type Err = crate::unknown_name::UnknownName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "kernel" => Ok(IrqchipMode::Kernel),
            "split" => Ok(IrqchipMode::Split),
            _ => Err(crate::unknown_name::UnknownName::new("irqchip mode", s, "kernel, split")),
        }
    }
}

/// KVM's in-kernel PICs, IOAPIC and PIT (kernel mode only; in split mode the IOAPIC's
/// state is a device's and there is no PIC or PIT).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KernelIrqchipState {
    pub pic_master: kvm_irqchip,
    pub pic_slave: kvm_irqchip,
    pub ioapic: kvm_irqchip,
    pub pit: kvm_pit_state2,
}

impl KernelIrqchipState {
    pub fn save(vm: &VmFd) -> Result<KernelIrqchipState, IrqchipError> {
        let chip = |chip_id, step| {
            let mut c = kvm_irqchip { chip_id, ..Default::default() };
            vm.get_irqchip(&mut c).map(|_| c).map_err(kvm(step))
        };
        Ok(KernelIrqchipState {
            pic_master: chip(KVM_IRQCHIP_PIC_MASTER, "KVM_GET_IRQCHIP(PIC master)")?,
            pic_slave: chip(KVM_IRQCHIP_PIC_SLAVE, "KVM_GET_IRQCHIP(PIC slave)")?,
            ioapic: chip(KVM_IRQCHIP_IOAPIC, "KVM_GET_IRQCHIP(IOAPIC)")?,
            pit: vm.get_pit2().map_err(kvm("KVM_GET_PIT2"))?,
        })
    }

    pub fn restore(&self, vm: &VmFd) -> Result<(), IrqchipError> {
        vm.set_irqchip(&self.pic_master).map_err(kvm("KVM_SET_IRQCHIP(PIC master)"))?;
        vm.set_irqchip(&self.pic_slave).map_err(kvm("KVM_SET_IRQCHIP(PIC slave)"))?;
        vm.set_irqchip(&self.ioapic).map_err(kvm("KVM_SET_IRQCHIP(IOAPIC)"))?;
        vm.set_pit2(&self.pit).map_err(kvm("KVM_SET_PIT2"))
    }
}
