//! The boot GDT and the `kvm_segment`s that match it.
//!
//! A 64-bit entry needs a code segment with L=1 and flat data segments. The same table is
//! written into guest memory (the guest may reload its segment registers from it) and
//! turned into the hidden segment-register state KVM loads directly.

use kvm_bindings::kvm_segment;

/// Selector of the 64-bit code segment in the boot GDT.
pub const CODE_SELECTOR: u16 = 0x08;
/// Selector of the flat data segment in the boot GDT.
pub const DATA_SELECTOR: u16 = 0x10;
/// Selector of the (unused, but required by VMX) task segment in the boot GDT.
pub const TSS_SELECTOR: u16 = 0x18;

/// The boot GDT: null, code64, data, tss.
pub const BOOT_GDT: [u64; 4] =
    [0, gdt_entry(0xa09b, 0, 0xfffff), gdt_entry(0xc093, 0, 0xfffff), gdt_entry(0x808b, 0, 0xfffff)];

/// Packs a segment descriptor. `flags` holds the access byte in bits 0..8 and the
/// granularity/size nibble in bits 12..16, as the descriptor lays them out.
pub const fn gdt_entry(flags: u16, base: u32, limit: u32) -> u64 {
    ((base as u64 & 0xff00_0000) << 32)
        | ((base as u64 & 0x00ff_ffff) << 16)
        | (limit as u64 & 0x0000_ffff)
        | ((limit as u64 & 0x000f_0000) << 32)
        | ((flags as u64 & 0xf0ff) << 40)
}

/// The hidden segment state KVM needs for descriptor `entry` at `selector`.
pub fn segment_from_entry(entry: u64, selector: u16) -> kvm_segment {
    let bit = |n: u32| ((entry >> n) & 1) as u8;
    let limit = ((entry & 0xffff) | ((entry >> 32) & 0xf_0000)) as u32;
    let g = bit(55);
    kvm_segment {
        base: ((entry >> 16) & 0xff_ffff) | (((entry >> 56) & 0xff) << 24),
        // With G=1 the limit counts 4 KiB pages.
        limit: if g == 1 { (limit << 12) | 0xfff } else { limit },
        selector,
        type_: ((entry >> 40) & 0xf) as u8,
        present: bit(47),
        dpl: ((entry >> 45) & 0x3) as u8,
        db: bit(54),
        s: bit(44),
        l: bit(53),
        g,
        avl: bit(52),
        unusable: if bit(47) == 1 { 0 } else { 1 },
        padding: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_segment_is_64_bit_ring_0() {
        let cs = segment_from_entry(BOOT_GDT[1], CODE_SELECTOR);
        assert_eq!((cs.l, cs.db, cs.dpl, cs.present, cs.s), (1, 0, 0, 1, 1));
        assert_eq!(cs.type_, 0xb);
        assert_eq!(cs.limit, 0xffff_ffff);
        assert_eq!(cs.base, 0);
    }

    #[test]
    fn data_segment_is_flat_and_writable() {
        let ds = segment_from_entry(BOOT_GDT[2], DATA_SELECTOR);
        assert_eq!((ds.l, ds.db, ds.g, ds.type_), (0, 1, 1, 0x3));
        assert_eq!(ds.limit, 0xffff_ffff);
    }

    #[test]
    fn entry_packs_base_and_limit() {
        let e = gdt_entry(0x0089, 0x1234_5678, 0xabcde);
        let s = segment_from_entry(e, 0);
        assert_eq!(s.base, 0x1234_5678);
        assert_eq!(s.limit, 0xabcde);
        assert_eq!(s.g, 0);
        assert_eq!(s.type_, 0x9);
    }
}
