//! The VMM's completion of guest instructions KVM's emulator cannot run (XSAVE/XRSTOR,
//! XGETBV/XSETBV, CLAC/STAC, INT3, FWAIT on PVM hosts): everything in it is guest-chosen
//! bytes — the instruction, its memory operand, the guest's page tables and XSAVE area.
//!
//! This follows `vstate::emulation::complete` and its `xsave_access` without a vCPU: the
//! registers KVM would report come from the input instead. It decodes the instruction
//! (`decode::decode`), computes the operand's address (`MemOperand::address`), walks the
//! guest's 4-level page tables (`page_walk::read`/`write`, which set accessed and dirty
//! bits) and runs `xsave::save`/`xsave::restore` on the area, with the layout of an
//! AVX-512 CPU.
//!
//! Input: 16 instruction bytes; 4 u64 register values (the 16 GPRs cycle through them;
//! RAX/RDX give the feature mask); a control byte (bit 0 CR0.PG, bit 1 CR0.WP, bit 2
//! CR4.LA57, bit 3 CR4.OSXSAVE, bits 4-5 CPL); CR3's page (u8, `% 64`); FS and GS bases
//! (u64); XCR0 (u64); then 10-byte records `(slot u16, value u64)` that write `value` at
//! page `slot >> 9` (`% 64`), entry `slot & 511` of guest memory (page tables and data).
//!
//! Checked: a decoded instruction is at most 15 bytes, all of them from the input, and
//! decodes the same from exactly its own bytes; an XRSTOR result is a whole XSAVE image.

#![no_main]

use forkvm_fuzz::{virtq, Bytes};
use forkvm_vmm::vstate::emulation::decode::{decode, Op};
use forkvm_vmm::vstate::emulation::page_walk::{self, Paging};
use forkvm_vmm::vstate::emulation::xsave::{self, Component, Layout, HEADER_LEN, HEADER_OFFSET, KVM_XSAVE_LEN};
use libfuzzer_sys::fuzz_target;
use vm_memory::{Bytes as _, GuestAddress};

const CR0_PG: u64 = 1 << 31;
const CR0_WP: u64 = 1 << 16;
const CR4_LA57: u64 = 1 << 12;
const CR4_OSXSAVE: u64 = 1 << 18;
const PAGES: u64 = 64;

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

/// The vCPU's XSAVE image as KVM would return it: a pattern with a sane MXCSR mask.
fn cpu_image() -> Vec<u8> {
    let mut cpu: Vec<u8> = (0..KVM_XSAVE_LEN).map(|i| (i as u8).wrapping_mul(13)).collect();
    cpu[24..28].copy_from_slice(&0x1f80u32.to_le_bytes());
    cpu[28..32].copy_from_slice(&0xffffu32.to_le_bytes());
    cpu[HEADER_OFFSET..HEADER_OFFSET + HEADER_LEN].fill(0);
    cpu[HEADER_OFFSET..HEADER_OFFSET + 8].copy_from_slice(&0xe7u64.to_le_bytes());
    cpu
}

fuzz_target!(|data: &[u8]| {
    let mut b = Bytes::new(data);
    let insn_bytes: [u8; 16] = b.array();
    let vals = [b.u64(), b.u64(), b.u64(), b.u64()];
    let control = b.u8();
    let cr3 = u64::from(b.u8()) % PAGES * 4096;
    let (fs_base, gs_base, xcr0) = (b.u64(), b.u64(), b.u64());
    let mem = virtq::memory();
    while !b.is_empty() {
        let (slot, value) = (b.u16(), b.u64());
        let at = (u64::from(slot >> 9) % PAGES) * 4096 + u64::from(slot & 511) * 8;
        let _ = mem.write_obj(value, GuestAddress(at));
    }

    let Some(insn) = decode(&insn_bytes) else { return };
    assert!(insn.len >= 1 && insn.len <= 15, "decoded length {}", insn.len);
    assert_eq!(decode(&insn_bytes[..insn.len as usize]), Some(insn), "decoding depends on bytes past the instruction");
    if !matches!(insn.op, Op::Xsave | Op::Xrstor) || control & 8 == 0 {
        return;
    }
    let gprs: [u64; 16] = std::array::from_fn(|i| vals[i % 4]);
    let rfbm = xcr0 & ((gprs[2] << 32) | (gprs[0] & 0xffff_ffff));
    let layout = layout();
    if layout.unsupported(rfbm) != 0 {
        return;
    }
    let Some(operand) = insn.mem else { return };
    let rip = 0xffff_ffff_8100_0000u64;
    let area = operand.address(&gprs, rip + insn.len, fs_base, gs_base);
    if area & 63 != 0 {
        return;
    }
    let paging = Paging {
        cr0: if control & 1 != 0 { CR0_PG } else { 0 } | if control & 2 != 0 { CR0_WP } else { 0 },
        cr3,
        cr4: CR4_OSXSAVE | if control & 4 != 0 { CR4_LA57 } else { 0 },
        cpl: (control >> 4) & 3,
    };
    let cpu = cpu_image();
    let len = layout.area_len(rfbm);
    let Ok(image) = page_walk::read(&mem, paging, area, len) else { return };
    assert_eq!(image.len(), len);
    if insn.op == Op::Xsave {
        let header = &image[HEADER_OFFSET..HEADER_OFFSET + HEADER_LEN];
        let mut out = image.clone();
        for (at, bytes) in xsave::save(&layout, &cpu, rfbm, header) {
            out[at..at + bytes.len()].copy_from_slice(&bytes);
        }
        let _ = page_walk::write(&mem, paging, area, &out);
    } else {
        let mut read = |from: usize, n: usize| image[from..from + n].to_vec();
        if let Ok(loaded) = xsave::restore(&layout, &cpu, rfbm, xcr0, &mut read) {
            assert_eq!(loaded.len(), cpu.len(), "XRSTOR changed the image size");
        }
    }
});
