//! The I/O APIC, emulated in the VMM for KVM's split-irqchip mode.
//!
//! Creating KVM's full in-kernel irqchip costs ~16 ms on PVM hosts; a split irqchip
//! (LAPIC in KVM) costs 0.17 ms. With it the IOAPIC is ours: the guest programs its
//! redirection table through the MMIO window, and a device interrupt on a pin becomes an
//! MSI (`KVM_SIGNAL_MSI`) to the LAPIC the entry names. Edge-triggered entries only:
//! level-triggered ones are delivered as edges (our devices raise edges).

use super::super::vstate::irqchip::IOAPIC_PINS;
use kvm_bindings::kvm_msi;
use serde::{Deserialize, Serialize};

const IOREGSEL: u64 = 0x00;
const IOWIN: u64 = 0x10;
const REG_ID: u32 = 0x00;
const REG_VERSION: u32 = 0x01;
const REG_ARBITRATION: u32 = 0x02;
const REG_REDIRECTION_BASE: u32 = 0x10;
/// Version 0x11, `IOAPIC_PINS - 1` as the highest redirection entry.
const VERSION: u32 = 0x11 | (((IOAPIC_PINS as u32) - 1) << 16);
const MASKED: u64 = 1 << 16;
const REMOTE_IRR: u64 = 1 << 14;
/// Bits the guest may write in a redirection entry (not delivery status, not remote IRR).
const WRITABLE: u64 = 0xff00_0000_0001_afff;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IoapicState {
    pub id: u32,
    pub ioregsel: u32,
    pub redirection: Vec<u64>,
}

#[derive(Debug)]
pub struct Ioapic {
    id: u32,
    ioregsel: u32,
    redirection: [u64; IOAPIC_PINS],
}

#[derive(Debug, thiserror::Error)]
#[error("IOAPIC state has {0} redirection entries, expected {IOAPIC_PINS}")]
pub struct BadIoapicState(usize);

impl Default for Ioapic {
    fn default() -> Self {
        Ioapic { id: 0, ioregsel: 0, redirection: [MASKED; IOAPIC_PINS] }
    }
}

impl Ioapic {
    pub fn save(&self) -> IoapicState {
        IoapicState { id: self.id, ioregsel: self.ioregsel, redirection: self.redirection.to_vec() }
    }

    pub fn restore(state: &IoapicState) -> Result<Ioapic, BadIoapicState> {
        let redirection =
            state.redirection.as_slice().try_into().map_err(|_| BadIoapicState(state.redirection.len()))?;
        Ok(Ioapic { id: state.id, ioregsel: state.ioregsel, redirection })
    }

    pub fn mmio_read(&self, offset: u64, data: &mut [u8]) {
        let value = match offset {
            IOREGSEL => self.ioregsel,
            IOWIN => self.read_register(self.ioregsel),
            _ => 0,
        };
        let bytes = value.to_le_bytes();
        let n = data.len().min(4);
        data[..n].copy_from_slice(&bytes[..n]);
    }

    pub fn mmio_write(&mut self, offset: u64, data: &[u8]) {
        let mut bytes = [0u8; 4];
        let n = data.len().min(4);
        bytes[..n].copy_from_slice(&data[..n]);
        let value = u32::from_le_bytes(bytes);
        match offset {
            IOREGSEL => self.ioregsel = value & 0xff,
            IOWIN => self.write_register(self.ioregsel, value),
            _ => {}
        }
    }

    fn read_register(&self, reg: u32) -> u32 {
        match reg {
            REG_ID | REG_ARBITRATION => self.id << 24,
            REG_VERSION => VERSION,
            r if r >= REG_REDIRECTION_BASE && ((r - REG_REDIRECTION_BASE) / 2) < IOAPIC_PINS as u32 => {
                let entry = self.redirection[((r - REG_REDIRECTION_BASE) / 2) as usize];
                if (r - REG_REDIRECTION_BASE).is_multiple_of(2) {
                    entry as u32
                } else {
                    (entry >> 32) as u32
                }
            }
            _ => 0,
        }
    }

    fn write_register(&mut self, reg: u32, value: u32) {
        match reg {
            REG_ID => self.id = (value >> 24) & 0xf,
            r if r >= REG_REDIRECTION_BASE && ((r - REG_REDIRECTION_BASE) / 2) < IOAPIC_PINS as u32 => {
                let pin = ((r - REG_REDIRECTION_BASE) / 2) as usize;
                let old = self.redirection[pin];
                let new = if (r - REG_REDIRECTION_BASE).is_multiple_of(2) {
                    (old & !0xffff_ffff) | u64::from(value)
                } else {
                    (old & 0xffff_ffff) | (u64::from(value) << 32)
                };
                self.redirection[pin] = (new & WRITABLE) | (old & REMOTE_IRR);
            }
            _ => {}
        }
    }

    /// The MSI that an interrupt on `pin` becomes, or `None` while the pin is masked.
    pub fn msi_for(&self, pin: usize) -> Option<kvm_msi> {
        let entry = *self.redirection.get(pin)?;
        if entry & MASKED != 0 {
            return None;
        }
        let vector = (entry & 0xff) as u32;
        let delivery_mode = ((entry >> 8) & 0x7) as u32;
        let dest_mode = ((entry >> 11) & 1) as u32;
        let dest = ((entry >> 56) & 0xff) as u32;
        Some(kvm_msi {
            address_lo: 0xfee0_0000 | (dest << 12) | (dest_mode << 2),
            address_hi: 0,
            data: vector | (delivery_mode << 8),
            ..Default::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_reg(io: &mut Ioapic, reg: u32, value: u32) {
        io.mmio_write(IOREGSEL, &reg.to_le_bytes());
        io.mmio_write(IOWIN, &value.to_le_bytes());
    }

    fn read_reg(io: &mut Ioapic, reg: u32) -> u32 {
        io.mmio_write(IOREGSEL, &reg.to_le_bytes());
        let mut b = [0u8; 4];
        io.mmio_read(IOWIN, &mut b);
        u32::from_le_bytes(b)
    }

    #[test]
    fn pins_start_masked() {
        let io = Ioapic::default();
        assert!((0..IOAPIC_PINS).all(|p| io.msi_for(p).is_none()));
    }

    #[test]
    fn programmed_pin_becomes_an_msi() {
        let mut io = Ioapic::default();
        write_reg(&mut io, 0x18, 0x24); // pin 4, vector 0x24, unmasked
        write_reg(&mut io, 0x19, 3 << 24); // to APIC 3
        let msi = io.msi_for(4).unwrap();
        assert_eq!(msi.address_lo, 0xfee0_3000);
        assert_eq!(msi.data, 0x24);
        assert_eq!(read_reg(&mut io, 0x18), 0x24);
        assert_eq!(read_reg(&mut io, 0x19), 3 << 24);
    }

    #[test]
    fn version_reports_the_pin_count() {
        let mut io = Ioapic::default();
        assert_eq!(read_reg(&mut io, REG_VERSION) >> 16, IOAPIC_PINS as u32 - 1);
    }

    #[test]
    fn state_round_trips() {
        let mut io = Ioapic::default();
        write_reg(&mut io, 0x10, 0x31);
        write_reg(&mut io, REG_ID, 2 << 24);
        let state = io.save();
        let again = Ioapic::restore(&state).unwrap().save();
        assert_eq!(state, again);
        assert!(Ioapic::restore(&IoapicState { redirection: vec![0; 3], ..state }).is_err());
    }
}
