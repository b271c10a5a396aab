//! CPUID for guests: KVM's supported set filtered through a named CPU template.
//!
//! A template says which features a guest may see and which extended (XSAVE) state it
//! may enable. The code path is the same for every template; only the profile differs:
//!
//! | template | host | hidden | XCR0 the guest may set |
//! | --- | --- | --- | --- |
//! | `host` | hardware KVM | nothing | what KVM supports and the VMM saves (x87, SSE, AVX, AVX-512, PKRU; no AMX) |
//! | `pvm-xsave` | PVM (default) | features KVM's emulator cannot run for the guest kernel | x87, SSE, AVX, AVX-512 (the VMM completes XSAVE/XRSTOR) |
//! | `pvm-compat` | PVM (snapshots made before `pvm-xsave`) | the same, plus XSAVE and every AVX feature | none (`noxsave`) |
//!
//! Why `pvm-compat` is no longer used for new guests: on PVM hosts guest user code runs
//! natively, sees the host's CPUID and — while the guest kernel has not enabled XSAVE —
//! the host's XCR0, so it uses AVX/AVX-512 registers that a `noxsave` kernel never saves
//! on a context switch: processes corrupt each other's vector registers. Under
//! `pvm-xsave` the kernel enables XSAVE with XCR0 limited to what it saves, KVM loads
//! that XCR0 while the guest runs, and user code sees it through XGETBV (docs/vector-state.md).
//!
//! The template is recorded in the snapshot so that a restored guest sees exactly the
//! CPUID it booted with.

use kvm_bindings::{kvm_cpuid_entry2, CpuId, KVM_MAX_CPUID_ENTRIES};
use kvm_ioctls::Kvm;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A named CPU template.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CpuTemplate {
    /// KVM's supported CPUID, with XSAVE state limited to what the VMM saves.
    Host,
    /// PVM, before XSAVE completion: hides XSAVE and AVX (`noxsave`). Kept so snapshots
    /// made with it restore with the CPUID they booted with; not chosen for new guests.
    PvmCompat,
    /// PVM: hides what KVM's emulator cannot run for the guest kernel; XSAVE with AVX and
    /// AVX-512, completed by the VMM.
    PvmXsave,
}

/// Overrides the CPU template chosen by host kind (`host`, `pvm-xsave`, `pvm-compat`).
pub const TEMPLATE_ENV: &str = "FORKVM_CPU_TEMPLATE";

/// XSAVE state components the VMM can hold (in the 4 KiB `kvm_xsave` it snapshots):
/// x87, SSE, AVX, AVX-512 opmask, ZMM_Hi256, Hi16_ZMM and PKRU. Not AMX tile data.
pub const SAVED_XFEATURES: u64 = 0x2e7;
/// What the PVM profile lets the guest enable: no PKRU (protection keys are hidden).
pub const PVM_XFEATURES: u64 = 0xe7;

#[derive(Clone, Copy)]
enum Reg {
    Eax,
    Ebx,
    Ecx,
    Edx,
}

/// (leaf, subleaf, register, bit) that every PVM profile clears: instructions KVM's
/// emulator cannot run for the guest kernel.
const PVM_HIDDEN: &[(u32, u32, Reg, u8)] = &[
    // Leaf 1 ECX: sse3 pclmul ssse3 cx16 pcid sse4.1 sse4.2 movbe popcnt aes rdrand.
    (1, 0, Reg::Ecx, 0),
    (1, 0, Reg::Ecx, 1),
    (1, 0, Reg::Ecx, 9),
    (1, 0, Reg::Ecx, 13),
    (1, 0, Reg::Ecx, 17),
    (1, 0, Reg::Ecx, 19),
    (1, 0, Reg::Ecx, 20),
    (1, 0, Reg::Ecx, 22),
    (1, 0, Reg::Ecx, 23),
    (1, 0, Reg::Ecx, 25),
    (1, 0, Reg::Ecx, 30),
    // Leaf 7.0 EBX: fsgsbase bmi1 bmi2 invpcid rdseed adx smap sha.
    (7, 0, Reg::Ebx, 0),
    (7, 0, Reg::Ebx, 3),
    (7, 0, Reg::Ebx, 8),
    (7, 0, Reg::Ebx, 10),
    (7, 0, Reg::Ebx, 18),
    (7, 0, Reg::Ebx, 19),
    (7, 0, Reg::Ebx, 20),
    (7, 0, Reg::Ebx, 29),
    // Leaf 7.0 ECX: pku ospke rdpid.
    (7, 0, Reg::Ecx, 3),
    (7, 0, Reg::Ecx, 4),
    (7, 0, Reg::Ecx, 22),
    // Leaf 0x8000_0001: abm/lzcnt (ECX 5), rdtscp (EDX 27).
    (0x8000_0001, 0, Reg::Ecx, 5),
    (0x8000_0001, 0, Reg::Edx, 27),
    // KVM's paravirtual features that are hypercalls (`vmcall`): PVM does not complete
    // one for the guest kernel, which then spins on it for ever (an SMP guest stopped at
    // its first PV IPI). PV_UNHALT (7), PV_SEND_IPI (11), PV_SCHED_YIELD (13); IPIs go
    // through the LAPIC instead.
    (0x4000_0001, 0, Reg::Eax, 7),
    (0x4000_0001, 0, Reg::Eax, 11),
    (0x4000_0001, 0, Reg::Eax, 13),
];

/// What `pvm-compat` clears on top: XSAVE and the features whose state lives in it.
const PVM_COMPAT_VECTOR_HIDDEN: &[(u32, u32, Reg, u8)] = &[
    // Leaf 1 ECX: fma xsave osxsave avx f16c.
    (1, 0, Reg::Ecx, 12),
    (1, 0, Reg::Ecx, 26),
    (1, 0, Reg::Ecx, 27),
    (1, 0, Reg::Ecx, 28),
    (1, 0, Reg::Ecx, 29),
    // Leaf 7.0 EBX: avx2 avx512f/dq/ifma/pf/er/cd/bw/vl.
    (7, 0, Reg::Ebx, 5),
    (7, 0, Reg::Ebx, 16),
    (7, 0, Reg::Ebx, 17),
    (7, 0, Reg::Ebx, 21),
    (7, 0, Reg::Ebx, 26),
    (7, 0, Reg::Ebx, 27),
    (7, 0, Reg::Ebx, 28),
    (7, 0, Reg::Ebx, 30),
    (7, 0, Reg::Ebx, 31),
];

/// One template's rules.
struct Profile {
    hidden: &'static [&'static [(u32, u32, Reg, u8)]],
    /// XCR0 bits the guest may set (CPUID 0xD.0 EDX:EAX); 0 hides XSAVE altogether.
    xfeatures: u64,
    /// Whether XSAVEOPT, XSAVEC, XGETBV1 and XSAVES (CPUID 0xD.1) stay visible: only
    /// where the CPU runs them for the guest kernel, not where the VMM completes XSAVE.
    xsave_variants: bool,
    /// Kernel command-line arguments a Linux guest needs.
    cmdline: &'static str,
}

/// `clearcpuid` (kernel feature numbers) of the features KVM's emulator cannot run:
/// popcnt, smap, fsgsbase, rdrand, rdseed, rdpid, pcid, invpcid, pku, aes, pclmul,
/// sse3-4.2, movbe, bmi, abm, sha, rdtscp, cx16, vaes, vpclmulqdq, clzero, and the XSAVE
/// variants the VMM does not complete (xsaveopt, xsavec, xgetbv1, xsaves, xfd).
const PVM_XSAVE_CMDLINE: &str = "nofsgsbase nowatchdog tsc=unstable clearcpuid=151,308,288,158,306,534,145,298,515,153,129,147,148,137,128,150,291,296,197,317,59,141,521,522,320,321,322,323,324,416";

const HOST: Profile = Profile { hidden: &[], xfeatures: SAVED_XFEATURES, xsave_variants: true, cmdline: "" };
const PVM_COMPAT: Profile = Profile {
    hidden: &[PVM_HIDDEN, PVM_COMPAT_VECTOR_HIDDEN],
    xfeatures: 0,
    xsave_variants: false,
    cmdline: "noxsave nofsgsbase nowatchdog tsc=unstable clearcpuid=151,308,288,158,306,534,145,298,515,154,156,293,153,129,147,148,137,128,150,291,296,197,317,59,141,140,157,304,521,522,320,321,323,416",
};
const PVM_XSAVE: Profile =
    Profile { hidden: &[PVM_HIDDEN], xfeatures: PVM_XFEATURES, xsave_variants: false, cmdline: PVM_XSAVE_CMDLINE };

impl CpuTemplate {
    /// The template for this host: `pvm-xsave` on a PVM host, `host` elsewhere.
    pub fn for_host(kind: crate::host::HostKind) -> CpuTemplate {
        match kind {
            crate::host::HostKind::Pvm => CpuTemplate::PvmXsave,
            crate::host::HostKind::Hardware => CpuTemplate::Host,
        }
    }

    /// The template for the host this process runs on, unless `FORKVM_CPU_TEMPLATE`
    /// names another (an unknown name is ignored with a warning, never guessed at).
    pub fn for_this_host() -> CpuTemplate {
        if let Ok(name) = std::env::var(TEMPLATE_ENV) {
            match name.parse() {
                Ok(t) => return t,
                Err(e) => tracing::warn!(error = %e, "{TEMPLATE_ENV} ignored"),
            }
        }
        CpuTemplate::for_host(crate::host::HostKind::detect())
    }

    pub const ALL: [CpuTemplate; 3] = [CpuTemplate::Host, CpuTemplate::PvmCompat, CpuTemplate::PvmXsave];

    pub fn name(self) -> &'static str {
        match self {
            CpuTemplate::Host => "host",
            CpuTemplate::PvmCompat => "pvm-compat",
            CpuTemplate::PvmXsave => "pvm-xsave",
        }
    }

    fn profile(self) -> &'static Profile {
        match self {
            CpuTemplate::Host => &HOST,
            CpuTemplate::PvmCompat => &PVM_COMPAT,
            CpuTemplate::PvmXsave => &PVM_XSAVE,
        }
    }

    /// Kernel command-line arguments a Linux guest needs under this template. On PVM
    /// hosts the guest sees some host features even when CPUID hides them, and KVM's
    /// emulator cannot run their instructions, so the kernel is told to leave them alone
    /// (`clearcpuid` by feature number); `tsc=unstable` makes it use kvm-clock, which a
    /// restore can set.
    pub fn linux_cmdline(self) -> &'static str {
        self.profile().cmdline
    }

    /// The XCR0 bits a guest may enable under this template (0: no XSAVE).
    pub fn xfeatures(self) -> u64 {
        self.profile().xfeatures
    }

    /// Applies the template to `entries` in place.
    pub fn apply(self, entries: &mut [kvm_cpuid_entry2]) {
        let profile = self.profile();
        for &(leaf, subleaf, reg, bit) in profile.hidden.iter().flat_map(|l| l.iter()) {
            for e in entries.iter_mut().filter(|e| e.function == leaf && e.index == subleaf) {
                let r = match reg {
                    Reg::Eax => &mut e.eax,
                    Reg::Ebx => &mut e.ebx,
                    Reg::Ecx => &mut e.ecx,
                    Reg::Edx => &mut e.edx,
                };
                *r &= !(1u32 << bit);
            }
        }
        limit_xsave_leaf(entries, profile);
    }
}

/// CPUID leaf 0xD under `profile`: XCR0 limited to its xfeatures (and to what KVM
/// supports), the maximum area size recomputed for that set, the XSAVE variants hidden
/// unless the profile keeps them, and no supervisor (XSS) state.
fn limit_xsave_leaf(entries: &mut [kvm_cpuid_entry2], profile: &Profile) {
    let supported = entries
        .iter()
        .find(|e| e.function == 0xd && e.index == 0)
        .map_or(0, |e| u64::from(e.eax) | u64::from(e.edx) << 32);
    let allowed = supported & profile.xfeatures;
    if allowed & 0b11 != 0b11 {
        // No XSAVE: the leaf must not advertise anything, nor leaf 1 XSAVE/OSXSAVE.
        for e in entries.iter_mut() {
            match e.function {
                0xd => (e.eax, e.ebx, e.ecx, e.edx) = (0, 0, 0, 0),
                1 => e.ecx &= !(1 << 26 | 1 << 27),
                _ => {}
            }
        }
        return;
    }
    let max_size = entries
        .iter()
        .filter(|e| e.function == 0xd && e.index >= 2 && e.index < 64 && allowed & (1u64 << e.index) != 0)
        .map(|e| e.ebx + e.eax)
        .fold(576, u32::max);
    for e in entries.iter_mut().filter(|e| e.function == 0xd) {
        match e.index {
            0 => {
                e.eax = allowed as u32;
                e.edx = (allowed >> 32) as u32;
                e.ebx = 576; // for XCR0 = x87|SSE; KVM updates it as XCR0 changes
                e.ecx = max_size;
            }
            1 => {
                if !profile.xsave_variants {
                    e.eax = 0;
                }
                // No supervisor state: IA32_XSS stays 0 (the VMM does not save it).
                (e.ebx, e.ecx, e.edx) = (0, 0, 0);
                e.eax &= !(1 << 3 | 1 << 4); // XSAVES and XFD: supervisor and AMX state
            }
            i if i < 64 && allowed & (1u64 << i) != 0 => {}
            _ => (e.eax, e.ebx, e.ecx, e.edx) = (0, 0, 0, 0),
        }
    }
}

impl fmt::Display for CpuTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for CpuTemplate {
    type Err = crate::unknown_name::UnknownName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "host" => Ok(CpuTemplate::Host),
            "pvm-compat" => Ok(CpuTemplate::PvmCompat),
            "pvm-xsave" => Ok(CpuTemplate::PvmXsave),
            _ => Err(crate::unknown_name::UnknownName::new("CPU template", s, "host, pvm-xsave, pvm-compat")),
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

/// Per-vCPU CPUID: the hypervisor bit so the guest looks for KVM leaves, and a topology
/// of `vcpu_count` single-threaded cores in one package, vCPU i being APIC id i, told
/// the same way in every leaf a kernel may read it from (Intel's 1, 4, 0xB and 0x1F,
/// AMD's 0x8000_0008 and 0x8000_001E). Without it the guest would read the host's
/// cores and threads from KVM's supported CPUID.
pub fn vcpu_cpuid(
    base: &[kvm_cpuid_entry2],
    vcpu_index: u8,
    vcpu_count: u8,
) -> Result<CpuId, vmm_sys_util::fam::Error> {
    let mut entries = base.to_vec();
    let count = u32::from(vcpu_count.max(1));
    let apic_id = u32::from(vcpu_index);
    // Bits of the APIC id that number the cores: enough for every vCPU.
    let core_bits = u32::BITS - (count - 1).leading_zeros();
    for e in entries.iter_mut() {
        match (e.function, e.index) {
            (1, _) => {
                e.ecx |= 1 << 31; // hypervisor present
                e.ebx = (e.ebx & 0x0000_ffff) | (count << 16) | (apic_id << 24);
                if count > 1 {
                    e.edx |= 1 << 28; // HTT: EBX[23:16] is meaningful
                } else {
                    e.edx &= !(1 << 28);
                }
            }
            // Deterministic cache parameters: cores per package - 1 in EAX[31:26];
            // each cache is private to its core (EAX[25:14] = 0 threads sharing - 1),
            // except the last level, shared by the package.
            (4, _) => {
                let level = (e.eax >> 5) & 0x7;
                let sharing = if level >= 3 { count - 1 } else { 0 };
                e.eax = (e.eax & 0x3fff) | (sharing.min(0xfff) << 14) | ((count - 1).min(0x3f) << 26);
            }
            // Extended topology: level 0 is SMT (one thread per core), level 1 the cores.
            (0xb | 0x1f, level) => {
                (e.eax, e.ebx, e.ecx) = match level {
                    0 => (0, 1, 1 << 8),
                    1 => (core_bits, count, (2 << 8) | 1),
                    _ => (0, 0, level),
                };
                e.edx = apic_id;
            }
            (0x8000_0008, _) => e.ecx = (e.ecx & !0xf0ff) | (core_bits << 12) | (count - 1),
            // AMD: extended APIC id, core id (one thread per core), node 0.
            (0x8000_001e, _) => {
                e.eax = apic_id;
                e.ebx = apic_id & 0xff;
                e.ecx = 0;
            }
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
        let mut e = vec![entry(1, 0), entry(7, 0), entry(0xd, 1), entry(0x8000_0001, 0), entry(0x4000_0001, 0)];
        CpuTemplate::PvmCompat.apply(&mut e);
        assert_eq!(e[4].eax & (1 << 7 | 1 << 11 | 1 << 13), 0, "no KVM hypercall features");
        assert_ne!(e[4].eax & (1 << 3), 0, "kvm-clock stays");
        assert_eq!(e[0].ecx & (1 << 23), 0, "popcnt");
        assert_eq!(e[0].ecx & (1 << 13), 0, "cx16");
        assert_eq!(e[0].ecx & (1 << 26), 0, "xsave");
        assert_ne!(e[0].edx, 0, "leaf 1 EDX (fpu, sse2, ..) stays");
        assert_eq!(e[1].ebx & 1, 0, "fsgsbase");
        assert_eq!(e[2].eax, 0, "xsave leaf");
        assert_eq!(e[3].edx & (1 << 27), 0, "rdtscp");
    }

    /// Leaf 0xD as KVM reports it on an AVX-512 + AMX CPU (offset, size per component).
    fn xsave_leaf() -> Vec<kvm_cpuid_entry2> {
        let mut v = vec![
            kvm_cpuid_entry2 {
                function: 0xd,
                index: 0,
                eax: 0x602e7,
                ebx: 576,
                ecx: 11008,
                edx: 0,
                ..Default::default()
            },
            kvm_cpuid_entry2 { function: 0xd, index: 1, eax: 0x1f, ebx: 0, ecx: 0x1900, edx: 0, ..Default::default() },
        ];
        for (index, size, offset) in [(2, 256, 576), (5, 64, 1088), (6, 512, 1152), (7, 1024, 1664), (9, 8, 2688)] {
            v.push(kvm_cpuid_entry2 { function: 0xd, index, eax: size, ebx: offset, ..Default::default() });
        }
        v.push(kvm_cpuid_entry2 { function: 0xd, index: 18, eax: 8192, ebx: 2816, ..Default::default() });
        v
    }

    fn leaf(e: &[kvm_cpuid_entry2], function: u32, index: u32) -> kvm_cpuid_entry2 {
        *e.iter().find(|x| x.function == function && x.index == index).unwrap()
    }

    #[test]
    fn host_template_keeps_features_and_limits_xsave_to_what_the_vmm_saves() {
        let mut e = vec![entry(1, 0), entry(7, 0)];
        e.extend(xsave_leaf());
        CpuTemplate::Host.apply(&mut e);
        assert_eq!(e[0].ecx, !0, "leaf 1 untouched");
        assert_eq!(e[1].ebx, !0, "leaf 7 untouched");
        let d0 = leaf(&e, 0xd, 0);
        assert_eq!((d0.eax, d0.edx), (0x2e7, 0), "no AMX: kvm_xsave cannot hold it");
        assert_eq!(d0.ecx, 2696, "max size recomputed: PKRU ends at 2696");
        assert_eq!(leaf(&e, 0xd, 1).eax, 0x7, "xsaveopt/xsavec/xgetbv1 kept, xsaves/xfd not");
        assert_eq!(leaf(&e, 0xd, 18).eax, 0, "AMX tile data hidden");
    }

    #[test]
    fn pvm_xsave_offers_avx512_state_through_plain_xsave_only() {
        let mut e = vec![entry(1, 0), entry(7, 0)];
        e.extend(xsave_leaf());
        CpuTemplate::PvmXsave.apply(&mut e);
        assert_ne!(e[0].ecx & (1 << 26), 0, "xsave");
        assert_ne!(e[0].ecx & (1 << 28), 0, "avx");
        assert_eq!(e[0].ecx & (1 << 23), 0, "popcnt still hidden");
        assert_ne!(e[1].ebx & (1 << 16), 0, "avx512f");
        assert_eq!(e[1].ebx & 1, 0, "fsgsbase still hidden");
        let d0 = leaf(&e, 0xd, 0);
        assert_eq!((d0.eax, d0.edx, d0.ecx), (0xe7, 0, 2688));
        assert_eq!(leaf(&e, 0xd, 1).eax, 0, "the VMM completes XSAVE/XRSTOR only");
        assert_eq!(leaf(&e, 0xd, 9).eax, 0, "no PKRU");
        assert_eq!(leaf(&e, 0xd, 7).ebx, 1664, "Hi16_ZMM keeps its offset");
        assert!(!CpuTemplate::PvmXsave.linux_cmdline().contains("noxsave"));
        assert!(CpuTemplate::PvmCompat.linux_cmdline().contains("noxsave"));
    }

    #[test]
    fn without_a_usable_xsave_leaf_xsave_is_hidden() {
        let mut e = vec![entry(1, 0)];
        CpuTemplate::Host.apply(&mut e);
        assert_eq!(e[0].ecx & (1 << 26 | 1 << 27), 0);
    }

    #[test]
    fn every_leaf_tells_one_package_of_single_threaded_cores() {
        let base = vec![
            entry(1, 0),
            kvm_cpuid_entry2 { function: 4, index: 0, eax: (1 << 5) | 1, ..Default::default() },
            kvm_cpuid_entry2 { function: 4, index: 3, eax: (3 << 5) | 3, ..Default::default() },
            entry(0xb, 0),
            entry(0xb, 1),
            entry(0xb, 2),
            entry(0x8000_0008, 0),
            entry(0x8000_001e, 0),
        ];
        for (count, bits) in [(1u8, 0u32), (2, 1), (3, 2), (4, 2), (8, 3)] {
            for index in 0..count {
                let c = vcpu_cpuid(&base, index, count).unwrap();
                let e = c.as_slice();
                let what = format!("vCPU {index} of {count}");
                assert_eq!(e[0].ebx >> 24, u32::from(index), "{what}: leaf 1 APIC id");
                assert_eq!((e[0].ebx >> 16) & 0xff, u32::from(count), "{what}: leaf 1 count");
                assert_eq!(e[0].edx & (1 << 28) != 0, count > 1, "{what}: HTT");
                assert_eq!(e[1].eax >> 26, u32::from(count) - 1, "{what}: leaf 4 cores");
                assert_eq!((e[1].eax >> 14) & 0xfff, 0, "{what}: L1 is per core");
                assert_eq!((e[2].eax >> 14) & 0xfff, u32::from(count) - 1, "{what}: L3 is shared");
                assert_eq!(e[2].eax & 0x3fff, (3 << 5) | 3, "{what}: leaf 4 keeps the cache's own bits");
                assert_eq!((e[3].eax, e[3].ebx, e[3].ecx, e[3].edx), (0, 1, 0x100, u32::from(index)), "{what}: SMT");
                assert_eq!((e[4].eax, e[4].ebx, e[4].ecx), (bits, u32::from(count), 0x201), "{what}: cores");
                assert_eq!((e[5].eax, e[5].ebx, e[5].ecx & 0xff), (0, 0, 2), "{what}: last level");
                assert_eq!(e[6].ecx & 0xff, u32::from(count) - 1, "{what}: AMD NC");
                assert_eq!((e[6].ecx >> 12) & 0xf, bits, "{what}: AMD APIC id size");
                assert_eq!((e[7].eax, e[7].ebx), (u32::from(index), u32::from(index)), "{what}: AMD ids");
            }
        }
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
        for t in CpuTemplate::ALL {
            assert_eq!(t.name().parse::<CpuTemplate>().unwrap(), t);
        }
        assert!("x".parse::<CpuTemplate>().is_err());
    }
}
