//! `XSAVE` and `XRSTOR` (standard form) on the vCPU's extended state, as the SDM
//! (vol. 1, ch. 13) defines them, for guest kernels whose ring-0 code KVM's emulator runs
//! and which it cannot run these instructions for (PVM hosts).
//!
//! The vCPU's registers come from and go to KVM as the 4 KiB `kvm_xsave` image
//! (`KVM_GET_XSAVE`/`KVM_SET_XSAVE`), which is the standard (non-compacted) XSAVE format
//! with the host's component offsets — the offsets the guest's CPUID leaf 0xD reports.
//! Nothing here touches KVM or guest memory: the caller reads and writes the guest's
//! XSAVE area, so the rules can be tested on plain buffers.
//!
//! Only the standard form exists for the guest: the profile hides XSAVEOPT, XSAVEC and
//! XSAVES (CPUID 0xD.1), so a compacted image (`XCOMP_BV[63]`) is refused with #GP as a
//! CPU without XSAVEC refuses it.

/// The legacy region (x87 + SSE) and the 64-byte header that follows it.
pub const LEGACY_LEN: usize = 512;
pub const HEADER_OFFSET: usize = 512;
pub const HEADER_LEN: usize = 64;
/// `kvm_xsave` holds 4 KiB: components must end inside it.
pub const KVM_XSAVE_LEN: usize = 4096;

const MXCSR: usize = 24;
const MXCSR_MASK: usize = 28;
const DEFAULT_MXCSR_MASK: u32 = 0xffbf;
const FCW_INIT: u16 = 0x037f;

const X87: u64 = 1;
const SSE: u64 = 1 << 1;
const AVX: u64 = 1 << 2;

/// Where an extended component (index 2..63) lives in a standard-format area.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Component {
    pub index: u8,
    pub offset: u32,
    pub size: u32,
}

/// The standard-format layout of the guest's XSAVE area, from its CPUID leaf 0xD.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Layout {
    pub components: Vec<Component>,
}

/// Why the instruction raises an exception instead of completing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// #GP(0): misaligned area, a bad header, reserved MXCSR bits.
    GeneralProtection(&'static str),
}

impl Layout {
    /// From CPUID leaf 0xD subleaves 2..63 (EAX = size, EBX = offset).
    pub fn from_cpuid(entries: &[kvm_bindings::kvm_cpuid_entry2]) -> Layout {
        let mut components: Vec<Component> = entries
            .iter()
            .filter(|e| e.function == 0xd && (2..64).contains(&e.index) && e.eax != 0)
            .map(|e| Component { index: e.index as u8, offset: e.ebx, size: e.eax })
            .collect();
        components.sort_by_key(|c| c.index);
        Layout { components }
    }

    /// Bytes of the area the features in `rfbm` use (legacy region and header included).
    pub fn area_len(&self, rfbm: u64) -> usize {
        self.enabled(rfbm).map(|c| (c.offset + c.size) as usize).fold(LEGACY_LEN + HEADER_LEN, usize::max)
    }

    fn enabled(&self, rfbm: u64) -> impl Iterator<Item = &Component> + '_ {
        self.components.iter().filter(move |c| rfbm & (1u64 << c.index) != 0)
    }

    /// The components of `rfbm` that do not fit `kvm_xsave`, or that the layout does not
    /// know (the VMM cannot hold their state, so it cannot complete the instruction).
    pub fn unsupported(&self, rfbm: u64) -> u64 {
        let mut known = X87 | SSE;
        for c in &self.components {
            if (c.offset + c.size) as usize <= KVM_XSAVE_LEN && c.offset as usize >= LEGACY_LEN + HEADER_LEN {
                known |= 1u64 << c.index;
            }
        }
        rfbm & !known
    }

    /// The byte ranges of the area that `XSAVE` with `rfbm` writes, header excluded.
    fn ranges(&self, rfbm: u64) -> Vec<(usize, usize)> {
        let mut r = Vec::new();
        if rfbm & X87 != 0 {
            r.push((0, MXCSR));
            r.push((32, 160));
        }
        if rfbm & (SSE | AVX) != 0 {
            r.push((MXCSR, 32));
        }
        if rfbm & SSE != 0 {
            r.push((160, 416));
        }
        for c in self.enabled(rfbm) {
            r.push((c.offset as usize, (c.offset + c.size) as usize));
        }
        r
    }
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

/// `XSAVE`: the writes (offset in the guest's area, bytes) that save `rfbm` of the vCPU's
/// state `cpu`, given the guest area's current 64-byte header. `XSTATE_BV` bits outside
/// `rfbm` and the rest of the header keep their values, as the CPU leaves them.
pub fn save(layout: &Layout, cpu: &[u8], rfbm: u64, guest_header: &[u8]) -> Vec<(usize, Vec<u8>)> {
    let mut writes: Vec<(usize, Vec<u8>)> =
        layout.ranges(rfbm).into_iter().map(|(from, to)| (from, cpu[from..to].to_vec())).collect();
    let cpu_bv = u64_at(cpu, HEADER_OFFSET);
    let old_bv = u64_at(guest_header, 0);
    let new_bv = (old_bv & !rfbm) | (cpu_bv & rfbm);
    writes.push((HEADER_OFFSET, new_bv.to_le_bytes().to_vec()));
    writes
}

/// `XRSTOR`: checks the guest area's header (and MXCSR, when loaded) like the CPU, then
/// returns the vCPU state `cpu` with `rfbm`'s components loaded from the area (those whose
/// `XSTATE_BV` bit is set) or put in their initial configuration (the others).
/// `read(offset, len)` reads the guest's area.
pub fn restore(
    layout: &Layout,
    cpu: &[u8],
    rfbm: u64,
    xcr0: u64,
    read: &mut dyn FnMut(usize, usize) -> Vec<u8>,
) -> Result<Vec<u8>, Fault> {
    let header = read(HEADER_OFFSET, HEADER_LEN);
    let xstate_bv = u64_at(&header, 0);
    let xcomp_bv = u64_at(&header, 8);
    if xcomp_bv & (1 << 63) != 0 {
        return Err(Fault::GeneralProtection("compacted form (XCOMP_BV[63]) without XSAVEC"));
    }
    if header[8..].iter().any(|b| *b != 0) {
        return Err(Fault::GeneralProtection("reserved header bytes are not zero"));
    }
    if xstate_bv & !xcr0 != 0 {
        return Err(Fault::GeneralProtection("XSTATE_BV sets a bit XCR0 does not"));
    }
    let mut out = cpu.to_vec();
    if rfbm & (SSE | AVX) != 0 {
        let mut mask = u32_at(cpu, MXCSR_MASK);
        if mask == 0 {
            mask = DEFAULT_MXCSR_MASK;
        }
        let mxcsr = read(MXCSR, 4);
        if u32_at(&mxcsr, 0) & !mask != 0 {
            return Err(Fault::GeneralProtection("MXCSR sets reserved bits"));
        }
        out[MXCSR..MXCSR + 4].copy_from_slice(&mxcsr);
    }
    let mut load = |from: usize, to: usize, index: u8| {
        if xstate_bv & (1u64 << index) != 0 {
            out[from..to].copy_from_slice(&read(from, to - from));
        } else {
            out[from..to].fill(0);
        }
    };
    if rfbm & X87 != 0 {
        load(0, MXCSR, 0);
        load(32, 160, 0);
    }
    if rfbm & SSE != 0 {
        load(160, 416, 1);
    }
    for c in layout.enabled(rfbm) {
        load(c.offset as usize, (c.offset + c.size) as usize, c.index);
    }
    if rfbm & X87 != 0 && xstate_bv & X87 == 0 {
        out[0..2].copy_from_slice(&FCW_INIT.to_le_bytes());
    }
    let bv = (u64_at(cpu, HEADER_OFFSET) & !rfbm) | (xstate_bv & rfbm);
    out[HEADER_OFFSET..HEADER_OFFSET + 8].copy_from_slice(&bv.to_le_bytes());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The layout of an AVX-512 CPU: AVX at 576, opmask at 1088, ZMM_Hi256 at 1152,
    /// Hi16_ZMM at 1664.
    fn layout() -> Layout {
        Layout {
            components: vec![
                Component { index: 2, offset: 576, size: 256 },
                Component { index: 5, offset: 1088, size: 64 },
                Component { index: 6, offset: 1152, size: 512 },
                Component { index: 7, offset: 1664, size: 1024 },
            ],
        }
    }

    const ALL: u64 = 0xe7;

    fn cpu_state(fill: u8, bv: u64) -> Vec<u8> {
        let mut c = vec![fill; KVM_XSAVE_LEN];
        c[MXCSR..MXCSR + 4].copy_from_slice(&0x1f80u32.to_le_bytes());
        c[MXCSR_MASK..MXCSR_MASK + 4].copy_from_slice(&0xffffu32.to_le_bytes());
        c[HEADER_OFFSET..HEADER_OFFSET + HEADER_LEN].fill(0);
        c[HEADER_OFFSET..HEADER_OFFSET + 8].copy_from_slice(&bv.to_le_bytes());
        c
    }

    fn apply(area: &mut [u8], writes: &[(usize, Vec<u8>)]) {
        for (at, bytes) in writes {
            area[*at..*at + bytes.len()].copy_from_slice(bytes);
        }
    }

    #[test]
    fn area_length_follows_the_requested_features() {
        assert_eq!(layout().area_len(0x3), 576);
        assert_eq!(layout().area_len(0x7), 832);
        assert_eq!(layout().area_len(ALL), 2688);
        assert_eq!(layout().unsupported(ALL), 0);
        assert_eq!(layout().unsupported(ALL | 1 << 17), 1 << 17, "AMX tile data is not in the layout");
    }

    #[test]
    fn save_then_restore_round_trips_every_component() {
        let l = layout();
        let cpu = cpu_state(0x5a, ALL);
        let mut area = vec![0u8; l.area_len(ALL)];
        let header = area[HEADER_OFFSET..HEADER_OFFSET + HEADER_LEN].to_vec();
        apply(&mut area, &save(&l, &cpu, ALL, &header));
        assert_eq!(u64_at(&area, HEADER_OFFSET), ALL);
        assert!(area[1664..2688].iter().all(|b| *b == 0x5a), "Hi16_ZMM saved");
        assert!(area[416..512].iter().all(|b| *b == 0), "reserved legacy bytes untouched");
        let other = cpu_state(0x11, ALL);
        let back = restore(&l, &other, ALL, ALL, &mut |at, n| area[at..at + n].to_vec()).unwrap();
        for (from, to) in [(0, 24), (24, 28), (32, 416), (576, 832), (1088, 2688)] {
            assert_eq!(back[from..to], cpu[from..to], "bytes {from}..{to}");
        }
    }

    #[test]
    fn save_keeps_header_bits_outside_the_request() {
        let l = layout();
        let cpu = cpu_state(0x5a, 0x3);
        let mut header = vec![0u8; HEADER_LEN];
        header[0..8].copy_from_slice(&0xe0u64.to_le_bytes());
        let writes = save(&l, &cpu, 0x3, &header);
        let bv = writes.iter().find(|(at, _)| *at == HEADER_OFFSET).unwrap();
        assert_eq!(u64::from_le_bytes(bv.1[..8].try_into().unwrap()), 0xe3);
        assert!(!writes.iter().any(|(at, _)| *at == 576), "AVX not requested, not written");
    }

    #[test]
    fn restore_puts_components_absent_from_xstate_bv_in_their_initial_state() {
        let l = layout();
        let mut area = vec![0x77u8; l.area_len(ALL)];
        area[HEADER_OFFSET..HEADER_OFFSET + HEADER_LEN].fill(0);
        area[HEADER_OFFSET..HEADER_OFFSET + 8].copy_from_slice(&0x3u64.to_le_bytes());
        area[MXCSR..MXCSR + 4].copy_from_slice(&0x1f80u32.to_le_bytes());
        let cpu = cpu_state(0x5a, ALL);
        let back = restore(&l, &cpu, ALL, ALL, &mut |at, n| area[at..at + n].to_vec()).unwrap();
        assert!(back[160..416].iter().all(|b| *b == 0x77), "SSE loaded");
        assert!(back[576..832].iter().chain(&back[1088..2688]).all(|b| *b == 0), "AVX and AVX-512 initialised");
        assert_eq!(u64_at(&back, HEADER_OFFSET), 0x3);
        // Only x87 requested: SSE and AVX-512 stay as the vCPU had them.
        let back = restore(&l, &cpu, 0x1, ALL, &mut |at, n| area[at..at + n].to_vec()).unwrap();
        assert!(back[160..416].iter().all(|b| *b == 0x5a));
        assert_eq!(u64_at(&back, HEADER_OFFSET), ALL);
    }

    /// A guest's XSAVE area is untrusted: random images either load or raise #GP, and a
    /// load never sets state outside XCR0 (bounded smoke run).
    #[test]
    fn arbitrary_areas_load_or_fault_but_never_panic() {
        let l = layout();
        let cpu = cpu_state(0, ALL);
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut loaded = 0;
        for _ in 0..2_000 {
            let mut area: Vec<u8> = (0..l.area_len(ALL)).map(|_| next() as u8).collect();
            // Often a plausible header, so the load path is taken too.
            if next() % 2 == 0 {
                area[HEADER_OFFSET..HEADER_OFFSET + HEADER_LEN].fill(0);
                area[HEADER_OFFSET] = next() as u8 & ALL as u8;
                area[MXCSR..MXCSR + 4].copy_from_slice(&(next() as u32 & 0xffbf).to_le_bytes());
            }
            let rfbm = next() & ALL;
            if let Ok(out) = restore(&l, &cpu, rfbm, ALL, &mut |at, n| area[at..at + n].to_vec()) {
                assert_eq!(out.len(), KVM_XSAVE_LEN);
                assert_eq!(u64_at(&out, HEADER_OFFSET) & !ALL, 0);
                loaded += 1;
            }
        }
        assert!(loaded > 100, "the load path ran ({loaded} loads)");
    }

    #[test]
    fn restore_refuses_what_the_cpu_refuses() {
        let l = layout();
        let cpu = cpu_state(0, ALL);
        let try_header = |bv: u64, comp: u64, mxcsr: u32| {
            let mut area = vec![0u8; l.area_len(ALL)];
            area[HEADER_OFFSET..HEADER_OFFSET + 8].copy_from_slice(&bv.to_le_bytes());
            area[HEADER_OFFSET + 8..HEADER_OFFSET + 16].copy_from_slice(&comp.to_le_bytes());
            area[MXCSR..MXCSR + 4].copy_from_slice(&mxcsr.to_le_bytes());
            restore(&l, &cpu, ALL, 0x7, &mut |at, n| area[at..at + n].to_vec())
        };
        assert!(try_header(0x7, 0, 0x1f80).is_ok());
        assert!(try_header(0xe7, 0, 0x1f80).is_err(), "XSTATE_BV beyond XCR0");
        assert!(try_header(0x7, 1 << 63 | 0x7, 0x1f80).is_err(), "compacted form");
        assert!(try_header(0x7, 0x7, 0x1f80).is_err(), "reserved header bytes");
        assert!(try_header(0x7, 0, 0x1_0000).is_err(), "reserved MXCSR bits");
    }
}
