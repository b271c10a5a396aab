//! The register round trips of `vector_regs.S`, and which of them this CPU and kernel
//! let a process run.

use std::arch::global_asm;

global_asm!(include_str!("vector_regs.S"));

extern "C" {
    fn forkvm_vc_sse(input: *const u8, output: *mut u8);
    fn forkvm_vc_avx(input: *const u8, output: *mut u8);
    fn forkvm_vc_avx512(input: *const u8, output: *mut u8);
    fn forkvm_vh_sse(input: *const u8, output: *mut u8, flag: *const u8);
    fn forkvm_vh_avx(input: *const u8, output: *mut u8, flag: *const u8);
    fn forkvm_vh_avx512(input: *const u8, output: *mut u8, flag: *const u8);
}

/// Bytes of a register image: 32 × 64 (xmm/ymm/zmm) + 8 × 8 (opmask).
pub const IMAGE_LEN: usize = 32 * 64 + 8 * 8;

/// The widest register set a process may use: what CPUID advertises *and* XCR0 enables
/// (software must check both; XCR0 is what the kernel saves when it tells the truth).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// xmm0–15.
    Sse,
    /// ymm0–15.
    Avx,
    /// zmm0–31 and k0–7.
    Avx512,
}

impl Level {
    pub fn name(self) -> &'static str {
        match self {
            Level::Sse => "sse",
            Level::Avx => "avx",
            Level::Avx512 => "avx512",
        }
    }
}

/// What CPUID advertises and XCR0 enables, as this process sees them.
#[derive(Debug, Clone, Copy)]
pub struct Support {
    pub xcr0: u64,
    pub cpuid_avx: bool,
    pub cpuid_avx512: bool,
}

impl Support {
    pub fn detect() -> Support {
        let leaf1 = std::arch::x86_64::__cpuid(1);
        let leaf7 = std::arch::x86_64::__cpuid_count(7, 0);
        let avx512f = leaf7.ebx & (1 << 16) != 0;
        let avx512bw = leaf7.ebx & (1 << 30) != 0; // kmovq
        Support {
            xcr0: crate::xstate::cpu_xfeatures(),
            cpuid_avx: leaf1.ecx & (1 << 28) != 0,
            cpuid_avx512: avx512f && avx512bw,
        }
    }

    /// The widest level that is both advertised and enabled.
    pub fn level(&self) -> Level {
        const AVX_STATE: u64 = 0b110;
        const AVX512_STATE: u64 = 0b1110_0110;
        if self.cpuid_avx512 && self.xcr0 & AVX512_STATE == AVX512_STATE {
            Level::Avx512
        } else if self.cpuid_avx && self.xcr0 & AVX_STATE == AVX_STATE {
            Level::Avx
        } else {
            Level::Sse
        }
    }

    /// The widest level CPUID advertises, enabled or not.
    pub fn advertised(&self) -> Level {
        if self.cpuid_avx512 {
            Level::Avx512
        } else if self.cpuid_avx {
            Level::Avx
        } else {
            Level::Sse
        }
    }
}

/// Loads `input` into the registers of `level`, yields the CPU once, stores them.
pub fn round_trip(level: Level, input: &[u8; IMAGE_LEN], output: &mut [u8; IMAGE_LEN]) {
    // SAFETY: both buffers hold IMAGE_LEN bytes, which is all the functions touch; they
    // only use registers of `level`, which the caller got from `Support::level` (CPUID
    // advertises them and XCR0 enables them), and the sched_yield system call.
    unsafe {
        match level {
            Level::Sse => forkvm_vc_sse(input.as_ptr(), output.as_mut_ptr()),
            Level::Avx => forkvm_vc_avx(input.as_ptr(), output.as_mut_ptr()),
            Level::Avx512 => forkvm_vc_avx512(input.as_ptr(), output.as_mut_ptr()),
        }
    }
}

/// Loads `input` into the registers of `level`, holds them until `*flag` is non-zero
/// (set by a signal handler), stores them.
pub fn hold(level: Level, input: &[u8; IMAGE_LEN], output: &mut [u8; IMAGE_LEN], flag: &std::sync::atomic::AtomicU8) {
    let flag = flag.as_ptr() as *const u8;
    // SAFETY: as in `round_trip`; `flag` points at a live byte that the functions only
    // read (a plain byte load of an atomic, which x86 makes a relaxed atomic load).
    unsafe {
        match level {
            Level::Sse => forkvm_vh_sse(input.as_ptr(), output.as_mut_ptr(), flag),
            Level::Avx => forkvm_vh_avx(input.as_ptr(), output.as_mut_ptr(), flag),
            Level::Avx512 => forkvm_vh_avx512(input.as_ptr(), output.as_mut_ptr(), flag),
        }
    }
}
