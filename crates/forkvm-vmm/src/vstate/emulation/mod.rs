//! Completing instructions KVM's emulator cannot run.
//!
//! On PVM hosts guest kernel code runs through KVM's instruction emulator, which stops
//! with `KVM_EXIT_INTERNAL_ERROR` (suberror `EMULATION`) on a few instructions a Linux
//! guest executes (PLATFORM.md). Those have well-defined architectural effects, so the
//! VMM completes them and lets the guest continue:
//!
//! | bytes | instruction | completion |
//! | --- | --- | --- |
//! | `CC` | `int3` | RIP += 1, raise #BP (vector 3) |
//! | `9B` | `fwait` | RIP += 1 (no x87 exceptions pending under KVM) |
//! | `0F 01 CA` | `clac` | RFLAGS.AC = 0, RIP += 3 |
//! | `0F 01 CB` | `stac` | RFLAGS.AC = 1, RIP += 3 |
//! | `0F 01 D0` | `xgetbv` | EDX:EAX = XCR0 (`KVM_GET_XCRS`) |
//! | `0F 01 D1` | `xsetbv` | XCR0 = EDX:EAX (`KVM_SET_XCRS`, which checks it; #GP if refused) |
//! | `[REX] 0F AE /4` | `xsave` | the vCPU's state (`KVM_GET_XSAVE`) into the guest's area ([`xsave`]) |
//! | `[REX] 0F AE /5` | `xrstor` | the guest's area, checked, into the vCPU (`KVM_SET_XSAVE`) |
//!
//! `xsave`/`xrstor` are what let a PVM guest kernel save AVX and AVX-512 state on a
//! context switch (without them it must boot with `noxsave` and its processes corrupt
//! each other's vector registers). Their memory operand is a guest linear address,
//! translated by walking the guest's page tables ([`page_walk`]); a fault there, a
//! misaligned area or a header the CPU would refuse becomes the exception the CPU would
//! raise, so the guest kernel's own fault handling (signal frames in user memory) works.
//!
//! Anything else stops the VM with an error that names the bytes. Every completion is
//! counted per kind (the control socket's `status` and `forkvm doctor` show them); on
//! hardware KVM the path is never taken.

pub mod decode;
pub mod page_walk;
pub mod xsave;

use decode::{Instruction, Op};
use kvm_bindings::{kvm_regs, kvm_xsave};
use kvm_ioctls::VcpuFd;
use page_walk::{Paging, WalkError};
use std::sync::atomic::{AtomicU64, Ordering};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

const RFLAGS_AC: u64 = 1 << 18;
const CR4_OSXSAVE: u64 = 1 << 18;
const VECTOR_UD: u8 = 6;
const VECTOR_BP: u8 = 3;
const VECTOR_GP: u8 = 13;
const VECTOR_PF: u8 = 14;

/// The instructions we know how to complete (one counter each).
pub type Fixup = Op;

impl Op {
    pub const ALL: [Op; 8] = [Op::Int3, Op::Fwait, Op::Clac, Op::Stac, Op::Xgetbv, Op::Xsetbv, Op::Xsave, Op::Xrstor];

    pub fn name(self) -> &'static str {
        match self {
            Op::Int3 => "int3",
            Op::Fwait => "fwait",
            Op::Clac => "clac",
            Op::Stac => "stac",
            Op::Xgetbv => "xgetbv",
            Op::Xsetbv => "xsetbv",
            Op::Xsave => "xsave",
            Op::Xrstor => "xrstor",
        }
    }
}

/// Completions per kind, for this process (one VMM process runs one VM).
static COUNTS: [AtomicU64; 8] = [const { AtomicU64::new(0) }; 8];

/// (kind, count) for every kind, in a fixed order.
pub fn counts() -> Vec<(&'static str, u64)> {
    Op::ALL.iter().enumerate().map(|(i, f)| (f.name(), COUNTS[i].load(Ordering::Relaxed))).collect()
}

#[derive(Debug, thiserror::Error)]
pub enum EmulationError {
    #[error("emulation failure: reading registers: {0}")]
    Regs(kvm_ioctls::Error),
    #[error("emulation failure at rip {rip:#x}: the address does not translate ({0})", rip = .1)]
    Translate(kvm_ioctls::Error, u64),
    #[error("emulation failure at rip {rip:#x}: cannot read the instruction bytes")]
    Fetch { rip: u64 },
    #[error("emulation failure at rip {rip:#x}: instruction {bytes} is not one the VMM completes")]
    Unknown { rip: u64, bytes: String },
    #[error("emulation failure at rip {rip:#x}: completing {kind}: {step}: {source}")]
    Complete { rip: u64, kind: &'static str, step: &'static str, source: kvm_ioctls::Error },
    #[error("emulation failure at rip {rip:#x}: completing {kind}: {what}")]
    Unsupported { rip: u64, kind: &'static str, what: String },
}

/// An exception the completed instruction raises instead of finishing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Exception {
    vector: u8,
    error_code: Option<u32>,
    /// CR2, for a page fault.
    address: Option<u64>,
}

impl Exception {
    const UD: Exception = Exception { vector: VECTOR_UD, error_code: None, address: None };
    const GP: Exception = Exception { vector: VECTOR_GP, error_code: Some(0), address: None };
}

/// What the instruction did.
enum Outcome {
    /// Done: RIP moves past it (registers as given).
    Completed(kvm_regs),
    /// It faulted: RIP stays, the exception is raised.
    Raised(Exception),
}

/// Completes the instruction that stopped the emulator; returns what it was (the caller
/// reports first occurrences). `layout` is the vCPU's XSAVE area layout (from its CPUID,
/// [`xsave::Layout::from_cpuid`], made once per vCPU by the caller).
pub fn complete(
    vcpu: &VcpuFd,
    mem: &GuestMemoryMmap,
    layout: &xsave::Layout,
    payload_events: bool,
) -> Result<Fixup, EmulationError> {
    let regs = vcpu.get_regs().map_err(EmulationError::Regs)?;
    let rip = regs.rip;
    let bytes = fetch(vcpu, mem, rip)?;
    let insn = decode::decode(&bytes).ok_or_else(|| EmulationError::Unknown {
        rip,
        bytes: bytes.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(" "),
    })?;
    let kind = insn.op.name();
    let fail = |step| move |source| EmulationError::Complete { rip, kind, step, source };
    let outcome = match insn.op {
        Op::Int3 | Op::Fwait | Op::Clac | Op::Stac => {
            let mut r = regs;
            match insn.op {
                Op::Clac => r.rflags &= !RFLAGS_AC,
                Op::Stac => r.rflags |= RFLAGS_AC,
                _ => {}
            }
            Outcome::Completed(r)
        }
        Op::Xgetbv | Op::Xsetbv => xcr_access(vcpu, insn.op, regs).map_err(|(step, e)| fail(step)(e))?,
        Op::Xsave | Op::Xrstor => xsave_access(vcpu, mem, layout, &insn, regs)?,
    };
    match outcome {
        Outcome::Completed(mut r) => {
            r.rip = rip + insn.len;
            vcpu.set_regs(&r).map_err(fail("KVM_SET_REGS"))?;
            if insn.op == Op::Int3 {
                // A trap: delivered with the saved RIP past the int3.
                let bp = Exception { vector: VECTOR_BP, error_code: None, address: None };
                raise(vcpu, bp, payload_events).map_err(fail("raising #BP"))?;
            }
        }
        Outcome::Raised(e) => raise(vcpu, e, payload_events).map_err(fail("raising the exception"))?,
    }
    let index = Op::ALL.iter().position(|f| *f == insn.op).unwrap_or(0);
    COUNTS[index].fetch_add(1, Ordering::Relaxed);
    Ok(insn.op)
}

/// Makes the guest take `e` on its next entry. With exception payloads enabled KVM takes
/// a *pending* exception (and sets CR2 from the payload on delivery); otherwise an
/// injected one, with CR2 set here.
fn raise(vcpu: &VcpuFd, e: Exception, payload_events: bool) -> Result<(), kvm_ioctls::Error> {
    if let (Some(cr2), false) = (e.address, payload_events) {
        let mut sregs = vcpu.get_sregs()?;
        sregs.cr2 = cr2;
        vcpu.set_sregs(&sregs)?;
    }
    let mut events = vcpu.get_vcpu_events()?;
    events.exception.nr = e.vector;
    events.exception.has_error_code = u8::from(e.error_code.is_some());
    events.exception.error_code = e.error_code.unwrap_or(0);
    if payload_events {
        events.exception.pending = 1;
        events.exception.injected = 0;
        events.exception_has_payload = u8::from(e.address.is_some());
        events.exception_payload = e.address.unwrap_or(0);
    } else {
        events.exception.injected = 1;
    }
    vcpu.set_vcpu_events(&events)
}

/// Test hook: xfeatures (hex) that completed XSAVEs leave out, as a kernel that loses
/// that state would, so tests can show the vector-state check catches such a guest.
pub const TEST_XSAVE_DROP_ENV: &str = "FORKVM_TEST_XSAVE_DROP";

/// [`TEST_XSAVE_DROP_ENV`], read once per process (0 when unset or unreadable).
fn dropped_xfeatures() -> u64 {
    static DROP: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *DROP.get_or_init(|| {
        std::env::var(TEST_XSAVE_DROP_ENV)
            .ok()
            .and_then(|v| u64::from_str_radix(v.trim_start_matches("0x"), 16).ok())
            .unwrap_or(0)
    })
}

type StepError = (&'static str, kvm_ioctls::Error);

fn xcr0(vcpu: &VcpuFd) -> Result<u64, StepError> {
    let xcrs = vcpu.get_xcrs().map_err(|e| ("KVM_GET_XCRS", e))?;
    Ok(xcrs.xcrs[..xcrs.nr_xcrs.min(16) as usize].iter().find(|x| x.xcr == 0).map_or(1, |x| x.value))
}

/// `XGETBV`/`XSETBV` of XCR0 (the only XCR the guest's CPUID offers: no XGETBV1).
fn xcr_access(vcpu: &VcpuFd, op: Op, mut regs: kvm_regs) -> Result<Outcome, StepError> {
    let sregs = vcpu.get_sregs().map_err(|e| ("KVM_GET_SREGS", e))?;
    if sregs.cr4 & CR4_OSXSAVE == 0 {
        return Ok(Outcome::Raised(Exception::UD));
    }
    if regs.rcx as u32 != 0 {
        return Ok(Outcome::Raised(Exception::GP));
    }
    if op == Op::Xgetbv {
        let v = xcr0(vcpu)?;
        regs.rax = v & 0xffff_ffff;
        regs.rdx = v >> 32;
        return Ok(Outcome::Completed(regs));
    }
    if sregs.cs.selector & 3 != 0 {
        return Ok(Outcome::Raised(Exception::GP));
    }
    let value = (regs.rdx << 32) | (regs.rax & 0xffff_ffff);
    let mut xcrs = vcpu.get_xcrs().map_err(|e| ("KVM_GET_XCRS", e))?;
    xcrs.nr_xcrs = 1;
    xcrs.xcrs[0].xcr = 0;
    xcrs.xcrs[0].value = value;
    // KVM checks the value as the CPU would (x87 set, AVX needs SSE, AVX-512 all or none,
    // nothing beyond the guest's CPUID): a refusal is the guest's #GP.
    match vcpu.set_xcrs(&xcrs) {
        Ok(()) => Ok(Outcome::Completed(regs)),
        Err(e) if e.errno() == libc::EINVAL => Ok(Outcome::Raised(Exception::GP)),
        Err(e) => Err(("KVM_SET_XCRS", e)),
    }
}

fn xsave_bytes(x: &kvm_xsave) -> Vec<u8> {
    x.region.iter().flat_map(|w| w.to_le_bytes()).collect()
}

fn gprs(r: &kvm_regs) -> [u64; 16] {
    [r.rax, r.rcx, r.rdx, r.rbx, r.rsp, r.rbp, r.rsi, r.rdi, r.r8, r.r9, r.r10, r.r11, r.r12, r.r13, r.r14, r.r15]
}

/// `XSAVE`/`XRSTOR` of the vCPU's state to/from the guest's area (see [`xsave`]).
fn xsave_access(
    vcpu: &VcpuFd,
    mem: &GuestMemoryMmap,
    layout: &xsave::Layout,
    insn: &Instruction,
    regs: kvm_regs,
) -> Result<Outcome, EmulationError> {
    let rip = regs.rip;
    let kind = insn.op.name();
    let step = |step: &'static str| move |source| EmulationError::Complete { rip, kind, step, source };
    let sregs = vcpu.get_sregs().map_err(step("KVM_GET_SREGS"))?;
    if sregs.cr4 & CR4_OSXSAVE == 0 {
        return Ok(Outcome::Raised(Exception::UD));
    }
    let xcr0 = xcr0(vcpu).map_err(|(s, e)| step(s)(e))?;
    let rfbm = xcr0 & ((regs.rdx << 32) | (regs.rax & 0xffff_ffff));
    let unsupported = layout.unsupported(rfbm);
    if unsupported != 0 {
        let what = format!("xfeatures {unsupported:#x} are enabled but the VMM cannot hold their state");
        return Err(EmulationError::Unsupported { rip, kind, what });
    }
    let Some(operand) = insn.mem else {
        return Err(EmulationError::Unsupported { rip, kind, what: "no memory operand".into() });
    };
    let area = operand.address(&gprs(&regs), rip + insn.len, sregs.fs.base, sregs.gs.base);
    if area & 63 != 0 {
        return Ok(Outcome::Raised(Exception::GP));
    }
    let paging = Paging { cr0: sregs.cr0, cr3: sregs.cr3, cr4: sregs.cr4, cpl: (sregs.cs.selector & 3) as u8 };
    let walk_failed = |e: WalkError| match e {
        WalkError::PageFault { addr, error_code } => {
            Ok(Outcome::Raised(Exception { vector: VECTOR_PF, error_code: Some(error_code), address: Some(addr) }))
        }
        WalkError::Unsupported(what) => Err(EmulationError::Unsupported { rip, kind, what: what.into() }),
    };
    let cpu = vcpu.get_xsave().map_err(step("KVM_GET_XSAVE"))?;
    let cpu_bytes = xsave_bytes(&cpu);
    let len = layout.area_len(rfbm);
    let image = match page_walk::read(mem, paging, area, len) {
        Ok(b) => b,
        Err(e) => return walk_failed(e),
    };
    if insn.op == Op::Xsave {
        let header = &image[xsave::HEADER_OFFSET..xsave::HEADER_OFFSET + xsave::HEADER_LEN];
        let mut out = image.clone();
        for (at, bytes) in xsave::save(layout, &cpu_bytes, rfbm & !dropped_xfeatures(), header) {
            out[at..at + bytes.len()].copy_from_slice(&bytes);
        }
        if let Err(e) = page_walk::write(mem, paging, area, &out) {
            return walk_failed(e);
        }
        return Ok(Outcome::Completed(regs));
    }
    let restored = match xsave::restore(layout, &cpu_bytes, rfbm, xcr0, &mut |at, n| image[at..at + n].to_vec()) {
        Ok(b) => b,
        Err(xsave::Fault::GeneralProtection(_)) => return Ok(Outcome::Raised(Exception::GP)),
    };
    let mut next = cpu;
    for (w, chunk) in next.region.iter_mut().zip(restored.chunks_exact(4)) {
        *w = u32::from_le_bytes(chunk.try_into().unwrap());
    }
    // SAFETY: `next` is the legacy 4 KiB `kvm_xsave` KVM_GET_XSAVE filled, with no
    // trailing extra area, which is exactly what KVM_SET_XSAVE reads.
    match unsafe { vcpu.set_xsave(&next) } {
        Ok(()) => Ok(Outcome::Completed(regs)),
        // KVM refuses state the CPU would refuse too (it re-checks MXCSR and the header).
        Err(e) if e.errno() == libc::EINVAL => Ok(Outcome::Raised(Exception::GP)),
        Err(e) => Err(step("KVM_SET_XSAVE")(e)),
    }
}

/// Up to 15 instruction bytes at the guest virtual address `rip`, stopping at a page
/// boundary it cannot translate.
fn fetch(vcpu: &VcpuFd, mem: &GuestMemoryMmap, rip: u64) -> Result<Vec<u8>, EmulationError> {
    let mut out = Vec::with_capacity(15);
    let mut va = rip;
    while out.len() < 15 {
        let t = vcpu.translate_gva(va).map_err(|e| EmulationError::Translate(e, rip))?;
        if t.valid == 0 {
            break;
        }
        let in_page = (0x1000 - (va & 0xfff)) as usize;
        let n = in_page.min(15 - out.len());
        let mut buf = vec![0u8; n];
        if mem.read_slice(&mut buf, GuestAddress(t.physical_address)).is_err() {
            break;
        }
        out.extend_from_slice(&buf);
        va += n as u64;
    }
    if out.is_empty() {
        return Err(EmulationError::Fetch { rip });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_a_counter_and_a_name() {
        assert_eq!(Op::ALL.len(), COUNTS.len());
        let names: std::collections::HashSet<_> = Op::ALL.iter().map(|o| o.name()).collect();
        assert_eq!(names.len(), Op::ALL.len());
    }
}
