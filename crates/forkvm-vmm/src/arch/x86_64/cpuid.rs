//! CPUID for guests: KVM's supported set filtered through a named CPU template.
//!
//! A template says which features a guest may see. `host` passes KVM's supported set
//! through; `pvm-compat` hides the features whose instructions KVM's instruction
//! emulator cannot execute on PVM hosts (PLATFORM.md), where guest ring-0 code runs
//! through that emulator. The template is recorded in the snapshot so that a restored
//! guest sees exactly the CPUID it booted with.

use kvm_bindings::{kvm_cpuid_entry2, CpuId, KVM_MAX_CPUID_ENTRIES};
use kvm_ioctls::Kvm;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A named CPU template.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CpuTemplate {
    /// KVM's supported CPUID, unfiltered.
    Host,
    /// Hides features the PVM instruction emulator cannot run (SSE3+, AVX, XSAVE, ...).
    PvmCompat,
}

#[derive(Clone, Copy)]
enum Reg {
    Ebx,
    Ecx,
    Edx,
}

/// (leaf, subleaf, register, bit) cleared by `pvm-compat`.
const PVM_HIDDEN: &[(u32, u32, Reg, u8)] = &[
    // Leaf 1 ECX: sse3 pclmul ssse3 fma cx16 pcid sse4.1 sse4.2 movbe popcnt aes xsave
    // osxsave avx f16c rdrand.
    (1, 0, Reg::Ecx, 0),
    (1, 0, Reg::Ecx, 1),
    (1, 0, Reg::Ecx, 9),
    (1, 0, Reg::Ecx, 12),
    (1, 0, Reg::Ecx, 13),
    (1, 0, Reg::Ecx, 17),
    (1, 0, Reg::Ecx, 19),
    (1, 0, Reg::Ecx, 20),
    (1, 0, Reg::Ecx, 22),
    (1, 0, Reg::Ecx, 23),
    (1, 0, Reg::Ecx, 25),
    (1, 0, Reg::Ecx, 26),
    (1, 0, Reg::Ecx, 27),
    (1, 0, Reg::Ecx, 28),
    (1, 0, Reg::Ecx, 29),
    (1, 0, Reg::Ecx, 30),
    // Leaf 7.0 EBX: fsgsbase bmi1 avx2 bmi2 invpcid avx512f/dq rdseed adx smap avx512* sha.
    (7, 0, Reg::Ebx, 0),
    (7, 0, Reg::Ebx, 3),
    (7, 0, Reg::Ebx, 5),
    (7, 0, Reg::Ebx, 8),
    (7, 0, Reg::Ebx, 10),
    (7, 0, Reg::Ebx, 16),
    (7, 0, Reg::Ebx, 17),
    (7, 0, Reg::Ebx, 18),
    (7, 0, Reg::Ebx, 19),
    (7, 0, Reg::Ebx, 20),
    (7, 0, Reg::Ebx, 21),
    (7, 0, Reg::Ebx, 26),
    (7, 0, Reg::Ebx, 27),
    (7, 0, Reg::Ebx, 28),
    (7, 0, Reg::Ebx, 29),
    (7, 0, Reg::Ebx, 30),
    (7, 0, Reg::Ebx, 31),
    // Leaf 7.0 ECX: pku ospke rdpid.
    (7, 0, Reg::Ecx, 3),
    (7, 0, Reg::Ecx, 4),
    (7, 0, Reg::Ecx, 22),
    // Leaf 0x8000_0001: abm/lzcnt (ECX 5), rdtscp (EDX 27).
    (0x8000_0001, 0, Reg::Ecx, 5),
    (0x8000_0001, 0, Reg::Edx, 27),
];

impl CpuTemplate {
    /// The template for this host: `pvm-compat` on a PVM host, `host` elsewhere.
    pub fn for_host(kind: crate::host::HostKind) -> CpuTemplate {
        match kind {
            crate::host::HostKind::Pvm => CpuTemplate::PvmCompat,
            crate::host::HostKind::Hardware => CpuTemplate::Host,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            CpuTemplate::Host => "host",
            CpuTemplate::PvmCompat => "pvm-compat",
        }
    }

    /// Kernel command-line arguments a Linux guest needs under this template. On PVM
    /// hosts the guest sees some host features even when CPUID hides them, and KVM's
    /// emulator cannot run their instructions, so the kernel is told to leave them alone
    /// (`clearcpuid` by bit number: popcnt, smap, fsgsbase, rdrand, rdseed, rdpid, pcid,
    /// invpcid, pku, xsave*, avx*, aes, pclmul, sse3-4.2, movbe, bmi, abm, sha, rdtscp,
    /// cx16, fma, f16c); `tsc=unstable` makes it use kvm-clock, which a restore can set.
    pub fn linux_cmdline(self) -> &'static str {
        match self {
            CpuTemplate::Host => "",
            CpuTemplate::PvmCompat => {
                "noxsave nofsgsbase nowatchdog tsc=unstable clearcpuid=151,308,288,158,306,534,145,298,515,154,156,293,153,129,147,148,137,128,150,291,296,197,317,59,141,140,157,304,521,522,320,321,323,416"
            }
        }
    }

    /// Applies the template to `entries` in place.
    pub fn apply(self, entries: &mut [kvm_cpuid_entry2]) {
        if self == CpuTemplate::Host {
            return;
        }
        for &(leaf, subleaf, reg, bit) in PVM_HIDDEN {
            for e in entries.iter_mut().filter(|e| e.function == leaf && e.index == subleaf) {
                let r = match reg {
                    Reg::Ebx => &mut e.ebx,
                    Reg::Ecx => &mut e.ecx,
                    Reg::Edx => &mut e.edx,
                };
                *r &= !(1u32 << bit);
            }
        }
        // Without XSAVE the XSAVE state leaf must not advertise anything either.
        for e in entries.iter_mut().filter(|e| e.function == 0xd) {
            (e.eax, e.ebx, e.ecx, e.edx) = (0, 0, 0, 0);
        }
    }
}

impl fmt::Display for CpuTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for CpuTemplate {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "host" => Ok(CpuTemplate::Host),
            "pvm-compat" => Ok(CpuTemplate::PvmCompat),
            _ => Err(format!("unknown CPU template {s:?}; known: host, pvm-compat")),
        }
    }
}

/// KVM's supported CPUID after `template`, without per-vCPU fields.
pub fn base_cpuid(kvm: &Kvm, template: CpuTemplate) -> Result<Vec<kvm_cpuid_entry2>, kvm_ioctls::Error> {
    let supported = kvm.get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)?;
    let mut entries = supported.as_slice().to_vec();
    template.apply(&mut entries);
    Ok(entries)
}

/// Per-vCPU CPUID: APIC ids, and the hypervisor bit so the guest looks for KVM leaves.
pub fn vcpu_cpuid(
    base: &[kvm_cpuid_entry2],
    vcpu_index: u8,
    vcpu_count: u8,
) -> Result<CpuId, vmm_sys_util::fam::Error> {
    let mut entries = base.to_vec();
    for e in entries.iter_mut() {
        match e.function {
            1 => {
                e.ecx |= 1 << 31; // hypervisor present
                e.ebx = (e.ebx & 0x0000_ffff) | (u32::from(vcpu_count) << 16) | (u32::from(vcpu_index) << 24);
            }
            0xb | 0x1f => e.edx = u32::from(vcpu_index),
            _ => {}
        }
    }
    CpuId::from_entries(&entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(function: u32, index: u32) -> kvm_cpuid_entry2 {
        kvm_cpuid_entry2 { function, index, eax: !0, ebx: !0, ecx: !0, edx: !0, ..Default::default() }
    }

    #[test]
    fn pvm_compat_hides_emulator_hostile_features() {
        let mut e = vec![entry(1, 0), entry(7, 0), entry(0xd, 1), entry(0x8000_0001, 0)];
        CpuTemplate::PvmCompat.apply(&mut e);
        assert_eq!(e[0].ecx & (1 << 23), 0, "popcnt");
        assert_eq!(e[0].ecx & (1 << 13), 0, "cx16");
        assert_eq!(e[0].ecx & (1 << 26), 0, "xsave");
        assert_ne!(e[0].edx, 0, "leaf 1 EDX (fpu, sse2, ..) stays");
        assert_eq!(e[1].ebx & 1, 0, "fsgsbase");
        assert_eq!(e[2].eax, 0, "xsave leaf");
        assert_eq!(e[3].edx & (1 << 27), 0, "rdtscp");
    }

    #[test]
    fn host_template_changes_nothing() {
        let mut e = vec![entry(1, 0)];
        CpuTemplate::Host.apply(&mut e);
        assert_eq!(e[0].ecx, !0);
    }

    #[test]
    fn vcpu_cpuid_sets_apic_id() {
        let base = vec![kvm_cpuid_entry2 { function: 1, ..Default::default() }];
        let c = vcpu_cpuid(&base, 3, 4).unwrap();
        let e = c.as_slice()[0];
        assert_eq!(e.ebx >> 24, 3);
        assert_eq!((e.ebx >> 16) & 0xff, 4);
        assert_ne!(e.ecx & (1 << 31), 0);
    }

    #[test]
    fn template_names_parse() {
        for t in [CpuTemplate::Host, CpuTemplate::PvmCompat] {
            assert_eq!(t.name().parse::<CpuTemplate>().unwrap(), t);
        }
        assert!("x".parse::<CpuTemplate>().is_err());
    }
}
