//! Sandboxes from a snapshot: one zygote reads the snapshot once (and replays the image's
//! memory playbook into it) and `fork()`s a VMM process per sandbox; each is registered,
//! waited for, and re-identified (new id, hostname, clock, entropy) before it is handed
//! out.
//!
//! The caller must be single-threaded when it calls [`spawn`] or [`start_vmms`] (the
//! zygote forks). The sandboxes outlive the caller until they are killed
//! ([`crate::verbs::kill`]).

use super::memory_server::{self, MemoryServerError};
use super::{ms_since, new_sandbox_id, Batch, SpawnError, SpawnOptions, VmmUids, MAX_SPAWN};
use crate::ready::{finish, learn_memory, SpawnedSandbox};
use crate::registry::{Origin, Registry, SandboxRecord};
use crate::source::SpawnSource;
use crate::volumes::{VolumeError, VolumeMount, Volumes};
use forkvm_vmm::phase_timer::thread_cpu_time;
use forkvm_vmm::zygote::Zygote;
use std::path::PathBuf;
use std::time::Instant;

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
    /// The slot serial of each volume put in, in the order asked (the same in every child).
    #[serde(default)]
    pub volume_slots: Vec<String>,
}

/// Starts one VMM per id from `source` (forked from this process as the zygote) and
/// registers them; they are not yet answering. All or nothing ([`Batch`]). The caller
/// must be single-threaded (the module doc); the daemon calls this in its spawner
/// process.
pub fn start_vmms(
    registry: &Registry,
    source: &SpawnSource,
    ids: &[String],
    opts: &SpawnOptions,
) -> Result<StartedVmms, SpawnError> {
    start_vmms_with(registry, source, ids, opts, &[])
}

/// [`start_vmms`] with volumes `volumes` put into each child's volume slots (leased
/// once the rows exist: a writer's lease lives as long as its sandbox's row);
/// [`StartedVmms::volume_slots`] says which slots.
pub fn start_vmms_with(
    registry: &Registry,
    source: &SpawnSource,
    ids: &[String],
    opts: &SpawnOptions,
    volumes: &[VolumeMount],
) -> Result<StartedVmms, SpawnError> {
    if ids.is_empty() || ids.len() > MAX_SPAWN {
        return Err(SpawnError::Count(ids.len()));
    }
    // The snapshot's defaults (a template tag's), but for what the spawn asks.
    let opts = &SpawnOptions::of_snapshot(&source.meta).overridden_by(*opts);
    let started = Instant::now();
    let mut zygote = match source.lazy_memory {
        true => Zygote::lazy(&source.dir)?,
        false => Zygote::with_memory(&source.dir, source.memory.as_deref())?,
    };
    let lazy_from = match (source.lazy_memory, &source.tag, registry.store_root()) {
        (false, _, _) => None,
        (true, Some(tag), Some(root)) => Some((root.to_path_buf(), tag.clone())),
        (true, None, _) => return Err(MemoryServerError::NoTag("no tag").into()),
        (true, _, None) => return Err(MemoryServerError::NoTag("no store").into()),
    };
    let image = source.memory.clone().unwrap_or_else(|| source.dir.join(forkvm_snapshot::MEMORY_IMG));
    let memory_playbook = crate::memory_playbook::playbook_path(&image);
    let memory_prefetch_pages = match &memory_playbook {
        Some(p) if crate::memory_playbook::replay_enabled() => {
            crate::memory_playbook::replay(&mut zygote, p, opts.memory_limit_bytes)
        }
        _ => 0,
    };
    let prepare_ms = ms_since(started);
    let forking = Instant::now();
    let forking_cpu = thread_cpu_time();
    let origin = Origin {
        template: source.template().map(String::from),
        source_tag: source.tag.clone(),
        vcpus: Some(source.meta.vcpu_count),
        ..Origin::default()
    };
    let mut batch = Batch::begin(registry, ids, origin, opts, VmmUids::Own)?;
    let leased = match (volumes, registry.store_root()) {
        ([], _) => Vec::new(),
        (_, None) => return Err(VolumeError::Attach("volumes need a store (this registry has none)".into()).into()),
        (_, Some(root)) => Volumes::of(&forkvm_snapshot::Store::open(root)).lease(registry, volumes, ids)?,
    };
    let mut volume_slots = Vec::new();
    for i in 0..ids.len() {
        let r = &batch.records()[i];
        // Its own network namespace; its VMM's tap alone keeps it once spawned.
        let net = if source.has_network() { Some(crate::network::pool::take()?) } else { None };
        let mut devices =
            source.devices(&r.vsock(), &r.disk_dir(), net.as_ref().map(crate::network::NetSlot::tap_source));
        volume_slots = crate::volumes::attach::apply(&leased, &mut devices, &r.id, r.uid)?;
        let mut spec = batch.vmm_spec(i, devices)?;
        if let Some((root, tag)) = &lazy_from {
            spec.memory_source = Some(memory_server::start(root, tag, &batch.records()[i].console())?);
        }
        let pid = zygote.spawn(spec)?;
        // Its DNS and policy are served once it runs, by whoever makes it ready
        // (`ready::finish`), from its VMM's tap.
        drop(net);
        batch.started(i, pid);
    }
    let records = batch.commit()?;
    Ok(StartedVmms {
        records,
        prepare_ms,
        host_spawn_ms: ms_since(forking),
        host_spawn_cpu_ms: (thread_cpu_time() - forking_cpu).as_secs_f64() * 1e3,
        memory_playbook,
        memory_prefetch_pages,
        volume_slots,
    })
}

/// Spawns `n` sandboxes from `source` (see the module doc): [`start_vmms`], then
/// [`finish`].
pub fn spawn(
    registry: &Registry,
    source: &SpawnSource,
    n: usize,
    opts: &SpawnOptions,
) -> Result<(Vec<SpawnedSandbox>, SpawnTimings), SpawnError> {
    spawn_with(registry, source, n, opts, &[])
}

/// [`spawn`] with volumes attached (`volumes` checked, writers' leases taken, the
/// volumes put into slots and mounted in each guest). All or nothing: a mount that
/// fails kills every sandbox of the call.
pub fn spawn_with(
    registry: &Registry,
    source: &SpawnSource,
    n: usize,
    opts: &SpawnOptions,
    volumes: &[VolumeMount],
) -> Result<(Vec<SpawnedSandbox>, SpawnTimings), SpawnError> {
    if n == 0 || n > MAX_SPAWN {
        return Err(SpawnError::Count(n));
    }
    let started = Instant::now();
    let ids: Vec<String> = (0..n).map(|_| new_sandbox_id()).collect();
    let vmms = start_vmms_with(registry, source, &ids, opts, volumes)?;
    let sandboxes = finish(registry, vmms.records, started)?;
    crate::volumes::attach::mount_in_all(registry, &sandboxes, volumes, &vmms.volume_slots)?;
    let all_ready_ms = ms_since(started);
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
