//! Kill: a sandbox's VMM stopped (shutdown through its control socket, SIGKILL if it does
//! not stop), its run directory, cgroup and row removed, and a restored sandbox's
//! archive with it.

use super::LifecycleError;
use crate::registry::{vmm_alive, Registry, SandboxRecord};
use forkvm_vmm::control::ControlClient;
use std::time::{Duration, Instant};

/// Stops sandbox `id`: shutdown through its control socket, SIGKILL if it does not stop;
/// its run directory and cgroup are gone afterwards.
pub fn kill(registry: &Registry, id: &str) -> Result<(), LifecycleError> {
    let r = registry.get(id)?;
    kill_record(registry, &r)
}

/// [`kill`] for a record in hand (also used to undo a failed spawn).
/// A restored sandbox's archive (its lower disk layers) goes with it.
pub fn kill_record(registry: &Registry, r: &SandboxRecord) -> Result<(), LifecycleError> {
    let archive = crate::archive::linked_archive(&r.run_dir);
    let archive_error = |dir: &std::path::Path, source| LifecycleError::RemoveArchive {
        id: r.id.clone(),
        dir: dir.to_path_buf(),
        source,
    };
    if let Some(dir) = &archive {
        // Uncommitted before the VMM stops: a crash from here on leaves a sandbox that
        // runs, or one that stopped, never its archive listed as if it were archived.
        crate::archive::format::uncommit(dir).map_err(|e| archive_error(dir, e))?;
    }
    sync_volume_writer(registry, r);
    stop_vmm(r)?;
    // The VMM removes both when it stops cleanly; after SIGKILL it could not.
    registry.clean_up(r);
    if let Some(dir) = &archive {
        crate::archive::format::remove_linked(dir).map_err(|e| archive_error(dir, e))?;
    }
    Ok(())
}

/// Stops sandbox `r`'s VMM (shutdown through its control socket, SIGKILL if it does not
/// stop within a grace period) and nothing else: its row, run directory and cgroup are
/// the caller's to remove or reuse (a rewind keeps the row).
pub fn stop_vmm(r: &SandboxRecord) -> Result<(), LifecycleError> {
    const GRACE: Duration = Duration::from_secs(10);
    // Taken before anything else: the process checked now is the one signalled later.
    // A pid that now names another process (the VMM died, the pid was reused) is dead.
    let pidfd = crate::registry::vmm_pidfd(r);
    let alive = || pidfd.is_some() && vmm_alive(r.pid);
    // Asked when something serves its control socket (whatever the answer: a VMM may
    // stop before it replies).
    let asked = ControlClient::connect(&r.control_socket())
        .map(|mut c| {
            let _ = c.shutdown();
        })
        .is_ok();
    if asked && r.pid <= 0 {
        // Known only by its socket (its starter died before recording the pid): a VMM
        // that stops cleanly removes its run directory itself.
        let deadline = Instant::now() + GRACE;
        while r.run_dir.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    // A VMM that was asked gets time to stop cleanly; one that could not be asked is
    // killed at once.
    let deadline = Instant::now() + if asked { GRACE } else { Duration::ZERO };
    while alive() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
    if let (true, Some(fd)) = (alive(), &pidfd) {
        let _ = crate::registry::pidfd_signal(fd, libc::SIGKILL);
        let deadline = Instant::now() + Duration::from_secs(5);
        while alive() {
            if Instant::now() > deadline {
                return Err(LifecycleError::Unkillable { id: r.id.clone(), pid: r.pid, waited: GRACE });
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    Ok(())
}

/// How long a volume writer's guest gets to flush before it is stopped.
const SYNC_GRACE: Duration = Duration::from_secs(10);

/// Asks the guest of a sandbox that writes a volume to flush its dirty pages first, so
/// what it wrote before the kill is on the volume (bounded: a guest that does not
/// answer is stopped anyway, keeping what it had flushed).
fn sync_volume_writer(registry: &Registry, r: &SandboxRecord) {
    let Some(store) = registry.store_root() else { return };
    if !r.disks.iter().any(|d| crate::volumes::is_writer_dir(store, &d.dir, &r.id)) {
        return;
    }
    // Bounded by the agent's silence: a `sync` answers only once it is done.
    let client = forkvm_proto::AgentClient::vsock_uds_within(r.vsock(), crate::guest::AGENT_PORT, SYNC_GRACE);
    if let Err(e) = client.sync() {
        tracing::warn!(id = %r.id, error = %e, "a volume writer's guest did not sync before its kill (within {SYNC_GRACE:?})");
    }
}
