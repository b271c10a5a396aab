//! The limits a verb that starts sandboxes takes (`fork`, `disk-fork`, and a tag's
//! defaults for `snapshot create`): cgroup limits and I/O caps, the same way on this host
//! and through a daemon.

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
    /// Disk bandwidth cap per disk, bytes per second (at least 65536) [default: none; a
    /// fork of a running sandbox: its source's].
    #[arg(long)]
    pub disk_bytes_per_sec: Option<u64>,
    /// Disk requests per second per disk (at least 10) [default: none].
    #[arg(long)]
    pub disk_ops_per_sec: Option<u64>,
    /// Random bytes per second from the entropy device (at least 64) [default: none].
    #[arg(long)]
    pub rng_bytes_per_sec: Option<u64>,
    /// Bytes per second the guest may send on its network (at least 8192) [default: none].
    #[arg(long)]
    pub net_tx_bytes_per_sec: Option<u64>,
    /// Bytes per second the guest may receive on its network (at least 8192) [default:
    /// none].
    #[arg(long)]
    pub net_rx_bytes_per_sec: Option<u64>,
}

impl LimitArgs {
    /// What this host's library is asked.
    pub fn spawn_options(&self) -> SpawnOptions {
        SpawnOptions {
            memory_limit_bytes: self.mem_limit_mib.map(|m| m.saturating_mul(1 << 20)),
            cpu_millis: self.cpu_limit_millis,
            pids_max: self.pids_limit,
            io: self.io(),
        }
    }

    /// The I/O caps asked for.
    pub fn io(&self) -> forkvm_client::api::IoLimits {
        forkvm_client::api::IoLimits {
            disk_bytes_per_sec: self.disk_bytes_per_sec,
            disk_ops_per_sec: self.disk_ops_per_sec,
            rng_bytes_per_sec: self.rng_bytes_per_sec,
            net_tx_bytes_per_sec: self.net_tx_bytes_per_sec,
            net_rx_bytes_per_sec: self.net_rx_bytes_per_sec,
        }
    }

    /// The I/O caps asked for, as a request carries them (none when none is asked).
    pub fn io_limits(&self) -> Option<forkvm_client::api::IoLimits> {
        self.io().asked()
    }
}
