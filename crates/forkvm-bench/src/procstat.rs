//! Memory accounting of a process from `/proc/<pid>/smaps_rollup`.

use anyhow::{Context, Result};

/// Kilobyte figures of one process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemUsage {
    pub rss_kib: u64,
    pub pss_kib: u64,
    /// Private_Clean + Private_Dirty: what this process alone holds.
    pub private_kib: u64,
}

pub fn parse_smaps_rollup(text: &str) -> MemUsage {
    let mut m = MemUsage::default();
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        let (Some(key), Some(value)) = (parts.next(), parts.next()) else {
            continue;
        };
        let Ok(kib) = value.parse::<u64>() else {
            continue;
        };
        match key {
            "Rss:" => m.rss_kib = kib,
            "Pss:" => m.pss_kib = kib,
            "Private_Clean:" | "Private_Dirty:" => m.private_kib += kib,
            _ => {}
        }
    }
    m
}

pub fn mem_usage(pid: i32) -> Result<MemUsage> {
    let path = format!("/proc/{pid}/smaps_rollup");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    Ok(parse_smaps_rollup(&text))
}

/// CPU time of this whole process (every thread) and of its waited-for children, in
/// microseconds.
pub fn process_cpu_us() -> f64 {
    let usage = |who| {
        // SAFETY: getrusage fills a struct we own.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: as above; RUSAGE_SELF and RUSAGE_CHILDREN are valid.
        unsafe { libc::getrusage(who, &mut u) };
        let t = |tv: libc::timeval| tv.tv_sec as f64 * 1e6 + tv.tv_usec as f64;
        t(u.ru_utime) + t(u.ru_stime)
    };
    usage(libc::RUSAGE_SELF) + usage(libc::RUSAGE_CHILDREN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_private_and_reads_pss() {
        let text = "55d0-7ffd ---p 00000000 00:00 0 [rollup]\nRss: 1000 kB\nPss: 300 kB\nPss_Anon: 10 kB\nPrivate_Clean: 20 kB\nPrivate_Dirty: 180 kB\n";
        assert_eq!(parse_smaps_rollup(text), MemUsage { rss_kib: 1000, pss_kib: 300, private_kib: 200 });
    }
}
