//! Groups for forkvm's own processes, beside the sandboxes': `forkvm/daemon` and
//! `forkvm/spawner`.
//!
//! Each sandbox is limited in its group, but the daemon and its spawner ran in whatever
//! group started them, competing with every sandbox as one more task. In groups of their
//! own they are accounted apart (`forkvm doctor`, the host's tools) and get a CPU weight
//! several times a sandbox's, so that a host full of busy sandboxes still answers its
//! API and starts new ones. They get no quota and no memory or tasks limit: the
//! daemon's work is bounded by its own admission limits, not by the kernel.
//!
//! A process in one of these groups finds the same `forkvm` root as before it moved
//! (its group's parent is `forkvm`), so the sandboxes it starts go beside it.

use super::{create_dir_if_missing, CgroupError, CgroupRoot, CgroupVersion, Controller};
use std::path::PathBuf;

/// One of forkvm's own processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    /// `forkvm daemon`: the API.
    Daemon,
    /// The daemon's spawner: forks and restores VMMs.
    Spawner,
}

impl Service {
    pub const ALL: [Service; 2] = [Service::Daemon, Service::Spawner];

    /// The group's name under `forkvm/` (never a sandbox's: see `validate_name`).
    pub fn name(self) -> &'static str {
        match self {
            Service::Daemon => "daemon",
            Service::Spawner => "spawner",
        }
    }

    /// CPU weight against one sandbox's group, which has the kernel's default (v1
    /// `cpu.shares` 1024, v2 `cpu.weight` 100).
    pub fn cpu_weight_over_a_sandbox(self) -> u64 {
        match self {
            Service::Daemon => 8,
            Service::Spawner => 4,
        }
    }
}

impl CgroupRoot {
    /// Moves the calling process, all its threads, into `forkvm/<service>` (made if
    /// missing, in every hierarchy on v1) after setting its CPU weight; returns the
    /// group's directory in the memory (v1) or unified (v2) hierarchy.
    pub fn join_service(&self, service: Service) -> Result<PathBuf, CgroupError> {
        self.ensure_parent()?;
        let dirs: Vec<(Option<Controller>, PathBuf)> = std::iter::once((None, self.dir.join(service.name())))
            .chain(self.v1_extra.iter().map(|(c, d)| (Some(*c), d.join(service.name()))))
            .collect();
        for (_, dir) in &dirs {
            create_dir_if_missing(dir)?;
        }
        let weight = service.cpu_weight_over_a_sandbox();
        let cpu = match self.version {
            CgroupVersion::V1 => dirs
                .iter()
                .find(|(c, _)| *c == Some(Controller::Cpu))
                .map(|(_, d)| (d.join("cpu.shares"), (1024 * weight).to_string())),
            CgroupVersion::V2 => self
                .controllers()
                .contains(&Controller::Cpu)
                .then(|| (dirs[0].1.join("cpu.weight"), (100 * weight).to_string())),
        };
        if let Some((path, value)) = cpu {
            std::fs::write(&path, value).map_err(|source| CgroupError::SetLimit { path, source })?;
        }
        for (_, dir) in &dirs {
            let path = dir.join("cgroup.procs");
            std::fs::write(&path, "0").map_err(|source| CgroupError::Join { pid: std::process::id(), path, source })?;
        }
        Ok(dirs[0].1.clone())
    }
}
