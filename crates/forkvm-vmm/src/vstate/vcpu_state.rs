//! Typed vCPU state: everything KVM holds for one vCPU, saved and restored as a unit.
//!
//! Restore order matters: CPUID before anything that depends on features; special
//! registers (which carry EFER and the APIC base) before the LAPIC and the MSRs; events
//! and MP state last, because setting earlier state can reset them.

use kvm_bindings::{
    kvm_cpuid_entry2, kvm_debugregs, kvm_lapic_state, kvm_mp_state, kvm_msr_entry, kvm_regs, kvm_sregs,
    kvm_vcpu_events, kvm_xcrs, kvm_xsave, CpuId, Msrs,
};
use kvm_ioctls::VcpuFd;
use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum VcpuStateError {
    #[error("vCPU state: {step}: {source}")]
    Kvm { step: &'static str, source: kvm_ioctls::Error },
    #[error("vCPU state: KVM saved {got} of {want} MSRs")]
    PartialMsrs { got: usize, want: usize },
    #[error("vCPU state: XSAVE area has {0} words, expected 1024")]
    XsaveSize(usize),
    #[error("vCPU state: building the {0} list: {1:?}")]
    Fam(&'static str, vmm_sys_util::fam::Error),
}

fn kvm(step: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> VcpuStateError {
    move |source| VcpuStateError::Kvm { step, source }
}

/// x87/SSE state, as `kvm_fpu` lays it out, read from the XSAVE area's legacy region.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FpuState {
    pub fpr: [[u8; 16]; 8],
    pub fcw: u16,
    pub fsw: u16,
    pub ftwx: u8,
    pub last_opcode: u16,
    pub last_ip: u64,
    pub last_dp: u64,
    pub xmm: [[u8; 16]; 16],
    pub mxcsr: u32,
}

impl FpuState {
    /// The x87/SSE state in the legacy region of `xsave` (the FXSAVE layout, which is
    /// what `KVM_GET_FPU` reads too): the saved state keeps its `fpu` without a second
    /// ioctl per vCPU.
    fn from_xsave(xsave: &XsaveState) -> FpuState {
        let mut bytes = [0u8; 512];
        for (chunk, word) in bytes.chunks_exact_mut(4).zip(&xsave.0) {
            chunk.copy_from_slice(&word.to_le_bytes());
        }
        let u16_at = |at: usize| u16::from_le_bytes([bytes[at], bytes[at + 1]]);
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        let sixteen = |at: usize| -> [u8; 16] { bytes[at..at + 16].try_into().expect("16 bytes") };
        FpuState {
            fpr: std::array::from_fn(|i| sixteen(32 + 16 * i)),
            fcw: u16_at(0),
            fsw: u16_at(2),
            ftwx: bytes[4],
            last_opcode: u16_at(6),
            last_ip: u64_at(8),
            last_dp: u64_at(16),
            xmm: std::array::from_fn(|i| sixteen(160 + 16 * i)),
            mxcsr: u32::from_le_bytes(bytes[24..28].try_into().expect("4 bytes")),
        }
    }
}

/// The legacy 4 KiB XSAVE area, as `KVM_GET_XSAVE` returns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct XsaveState(pub Vec<u32>);

impl XsaveState {
    const WORDS: usize = 1024;

    fn to_kvm(&self) -> Result<kvm_xsave, VcpuStateError> {
        let region: [u32; Self::WORDS] =
            self.0.as_slice().try_into().map_err(|_| VcpuStateError::XsaveSize(self.0.len()))?;
        Ok(kvm_xsave { region, ..Default::default() })
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VcpuState {
    pub cpuid: Vec<kvm_cpuid_entry2>,
    pub regs: kvm_regs,
    pub sregs: kvm_sregs,
    pub fpu: FpuState,
    pub xsave: XsaveState,
    pub xcrs: kvm_xcrs,
    pub lapic: kvm_lapic_state,
    pub msrs: Vec<kvm_msr_entry>,
    pub vcpu_events: kvm_vcpu_events,
    pub mp_state: kvm_mp_state,
    pub debugregs: kvm_debugregs,
}

impl VcpuState {
    /// Reads the state of a vCPU that is not running. `msr_indices` is the host's
    /// readable MSR list (see `arch::x86_64::msr::saved_msr_indices`).
    pub fn save(vcpu: &VcpuFd, cpuid: &[kvm_cpuid_entry2], msr_indices: &[u32]) -> Result<VcpuState, VcpuStateError> {
        // MP state first: reading it makes KVM accept a pending INIT or SIPI, which
        // rewrites the registers, MSRs and LAPIC read below (an AP caught starting up).
        let mp_state = vcpu.get_mp_state().map_err(kvm("KVM_GET_MP_STATE"))?;
        let entries: Vec<kvm_msr_entry> =
            msr_indices.iter().map(|&index| kvm_msr_entry { index, ..Default::default() }).collect();
        let mut msrs = Msrs::from_entries(&entries).map_err(|e| VcpuStateError::Fam("MSR", e))?;
        let got = vcpu.get_msrs(&mut msrs).map_err(kvm("KVM_GET_MSRS"))?;
        if got != entries.len() {
            return Err(VcpuStateError::PartialMsrs { got, want: entries.len() });
        }
        let xsave = XsaveState(vcpu.get_xsave().map_err(kvm("KVM_GET_XSAVE"))?.region.to_vec());
        Ok(VcpuState {
            cpuid: cpuid.to_vec(),
            regs: vcpu.get_regs().map_err(kvm("KVM_GET_REGS"))?,
            sregs: vcpu.get_sregs().map_err(kvm("KVM_GET_SREGS"))?,
            fpu: FpuState::from_xsave(&xsave),
            xsave,
            xcrs: vcpu.get_xcrs().map_err(kvm("KVM_GET_XCRS"))?,
            lapic: vcpu.get_lapic().map_err(kvm("KVM_GET_LAPIC"))?,
            msrs: msrs.as_slice().to_vec(),
            vcpu_events: vcpu.get_vcpu_events().map_err(kvm("KVM_GET_VCPU_EVENTS"))?,
            mp_state,
            debugregs: vcpu.get_debug_regs().map_err(kvm("KVM_GET_DEBUGREGS"))?,
        })
    }

    /// Loads this state into a freshly created vCPU.
    pub fn restore(&self, vcpu: &VcpuFd) -> Result<(), VcpuStateError> {
        let cpuid = CpuId::from_entries(&self.cpuid).map_err(|e| VcpuStateError::Fam("CPUID", e))?;
        vcpu.set_cpuid2(&cpuid).map_err(kvm("KVM_SET_CPUID2"))?;
        vcpu.set_sregs(&self.sregs).map_err(kvm("KVM_SET_SREGS"))?;
        vcpu.set_regs(&self.regs).map_err(kvm("KVM_SET_REGS"))?;
        // No KVM_SET_FPU: the XSAVE area holds the x87/SSE state too, and KVM_SET_XSAVE
        // sets every component it describes (`fpu` is kept for the format only).
        let xsave = self.xsave.to_kvm()?;
        // SAFETY: `xsave` is the legacy 4 KiB layout with no trailing extra area, which
        // is exactly what KVM_SET_XSAVE reads.
        unsafe { vcpu.set_xsave(&xsave) }.map_err(kvm("KVM_SET_XSAVE"))?;
        vcpu.set_xcrs(&self.xcrs).map_err(kvm("KVM_SET_XCRS"))?;
        vcpu.set_lapic(&self.lapic).map_err(kvm("KVM_SET_LAPIC"))?;
        let msrs = Msrs::from_entries(&self.msrs).map_err(|e| VcpuStateError::Fam("MSR", e))?;
        let set = vcpu.set_msrs(&msrs).map_err(kvm("KVM_SET_MSRS"))?;
        if set != self.msrs.len() {
            return Err(VcpuStateError::PartialMsrs { got: set, want: self.msrs.len() });
        }
        vcpu.set_vcpu_events(&self.vcpu_events).map_err(kvm("KVM_SET_VCPU_EVENTS"))?;
        vcpu.set_mp_state(self.mp_state).map_err(kvm("KVM_SET_MP_STATE"))?;
        vcpu.set_debug_regs(&self.debugregs).map_err(kvm("KVM_SET_DEBUGREGS"))?;
        Ok(())
    }
}
