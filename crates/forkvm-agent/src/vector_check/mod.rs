//! A guest-side check that the kernel preserves every vector register class user code
//! may use: `forkvm-agent vector-check` and `forkvm-agent vector-hold`.
//!
//! Why: on PVM hosts a guest kernel booted with `noxsave` saved only x87/SSE state while
//! user code, which sees the host's CPUID and XCR0, used AVX and AVX-512 registers;
//! processes silently corrupted each other's results (numpy in two processes computed
//! wrong numbers). The VMM now completes XSAVE/XRSTOR so the kernel saves everything it
//! enables, and this check makes any regression of that kind loud: the template build
//! refuses a snapshot whose guest fails it, naming the register class.
//!
//! `vector-check`: several processes each load known, process-specific values into every
//! register of the widest class set that CPUID advertises and XCR0 enables (xmm, ymm,
//! zmm0-31, k0-7), call `sched_yield` so the others run, and compare what they read back,
//! thousands of times. The report ([`forkvm_proto::vector_check::VectorCheckReport`]) is
//! one JSON line on stdout; the exit status is 1 when any class came back wrong.
//!
//! `vector-hold RESULT`: loads known values and holds them in the registers (spinning,
//! yielding now and then) until SIGUSR1, then writes `ok` or the wrong classes to RESULT.
//! It creates `RESULT.ready` once its SIGUSR1 handler is installed: a caller that signals
//! earlier would kill it (SIGUSR1's default action), so tests wait for that file before
//! they snapshot, restore, fork or live-branch it.

mod asm;

use std::io::{self, Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicU8, Ordering};

pub use asm::{Level, Support, IMAGE_LEN};
use forkvm_proto::vector_check::{ClassResult, VectorCheckReport};

/// A register class: a set of byte ranges of the register image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    Xmm,
    YmmUpper,
    ZmmUpper,
    Zmm16to31,
    Opmask,
}

impl Class {
    pub const ALL: [Class; 5] = [Class::Xmm, Class::YmmUpper, Class::ZmmUpper, Class::Zmm16to31, Class::Opmask];

    pub fn name(self) -> &'static str {
        match self {
            Class::Xmm => "xmm",
            Class::YmmUpper => "ymm_upper",
            Class::ZmmUpper => "zmm_upper",
            Class::Zmm16to31 => "zmm16_31",
            Class::Opmask => "opmask",
        }
    }

    /// Whether a round trip at `level` covers this class.
    pub fn covered_at(self, level: Level) -> bool {
        match self {
            Class::Xmm => true,
            Class::YmmUpper => level >= Level::Avx,
            Class::ZmmUpper | Class::Zmm16to31 | Class::Opmask => level == Level::Avx512,
        }
    }

    /// Whether `a` and `b` differ in this class's bytes (no allocation: forked workers
    /// call it).
    fn differs(self, a: &[u8; IMAGE_LEN], b: &[u8; IMAGE_LEN]) -> bool {
        let lane =
            |from: usize, to: usize| (0..16).any(|i| a[i * 64 + from..i * 64 + to] != b[i * 64 + from..i * 64 + to]);
        match self {
            Class::Xmm => lane(0, 16),
            Class::YmmUpper => lane(16, 32),
            Class::ZmmUpper => lane(32, 64),
            Class::Zmm16to31 => a[16 * 64..32 * 64] != b[16 * 64..32 * 64],
            Class::Opmask => a[2048..] != b[2048..],
        }
    }
}

/// Register values for process `seed`, round `round`: every byte differs between
/// processes and rounds, so a value left by another process is always noticed.
pub fn pattern(seed: u64, round: u64) -> [u8; IMAGE_LEN] {
    let mut out = [0u8; IMAGE_LEN];
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ round.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    for chunk in out.chunks_exact_mut(8) {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        chunk.copy_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out
}

/// The classes (covered at `level`) in which `got` differs from `expected`.
pub fn wrong_classes(level: Level, expected: &[u8; IMAGE_LEN], got: &[u8; IMAGE_LEN]) -> Vec<Class> {
    Class::ALL.into_iter().filter(|c| c.covered_at(level) && c.differs(expected, got)).collect()
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both are fresh descriptors this process owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// One worker: `switches` round trips; returns wrong counts per class (Class::ALL order).
fn worker(level: Level, seed: u64, switches: u32) -> [u64; 5] {
    let mut wrong = [0u64; 5];
    let mut got = [0u8; IMAGE_LEN];
    for round in 0..u64::from(switches) {
        let expected = pattern(seed, round);
        asm::round_trip(level, &expected, &mut got);
        for (i, c) in Class::ALL.iter().enumerate() {
            if c.covered_at(level) && c.differs(&expected, &got) {
                wrong[i] += 1;
            }
        }
    }
    wrong
}

/// Runs the check in `processes` processes of `switches` round trips each. Call it from
/// any process: the forked workers allocate nothing.
pub fn run(processes: u32, switches: u32) -> io::Result<VectorCheckReport> {
    let support = Support::detect();
    let level = support.level();
    let (go_read, go_write) = pipe()?;
    let (result_read, result_write) = pipe()?;
    let mut children = Vec::new();
    for p in 0..processes {
        // SAFETY: the child only computes (without allocating), reads and writes pipes and
        // leaves with _exit, so it is sound even where the caller has other threads.
        match unsafe { libc::fork() } {
            -1 => return Err(io::Error::last_os_error()),
            0 => {
                drop(go_write);
                // Wait until every worker exists, so they interleave from the start.
                let mut b = [0u8; 1];
                let _ = std::fs::File::from(go_read).read(&mut b);
                let seed = u64::from(p + 1) << 32 | u64::from(std::process::id());
                let wrong = worker(level, seed, switches);
                let mut msg = [0u8; 40];
                for (slot, w) in msg.chunks_exact_mut(8).zip(wrong) {
                    slot.copy_from_slice(&w.to_le_bytes());
                }
                let ok = std::fs::File::from(result_write).write_all(&msg).is_ok();
                // SAFETY: _exit ends the forked child without running the parent's
                // atexit handlers or destructors.
                unsafe { libc::_exit(if ok { 0 } else { 2 }) };
            }
            pid => children.push(pid),
        }
    }
    drop(go_write);
    drop(go_read);
    drop(result_write);
    let mut all = Vec::new();
    std::fs::File::from(result_read).read_to_end(&mut all)?;
    for pid in children {
        let mut status = 0;
        // SAFETY: waiting for our own child; `status` is a valid out-pointer.
        unsafe { libc::waitpid(pid, &mut status, 0) };
    }
    if all.len() != processes as usize * 40 {
        return Err(io::Error::other(format!(
            "vector check: {} of {processes} worker processes reported",
            all.len() / 40
        )));
    }
    let mut wrong = [0u64; 5];
    for msg in all.chunks_exact(40) {
        for (i, w) in msg.chunks_exact(8).enumerate() {
            wrong[i] += u64::from_le_bytes(w.try_into().unwrap());
        }
    }
    let checked = u64::from(processes) * u64::from(switches);
    let classes = Class::ALL
        .iter()
        .enumerate()
        .filter(|(_, c)| c.covered_at(level))
        .map(|(i, c)| ClassResult { class: c.name().into(), checked, wrong: wrong[i] })
        .collect();
    Ok(VectorCheckReport {
        level: level.name().into(),
        advertised: support.advertised().name().into(),
        xcr0: format!("{:#x}", support.xcr0),
        kernel_xfeatures: crate::xstate::kernel_xfeatures().map(|k| format!("{k:#x}")),
        processes,
        switches,
        classes,
    })
}

static RELEASE: AtomicU8 = AtomicU8::new(0);

extern "C" fn release(_: libc::c_int) {
    RELEASE.store(1, Ordering::SeqCst);
}

/// The values `vector-hold` holds (fixed, so a restored copy of the process knows them).
const HOLD_SEED: u64 = 0x686f_6c64;

/// Holds known values in the registers until SIGUSR1, then writes `ok <level>` or
/// `wrong <level> <classes>` to `result` (through a temporary file and a rename). Creates
/// `result` with the extension `ready` once SIGUSR1 no longer kills it.
pub fn hold(result: &Path) -> io::Result<bool> {
    let level = Support::detect().level();
    // SAFETY: `release` only stores to an atomic, which is async-signal-safe.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = release as *const () as usize;
        if libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    std::fs::write(result.with_extension("ready"), b"")?;
    let expected = pattern(HOLD_SEED, 0);
    let mut got = [0u8; IMAGE_LEN];
    asm::hold(level, &expected, &mut got, &RELEASE);
    let wrong = wrong_classes(level, &expected, &got);
    let line = if wrong.is_empty() {
        format!("ok {}\n", level.name())
    } else {
        format!("wrong {} {}\n", level.name(), wrong.iter().map(|c| c.name()).collect::<Vec<_>>().join(","))
    };
    let tmp = result.with_extension("partial");
    std::fs::write(&tmp, line)?;
    std::fs::rename(&tmp, result)?;
    Ok(wrong.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_differ_between_processes_and_rounds() {
        assert_ne!(pattern(1, 0)[..], pattern(2, 0)[..]);
        assert_ne!(pattern(1, 0)[..], pattern(1, 1)[..]);
        assert_eq!(pattern(7, 3)[..], pattern(7, 3)[..]);
    }

    #[test]
    fn a_difference_is_charged_to_its_class() {
        let a = pattern(1, 0);
        let mut b = a;
        b[5 * 64 + 20] ^= 1; // ymm5, upper half
        b[20 * 64] ^= 1; // zmm20
        assert_eq!(wrong_classes(Level::Avx512, &a, &b), vec![Class::YmmUpper, Class::Zmm16to31]);
        assert_eq!(wrong_classes(Level::Avx, &a, &b), vec![Class::YmmUpper], "zmm20 is not covered at AVX");
        assert!(wrong_classes(Level::Sse, &a, &b).is_empty());
    }

    #[test]
    fn the_check_passes_on_this_host() {
        // The host kernel saves what it enables: no class may come back wrong.
        let r = run(3, 300).unwrap();
        assert_eq!(r.processes, 3);
        assert!(!r.classes.is_empty());
        assert!(r.failures().is_empty(), "{r:?}");
        assert_eq!(r.classes[0].checked, 900);
    }

    #[test]
    fn the_round_trip_really_moves_the_values_through_the_registers() {
        let level = Support::detect().level();
        let input = pattern(42, 0);
        let mut out = [0u8; IMAGE_LEN];
        asm::round_trip(level, &input, &mut out);
        assert!(wrong_classes(level, &input, &out).is_empty());
        // Bytes of classes the level does not cover are not written.
        if level == Level::Sse {
            assert!(out[16..64].iter().all(|b| *b == 0));
        }
    }
}
