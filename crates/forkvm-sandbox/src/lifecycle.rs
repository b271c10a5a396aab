//! Verbs on running sandboxes, through their VMMs' control sockets: branch (snapshot
//! under a new tag, full or live), fork a running sandbox into N new ones, kill.
//!
//! Each verb checks state first: an unknown id is `not_found`; a tag collision or a
//! `writing` source is `conflict`; the VMM's own refusals keep their code (`disk_full`,
//! ...). See `docs/branching.md` for the failure-mode table.

use crate::registry::{now_unix_ms, vmm_alive, Registry, RegistryError, SandboxRecord};
use crate::sandbox::new_sandbox_id;
use crate::spawn::{finish, make_cgroup, SpawnError, SpawnOptions, SpawnedSandbox};
use crate::state::SandboxState;
use crate::template_snapshot::AGENT_PORT;
use forkvm_api::ErrorCode;
use forkvm_proto::AgentClient;
use forkvm_snapshot::Store;
use forkvm_vmm::control::{ControlClient, ControlClientError};
use forkvm_vmm::host::cgroup::CgroupRoot;
use forkvm_vmm::vmm::{BranchMode, BranchReport, BranchRequest, ForkChild, ForkReport, VmmLabels};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error(transparent)]
    Store(#[from] forkvm_snapshot::StoreError),
    #[error("sandbox {id}: {source}")]
    Control { id: String, source: ControlClientError },
    #[error("sandbox {id}: removing its archive {}: {source}", dir.display())]
    RemoveArchive { id: String, dir: std::path::PathBuf, source: std::io::Error },
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    #[error("sandbox {id} is {state}: it takes calls once it runs")]
    NotReady { id: String, state: SandboxState },
    #[error("sandbox {id} (pid {pid}) did not stop within {waited:?} of shutdown and SIGKILL")]
    Unkillable { id: String, pid: i32, waited: Duration },
}

impl LifecycleError {
    /// The API code: `not_found`, `conflict`, `bad_request`, `disk_full`, `internal`.
    pub fn code(&self) -> ErrorCode {
        match self {
            LifecycleError::Registry(e) => e.code(),
            LifecycleError::Store(e) => e.code(),
            // The VMM's refusals keep their class; anything else it says is internal.
            LifecycleError::Control { source, .. } => match ControlClient::code(source) {
                Some(c @ (ErrorCode::Conflict | ErrorCode::BadRequest | ErrorCode::DiskFull)) => c,
                _ => ErrorCode::Internal,
            },
            LifecycleError::Spawn(e) => e.code(),
            LifecycleError::NotReady { .. } => ErrorCode::Conflict,
            _ => ErrorCode::Internal,
        }
    }

    /// For a conflict: the state the API reports, `writing` for a snapshot still being
    /// written, else `exists`.
    pub fn conflict_state(&self) -> &'static str {
        match self {
            LifecycleError::Store(forkvm_snapshot::StoreError::Writing { .. }) => "writing",
            LifecycleError::NotReady { state, .. } => state.as_str(),
            _ => "exists",
        }
    }
}

/// A client for the agent of running sandbox `id`. Its state is checked first: one the
/// daemon paused for idleness is resumed (as the daemon does before its own calls), one
/// still starting or being restored is refused naming its state; the call is noted as
/// activity.
pub fn agent(registry: &Registry, id: &str) -> Result<AgentClient<UnixStream>, LifecycleError> {
    let r = registry.get(id)?;
    match registry.row(id).map(|row| row.state) {
        Some(SandboxState::Paused) => {
            call(&r, |c| c.resume())?;
            registry.transition(id, &[SandboxState::Paused], SandboxState::Running, None)?;
        }
        Some(state) if state.is_starting() => return Err(LifecycleError::NotReady { id: id.to_string(), state }),
        _ => {}
    }
    let _ = registry.touch(id, now_unix_ms());
    Ok(AgentClient::vsock_uds(r.vsock(), AGENT_PORT))
}

fn control(r: &SandboxRecord) -> Result<ControlClient, LifecycleError> {
    ControlClient::connect(&r.control_socket()).map_err(|source| LifecycleError::Control { id: r.id.clone(), source })
}

/// One request to sandbox `r`'s VMM, made by `f` on its typed control client.
pub(crate) fn call<T>(
    r: &SandboxRecord,
    f: impl FnOnce(&mut ControlClient) -> Result<T, ControlClientError>,
) -> Result<T, LifecycleError> {
    f(&mut control(r)?).map_err(|source| LifecycleError::Control { id: r.id.clone(), source })
}

/// Snapshots running sandbox `id` under `tag` (default `branch-<id>-<seq>`) in `store`.
pub fn branch(
    registry: &Registry,
    store: &Store,
    id: &str,
    tag: Option<&str>,
    mode: BranchMode,
    wait: bool,
) -> Result<BranchReport, LifecycleError> {
    let snapshots = store.ensure()?;
    let report = branch_to_dir(registry, &snapshots, id, tag, mode, wait)?;
    // Counted in its row (best effort: the snapshot stands either way).
    let _ = registry.record_branch(id, &report.tag);
    Ok(report)
}

/// [`branch`] into `<dir>/<tag>` instead of the store (a staging place for a diff).
pub fn branch_to_dir(
    registry: &Registry,
    dir: &std::path::Path,
    id: &str,
    tag: Option<&str>,
    mode: BranchMode,
    wait: bool,
) -> Result<BranchReport, LifecycleError> {
    let r = registry.get(id)?;
    // The VMM checks the tag (rule, collision) before it pauses anything.
    let req =
        BranchRequest { store: dir.to_path_buf(), tag: tag.map(String::from), mode, wait, disks: Default::default() };
    call(&r, |c| c.branch(req))
}

/// Forks running sandbox `id` into `n` new sandboxes, without a disk round trip; each is
/// registered and re-identified. Returns them and the source's pause window.
pub fn fork_running(
    registry: &Registry,
    id: &str,
    n: usize,
    opts: &SpawnOptions,
) -> Result<(Vec<SpawnedSandbox>, f64), LifecycleError> {
    let ids: Vec<String> = (0..n).map(|_| new_sandbox_id()).collect();
    fork_running_as(registry, id, &ids, opts)
}

/// [`fork_running`] with the children's ids chosen by the caller (the daemon records
/// them before they exist, so a crash mid-fork can be cleaned up).
pub fn fork_running_as(
    registry: &Registry,
    id: &str,
    ids: &[String],
    opts: &SpawnOptions,
) -> Result<(Vec<SpawnedSandbox>, f64), LifecycleError> {
    if ids.is_empty() || ids.len() > crate::spawn::MAX_SPAWN {
        return Err(SpawnError::Count(ids.len()).into());
    }
    let source = registry.get(id)?;
    let started = Instant::now();
    let cgroups = opts.memory_limit_bytes.map(|_| CgroupRoot::detect()).transpose().map_err(SpawnError::from)?;
    let mut records = Vec::new();
    let mut children = Vec::new();
    for child_id in ids {
        let child_id = child_id.clone();
        let run_dir = registry.create_run_dir(&child_id)?;
        let cgroup = make_cgroup(&cgroups, &child_id, opts.memory_limit_bytes).map_err(SpawnError::from)?;
        let record = SandboxRecord {
            id: child_id.clone(),
            pid: 0,
            run_dir: run_dir.clone(),
            template: source.template.clone(),
            source_tag: source.source_tag.clone(),
            forked_from: Some(source.id.clone()),
            created_at_unix_ms: now_unix_ms(),
            memory_limit_bytes: opts.memory_limit_bytes,
            cgroup: cgroup.clone(),
            // The source's disks, in the child's own directory (where its VMM links the
            // source's own layers: `inherited-*`).
            disks: source
                .disks
                .iter()
                .map(|d| crate::registry::RecordedDisk {
                    dir: run_dir.join("disks").join(d.dir.file_name().unwrap_or_default()),
                    ..d.clone()
                })
                .collect(),
        };
        children.push(ForkChild {
            socket: record.control_socket(),
            console_log: Some(record.console()),
            vsock_uds: Some(record.vsock()),
            labels: VmmLabels { sandbox_id: Some(child_id), template: source.template.clone() },
            disk_dir: Some(record.disk_dir()),
            run_dir: Some(run_dir),
            cgroup,
        });
        records.push(record);
    }
    registry.begin(&records.iter().collect::<Vec<_>>(), None)?;
    let report: ForkReport = match call(&source, |c| c.fork(children)) {
        Ok(r) => r,
        Err(e) => {
            for r in &records {
                registry.clean_up(r);
            }
            return Err(e);
        }
    };
    let mut pending = Vec::new();
    for (mut record, pid) in records.into_iter().zip(report.pids) {
        record.pid = pid;
        registry.note_started(&record);
        pending.push(record);
    }
    // One transaction for all children; without it they could not be found: stopped.
    if let Err(e) = registry.write_all(&pending.iter().collect::<Vec<_>>()) {
        for r in &pending {
            let _ = kill_record(registry, r);
        }
        return Err(e.into());
    }
    let sandboxes = finish(registry, pending, started)?;
    Ok((sandboxes, report.pause_ms))
}

/// Stops sandbox `id`: shutdown through its control socket, SIGKILL if it does not stop;
/// its run directory and cgroup are gone afterwards.
pub fn kill(registry: &Registry, id: &str) -> Result<(), LifecycleError> {
    let r = registry.get(id)?;
    kill_record(registry, &r)
}

/// [`kill`] for a record in hand (also used to undo a failed spawn).
/// A restored sandbox's archive (its lower disk layers) goes with it.
pub fn kill_record(registry: &Registry, r: &SandboxRecord) -> Result<(), LifecycleError> {
    const GRACE: Duration = Duration::from_secs(10);
    let archive = crate::archive::linked_archive(&r.run_dir);
    // Taken before anything else: the process checked now is the one signalled later.
    // A pid that now names another process (the VMM died, the pid was reused) is dead.
    let pidfd = crate::registry::vmm_pidfd(r);
    let alive = || pidfd.is_some() && vmm_alive(r.pid);
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
    // The VMM removes both when it stops cleanly; after SIGKILL it could not.
    registry.clean_up(r);
    if let Some(dir) = &archive {
        crate::archive::format::remove_linked(dir).map_err(|e| archive_error(dir, e))?;
    }
    Ok(())
}
