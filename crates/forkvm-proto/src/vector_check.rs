//! The report of `forkvm-agent vector-check`: whether a guest's kernel preserves every
//! vector register class user code can use across context switches. The agent prints it
//! as one JSON line; the host reads it at template build, in `forkvm doctor` and in tests.

use serde::{Deserialize, Serialize};

/// The `GLIBC_TUNABLES` entry that keeps glibc's string and memory functions on SSE.
/// Clearing AVX2 alone is not enough: glibc's memmove keys on the derived
/// `AVX_Fast_Unaligned_Load` preference, which the hwcaps mask does not clear.
/// The vector-state check starts with it, so a kernel that loses vector state corrupts
/// only the registers the check tests, and the check lives to report it.
pub const GLIBC_SSE_ONLY: &str = "glibc.cpu.hwcaps=-AVX,-AVX2,-AVX512F,-AVX512VL,-AVX512BW,-AVX512DQ,\
-AVX512CD,-FMA,-FMA4,-AVX_Fast_Unaligned_Load,Prefer_No_AVX512";

/// One register class and what the check saw.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassResult {
    /// `xmm` (xmm0-15), `ymm_upper` (bits 128-255 of ymm0-15), `zmm_upper` (bits 256-511
    /// of zmm0-15), `zmm16_31`, `opmask` (k0-7).
    pub class: String,
    /// Round trips (load, yield, store) that covered this class.
    pub checked: u64,
    /// Round trips after which some register of the class held another value.
    pub wrong: u64,
}

/// The whole check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VectorCheckReport {
    /// The widest level checked: `sse`, `avx` or `avx512` (advertised and enabled).
    pub level: String,
    /// The widest level CPUID advertises to user code.
    pub advertised: String,
    /// XCR0 as user code sees it (hex).
    pub xcr0: String,
    /// What the kernel says it saves (`ARCH_GET_XCOMP_SUPP`, hex), if it says.
    pub kernel_xfeatures: Option<String>,
    pub processes: u32,
    pub switches: u32,
    pub classes: Vec<ClassResult>,
}

impl VectorCheckReport {
    /// The classes with wrong results, if any.
    pub fn failures(&self) -> Vec<&ClassResult> {
        self.classes.iter().filter(|c| c.wrong > 0).collect()
    }

    /// One line for an error message: `ymm_upper: 812 of 3000 wrong, ...`.
    pub fn describe_failures(&self) -> String {
        self.failures()
            .iter()
            .map(|c| format!("{}: {} of {} wrong", c.class, c.wrong, c.checked))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_name_their_class() {
        let r = VectorCheckReport {
            level: "avx512".into(),
            advertised: "avx512".into(),
            xcr0: "0xe7".into(),
            kernel_xfeatures: Some("0x3".into()),
            processes: 3,
            switches: 10,
            classes: vec![
                ClassResult { class: "xmm".into(), checked: 30, wrong: 0 },
                ClassResult { class: "zmm16_31".into(), checked: 30, wrong: 7 },
            ],
        };
        assert_eq!(r.describe_failures(), "zmm16_31: 7 of 30 wrong");
        let back: VectorCheckReport = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
    }
}
