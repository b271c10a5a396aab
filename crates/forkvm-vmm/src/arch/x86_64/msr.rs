//! Model-specific registers: the boot values, and the list a snapshot saves.
//!
//! A snapshot must carry every MSR KVM can report (`KVM_GET_MSR_INDEX_LIST`), or a
//! restored guest silently loses state such as its syscall entry point or TSC. Some
//! listed MSRs cannot be read on a given host; the list is probed once per process.

use kvm_bindings::{kvm_msr_entry, Msrs};
use kvm_ioctls::{Kvm, VcpuFd};
use std::sync::OnceLock;

pub const MSR_IA32_TSC: u32 = 0x10;
pub const MSR_IA32_SYSENTER_CS: u32 = 0x174;
pub const MSR_IA32_SYSENTER_ESP: u32 = 0x175;
pub const MSR_IA32_SYSENTER_EIP: u32 = 0x176;
pub const MSR_IA32_MISC_ENABLE: u32 = 0x1a0;
pub const MSR_MTRR_DEF_TYPE: u32 = 0x2ff;
pub const MSR_STAR: u32 = 0xc000_0081;
pub const MSR_LSTAR: u32 = 0xc000_0082;
pub const MSR_CSTAR: u32 = 0xc000_0083;
pub const MSR_SYSCALL_MASK: u32 = 0xc000_0084;
pub const MSR_KERNEL_GS_BASE: u32 = 0xc000_0102;

const MISC_ENABLE_FAST_STRING: u64 = 1;
const MTRR_ENABLE_WRITEBACK: u64 = (1 << 11) | 6;

/// The MSR values a vCPU starts with.
pub fn boot_msr_entries() -> Vec<kvm_msr_entry> {
    [
        (MSR_IA32_SYSENTER_CS, 0),
        (MSR_IA32_SYSENTER_ESP, 0),
        (MSR_IA32_SYSENTER_EIP, 0),
        (MSR_STAR, 0),
        (MSR_CSTAR, 0),
        (MSR_KERNEL_GS_BASE, 0),
        (MSR_SYSCALL_MASK, 0),
        (MSR_LSTAR, 0),
        (MSR_IA32_TSC, 0),
        (MSR_IA32_MISC_ENABLE, MISC_ENABLE_FAST_STRING),
        (MSR_MTRR_DEF_TYPE, MTRR_ENABLE_WRITEBACK),
    ]
    .into_iter()
    .map(|(index, data)| kvm_msr_entry { index, data, ..Default::default() })
    .collect()
}

/// Builds the FAM wrapper KVM's MSR ioctls take.
pub fn msrs_from_entries(entries: &[kvm_msr_entry]) -> Result<Msrs, vmm_sys_util::fam::Error> {
    Msrs::from_entries(entries)
}

/// The MSR indices to save, probed once on a vCPU: KVM's index list minus the ones this
/// host refuses to read.
pub fn saved_msr_indices(kvm: &Kvm, vcpu: &VcpuFd) -> &'static [u32] {
    static LIST: OnceLock<Vec<u32>> = OnceLock::new();
    LIST.get_or_init(|| {
        let mut list: Vec<u32> = kvm.get_msr_index_list().map(|l| l.as_slice().to_vec()).unwrap_or_default();
        // KVM stops at the first MSR it cannot read: drop that one and retry.
        loop {
            let entries: Vec<kvm_msr_entry> =
                list.iter().map(|&index| kvm_msr_entry { index, ..Default::default() }).collect();
            let Ok(mut msrs) = Msrs::from_entries(&entries) else {
                return Vec::new();
            };
            match vcpu.get_msrs(&mut msrs) {
                Ok(n) if n == list.len() => return list,
                Ok(n) => {
                    tracing::debug!(msr = list[n], "MSR in KVM's index list is not readable here");
                    list.remove(n);
                }
                Err(_) => return Vec::new(),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_msrs_enable_mtrrs_and_fast_strings() {
        let e = boot_msr_entries();
        let get = |i| e.iter().find(|m| m.index == i).unwrap().data;
        assert_eq!(get(MSR_MTRR_DEF_TYPE), 0x806);
        assert_eq!(get(MSR_IA32_MISC_ENABLE) & 1, 1);
        assert!(msrs_from_entries(&e).is_ok());
    }
}
