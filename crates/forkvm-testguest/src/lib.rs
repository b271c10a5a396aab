//! Tiny freestanding x86-64 test guests for forkvm's fast test tier.
//!
//! On PVM hosts guest ring-0 code runs through KVM's instruction emulator, ~1000x slower
//! than native. These guests spend a handful of ring-0 instructions setting up (GDT, TSS,
//! IDT, IOAPIC route for COM1), then drop to ring 3 with IOPL=3 and do all their work
//! there at native speed. They exercise the VMM's boot path, serial port, interrupts,
//! snapshot, restore and fork in milliseconds.
//!
//! Each guest is a flat binary loaded at [`IMAGE_BASE`] and entered in 64-bit mode; its
//! arguments are little-endian u64 words the VMM writes at [`ARGS_ADDR`]. Sources are in
//! `guests/*.S`, assembled by `build.rs`.

use std::fmt;
use std::str::FromStr;

/// Guest physical address the image is loaded at and entered.
pub const IMAGE_BASE: u64 = 0x10_0000;
/// Guest physical address of the u64 argument block.
pub const ARGS_ADDR: u64 = 0x7000;
/// Most arguments a guest takes.
pub const MAX_ARGS: usize = 8;
/// I/O port a guest writes its exit code to (see `exit` in `prelude.S`).
pub const EXIT_PORT: u16 = 0x501;
/// Exit code the guests' CPU-exception handler reports.
pub const EXIT_CODE_FAULT: u8 = 0xfe;
/// `count`: guest physical addresses of the published counter and hash.
pub const COUNT_COUNTER_ADDR: u64 = 0x6000;
pub const COUNT_HASH_ADDR: u64 = 0x6008;
/// `dirty`: guest physical address of the published pass count.
pub const DIRTY_GEN_ADDR: u64 = 0x6000;
/// Most vCPUs a test guest runs on (see `prelude.S`).
pub const MAX_VCPUS: u8 = 8;
/// `smp`: vCPU i's counter is the u64 at `SMP_COUNTERS_ADDR + 8 * i`.
pub const SMP_COUNTERS_ADDR: u64 = 0x6000;
/// Every guest: vCPU i's LAPIC timer interrupts, and the IPIs it received (u64 arrays).
pub const TICKS_ADDR: u64 = 0x6040;
pub const IPIS_ADDR: u64 = 0x6080;
/// `sink`: bytes received in order, and breaks in the order.
pub const SINK_RECEIVED_ADDR: u64 = 0x6000;
pub const SINK_GAPS_ADDR: u64 = 0x6008;

/// The test guests this crate builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestGuest {
    /// Prints `hello from ring 3` and sleeps.
    Hello,
    /// Runs `args[0]` steps of a hash chain, prints `count=<hex> hash=<hex>`, exits 0.
    Count,
    /// Echoes COM1 input back.
    Echo,
    /// Fills `[args[0], args[0]+args[1])` with `args[2] ^ addr`, prints `ready`, then
    /// serves peek/poke/sum/fill/ping commands on COM1, and 32-bit device-register reads,
    /// writes and write storms (see `guests/monitor.S`).
    Monitor,
    /// Runs `fwait` and `int3` in ring 0 (instructions PVM's emulator cannot run), so
    /// the CPU exception handler reports the #BP: `!F 0000000000000003 <rip>`.
    Traps,
    /// Rewrites one word per page of `[args[0], args[0]+args[1])` forever, publishing
    /// its pass count at [`DIRTY_GEN_ADDR`] (for branch benchmarks); every other vCPU
    /// rewrites the same range too.
    Dirty,
    /// XSAVE state through ring 0: `xsetbv`, `xrstor` of known xmm0/ymm0 values, `xsave`;
    /// ring 3 checks them and prints `xsave ok` (see `guests/xsave.S`). With `args[0]`
    /// set, an `xsave` into unmapped memory raises #PF: `!F 000000000000000e <rip>`.
    Xsave,
    /// Prints `args[0]` bytes to COM1 with `rep outsb` (4 KiB per VM exit), then
    /// `flood done` and exits 0 (a guest that prints without end).
    Flood,
    /// Runs on `args[0]` vCPUs at once: each counts in ring 3 with its LAPIC timer
    /// (initial count `args[1]`, 0 for none) ticking, the others pass IPIs around, and
    /// vCPU 0 answers `p` with every vCPU's counter, ticks and IPIs (see `guests/smp.S`
    /// and [`smp::parse_report`]).
    Smp,
    /// Reads COM1's data register without end and checks that its bytes come in the
    /// order 1..=255, 1.. (counts at [`SINK_RECEIVED_ADDR`], [`SINK_GAPS_ADDR`]).
    Sink,
    /// Runs on `args[0]` vCPUs at once, in ring 0 (KVM's instruction emulator on PVM
    /// hosts): `args[1]` rounds each of `lock inc` on one shared word and `lock bts`/`btr`
    /// of its own bit in another, then vCPU 0 prints `atomic <sum> <lost0> ...` in hex
    /// (see `guests/atomic.S` and [`atomic::parse_report`]).
    Atomic,
}

impl TestGuest {
    pub const ALL: [TestGuest; 11] = [
        TestGuest::Hello,
        TestGuest::Count,
        TestGuest::Echo,
        TestGuest::Monitor,
        TestGuest::Traps,
        TestGuest::Dirty,
        TestGuest::Xsave,
        TestGuest::Flood,
        TestGuest::Smp,
        TestGuest::Sink,
        TestGuest::Atomic,
    ];

    pub fn name(self) -> &'static str {
        match self {
            TestGuest::Hello => "hello",
            TestGuest::Count => "count",
            TestGuest::Echo => "echo",
            TestGuest::Monitor => "monitor",
            TestGuest::Traps => "traps",
            TestGuest::Dirty => "dirty",
            TestGuest::Xsave => "xsave",
            TestGuest::Flood => "flood",
            TestGuest::Smp => "smp",
            TestGuest::Sink => "sink",
            TestGuest::Atomic => "atomic",
        }
    }

    /// The flat binary image, to be loaded at [`IMAGE_BASE`].
    pub fn image(self) -> &'static [u8] {
        match self {
            TestGuest::Hello => include_bytes!(concat!(env!("OUT_DIR"), "/hello.bin")),
            TestGuest::Count => include_bytes!(concat!(env!("OUT_DIR"), "/count.bin")),
            TestGuest::Echo => include_bytes!(concat!(env!("OUT_DIR"), "/echo.bin")),
            TestGuest::Monitor => include_bytes!(concat!(env!("OUT_DIR"), "/monitor.bin")),
            TestGuest::Traps => include_bytes!(concat!(env!("OUT_DIR"), "/traps.bin")),
            TestGuest::Dirty => include_bytes!(concat!(env!("OUT_DIR"), "/dirty.bin")),
            TestGuest::Xsave => include_bytes!(concat!(env!("OUT_DIR"), "/xsave.bin")),
            TestGuest::Flood => include_bytes!(concat!(env!("OUT_DIR"), "/flood.bin")),
            TestGuest::Smp => include_bytes!(concat!(env!("OUT_DIR"), "/smp.bin")),
            TestGuest::Sink => include_bytes!(concat!(env!("OUT_DIR"), "/sink.bin")),
            TestGuest::Atomic => include_bytes!(concat!(env!("OUT_DIR"), "/atomic.bin")),
        }
    }
}

impl fmt::Display for TestGuest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for TestGuest {
    type Err = UnknownTestGuest;
    fn from_str(s: &str) -> Result<Self, UnknownTestGuest> {
        TestGuest::ALL.into_iter().find(|g| g.name() == s).ok_or_else(|| UnknownTestGuest(s.to_string()))
    }
}

/// A name no [`TestGuest`] has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownTestGuest(pub String);

impl fmt::Display for UnknownTestGuest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<_> = TestGuest::ALL.iter().map(|g| g.name()).collect();
        write!(f, "unknown test guest {:?}; known: {}", self.0, names.join(", "))
    }
}

impl std::error::Error for UnknownTestGuest {}

/// The hash the `count` guest prints after `n` steps (see `guests/count.S`).
pub fn count_hash(n: u64) -> u64 {
    (1..=n).fold(0u64, |h, i| h.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(i))
}

/// Encodes `monitor` commands (see `guests/monitor.S`).
pub mod monitor {
    pub fn ping() -> Vec<u8> {
        vec![b'p']
    }
    pub fn write(addr: u64, value: u64) -> Vec<u8> {
        cmd(b'w', &[addr, value])
    }
    pub fn read(addr: u64) -> Vec<u8> {
        cmd(b'r', &[addr])
    }
    pub fn sum(addr: u64, len: u64) -> Vec<u8> {
        cmd(b's', &[addr, len])
    }
    pub fn fill(addr: u64, len: u64, seed: u64) -> Vec<u8> {
        cmd(b'f', &[addr, len, seed])
    }
    /// A 32-bit store at `addr` (a device register).
    pub fn write32(addr: u64, value: u32) -> Vec<u8> {
        cmd(b'W', &[addr, u64::from(value)])
    }
    /// A 32-bit load from `addr`; the reply is `=<16 hex digits>`.
    pub fn read32(addr: u64) -> Vec<u8> {
        cmd(b'R', &[addr])
    }
    /// `count` 32-bit stores of `value` at `addr`, one after another (a storm).
    pub fn repeat32(addr: u64, value: u32, count: u64) -> Vec<u8> {
        cmd(b'n', &[addr, u64::from(value), count])
    }
    /// The value the fill pattern puts at `addr`.
    pub fn pattern_word(seed: u64, addr: u64) -> u64 {
        seed ^ addr
    }
    fn cmd(op: u8, operands: &[u64]) -> Vec<u8> {
        let mut bytes = vec![op];
        for v in operands {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        bytes
    }
}

/// Reads the `smp` guest's report.
pub mod smp {
    /// The command that asks for a report.
    pub const REPORT: &[u8] = b"p";
    /// The command that ends the guest (exit code 0).
    pub const EXIT: &[u8] = b"x";

    /// One vCPU's numbers in a report.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct VcpuCounts {
        pub counter: u64,
        pub ticks: u64,
        pub ipis: u64,
    }

    /// Parses `smp <counter> <ticks> <ipis> ...` (hex, one triple per vCPU).
    pub fn parse_report(line: &str) -> Option<Vec<VcpuCounts>> {
        let rest = line.trim().strip_prefix("smp")?;
        let words: Vec<u64> =
            rest.split_whitespace().map(|w| u64::from_str_radix(w, 16)).collect::<Result<_, _>>().ok()?;
        if words.is_empty() || !words.len().is_multiple_of(3) {
            return None;
        }
        Some(words.chunks(3).map(|c| VcpuCounts { counter: c[0], ticks: c[1], ipis: c[2] }).collect())
    }
}

/// Reads the `atomic` guest's report.
pub mod atomic {
    /// What the guest counted: the shared sum and, per vCPU, how often its own bit was
    /// not as its last locked instruction left it.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Report {
        pub sum: u64,
        pub lost: Vec<u64>,
    }

    impl Report {
        /// Whether every locked instruction was atomic: `vcpus × rounds` increments and
        /// no bit lost.
        pub fn atomic(&self, rounds: u64) -> bool {
            self.sum == self.lost.len() as u64 * rounds && self.lost.iter().all(|&l| l == 0)
        }
    }

    /// Parses `atomic <sum> <lost0> <lost1> ...` (hex).
    pub fn parse_report(line: &str) -> Option<Report> {
        let rest = line.trim().strip_prefix("atomic")?;
        let words: Vec<u64> =
            rest.split_whitespace().map(|w| u64::from_str_radix(w, 16)).collect::<Result<_, _>>().ok()?;
        let (&sum, lost) = words.split_first()?;
        (!lost.is_empty()).then(|| Report { sum, lost: lost.to_vec() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_guest_is_assembled_and_small() {
        for g in TestGuest::ALL {
            let img = g.image();
            assert!(img.len() > 0x80 && img.len() < 64 * 1024, "{g}: {} bytes", img.len());
            // The first instruction is `cli`.
            assert_eq!(img[0], 0xfa, "{g} does not start with cli");
        }
    }

    #[test]
    fn names_round_trip() {
        for g in TestGuest::ALL {
            assert_eq!(g.name().parse::<TestGuest>().unwrap(), g);
        }
        assert!("nope".parse::<TestGuest>().unwrap_err().to_string().contains("known: hello"));
    }

    #[test]
    fn smp_reports_parse() {
        let r = smp::parse_report("smp 000000000000000a 0000000000000002 0000000000000001 00000000000000ff 0 0\n");
        let r = r.unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0], smp::VcpuCounts { counter: 10, ticks: 2, ipis: 1 });
        assert_eq!(r[1].counter, 255);
        assert_eq!(smp::parse_report("smp 1 2"), None);
        assert_eq!(smp::parse_report("smp"), None);
        assert_eq!(smp::parse_report("nope 1 2 3"), None);
    }

    #[test]
    fn atomic_reports_parse() {
        let r = atomic::parse_report("atomic 0000000000000014 0 0000000000000000\n").unwrap();
        assert_eq!(r, atomic::Report { sum: 20, lost: vec![0, 0] });
        assert!(r.atomic(10));
        assert!(!r.atomic(11));
        assert!(!atomic::parse_report("atomic 14 0 1").unwrap().atomic(10));
        assert_eq!(atomic::parse_report("atomic 14"), None);
        assert_eq!(atomic::parse_report("atomic x 0"), None);
    }

    #[test]
    fn count_hash_matches_the_recurrence() {
        assert_eq!(count_hash(0), 0);
        assert_eq!(count_hash(1), 1);
        assert_eq!(count_hash(2), 6_364_136_223_846_793_005u64.wrapping_add(2));
    }
}
