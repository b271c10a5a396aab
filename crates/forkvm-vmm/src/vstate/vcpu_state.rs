//! Typed vCPU state: everything KVM holds for one vCPU, saved and restored as a unit.
//!
//! Restore order matters: CPUID before anything that depends on features; special
//! registers (which carry EFER and the APIC base) before the LAPIC and the MSRs; events
//! and MP state last, because setting earlier state can reset them.

use kvm_bindings::{
    kvm_cpuid_entry2, kvm_debugregs, kvm_fpu, kvm_lapic_state, kvm_mp_state, kvm_msr_entry, kvm_regs, kvm_sregs,
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

/// Everything KVM holds for one vCPU.
/// x87/SSE state (`kvm_fpu`, which kvm-bindings does not make serializable).
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

impl From<&kvm_fpu> for FpuState {
    fn from(f: &kvm_fpu) -> Self {
        FpuState {
            fpr: f.fpr,
            fcw: f.fcw,
            fsw: f.fsw,
            ftwx: f.ftwx,
            last_opcode: f.last_opcode,
            last_ip: f.last_ip,
            last_dp: f.last_dp,
            xmm: f.xmm,
            mxcsr: f.mxcsr,
        }
    }
}

impl From<&FpuState> for kvm_fpu {
    fn from(f: &FpuState) -> Self {
        kvm_fpu {
            fpr: f.fpr,
            fcw: f.fcw,
            fsw: f.fsw,
            ftwx: f.ftwx,
            last_opcode: f.last_opcode,
            last_ip: f.last_ip,
            last_dp: f.last_dp,
            xmm: f.xmm,
            mxcsr: f.mxcsr,
            ..Default::default()
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
        Ok(VcpuState {
            cpuid: cpuid.to_vec(),
            regs: vcpu.get_regs().map_err(kvm("KVM_GET_REGS"))?,
            sregs: vcpu.get_sregs().map_err(kvm("KVM_GET_SREGS"))?,
            fpu: FpuState::from(&vcpu.get_fpu().map_err(kvm("KVM_GET_FPU"))?),
            xsave: XsaveState(vcpu.get_xsave().map_err(kvm("KVM_GET_XSAVE"))?.region.to_vec()),
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
        vcpu.set_fpu(&kvm_fpu::from(&self.fpu)).map_err(kvm("KVM_SET_FPU"))?;
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
