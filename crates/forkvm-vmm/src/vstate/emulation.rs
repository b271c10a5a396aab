//! Completing instructions KVM's emulator cannot run.
//!
//! On PVM hosts guest kernel code runs through KVM's instruction emulator, which stops
//! with `KVM_EXIT_INTERNAL_ERROR` (suberror `EMULATION`) on a few instructions a Linux
//! guest executes (PLATFORM.md). Those have simple architectural effects, so the VMM
//! completes them and lets the guest continue:
//!
//! | bytes | instruction | completion |
//! | --- | --- | --- |
//! | `CC` | `int3` | RIP += 1, raise #BP (vector 3) |
//! | `9B` | `fwait` | RIP += 1 (no x87 exceptions pending under KVM) |
//! | `0F 01 CA` | `clac` | RFLAGS.AC = 0, RIP += 3 |
//! | `0F 01 CB` | `stac` | RFLAGS.AC = 1, RIP += 3 |
//!
//! Anything else stops the VM with an error that names the bytes. Every completion is
//! counted per kind (the control socket's `status` and `forkvm doctor` show them); on
//! hardware KVM the path is never taken.

use kvm_ioctls::VcpuFd;
use std::sync::atomic::{AtomicU64, Ordering};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

const RFLAGS_AC: u64 = 1 << 18;
const VECTOR_BP: u8 = 3;

/// The instructions we know how to complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fixup {
    Int3,
    Fwait,
    Clac,
    Stac,
}

impl Fixup {
    pub const ALL: [Fixup; 4] = [Fixup::Int3, Fixup::Fwait, Fixup::Clac, Fixup::Stac];

    pub fn name(self) -> &'static str {
        match self {
            Fixup::Int3 => "int3",
            Fixup::Fwait => "fwait",
            Fixup::Clac => "clac",
            Fixup::Stac => "stac",
        }
    }

    /// Recognizes the instruction at the start of `bytes`.
    pub fn decode(bytes: &[u8]) -> Option<Fixup> {
        match bytes {
            [0xcc, ..] => Some(Fixup::Int3),
            [0x9b, ..] => Some(Fixup::Fwait),
            [0x0f, 0x01, 0xca, ..] => Some(Fixup::Clac),
            [0x0f, 0x01, 0xcb, ..] => Some(Fixup::Stac),
            _ => None,
        }
    }

    fn len(self) -> u64 {
        match self {
            Fixup::Int3 | Fixup::Fwait => 1,
            Fixup::Clac | Fixup::Stac => 3,
        }
    }
}

/// Completions per kind, for this process (one VMM process runs one VM).
static COUNTS: [AtomicU64; 4] = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];

/// (kind, count) for every kind, in a fixed order.
pub fn counts() -> Vec<(&'static str, u64)> {
    Fixup::ALL.iter().enumerate().map(|(i, f)| (f.name(), COUNTS[i].load(Ordering::Relaxed))).collect()
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
    #[error("emulation failure at rip {rip:#x}: completing {kind}: {source}")]
    Complete { rip: u64, kind: &'static str, source: kvm_ioctls::Error },
}

/// Completes the instruction that stopped the emulator; returns what it was (the caller
/// reports first occurrences).
pub fn complete(vcpu: &VcpuFd, mem: &GuestMemoryMmap, payload_events: bool) -> Result<Fixup, EmulationError> {
    let mut regs = vcpu.get_regs().map_err(EmulationError::Regs)?;
    let rip = regs.rip;
    let bytes = fetch(vcpu, mem, rip)?;
    let fixup = Fixup::decode(&bytes).ok_or_else(|| EmulationError::Unknown {
        rip,
        bytes: bytes.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(" "),
    })?;
    let fail = |source| EmulationError::Complete { rip, kind: fixup.name(), source };
    regs.rip += fixup.len();
    match fixup {
        Fixup::Clac => regs.rflags &= !RFLAGS_AC,
        Fixup::Stac => regs.rflags |= RFLAGS_AC,
        Fixup::Int3 | Fixup::Fwait => {}
    }
    vcpu.set_regs(&regs).map_err(fail)?;
    if fixup == Fixup::Int3 {
        let mut events = vcpu.get_vcpu_events().map_err(fail)?;
        // A trap: delivered with the saved RIP past the int3. With exception payloads
        // enabled KVM takes a *pending* exception; otherwise an injected one.
        events.exception.nr = VECTOR_BP;
        events.exception.has_error_code = 0;
        events.exception.error_code = 0;
        if payload_events {
            events.exception.pending = 1;
            events.exception.injected = 0;
        } else {
            events.exception.injected = 1;
        }
        vcpu.set_vcpu_events(&events).map_err(fail)?;
    }
    let index = Fixup::ALL.iter().position(|f| *f == fixup).unwrap_or(0);
    COUNTS[index].fetch_add(1, Ordering::Relaxed);
    Ok(fixup)
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
    fn decodes_the_known_instructions() {
        assert_eq!(Fixup::decode(&[0xcc, 0x90]), Some(Fixup::Int3));
        assert_eq!(Fixup::decode(&[0x9b]), Some(Fixup::Fwait));
        assert_eq!(Fixup::decode(&[0x0f, 0x01, 0xca]), Some(Fixup::Clac));
        assert_eq!(Fixup::decode(&[0x0f, 0x01, 0xcb, 0x00]), Some(Fixup::Stac));
        assert_eq!(Fixup::decode(&[0x0f, 0x01]), None);
        assert_eq!(Fixup::decode(&[0xf3, 0x0f, 0xb8, 0xc0]), None, "popcnt is hidden, not completed");
    }

    #[test]
    fn lengths_match_the_encodings() {
        assert_eq!(Fixup::Int3.len(), 1);
        assert_eq!(Fixup::Clac.len(), 3);
    }
}
