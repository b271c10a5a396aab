//! `GET /v1/sandboxes/{id}/usage`: one sample of what a sandbox's VMM uses of the host,
//! read from its cgroup (memory charged, CPU time), else from `/proc/<pid>` when it has
//! no group (a host without cgroup control). The E2B face's metrics read the same.

use crate::error::ApiError;
use crate::extract::Param;
use crate::state::AppState;
use axum::extract::State;
use axum::Json;
use forkvm_api::SandboxUsage;
use forkvm_sandbox::registry::{now_unix_ms, SandboxRecord};
use forkvm_vmm::host::cgroup::CgroupRoot;

pub async fn usage(State(s): State<AppState>, Param(id): Param) -> Result<Json<SandboxUsage>, ApiError> {
    s.blocking(move |s| {
        let record = super::sandboxes::running(&s, &id)?;
        Ok(Json(sample(&record)))
    })
    .await
}

/// What `record`'s VMM uses now (zeros where nothing can be read: a VMM that just
/// exited).
pub fn sample(record: &SandboxRecord) -> SandboxUsage {
    let group = record.cgroup.as_deref().and_then(|name| CgroupRoot::detected().ok()?.open(name));
    let from_group = group.as_ref().map(|g| (g.memory_usage_bytes().ok(), g.cpu_usage_usec().ok()));
    let (memory, cpu) = from_group.unwrap_or((None, None));
    SandboxUsage {
        at_unix_ms: now_unix_ms(),
        memory_bytes: memory.or_else(|| proc_rss_bytes(record.pid)).unwrap_or(0),
        memory_limit_bytes: record.memory_limit_bytes,
        cpu_usage_usec: cpu.or_else(|| proc_cpu_usec(record.pid)).unwrap_or(0),
        vcpus: u32::from(record.vcpus),
    }
}

/// `VmRSS` of `/proc/<pid>/status`.
fn proc_rss_bytes(pid: i32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: u64 =
        text.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kib << 10)
}

/// User and system time of `/proc/<pid>/stat`, all threads.
fn proc_cpu_usec(pid: i32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    cpu_usec_of_stat(&text, clock_ticks())
}

fn clock_ticks() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as u64
    } else {
        100
    }
}

/// Fields 14 and 15 (utime, stime, in ticks) of a `stat` line, in microseconds; the
/// command name (field 2) may hold spaces and parentheses, so fields are counted after
/// its last `)`.
fn cpu_usec_of_stat(stat: &str, ticks_per_second: u64) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((utime + stime) * 1_000_000 / ticks_per_second.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_times_are_counted_after_the_command_name() {
        let stat = "42 (forkvm (vmm) x) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 100 0 0";
        assert_eq!(cpu_usec_of_stat(stat, 100), Some(3_000_000));
        assert_eq!(cpu_usec_of_stat("42 (x) S 1", 100), None);
        assert_eq!(cpu_usec_of_stat("no parenthesis", 100), None);
    }

    #[test]
    fn this_process_has_cpu_time_and_memory() {
        let me = std::process::id() as i32;
        assert!(proc_rss_bytes(me).is_some_and(|b| b > 0));
        assert!(proc_cpu_usec(me).is_some());
    }
}
