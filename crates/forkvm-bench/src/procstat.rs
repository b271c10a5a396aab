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

/// CPU time of one VMM process, split into its vCPU threads (the guest's work, and the
/// host's on its behalf: exits, faults) and everything else (the host side: restore,
/// devices, control, and the processes it reaped), in microseconds. Threads that ended
/// are not counted.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct VmmCpu {
    pub host_us: f64,
    pub vcpu_us: f64,
}

/// The user + system ticks of a `/proc/.../stat` line (fields 14, 15) and the reaped
/// children's (16, 17), in microseconds.
fn stat_cpu_us(stat: &str, with_children: bool) -> Option<f64> {
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok());
    let mut sum = ticks(11)? + ticks(12)?;
    if with_children {
        sum += ticks(13)? + ticks(14)?;
    }
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Some(sum * 1e6 / hz)
}

pub fn vmm_cpu_us(pid: i32) -> Result<VmmCpu> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    // The processes it reaped, in clock ticks (the only record left of them); its own
    // threads in nanoseconds (`schedstat`), so one fork's milliseconds are not lost.
    let reaped = stat_cpu_us(&stat, true).zip(stat_cpu_us(&stat, false)).map(|(all, own)| all - own);
    let mut cpu = VmmCpu { host_us: reaped.with_context(|| format!("parsing {path}"))?, vcpu_us: 0.0 };
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).with_context(|| format!("listing /proc/{pid}/task"))?;
    for task in tasks.flatten() {
        let (Ok(stat), Ok(schedstat)) =
            (std::fs::read_to_string(task.path().join("stat")), std::fs::read_to_string(task.path().join("schedstat")))
        else {
            continue;
        };
        let Some(on_cpu_us) =
            schedstat.split_whitespace().next().and_then(|ns| ns.parse::<f64>().ok()).map(|ns| ns / 1e3)
        else {
            continue;
        };
        let name = stat.split_once('(').and_then(|(_, rest)| rest.rsplit_once(')')).map(|(n, _)| n).unwrap_or("");
        if name.starts_with("vcpu") {
            cpu.vcpu_us += on_cpu_us;
        } else {
            cpu.host_us += on_cpu_us;
        }
    }
    Ok(cpu)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_private_and_reads_pss() {
        let text = "55d0-7ffd ---p 00000000 00:00 0 [rollup]\nRss: 1000 kB\nPss: 300 kB\nPss_Anon: 10 kB\nPrivate_Clean: 20 kB\nPrivate_Dirty: 180 kB\n";
        assert_eq!(parse_smaps_rollup(text), MemUsage { rss_kib: 1000, pss_kib: 300, private_kib: 200 });
    }

    #[test]
    fn stat_fields_after_the_name_even_with_spaces_and_parentheses_in_it() {
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        let stat = "42 (vcpu 0 (x)) S 1 42 42 0 -1 4194560 10 0 0 0 7 3 2 1 20 0 1 0 5 0 0";
        assert_eq!(stat_cpu_us(stat, false), Some(10.0 * 1e6 / hz));
        assert_eq!(stat_cpu_us(stat, true), Some(13.0 * 1e6 / hz));
    }
}
