//! Vector registers the CPU lets user code use but the kernel does not save: keep glibc
//! (in the agent and, through the environment, in its children) off them.
//!
//! On PVM hosts (`kvm_pvm`, see the platform notes) guest user code runs natively and
//! sees the host's CPUID and XCR0: AVX, AVX2 and AVX-512 look usable (OSXSAVE set, XCR0
//! `0xe7`). The guest kernel runs with `noxsave` there (the emulator cannot execute
//! XRSTOR), so its context switches save only the FXSAVE state: x87, MXCSR and the low
//! 128 bits of xmm0–15. The upper halves of ymm0–15, all of ymm/zmm16–31 and the opmask
//! registers keep whatever the last task to run left in them.
//!
//! glibc picks its memcpy, memset, strlen, ... from CPUID, so on such a host every copy
//! in every guest process uses the AVX-512 versions, which keep data in zmm16+ while
//! they run. A large memcpy, for one, loads its first 64 bytes into a register, copies
//! the rest with `rep movsb` and stores the register last; a page fault inside that
//! copy (writing fresh memory; slow here, the guest kernel is emulated) lets another
//! thread or process run and overwrite the register, and the copy's first 64 bytes come
//! out wrong. Measured in a guest: 64- and 128-byte holes at 64 KiB chunk starts in
//! `cat` output streamed through the agent (every 4 MiB run), and wrong glibc memcpy
//! results beside a process that uses AVX-512. The same corruption in a copy that holds
//! pointers (a moved struct, a grown `Vec`) is how the agent, PID 1, died of SIGSEGV.
//!
//! [`avoid_unsaved_vector_state`] runs first in `main`: when XCR0 (what the CPU
//! enables) has state that `ARCH_GET_XCOMP_SUPP` (what the kernel saves) lacks, the agent
//! re-executes itself once with [`GLIBC_SSE_ONLY`] added to `GLIBC_TUNABLES`, so glibc
//! selects its SSE versions (xmm0–15 only, which FXSAVE covers). Processes the agent
//! starts inherit the variable. Where the kernel saves everything (hardware KVM, any
//! normal host) nothing changes.
//!
//! Not covered: code that picks AVX by itself from CPUID (numpy's BLAS, Rust's
//! `is_x86_feature_detected!`) still runs unprotected in guest programs; the agent's own
//! Rust code is compiled for baseline x86-64 (SSE2) and touches AVX only in the `memchr`
//! crate's error-position helpers.
//!
//! Since the `pvm-xsave` CPU template the guest kernel saves x87, SSE, AVX and AVX-512
//! (the VMM completes XSAVE/XRSTOR for it), so none of this triggers there: the only
//! state user code can still enable without the kernel saving it is PKRU and AMX (on PVM
//! the host's XCR0 stays loaded while guest user code runs), which glibc never uses, so
//! only [`GLIBC_XFEATURES`] count. The workaround remains for guests booted under the
//! legacy `pvm-compat` template.

use std::ffi::{OsStr, OsString};
use std::io;

pub use forkvm_proto::vector_check::GLIBC_SSE_ONLY;

/// Tests only: pretend the kernel saves just these xfeatures (hex), instead of asking it.
pub const KERNEL_XFEATURES_ENV: &str = "FORKVM_AGENT_KERNEL_XFEATURES";

/// x87 and SSE: what FXSAVE saves, and all a CPU without OSXSAVE offers.
pub const XFEATURES_FXSAVE: u64 = 0b11;

/// The xfeatures glibc's string and memory functions use: AVX (ymm) and AVX-512
/// (opmask, ZMM_Hi256, Hi16_ZMM).
pub const GLIBC_XFEATURES: u64 = 0xe4;

/// `arch_prctl` code: the xfeatures the kernel supports (saves) for user space (5.16+).
const ARCH_GET_XCOMP_SUPP: libc::c_int = 0x1021;

/// What [`avoid_unsaved_vector_state`] found; logged once tracing is up.
#[derive(Debug)]
pub enum VectorState {
    /// The kernel saves every xfeature the CPU enables.
    Saved,
    /// The kernel does not save `unsaved`; glibc runs with [`GLIBC_SSE_ONLY`].
    Avoided { unsaved: u64 },
    /// The kernel does not save `unsaved`, and re-executing with the tunable failed.
    Exposed { unsaved: u64, error: io::Error },
}

/// The xfeatures the CPU enables for user code: XCR0, or x87|SSE without OSXSAVE.
pub fn cpu_xfeatures() -> u64 {
    let leaf1 = std::arch::x86_64::__cpuid(1);
    if leaf1.ecx & (1 << 27) == 0 {
        return XFEATURES_FXSAVE;
    }
    // SAFETY: CPUID.1:ECX.OSXSAVE is set, so XGETBV is enabled and XCR0 (ecx = 0) exists.
    unsafe { xgetbv0() }
}

#[target_feature(enable = "xsave")]
unsafe fn xgetbv0() -> u64 {
    // SAFETY: the caller checked OSXSAVE.
    unsafe { std::arch::x86_64::_xgetbv(0) }
}

/// The xfeatures the kernel saves across context switches, if it says
/// (`ARCH_GET_XCOMP_SUPP`, Linux 5.16+), or the [`KERNEL_XFEATURES_ENV`] override.
pub fn kernel_xfeatures() -> Option<u64> {
    if let Some(v) = std::env::var_os(KERNEL_XFEATURES_ENV) {
        let v = v.to_string_lossy();
        return u64::from_str_radix(v.trim_start_matches("0x"), 16).ok();
    }
    let mut mask: u64 = 0;
    // SAFETY: ARCH_GET_XCOMP_SUPP writes one u64 through the pointer, which is valid.
    let rc = unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_GET_XCOMP_SUPP, &mut mask as *mut u64) };
    (rc == 0).then_some(mask)
}

/// Xfeatures the CPU enables that the kernel does not save. A kernel too old to say is
/// trusted: only the PVM mismatch (CPUID and XCR0 seen from the host) breaks the rule
/// that a kernel saves what it enables.
pub fn unsaved(cpu: u64, kernel: Option<u64>) -> u64 {
    kernel.map_or(0, |k| cpu & !k)
}

/// `GLIBC_TUNABLES` with [`GLIBC_SSE_ONLY`] appended, or `None` if it is already there.
pub fn tunables_with_sse_only(existing: Option<&OsStr>) -> Option<OsString> {
    match existing {
        Some(e) if e.to_string_lossy().split(':').any(|t| t == GLIBC_SSE_ONLY) => None,
        Some(e) if !e.is_empty() => {
            let mut v = e.to_os_string();
            v.push(":");
            v.push(GLIBC_SSE_ONLY);
            Some(v)
        }
        _ => Some(GLIBC_SSE_ONLY.into()),
    }
}

/// Call first in `main`, while the process has one thread: if the kernel does not save
/// vector state the CPU enables, re-executes this program (same pid, argv and
/// environment) with [`GLIBC_SSE_ONLY`] in `GLIBC_TUNABLES`; glibc reads it at startup,
/// before it binds memcpy & co. Returns only when no re-exec was needed, or it failed.
pub fn avoid_unsaved_vector_state() -> VectorState {
    let unsaved = unsaved(cpu_xfeatures(), kernel_xfeatures()) & GLIBC_XFEATURES;
    if unsaved == 0 {
        return VectorState::Saved;
    }
    let Some(tunables) = tunables_with_sse_only(std::env::var_os("GLIBC_TUNABLES").as_deref()) else {
        return VectorState::Avoided { unsaved };
    };
    let error = reexec_with("GLIBC_TUNABLES", &tunables);
    VectorState::Exposed { unsaved, error }
}

/// Keeps this process's glibc on its SSE code whatever the kernel saves: re-executes the
/// program (same pid, argv and environment) with [`GLIBC_SSE_ONLY`] in `GLIBC_TUNABLES`
/// unless it is there already. For the vector-state check, which must be able to report
/// a kernel that loses vector state instead of being corrupted by it. Returns only when
/// no re-exec was needed, or it failed.
pub fn keep_glibc_on_sse() -> Option<io::Error> {
    let tunables = tunables_with_sse_only(std::env::var_os("GLIBC_TUNABLES").as_deref())?;
    Some(reexec_with("GLIBC_TUNABLES", &tunables))
}

/// Re-executes the running program with `key=value` added to its environment; returns
/// only on failure. As PID 1 /proc is not mounted yet: the path comes from AT_EXECFN.
fn reexec_with(key: &str, value: &OsStr) -> io::Error {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::process::CommandExt;
    // SAFETY: getauxval only reads the auxiliary vector.
    let execfn = unsafe { libc::getauxval(libc::AT_EXECFN) } as *const libc::c_char;
    let path: OsString = if execfn.is_null() {
        "/proc/self/exe".into()
    } else {
        // SAFETY: AT_EXECFN points at the NUL-terminated file name the kernel put on
        // the initial stack, which lives as long as the process.
        OsStr::from_bytes(unsafe { std::ffi::CStr::from_ptr(execfn) }.to_bytes()).to_os_string()
    };
    let mut args = std::env::args_os();
    let argv0 = args.next().unwrap_or_else(|| path.clone());
    std::process::Command::new(&path).arg0(argv0).args(args).env(key, value).exec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsaved_is_what_the_cpu_enables_beyond_what_the_kernel_saves() {
        // PVM guest: host XCR0 (x87, SSE, AVX, opmask, ZMM) vs a noxsave kernel.
        assert_eq!(unsaved(0xe7, Some(XFEATURES_FXSAVE)), 0xe4);
        // Hardware KVM or a host: the kernel saves all of it, and more.
        assert_eq!(unsaved(0xe7, Some(0x2e7)), 0);
        assert_eq!(unsaved(XFEATURES_FXSAVE, Some(XFEATURES_FXSAVE)), 0);
        // A kernel too old to answer is trusted.
        assert_eq!(unsaved(0xe7, None), 0);
        // PVM guest under pvm-xsave: the host's XCR0 (with PKRU and AMX) against a kernel
        // that saves x87..AVX-512: nothing glibc uses is unsaved.
        assert_eq!(unsaved(0x602e7, Some(0xe7)), 0x60200);
        assert_eq!(unsaved(0x602e7, Some(0xe7)) & GLIBC_XFEATURES, 0);
    }

    #[test]
    fn the_tunable_is_added_once_and_keeps_other_tunables() {
        assert_eq!(tunables_with_sse_only(None).unwrap(), GLIBC_SSE_ONLY);
        assert_eq!(tunables_with_sse_only(Some(OsStr::new(""))).unwrap(), GLIBC_SSE_ONLY);
        let other = "glibc.malloc.check=3";
        let both = tunables_with_sse_only(Some(OsStr::new(other))).unwrap();
        assert_eq!(both, OsString::from(format!("{other}:{GLIBC_SSE_ONLY}")));
        // Already there (the re-executed agent): no second re-exec.
        assert_eq!(tunables_with_sse_only(Some(&both)), None);
        assert_eq!(tunables_with_sse_only(Some(OsStr::new(GLIBC_SSE_ONLY))), None);
    }
}
