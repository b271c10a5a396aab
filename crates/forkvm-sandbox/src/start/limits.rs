//! What a start asks of its sandboxes' cgroups: a memory limit (none unless asked), and a
//! CPU and a tasks limit (defaults unless asked); and of their VMMs' devices: caps on disk
//! and entropy I/O (none unless asked; `forkvm_vmm::devices::virtio::throttle`). A template's tag may carry defaults of
//! its own (`snapshot.json`'s `default_limits`), which a spawn from it takes unless it
//! asks for others. A sandbox's record keeps what was asked,
//! so that a fork of it and its restore from an archive ask the same; its cgroup, which
//! outlives a daemon restart, holds the limits themselves.

use crate::registry::SandboxRecord;
use forkvm_api::IoLimits;
use forkvm_vmm::devices::attach::RateLimits;
use forkvm_vmm::devices::virtio::throttle::RateLimit;
use forkvm_vmm::host::cgroup::Limits;

/// The CPU a one-vCPU sandbox may use unless told otherwise, in thousandths of a CPU
/// ([`default_cpu_millis`]).
pub const DEFAULT_CPU_MILLIS: u32 = 2000;

/// The CPU a sandbox with `vcpus` vCPUs may use unless told otherwise: a CPU per vCPU,
/// plus one for the VMM's own threads (device backends, a restore's prefetch, the
/// live-branch writer), which would otherwise take their time from the guest's.
pub fn default_cpu_millis(vcpus: u8) -> u32 {
    (u32::from(vcpus.max(1)) + 1) * 1000
}

/// Tasks a sandbox's VMM may have unless told otherwise: its threads, and room for a fork
/// of the running sandbox into [`super::MAX_SPAWN`] children (each counts in its source's
/// group until it has joined its own).
pub const DEFAULT_PIDS_MAX: u32 = super::MAX_SPAWN as u32 + 256;

/// Least CPU a sandbox may be given: 1 ms of each 100 ms period, the kernel's least quota.
pub const MIN_CPU_MILLIS: u32 = 10;
/// Most CPU a sandbox may be given (1024 CPUs).
pub const MAX_CPU_MILLIS: u32 = 1_024_000;
/// Fewest tasks a VMM needs: its main, vCPU, device, control-socket and reaper threads.
pub const MIN_PIDS_MAX: u32 = 32;
/// Most tasks a sandbox may be given (the kernel's own pid limit).
pub const MAX_PIDS_MAX: u32 = 4_194_304;
/// Least memory limit (a limit this small stops a guest early, which tests use).
pub const MIN_MEMORY_BYTES: u64 = 1 << 20;
/// Most memory limit accepted (1 PiB): anything larger is a mistake, not a limit.
pub const MAX_MEMORY_BYTES: u64 = 1 << 50;
/// Least disk bandwidth cap: a guest's largest requests (~1 MiB) must finish well within
/// its block layer's 30 s timeout.
pub const MIN_DISK_BYTES_PER_SEC: u64 = 64 << 10;
/// Fewest disk requests per second a cap may allow.
pub const MIN_DISK_OPS_PER_SEC: u64 = 10;
/// Least entropy cap: a guest's kernel asks for 64 bytes at a time.
pub const MIN_RNG_BYTES_PER_SEC: u64 = 64;
/// Least network cap, each way: a few full frames a second, so TCP keeps going.
pub const MIN_NET_BYTES_PER_SEC: u64 = 8 << 10;
/// Most any I/O cap may allow (a cap above it is a mistake, not a cap).
pub const MAX_IO_RATE: u64 = 1 << 40;

/// How sandboxes are spawned: the limits asked for; `None` takes the default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SpawnOptions {
    /// Memory limit of each sandbox's VMM process (cgroup v1 or v2); none by default.
    pub memory_limit_bytes: Option<u64>,
    /// CPU, in thousandths of a CPU per period; [`DEFAULT_CPU_MILLIS`] by default.
    pub cpu_millis: Option<u32>,
    /// Tasks (processes and threads); [`DEFAULT_PIDS_MAX`] by default.
    pub pids_max: Option<u32>,
    /// Caps on disk and entropy I/O; none by default.
    pub io: IoLimits,
}

/// A limit outside what forkvm accepts, named with the field a caller set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    #[error("memory limit {0} bytes is outside {MIN_MEMORY_BYTES}..={MAX_MEMORY_BYTES} (1 MiB to 1 PiB)")]
    Memory(u64),
    #[error("CPU limit {0} (thousandths of a CPU) is outside {MIN_CPU_MILLIS}..={MAX_CPU_MILLIS}")]
    Cpu(u32),
    #[error(
        "tasks limit {0} is outside {MIN_PIDS_MAX}..={MAX_PIDS_MAX} (a VMM needs {MIN_PIDS_MAX} for its own threads)"
    )]
    Pids(u32),
    #[error("{what} {value} is outside {min}..={MAX_IO_RATE}")]
    Io { what: &'static str, value: u64, min: u64 },
}

impl SpawnOptions {
    /// The limits sandbox `r` was started with: a fork of it and its restore keep them.
    /// A record from before CPU and tasks limits were kept asked for the defaults.
    pub fn of_record(r: &SandboxRecord) -> SpawnOptions {
        SpawnOptions {
            memory_limit_bytes: r.memory_limit_bytes,
            cpu_millis: r.cpu_millis,
            pids_max: r.pids_max,
            io: r.io_limits,
        }
    }

    /// A snapshot's default limits for the sandboxes spawned from it.
    pub fn of_snapshot(meta: &forkvm_snapshot::SnapshotMeta) -> SpawnOptions {
        let d = meta.default_limits.unwrap_or_default();
        SpawnOptions {
            memory_limit_bytes: d.memory_limit_bytes,
            cpu_millis: d.cpu_millis,
            pids_max: d.pids_max,
            io: d.io.unwrap_or_default(),
        }
    }

    /// These limits as a snapshot's defaults (none when nothing is set).
    pub fn as_snapshot_defaults(&self) -> Option<forkvm_snapshot::DefaultLimits> {
        self.asks().then_some(forkvm_snapshot::DefaultLimits {
            memory_limit_bytes: self.memory_limit_bytes,
            cpu_millis: self.cpu_millis,
            pids_max: self.pids_max,
            io: self.io.asked(),
        })
    }

    /// The limits children of running sandbox `source` get when `asked` these: its own,
    /// but for those asked anew (the one rule for a fork, the daemon's row and the
    /// library's start alike).
    pub fn for_fork_of(source: &SandboxRecord, asked: SpawnOptions) -> SpawnOptions {
        SpawnOptions::of_record(source).overridden_by(asked)
    }

    /// `origin` with these limits, as a new sandbox's row keeps them.
    pub fn recorded_in(&self, origin: crate::registry::Origin) -> crate::registry::Origin {
        crate::registry::Origin {
            memory_limit_bytes: self.memory_limit_bytes,
            cpu_millis: self.cpu_millis,
            pids_max: self.pids_max,
            io_limits: self.io,
            ..origin
        }
    }

    /// These options with every limit `asked` sets taking the place of this one's.
    pub fn overridden_by(self, asked: SpawnOptions) -> SpawnOptions {
        SpawnOptions {
            memory_limit_bytes: asked.memory_limit_bytes.or(self.memory_limit_bytes),
            cpu_millis: asked.cpu_millis.or(self.cpu_millis),
            pids_max: asked.pids_max.or(self.pids_max),
            io: IoLimits {
                disk_bytes_per_sec: asked.io.disk_bytes_per_sec.or(self.io.disk_bytes_per_sec),
                disk_ops_per_sec: asked.io.disk_ops_per_sec.or(self.io.disk_ops_per_sec),
                rng_bytes_per_sec: asked.io.rng_bytes_per_sec.or(self.io.rng_bytes_per_sec),
                net_tx_bytes_per_sec: asked.io.net_tx_bytes_per_sec.or(self.io.net_tx_bytes_per_sec),
                net_rx_bytes_per_sec: asked.io.net_rx_bytes_per_sec.or(self.io.net_rx_bytes_per_sec),
            },
        }
    }

    /// Checks every limit set against the bounds above.
    pub fn validate(&self) -> Result<(), LimitError> {
        if let Some(m) = self.memory_limit_bytes.filter(|m| !(MIN_MEMORY_BYTES..=MAX_MEMORY_BYTES).contains(m)) {
            return Err(LimitError::Memory(m));
        }
        if let Some(c) = self.cpu_millis.filter(|c| !(MIN_CPU_MILLIS..=MAX_CPU_MILLIS).contains(c)) {
            return Err(LimitError::Cpu(c));
        }
        if let Some(p) = self.pids_max.filter(|p| !(MIN_PIDS_MAX..=MAX_PIDS_MAX).contains(p)) {
            return Err(LimitError::Pids(p));
        }
        for (what, value, min) in [
            ("disk_bytes_per_sec", self.io.disk_bytes_per_sec, MIN_DISK_BYTES_PER_SEC),
            ("disk_ops_per_sec", self.io.disk_ops_per_sec, MIN_DISK_OPS_PER_SEC),
            ("rng_bytes_per_sec", self.io.rng_bytes_per_sec, MIN_RNG_BYTES_PER_SEC),
            ("net_tx_bytes_per_sec", self.io.net_tx_bytes_per_sec, MIN_NET_BYTES_PER_SEC),
            ("net_rx_bytes_per_sec", self.io.net_rx_bytes_per_sec, MIN_NET_BYTES_PER_SEC),
        ] {
            if let Some(value) = value.filter(|v| !(min..=MAX_IO_RATE).contains(v)) {
                return Err(LimitError::Io { what, value, min });
            }
        }
        Ok(())
    }

    /// Whether a limit was asked for, so that it must hold: a start without cgroups
    /// (forkvm run as a user) fails then, instead of going on with the defaults unset.
    pub fn asks(&self) -> bool {
        self.memory_limit_bytes.is_some()
            || self.cpu_millis.is_some()
            || self.pids_max.is_some()
            || self.io.asked().is_some()
    }

    /// The caps the sandboxes' devices get (none where none was asked).
    pub fn rate_limits(&self) -> RateLimits {
        RateLimits {
            disk: RateLimit { bytes_per_sec: self.io.disk_bytes_per_sec, ops_per_sec: self.io.disk_ops_per_sec },
            rng: RateLimit { bytes_per_sec: self.io.rng_bytes_per_sec, ops_per_sec: None },
            net_tx: RateLimit { bytes_per_sec: self.io.net_tx_bytes_per_sec, ops_per_sec: None },
            net_rx: RateLimit { bytes_per_sec: self.io.net_rx_bytes_per_sec, ops_per_sec: None },
        }
    }

    /// The cgroup limits of each sandbox with `vcpus` vCPUs: what was asked, the
    /// defaults for the rest.
    pub fn limits(&self, vcpus: u8) -> Limits {
        Limits {
            memory_bytes: self.memory_limit_bytes,
            cpu_millis: Some(self.cpu_millis.unwrap_or_else(|| default_cpu_millis(vcpus))),
            pids_max: Some(self.pids_max.unwrap_or(DEFAULT_PIDS_MAX)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_fill_what_was_not_asked() {
        let l = SpawnOptions { cpu_millis: Some(500), ..SpawnOptions::default() }.limits(2);
        assert_eq!((l.memory_bytes, l.cpu_millis, l.pids_max), (None, Some(500), Some(DEFAULT_PIDS_MAX)));
        assert!(!SpawnOptions::default().asks());
        assert!(SpawnOptions { pids_max: Some(64), ..SpawnOptions::default() }.asks());
        // The default CPU: one per vCPU, and one for the VMM's threads.
        for (vcpus, millis) in [(1, DEFAULT_CPU_MILLIS), (2, 3000), (4, 5000)] {
            assert_eq!(SpawnOptions::default().limits(vcpus).cpu_millis, Some(millis), "{vcpus} vCPUs");
        }
    }

    #[test]
    fn a_fork_keeps_its_sources_limits_unless_asked_otherwise() {
        let source = SpawnOptions {
            memory_limit_bytes: Some(256 << 20),
            cpu_millis: Some(500),
            pids_max: Some(100),
            io: IoLimits { disk_ops_per_sec: Some(100), rng_bytes_per_sec: Some(4096), ..IoLimits::default() },
        };
        let asked = SpawnOptions {
            cpu_millis: Some(1500),
            io: IoLimits { disk_ops_per_sec: Some(50), ..IoLimits::default() },
            ..SpawnOptions::default()
        };
        assert_eq!(
            source.overridden_by(asked),
            SpawnOptions {
                memory_limit_bytes: Some(256 << 20),
                cpu_millis: Some(1500),
                pids_max: Some(100),
                io: IoLimits { disk_ops_per_sec: Some(50), rng_bytes_per_sec: Some(4096), ..IoLimits::default() },
            }
        );
    }

    #[test]
    fn limits_out_of_bounds_are_refused_by_name() {
        let bad = [
            (SpawnOptions { memory_limit_bytes: Some(1000), ..SpawnOptions::default() }, "memory limit 1000"),
            (SpawnOptions { cpu_millis: Some(5), ..SpawnOptions::default() }, "CPU limit 5"),
            (SpawnOptions { cpu_millis: Some(MAX_CPU_MILLIS + 1), ..SpawnOptions::default() }, "CPU limit"),
            (SpawnOptions { pids_max: Some(8), ..SpawnOptions::default() }, "tasks limit 8"),
            (
                SpawnOptions {
                    io: IoLimits { disk_bytes_per_sec: Some(1000), ..IoLimits::default() },
                    ..SpawnOptions::default()
                },
                "disk_bytes_per_sec 1000",
            ),
            (
                SpawnOptions {
                    io: IoLimits { rng_bytes_per_sec: Some(1), ..IoLimits::default() },
                    ..SpawnOptions::default()
                },
                "rng_bytes_per_sec 1",
            ),
            (
                SpawnOptions {
                    io: IoLimits { net_tx_bytes_per_sec: Some(1500), ..IoLimits::default() },
                    ..SpawnOptions::default()
                },
                "net_tx_bytes_per_sec 1500",
            ),
        ];
        for (opts, said) in bad {
            let e = opts.validate().unwrap_err().to_string();
            assert!(e.contains(said), "{e:?} should name {said:?}");
        }
        let ok = SpawnOptions {
            memory_limit_bytes: Some(64 << 20),
            cpu_millis: Some(MIN_CPU_MILLIS),
            pids_max: Some(MIN_PIDS_MAX),
            io: IoLimits {
                disk_bytes_per_sec: Some(MIN_DISK_BYTES_PER_SEC),
                disk_ops_per_sec: Some(MIN_DISK_OPS_PER_SEC),
                rng_bytes_per_sec: Some(MIN_RNG_BYTES_PER_SEC),
                net_tx_bytes_per_sec: Some(MIN_NET_BYTES_PER_SEC),
                net_rx_bytes_per_sec: Some(MIN_NET_BYTES_PER_SEC),
            },
        };
        assert_eq!(ok.validate(), Ok(()));
        let caps = ok.rate_limits();
        assert!(ok.asks() && caps.disk.is_limited() && caps.rng.is_limited());
        assert!(caps.net_tx.is_limited() && caps.net_rx.is_limited());
    }
}
