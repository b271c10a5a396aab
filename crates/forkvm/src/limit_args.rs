//! The cgroup limits a verb that starts sandboxes takes (`fork`, `disk-fork`), the same
//! way on this host and through a daemon.

use forkvm_sandbox::SpawnOptions;

#[derive(clap::Args, Debug, Clone, Copy, Default)]
pub struct LimitArgs {
    /// Memory limit per sandbox, MiB (a cgroup per sandbox VMM) [default: none].
    #[arg(long)]
    pub mem_limit_mib: Option<u64>,
    /// CPU limit per sandbox, thousandths of a CPU [default: 2000; a fork of a running
    /// sandbox: its source's].
    #[arg(long)]
    pub cpu_limit_millis: Option<u32>,
    /// Tasks (threads and processes) per sandbox VMM [default: 4352; a fork of a running
    /// sandbox: its source's].
    #[arg(long)]
    pub pids_limit: Option<u32>,
}

impl LimitArgs {
    /// What this host's library is asked.
    pub fn spawn_options(&self) -> SpawnOptions {
        SpawnOptions {
            memory_limit_bytes: self.mem_limit_mib.map(|m| m.saturating_mul(1 << 20)),
            cpu_millis: self.cpu_limit_millis,
            pids_max: self.pids_limit,
        }
    }
}
