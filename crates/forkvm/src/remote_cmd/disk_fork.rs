//! `disk-fork ID` through the daemon (a cold boot on another sandbox's disk snapshot).

use super::{RemoteArgs, Spinner};
use crate::disk_cmd::DiskForkArgs;
use anyhow::Result;
use forkvm_client::api::{DiskForkRequest, DiskRestoreMode};

pub fn disk_fork(a: &DiskForkArgs, remote: &RemoteArgs) -> Result<Option<i32>> {
    let Some(client) = remote.client()? else { return Ok(None) };
    let started = std::time::Instant::now();
    let restore = match a.restore {
        crate::disk_cmd::RestoreArg::Eager => DiskRestoreMode::Eager,
        crate::disk_cmd::RestoreArg::Lazy => DiskRestoreMode::Lazy,
        crate::disk_cmd::RestoreArg::LazyPlaybook => DiskRestoreMode::LazyPlaybook,
    };
    let req = DiskForkRequest {
        seq: a.seq,
        memory_limit_mib: a.limits.mem_limit_mib,
        cpu_limit_millis: a.limits.cpu_limit_millis,
        pids_limit: a.limits.pids_limit,
        io_limits: a.limits.io_limits(),
        ttl_seconds: None,
        restore: Some(restore),
    };
    let s = {
        let _spinner = Spinner::start(format!("booting a new sandbox on {}'s disk", a.id));
        client.disk_fork(&a.id, &req)?
    };
    let ready_ms = started.elapsed().as_secs_f64() * 1e3;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        println!("{} (booted on {}'s disk in {:.1} s)", s.id, a.id, ready_ms / 1e3);
    }
    Ok(Some(0))
}
