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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_private_and_reads_pss() {
        let text = "55d0-7ffd ---p 00000000 00:00 0 [rollup]\nRss: 1000 kB\nPss: 300 kB\nPss_Anon: 10 kB\nPrivate_Clean: 20 kB\nPrivate_Dirty: 180 kB\n";
        assert_eq!(parse_smaps_rollup(text), MemUsage { rss_kib: 1000, pss_kib: 300, private_kib: 200 });
    }
}
