//! Decoding the few instructions the VMM completes, including the memory operand of
//! `XSAVE`/`XRSTOR` (ModRM, SIB, displacement, RIP-relative, REX).
//!
//! Only 64-bit mode with 64-bit addressing is understood: that is the only mode in which
//! a Linux guest's kernel runs these instructions. An encoding outside that (an
//! address-size override, a prefix the instruction does not take) decodes to `None`, and
//! the caller stops the VM with an error naming the bytes, as for any unknown instruction.

/// What the instruction is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Int3,
    Fwait,
    Clac,
    Stac,
    /// `XGETBV` (0F 01 D0): EDX:EAX = XCR[ECX].
    Xgetbv,
    /// `XSETBV` (0F 01 D1): XCR[ECX] = EDX:EAX.
    Xsetbv,
    /// `XSAVE`/`XSAVE64` (0F AE /4), standard form.
    Xsave,
    /// `XRSTOR`/`XRSTOR64` (0F AE /5), standard form.
    Xrstor,
}

/// A segment override that changes a 64-bit effective address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Segment {
    Fs,
    Gs,
}

/// A memory operand: `[base + index * scale + disp]`, or `[rip + disp]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemOperand {
    /// General register number (0 = rax .. 15 = r15), or `None`.
    pub base: Option<u8>,
    pub index: Option<(u8, u8)>,
    pub disp: i64,
    pub rip_relative: bool,
    pub segment: Option<Segment>,
}

/// One decoded instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Instruction {
    pub op: Op,
    /// Length in bytes, prefixes included.
    pub len: u64,
    pub mem: Option<MemOperand>,
}

impl MemOperand {
    /// The linear address, from the general registers (in `kvm_regs` order: rax, rcx,
    /// rdx, rbx, rsp, rbp, rsi, rdi, r8..r15), the address of the next instruction and
    /// the FS/GS bases.
    pub fn address(&self, gprs: &[u64; 16], next_rip: u64, fs_base: u64, gs_base: u64) -> u64 {
        let mut a = self.disp as u64;
        if self.rip_relative {
            a = a.wrapping_add(next_rip);
        }
        if let Some(b) = self.base {
            a = a.wrapping_add(gprs[usize::from(b)]);
        }
        if let Some((i, scale)) = self.index {
            a = a.wrapping_add(gprs[usize::from(i)].wrapping_mul(u64::from(scale)));
        }
        match self.segment {
            Some(Segment::Fs) => a.wrapping_add(fs_base),
            Some(Segment::Gs) => a.wrapping_add(gs_base),
            None => a,
        }
    }
}

/// Decodes the instruction at the start of `bytes`, if it is one the VMM completes.
pub fn decode(bytes: &[u8]) -> Option<Instruction> {
    match bytes {
        [0xcc, ..] => return Some(Instruction { op: Op::Int3, len: 1, mem: None }),
        [0x9b, ..] => return Some(Instruction { op: Op::Fwait, len: 1, mem: None }),
        [0x0f, 0x01, 0xca, ..] => return Some(Instruction { op: Op::Clac, len: 3, mem: None }),
        [0x0f, 0x01, 0xcb, ..] => return Some(Instruction { op: Op::Stac, len: 3, mem: None }),
        [0x0f, 0x01, 0xd0, ..] => return Some(Instruction { op: Op::Xgetbv, len: 3, mem: None }),
        [0x0f, 0x01, 0xd1, ..] => return Some(Instruction { op: Op::Xsetbv, len: 3, mem: None }),
        _ => {}
    }
    decode_xsave_family(bytes)
}

/// `[FS|GS] [REX] 0F AE /4|/5 <memory operand>`.
fn decode_xsave_family(bytes: &[u8]) -> Option<Instruction> {
    let mut at = 0;
    let mut segment = None;
    match bytes.first()? {
        0x64 => segment = Some(Segment::Fs),
        0x65 => segment = Some(Segment::Gs),
        _ => {}
    }
    if segment.is_some() {
        at += 1;
    }
    let mut rex = 0u8;
    if let Some(&b) = bytes.get(at) {
        if b & 0xf0 == 0x40 {
            rex = b;
            at += 1;
        }
    }
    if bytes.get(at..at + 2)? != [0x0f, 0xae] {
        return None;
    }
    at += 2;
    let modrm = *bytes.get(at)?;
    at += 1;
    let (md, reg, rm) = (modrm >> 6, (modrm >> 3) & 7, modrm & 7);
    let op = match reg {
        4 => Op::Xsave,
        5 => Op::Xrstor,
        _ => return None,
    };
    if md == 3 {
        return None; // register forms are other instructions (fences, rdfsbase, ...)
    }
    let (rex_b, rex_x) = ((rex & 1) << 3, ((rex >> 1) & 1) << 3);
    let mut mem = MemOperand { base: None, index: None, disp: 0, rip_relative: false, segment };
    let disp_len = match md {
        0 => 0,
        1 => 1,
        _ => 4,
    };
    let mut disp_len = disp_len;
    if rm == 4 {
        let sib = *bytes.get(at)?;
        at += 1;
        let (scale, index, base) = (1u8 << (sib >> 6), (sib >> 3) & 7, sib & 7);
        let index = index | rex_x;
        if index != 4 {
            mem.index = Some((index, scale));
        }
        if base == 5 && md == 0 {
            disp_len = 4;
        } else {
            mem.base = Some(base | rex_b);
        }
    } else if rm == 5 && md == 0 {
        mem.rip_relative = true;
        disp_len = 4;
    } else {
        mem.base = Some(rm | rex_b);
    }
    mem.disp = match disp_len {
        0 => 0,
        1 => i64::from(*bytes.get(at)? as i8),
        _ => i64::from(i32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?)),
    };
    at += disp_len;
    Some(Instruction { op, len: at as u64, mem: Some(mem) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem(bytes: &[u8]) -> (Op, u64, MemOperand) {
        let i = decode(bytes).unwrap_or_else(|| panic!("{bytes:02x?} did not decode"));
        (i.op, i.len, i.mem.unwrap())
    }

    #[test]
    fn decodes_the_simple_instructions() {
        assert_eq!(decode(&[0xcc, 0x90]).unwrap().op, Op::Int3);
        assert_eq!(decode(&[0x9b]).unwrap().op, Op::Fwait);
        assert_eq!(decode(&[0x0f, 0x01, 0xca]).unwrap().op, Op::Clac);
        assert_eq!(decode(&[0x0f, 0x01, 0xcb, 0x00]).unwrap().op, Op::Stac);
        assert_eq!(decode(&[0x0f, 0x01, 0xd0]).unwrap().op, Op::Xgetbv);
        assert_eq!(decode(&[0x0f, 0x01, 0xd1]).unwrap().op, Op::Xsetbv);
        assert_eq!(decode(&[0x0f, 0x01]), None);
        assert_eq!(decode(&[0xf3, 0x0f, 0xb8, 0xc0]), None, "popcnt is hidden, not completed");
    }

    #[test]
    fn decodes_xsave64_and_xrstor64_through_a_register() {
        // xsave64 (%rdi), xrstor64 (%rdi): what Linux's XSTATE_OP emits most often.
        let (op, len, m) = mem(&[0x48, 0x0f, 0xae, 0x27]);
        assert_eq!((op, len, m.base, m.index, m.disp), (Op::Xsave, 4, Some(7), None, 0));
        let (op, len, m) = mem(&[0x48, 0x0f, 0xae, 0x2f]);
        assert_eq!((op, len, m.base), (Op::Xrstor, 4, Some(7)));
        // xsave (%rax) without REX.W.
        let (op, len, m) = mem(&[0x0f, 0xae, 0x20]);
        assert_eq!((op, len, m.base), (Op::Xsave, 3, Some(0)));
    }

    #[test]
    fn decodes_displacements_sib_and_extended_registers() {
        // xsave64 0x40(%r12): REX.WB, mod 01, rm 100 -> SIB (base r12, no index), disp8.
        let (_, len, m) = mem(&[0x49, 0x0f, 0xae, 0x64, 0x24, 0x40]);
        assert_eq!((len, m.base, m.index, m.disp), (6, Some(12), None, 0x40));
        // xrstor64 -0x10(%rbx,%r9,8): REX.WX, mod 01, SIB scale 8 index r9 base rbx.
        let (op, len, m) = mem(&[0x4a, 0x0f, 0xae, 0x6c, 0xcb, 0xf0]);
        assert_eq!((op, len, m.base, m.index, m.disp), (Op::Xrstor, 6, Some(3), Some((9, 8)), -0x10));
        // xsave64 0x12345678(%rbp): mod 10, disp32.
        let (_, len, m) = mem(&[0x48, 0x0f, 0xae, 0xa5, 0x78, 0x56, 0x34, 0x12]);
        assert_eq!((len, m.base, m.disp), (8, Some(5), 0x1234_5678));
        // xsave64 0x100(%rip).
        let (_, len, m) = mem(&[0x48, 0x0f, 0xae, 0x25, 0x00, 0x01, 0x00, 0x00]);
        assert_eq!((len, m.rip_relative, m.base, m.disp), (8, true, None, 0x100));
        // xsave64 0x2000 (absolute: SIB with no base and no index).
        let (_, len, m) = mem(&[0x48, 0x0f, 0xae, 0x24, 0x25, 0x00, 0x20, 0x00, 0x00]);
        assert_eq!((len, m.base, m.index, m.disp), (9, None, None, 0x2000));
        // %gs:(%rdi).
        let (_, len, m) = mem(&[0x65, 0x48, 0x0f, 0xae, 0x27]);
        assert_eq!((len, m.segment), (5, Some(Segment::Gs)));
    }

    #[test]
    fn refuses_what_it_does_not_complete() {
        assert_eq!(decode(&[0x0f, 0xae, 0x30]), None, "xsaveopt (/6) is hidden");
        assert_eq!(decode(&[0x0f, 0xae, 0x00]), None, "fxsave is the emulator's");
        assert_eq!(decode(&[0x0f, 0xae, 0xe8]), None, "lfence (register form)");
        assert_eq!(decode(&[0x67, 0x0f, 0xae, 0x27]), None, "32-bit addressing");
        assert_eq!(decode(&[0x48, 0x0f, 0xae, 0x64]), None, "truncated SIB");
        assert_eq!(decode(&[0x48, 0x0f, 0xae, 0xa5, 0x78]), None, "truncated disp32");
    }

    /// Guest bytes are untrusted: any 15 bytes decode to nothing or to an instruction no
    /// longer than what was read (bounded smoke run of random and mutated encodings).
    #[test]
    fn arbitrary_bytes_never_panic_and_never_overrun() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let seeds: [&[u8]; 3] =
            [&[0x48, 0x0f, 0xae, 0x27], &[0x65, 0x4a, 0x0f, 0xae, 0x6c, 0xcb, 0xf0], &[0x0f, 0x01, 0xd1]];
        for i in 0..200_000 {
            let mut bytes: Vec<u8> = (0..(next() % 16) as usize).map(|_| next() as u8).collect();
            if i % 2 == 0 {
                let seed = seeds[i % 3];
                bytes = seed.iter().map(|b| if next() % 8 == 0 { next() as u8 } else { *b }).collect();
                bytes.extend((0..(next() % 8)).map(|_| next() as u8));
            }
            if let Some(insn) = decode(&bytes) {
                assert!(insn.len as usize <= bytes.len(), "{bytes:02x?} -> {insn:?}");
            }
        }
    }

    #[test]
    fn computes_addresses() {
        let mut g = [0u64; 16];
        g[3] = 0x1000;
        g[9] = 2;
        let m = mem(&[0x4a, 0x0f, 0xae, 0x6c, 0xcb, 0xf0]).2;
        assert_eq!(m.address(&g, 0, 0, 0), 0x1000 + 16 - 0x10);
        let m = mem(&[0x48, 0x0f, 0xae, 0x25, 0x00, 0x01, 0x00, 0x00]).2;
        assert_eq!(m.address(&g, 0x5008, 0, 0), 0x5108);
        let m = mem(&[0x65, 0x48, 0x0f, 0xae, 0x27]).2;
        g[7] = 0x40;
        assert_eq!(m.address(&g, 0, 1, 0x9000), 0x9040);
    }
}
