//! The whole VM as one typed value, and its encoding into `vmstate.bin`.
//!
//! `VmState` is what a snapshot restores from. Its bytes are untrusted input: the
//! container (`forkvm_snapshot::container`) checks magic, version, size cap and CRC; this
//! module then decodes with a size limit and checks that the pieces fit together (vCPU
//! count, irqchip mode vs saved chips, memory size) before anything touches KVM.
//!
//! Compatibility: any change to `VmState` or a type inside it changes the encoding and
//! must bump `forkvm_snapshot::VMSTATE_FORMAT_VERSION`; older snapshots are then refused
//! by the container check with a clear error rather than misread.

use crate::arch::x86_64::cpuid::CpuTemplate;
use crate::devices::DevicesState;
use crate::vstate::irqchip::{IrqchipMode, KernelIrqchipState};
use crate::vstate::vcpu_state::VcpuState;
use bincode::Options;
use kvm_bindings::kvm_clock_data;
use serde::{Deserialize, Serialize};

/// Most vCPUs a snapshot may describe.
pub const MAX_VCPUS: usize = 64;
/// Most MSRs or CPUID entries per vCPU a snapshot may carry.
const MAX_ENTRIES: usize = 512;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VmState {
    pub mem_size: u64,
    pub cpu_template: CpuTemplate,
    pub irqchip_mode: IrqchipMode,
    pub vcpus: Vec<VcpuState>,
    /// KVM's PICs, IOAPIC and PIT: present exactly when `irqchip_mode` is `Kernel`.
    pub kernel_irqchip: Option<KernelIrqchipState>,
    pub clock: kvm_clock_data,
    pub devices: DevicesState,
}

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("vmstate.bin: {0}")]
    Container(#[from] forkvm_snapshot::ContainerError),
    #[error("vmstate.bin: the VM state does not decode ({0}): corrupt, or written by another forkvm version")]
    Decode(bincode::Error),
    #[error("encoding the VM state: {0}")]
    Encode(bincode::Error),
    #[error("vmstate.bin: {0}")]
    Invalid(String),
}

fn options() -> impl Options {
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .with_little_endian()
        .with_limit(forkvm_snapshot::VMSTATE_MAX_BYTES)
}

impl VmState {
    /// The encoded state, without the container header.
    pub fn encode_payload(&self) -> Result<Vec<u8>, StateError> {
        options().serialize(self).map_err(StateError::Encode)
    }

    /// The full `vmstate.bin` image: container header and encoded state.
    pub fn encode(&self) -> Result<Vec<u8>, StateError> {
        Ok(forkvm_snapshot::encode_vmstate(&self.encode_payload()?))
    }

    /// Decodes and checks a `vmstate.bin` image.
    pub fn decode(bytes: &[u8]) -> Result<VmState, StateError> {
        let payload = forkvm_snapshot::decode_vmstate(bytes)?;
        Self::decode_payload(payload)
    }

    pub fn decode_payload(payload: &[u8]) -> Result<VmState, StateError> {
        let state: VmState = options().deserialize(payload).map_err(StateError::Decode)?;
        state.validate()?;
        Ok(state)
    }

    /// Checks that the parts agree with each other.
    pub fn validate(&self) -> Result<(), StateError> {
        let invalid = |m: String| Err(StateError::Invalid(m));
        if self.vcpus.is_empty() || self.vcpus.len() > MAX_VCPUS {
            return invalid(format!("{} vCPUs; a VM has 1 to {MAX_VCPUS}", self.vcpus.len()));
        }
        for (i, v) in self.vcpus.iter().enumerate() {
            if v.msrs.len() > MAX_ENTRIES || v.cpuid.len() > MAX_ENTRIES {
                return invalid(format!("vCPU {i} carries {} MSRs and {} CPUID entries", v.msrs.len(), v.cpuid.len()));
            }
        }
        match (self.irqchip_mode, &self.kernel_irqchip, &self.devices.ioapic) {
            (IrqchipMode::Kernel, Some(_), None) | (IrqchipMode::Split, None, Some(_)) => {}
            (mode, k, io) => {
                return invalid(format!(
                    "irqchip mode {mode} with {} kernel irqchip state and {} IOAPIC device state",
                    if k.is_some() { "a" } else { "no" },
                    if io.is_some() { "an" } else { "no" }
                ))
            }
        }
        if self.mem_size == 0 || !self.mem_size.is_multiple_of(2 << 20) {
            return invalid(format!("memory size {} is not a positive multiple of 2 MiB", self.mem_size));
        }
        Ok(())
    }
}
