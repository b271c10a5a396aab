//! The Intel MultiProcessor table (MP specification 1.4) that tells a Linux guest how
//! many vCPUs it has and where its interrupt controllers are.
//!
//! Our guest kernel has no ACPI (its tables and interpreter cost seconds of emulated
//! boot on PVM hosts), and without ACPI Linux finds other CPUs only through this table,
//! which it looks for at the 639 KiB mark among other places. The table lives in guest
//! memory, so a snapshot's `memory.img` carries it, and a restored guest, which already
//! read it, never needs it again. A one-vCPU guest gets none: its kernel then runs the
//! interrupt controllers in virtual-wire mode, as it always has.
//!
//! Contents: one processor entry per vCPU (APIC id = index, vCPU 0 the boot processor),
//! one ISA bus, the I/O APIC, ISA IRQs 0–15 wired to the I/O APIC pins of the same
//! number (KVM's default routing, and the pins our devices use), and ExtINT/NMI on every
//! LAPIC's LINT0/LINT1.

use super::layout::{EBDA_START, IOAPIC_START, LAPIC_START};
use vm_memory::{Bytes, GuestAddress, GuestMemory, GuestMemoryError};

/// Where the floating pointer structure goes: the start of the EBDA, 639 KiB, where
/// Linux looks; the configuration table follows it.
pub const MPTABLE_START: u64 = EBDA_START;
/// The most vCPUs a table describes: it must fit below 640 KiB.
pub const MAX_CPUS: u8 = 32;
/// Legacy ISA interrupts routed through the I/O APIC.
const ISA_IRQS: u8 = 16;

const APIC_VERSION: u8 = 0x14;
const IOAPIC_VERSION: u8 = 0x11;
const ENTRY_PROCESSOR: u8 = 0;
const ENTRY_BUS: u8 = 1;
const ENTRY_IOAPIC: u8 = 2;
const ENTRY_IO_INTERRUPT: u8 = 3;
const ENTRY_LOCAL_INTERRUPT: u8 = 4;
const INT_TYPE_INT: u8 = 0;
const INT_TYPE_NMI: u8 = 1;
const INT_TYPE_EXTINT: u8 = 3;
const CPU_ENABLED: u8 = 1;
const CPU_BOOT: u8 = 2;
/// All local APICs, as a destination of a local interrupt entry.
const ALL_LAPICS: u8 = 0xff;

#[derive(Debug, thiserror::Error)]
pub enum MpTableError {
    #[error("an MP table describes 1 to {MAX_CPUS} vCPUs, not {0}")]
    CpuCount(u8),
    #[error("writing the MP table into guest memory: {0}")]
    Write(#[from] GuestMemoryError),
}

/// The table for `cpus` vCPUs, as bytes to place at [`MPTABLE_START`].
pub fn build(cpus: u8) -> Result<Vec<u8>, MpTableError> {
    if cpus == 0 || cpus > MAX_CPUS {
        return Err(MpTableError::CpuCount(cpus));
    }
    let config_at = MPTABLE_START as u32 + 16;
    let ioapic_id = cpus; // the first id no LAPIC has
    let mut entries = Vec::new();
    let mut count: u16 = 0;
    for i in 0..cpus {
        let flags = CPU_ENABLED | if i == 0 { CPU_BOOT } else { 0 };
        entries.extend_from_slice(&[ENTRY_PROCESSOR, i, APIC_VERSION, flags]);
        entries.extend_from_slice(&0x600u32.to_le_bytes()); // family 6
        entries.extend_from_slice(&0x201u32.to_le_bytes()); // FPU, APIC
        entries.extend_from_slice(&[0; 8]);
        count += 1;
    }
    entries.extend_from_slice(&[ENTRY_BUS, 0]);
    entries.extend_from_slice(b"ISA   ");
    count += 1;
    entries.extend_from_slice(&[ENTRY_IOAPIC, ioapic_id, IOAPIC_VERSION, 1]);
    entries.extend_from_slice(&(IOAPIC_START as u32).to_le_bytes());
    count += 1;
    for irq in 0..ISA_IRQS {
        // Type, flags (conforming to the bus: ISA is edge, active high), bus, IRQ, I/O
        // APIC, pin.
        entries.extend_from_slice(&[ENTRY_IO_INTERRUPT, INT_TYPE_INT, 0, 0, 0, irq, ioapic_id, irq]);
        count += 1;
    }
    for (kind, lint) in [(INT_TYPE_EXTINT, 0), (INT_TYPE_NMI, 1)] {
        entries.extend_from_slice(&[ENTRY_LOCAL_INTERRUPT, kind, 0, 0, 0, 0, ALL_LAPICS, lint]);
        count += 1;
    }

    let mut header = Vec::with_capacity(44);
    header.extend_from_slice(b"PCMP");
    header.extend_from_slice(&((44 + entries.len()) as u16).to_le_bytes());
    header.push(4); // specification revision 1.4
    header.push(0); // checksum, below
    header.extend_from_slice(b"FORKVM  ");
    header.extend_from_slice(b"MICROVM     ");
    header.extend_from_slice(&0u32.to_le_bytes()); // no OEM table
    header.extend_from_slice(&0u16.to_le_bytes());
    header.extend_from_slice(&count.to_le_bytes());
    header.extend_from_slice(&(LAPIC_START as u32).to_le_bytes());
    header.extend_from_slice(&0u32.to_le_bytes()); // no extended table
    let mut config = header;
    config.extend_from_slice(&entries);
    config[7] = checksum(&config);

    let mut floating = Vec::with_capacity(16);
    floating.extend_from_slice(b"_MP_");
    floating.extend_from_slice(&config_at.to_le_bytes());
    floating.extend_from_slice(&[1, 4, 0, 0, 0, 0, 0, 0]); // 16 bytes, rev 1.4, table present
    floating[10] = checksum(&floating);

    let mut table = floating;
    table.extend_from_slice(&config);
    Ok(table)
}

/// Writes the table for `cpus` vCPUs into guest memory.
pub fn write<M: GuestMemory>(mem: &M, cpus: u8) -> Result<(), MpTableError> {
    mem.write_slice(&build(cpus)?, GuestAddress(MPTABLE_START))?;
    Ok(())
}

/// The byte that makes `bytes` sum to zero (with it in place of a zero byte).
fn checksum(bytes: &[u8]) -> u8 {
    0u8.wrapping_sub(bytes.iter().fold(0u8, |s, b| s.wrapping_add(*b)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum(bytes: &[u8]) -> u8 {
        bytes.iter().fold(0u8, |s, b| s.wrapping_add(*b))
    }

    /// A table as read back: (APIC id, flags) per processor, the I/O APIC's id, (IRQ,
    /// pin) per interrupt, and its size.
    type Parsed = (Vec<(u8, u8)>, u8, Vec<(u8, u8)>, usize);

    /// Reads a table back as Linux does: the floating pointer, then each entry.
    fn parse(table: &[u8]) -> Parsed {
        assert_eq!(&table[..4], b"_MP_");
        assert_eq!(sum(&table[..16]), 0, "floating pointer checksum");
        let at = u32::from_le_bytes(table[4..8].try_into().unwrap()) as u64;
        let config = &table[(at - MPTABLE_START) as usize..];
        assert_eq!(&config[..4], b"PCMP");
        let len = u16::from_le_bytes([config[4], config[5]]) as usize;
        assert_eq!(sum(&config[..len]), 0, "configuration table checksum");
        assert_eq!(u32::from_le_bytes(config[36..40].try_into().unwrap()) as u64, LAPIC_START);
        let count = u16::from_le_bytes([config[34], config[35]]) as usize;
        let (mut cpus, mut ioapic, mut irqs) = (Vec::new(), None, Vec::new());
        let mut p = 44;
        for _ in 0..count {
            match config[p] {
                ENTRY_PROCESSOR => {
                    cpus.push((config[p + 1], config[p + 3]));
                    p += 20;
                }
                ENTRY_IOAPIC => {
                    assert_eq!(u32::from_le_bytes(config[p + 4..p + 8].try_into().unwrap()) as u64, IOAPIC_START);
                    ioapic = Some(config[p + 1]);
                    p += 8;
                }
                ENTRY_IO_INTERRUPT => {
                    assert_eq!(config[p + 6], ioapic.unwrap(), "routed to the I/O APIC");
                    irqs.push((config[p + 5], config[p + 7]));
                    p += 8;
                }
                ENTRY_BUS | ENTRY_LOCAL_INTERRUPT => p += 8,
                other => panic!("unknown entry type {other}"),
            }
        }
        assert_eq!(p, len, "the entries fill the table");
        (cpus, ioapic.unwrap(), irqs, 16 + len)
    }

    #[test]
    fn a_table_lists_every_vcpu_the_ioapic_and_the_isa_irqs() {
        for cpus in [1u8, 2, 4, 16, MAX_CPUS] {
            let table = build(cpus).unwrap();
            let (listed, ioapic, irqs, size) = parse(&table);
            assert_eq!(size, table.len());
            let want: Vec<(u8, u8)> = (0..cpus).map(|i| (i, CPU_ENABLED | if i == 0 { CPU_BOOT } else { 0 })).collect();
            assert_eq!(listed, want, "{cpus} vCPUs");
            assert!(ioapic >= cpus, "the I/O APIC's id is no LAPIC's");
            assert_eq!(irqs, (0..16).map(|i| (i, i)).collect::<Vec<_>>());
            assert!(MPTABLE_START + table.len() as u64 <= 0xa0000, "{cpus} vCPUs: the table passes 640 KiB");
        }
    }

    #[test]
    fn a_count_outside_the_range_is_refused() {
        assert!(matches!(build(0), Err(MpTableError::CpuCount(0))));
        assert!(build(MAX_CPUS + 1).unwrap_err().to_string().contains("1 to 32"));
    }

    #[test]
    fn the_table_lands_where_linux_looks() {
        let mem = vm_memory::GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        write(&mem, 2).unwrap();
        let mut b = [0u8; 4];
        mem.read_slice(&mut b, GuestAddress(639 * 1024)).unwrap();
        assert_eq!(&b, b"_MP_");
    }
}
