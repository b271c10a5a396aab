//! Spawn N sandboxes from a snapshot: one zygote reads the snapshot once and `fork()`s a
//! VMM process per sandbox (own run directory, sockets, console log and, with a memory
//! limit, its own cgroup); each is registered, waited for, and re-identified (new id,
//! hostname, clock, entropy) before it is handed out.
//!
//! The caller must be single-threaded when it calls [`spawn`] (the zygote forks). The
//! sandboxes outlive the caller until they are killed ([`crate::lifecycle::kill`]).

use crate::registry::{Registry, RegistryError, SandboxRecord};
use crate::sandbox::{apply_identity, new_sandbox_id};
use crate::source::SpawnSource;
use crate::state::SandboxState;
use crate::template_snapshot::{wait_for_agent, AGENT_PORT};
use forkvm_proto::AgentClient;
use forkvm_vmm::host::cgroup::{CgroupError, CgroupRoot};
use forkvm_vmm::phase_timer::thread_cpu_time;
use forkvm_vmm::vmm::VmmLabels;
use forkvm_vmm::zygote::{ChildSpec, Owned, Zygote, ZygoteError};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long a spawned sandbox's agent may take to answer (emulated guest kernels).
pub const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// Most sandboxes one call spawns.
pub const MAX_SPAWN: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("spawn: n must be between 1 and {MAX_SPAWN}, got {0}")]
    Count(usize),
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error(transparent)]
    Zygote(#[from] ZygoteError),
    #[error("memory limit: {0}")]
    Cgroup(#[from] CgroupError),
    #[error("sandbox {id} (pid {pid}) {}; its console said: {console}", if *exited { "stopped before its agent answered" } else { "did not answer in time" })]
    NotReady { id: String, pid: i32, exited: bool, console: String },
    #[error("sandbox {id}: applying its identity: {source}")]
    Identity { id: String, source: forkvm_proto::ClientError },
    #[error("a readiness worker thread panicked")]
    Worker,
}

impl SpawnError {
    pub fn code(&self) -> forkvm_api::ErrorCode {
        match self {
            SpawnError::Count(_) => forkvm_api::ErrorCode::BadRequest,
            SpawnError::Registry(e) => e.code(),
            _ => forkvm_api::ErrorCode::Internal,
        }
    }
}

/// How sandboxes are spawned.
#[derive(Debug, Clone, Default)]
pub struct SpawnOptions {
    /// Memory limit of each sandbox's VMM process (cgroup v1 or v2).
    pub memory_limit_bytes: Option<u64>,
}

/// A running, re-identified sandbox and a client for its agent.
#[derive(Debug)]
pub struct SpawnedSandbox {
    pub record: SandboxRecord,
    pub client: AgentClient<UnixStream>,
    /// From the start of the call to this sandbox's identity being applied.
    pub ready_ms: f64,
}

/// What a spawn took, besides the sandboxes.
#[derive(Debug, Clone, Default)]
pub struct SpawnTimings {
    /// Reading the snapshot once (the zygote).
    pub prepare_ms: f64,
    /// Forking every VMM process (wall time of the zygote's loop; sandboxes that already
    /// run compete with it for the CPUs).
    pub host_spawn_ms: f64,
    /// CPU time of that loop in the zygote (the host-side work, `fork()` included).
    pub host_spawn_cpu_ms: f64,
    /// Until every sandbox answered and was re-identified.
    pub all_ready_ms: f64,
    /// Pages of the memory playbook replayed (0: none yet for this image).
    pub memory_prefetch_pages: u64,
}

/// The last lines of a console log, for error messages (its last 16 KiB only: a
/// guest decides how much it prints).
pub fn console_tail(record: &SandboxRecord) -> String {
    let tail = forkvm_vmm::devices::console_log::read_tail(&record.console(), 16 << 10);
    let text = String::from_utf8_lossy(&tail);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).rev().take(5).collect();
    lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
}

/// Creates the memory cgroup `sb-<id>` when a limit is asked for.
pub(crate) fn make_cgroup(
    root: &Option<CgroupRoot>,
    id: &str,
    limit: Option<u64>,
) -> Result<Option<String>, CgroupError> {
    match (root, limit) {
        (Some(root), Some(bytes)) => {
            let name = format!("sb-{id}");
            root.create(&name, bytes)?;
            Ok(Some(name))
        }
        _ => Ok(None),
    }
}

/// Threads that wait for agents and apply identities in parallel (the guests boot
/// concurrently; each identity costs a vsock round trip through the guest kernel).
const READY_WORKERS: usize = 16;

/// Waits for one pending sandbox's agent and re-identifies it.
fn make_ready(record: &SandboxRecord, started: Instant, timeout: Duration) -> Result<SpawnedSandbox, SpawnError> {
    let client = AgentClient::vsock_uds(record.vsock(), AGENT_PORT);
    let pid = record.pid;
    let gone = || (!crate::registry::vmm_alive(pid)).then(|| "exited".to_string());
    if let Err(why) = wait_for_agent(&record.vsock(), timeout, &gone) {
        return Err(SpawnError::NotReady {
            id: record.id.clone(),
            pid,
            exited: why.is_some(),
            console: console_tail(record),
        });
    }
    // Bounded and retried for the same reason as the readiness ping: a connection made
    // before the guest processed its transport reset is dropped silently. Applying the
    // identity twice is harmless (the second wins).
    let bounded = AgentClient::vsock_uds_within(record.vsock(), AGENT_PORT, crate::template_snapshot::PING_LIMIT);
    let mut attempt = 0;
    loop {
        attempt += 1;
        match apply_identity(&bounded, &record.id) {
            Ok(()) => break,
            Err(e) if attempt < 3 && !matches!(e, forkvm_proto::ClientError::Agent(_)) => {
                tracing::warn!(id = %record.id, %e, "applying the identity failed; retrying");
            }
            Err(source) => return Err(SpawnError::Identity { id: record.id.clone(), source }),
        }
    }
    Ok(SpawnedSandbox { record: record.clone(), client, ready_ms: started.elapsed().as_secs_f64() * 1e3 })
}

/// Waits for every started sandbox's agent and re-identifies it, in parallel. On
/// failure, every sandbox of the batch is killed: a spawn gives all of them or none.
/// Needs no single-threaded caller.
pub fn finish(
    registry: &Registry,
    pending: Vec<SandboxRecord>,
    started: Instant,
) -> Result<Vec<SpawnedSandbox>, SpawnError> {
    finish_within(registry, pending, started, READY_TIMEOUT)
}

/// [`finish`] with another limit on each agent's first answer (a cold boot needs more).
pub fn finish_within(
    registry: &Registry,
    pending: Vec<SandboxRecord>,
    started: Instant,
    timeout: Duration,
) -> Result<Vec<SpawnedSandbox>, SpawnError> {
    let results = crate::parallel::map(&pending, READY_WORKERS, |r| make_ready(r, started, timeout));
    let mut out = Vec::new();
    let mut failure = None;
    for r in results {
        match r {
            Some(Ok(s)) => out.push(s),
            Some(Err(e)) => {
                failure.get_or_insert(e);
            }
            None => {
                failure.get_or_insert(SpawnError::Worker);
            }
        }
    }
    if failure.is_none() {
        let ids: Vec<&str> = out.iter().map(|s: &SpawnedSandbox| s.record.id.as_str()).collect();
        if let Err(e) = registry.mark_ready(&ids) {
            failure = Some(e.into());
        }
    }
    if let Some(e) = failure {
        for r in &pending {
            let _ = crate::lifecycle::kill_record(registry, r);
        }
        return Err(e);
    }
    Ok(out)
}

/// The VMMs of a spawn, started (processes forked, registered) but not yet answering.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct StartedVmms {
    pub records: Vec<SandboxRecord>,
    /// Reading the snapshot once (the zygote).
    pub prepare_ms: f64,
    /// Wall time of the fork loop.
    pub host_spawn_ms: f64,
    /// CPU time of the fork loop.
    pub host_spawn_cpu_ms: f64,
    /// The source image's memory playbook (`crate::memory_playbook`), replayed if it
    /// existed; [`learn_memory`] records into it.
    #[serde(default)]
    pub memory_playbook: Option<PathBuf>,
    /// Its pages replayed (0: none).
    #[serde(default)]
    pub memory_prefetch_pages: u64,
}

/// Starts one VMM per id from `source` (run directory, optional cgroup, forked from this
/// process as the zygote) and registers them; they are not yet answering. On failure
/// every VMM already started is killed. The caller must be single-threaded (the module
/// doc); the daemon calls this in its spawner process.
pub fn start_vmms(
    registry: &Registry,
    source: &SpawnSource,
    ids: &[String],
    opts: &SpawnOptions,
) -> Result<StartedVmms, SpawnError> {
    if ids.is_empty() || ids.len() > MAX_SPAWN {
        return Err(SpawnError::Count(ids.len()));
    }
    let started = Instant::now();
    let mut zygote = Zygote::with_memory(&source.dir, source.memory.as_deref())?;
    let image = source.memory.clone().unwrap_or_else(|| source.dir.join(forkvm_snapshot::MEMORY_IMG));
    let memory_playbook = crate::memory_playbook::playbook_path(&image);
    let memory_prefetch_pages = match &memory_playbook {
        Some(p) if crate::memory_playbook::replay_enabled() => {
            crate::memory_playbook::replay(&mut zygote, p, opts.memory_limit_bytes)
        }
        _ => 0,
    };
    let cgroups = opts.memory_limit_bytes.map(|_| CgroupRoot::detect()).transpose()?;
    let prepare_ms = started.elapsed().as_secs_f64() * 1e3;
    let forking = Instant::now();
    let forking_cpu = thread_cpu_time();
    let origin = crate::registry::Origin {
        template: source.template().map(String::from),
        source_tag: source.tag.clone(),
        forked_from: None,
        memory_limit_bytes: opts.memory_limit_bytes,
    };
    let mut records: Vec<SandboxRecord> =
        ids.iter().map(|id| registry.new_record(id, origin.clone())).collect::<Result<_, _>>()?;
    // Rows first (one transaction): a crash from here on leaves `starting` rows whose
    // owner is gone, which the sweep settles.
    registry.begin(&records.iter().collect::<Vec<_>>(), None)?;
    let mut started_vmms = 0;
    let forked = records.iter_mut().try_for_each(|record| -> Result<(), SpawnError> {
        let id = record.id.clone();
        let run_dir = registry.create_run_dir(&id)?;
        let cgroup = make_cgroup(&cgroups, &id, opts.memory_limit_bytes)?;
        record.cgroup.clone_from(&cgroup);
        let spec = ChildSpec {
            socket: Some(record.control_socket()),
            console_log: Some(record.console()),
            console_stream: None,
            detach: true,
            devices: source.devices(&record.vsock(), &record.disk_dir()),
            labels: VmmLabels { sandbox_id: Some(id.clone()), template: record.template.clone() },
            owned: Owned { run_dir: Some(run_dir), cgroup },
        };
        record.disks = crate::registry::recorded_disks(&spec.devices);
        record.pid = zygote.spawn(spec)?;
        registry.note_started(record);
        started_vmms += 1;
        Ok(())
    });
    // One transaction for every child.
    let written = forked.and_then(|()| Ok(registry.write_all(&records.iter().collect::<Vec<_>>())?));
    if let Err(e) = written {
        // All or nothing: the VMMs started so far are stopped, every row goes.
        for (i, r) in records.iter().enumerate() {
            if i < started_vmms {
                let _ = crate::lifecycle::kill_record(registry, r);
            } else {
                registry.clean_up(r);
            }
            let _ = registry.remove_if(&r.id, &[SandboxState::Starting]);
        }
        return Err(e);
    }
    Ok(StartedVmms {
        records,
        prepare_ms,
        host_spawn_ms: forking.elapsed().as_secs_f64() * 1e3,
        host_spawn_cpu_ms: (thread_cpu_time() - forking_cpu).as_secs_f64() * 1e3,
        memory_playbook,
        memory_prefetch_pages,
    })
}

/// Teaches the spawn's memory playbook what its first ready sandbox touched (one per
/// spawn: the children of one image touch the same pages), now and again after its
/// first call (`memory_playbook::learn_after_first_call`). Best effort: a failure is
/// logged, the sandboxes stand.
pub fn learn_memory(playbook: Option<&Path>, ready: &[SpawnedSandbox]) {
    let (Some(path), Some(first)) = (playbook, ready.first()) else { return };
    if let Err(e) = crate::memory_playbook::record(&first.record, path) {
        tracing::warn!(sandbox = %first.record.id, error = %e, "recording the memory playbook failed");
    }
    if let Err(e) = crate::memory_playbook::arm_first_call(&first.record, path) {
        tracing::warn!(sandbox = %first.record.id, error = %e, "arming the memory playbook's first-call recording failed");
    }
}

/// Spawns `n` sandboxes from `source` (see the module doc): [`start_vmms`], then
/// [`finish`].
pub fn spawn(
    registry: &Registry,
    source: &SpawnSource,
    n: usize,
    opts: &SpawnOptions,
) -> Result<(Vec<SpawnedSandbox>, SpawnTimings), SpawnError> {
    if n == 0 || n > MAX_SPAWN {
        return Err(SpawnError::Count(n));
    }
    let started = Instant::now();
    let ids: Vec<String> = (0..n).map(|_| new_sandbox_id()).collect();
    let vmms = start_vmms(registry, source, &ids, opts)?;
    let sandboxes = finish(registry, vmms.records, started)?;
    let all_ready_ms = started.elapsed().as_secs_f64() * 1e3;
    learn_memory(vmms.memory_playbook.as_deref(), &sandboxes);
    let timings = SpawnTimings {
        prepare_ms: vmms.prepare_ms,
        host_spawn_ms: vmms.host_spawn_ms,
        host_spawn_cpu_ms: vmms.host_spawn_cpu_ms,
        all_ready_ms,
        memory_prefetch_pages: vmms.memory_prefetch_pages,
    };
    Ok((sandboxes, timings))
}
