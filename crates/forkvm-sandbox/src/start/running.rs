//! Children of a running sandbox: its own VMM forks them (no disk round trip; the source
//! pauses for the fork only). Each child gets its own run directory and cgroup from the
//! [`Batch`], the source's disks linked into its own directory, and is then made ready
//! like any other start. The children are born in their source's cgroup and moved into
//! their own from here, once the source reported their pids: until then (the few
//! milliseconds of the call) what they allocate is charged to their source.

use super::{new_sandbox_id, Batch, SpawnOptions, VmmUids};
use crate::ready::{finish, SpawnedSandbox};
use crate::registry::{Origin, RecordedDisk, Registry, SandboxRecord};
use crate::verbs::{call, check_ready, LifecycleError};
use forkvm_vmm::vmm::{ForkChild, ForkReport, VmmLabels};
use std::time::Instant;

/// Forks running sandbox `id` into `n` new sandboxes; each is registered and
/// re-identified. Returns them and the source's pause window.
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
    let (source, _) = check_ready(registry, id)?;
    let started = Instant::now();
    let origin = Origin { forked_from: Some(source.id.clone()), ..Origin::of(&source) };
    // The children keep their source's limits, but for those asked anew.
    let opts = SpawnOptions::for_fork_of(&source, *opts);
    // Born from the source's VMM, under its uid.
    let mut batch = Batch::begin(registry, ids, origin, &opts, VmmUids::Source(source.uid))?;
    let rate_limits = batch.rate_limits();
    let mut children: Vec<ForkChild> =
        batch.records_mut().iter_mut().map(|r| fork_child(&source, r, rate_limits)).collect();
    super::inherited_layers::link_inherited_layers(&source, batch.records()).map_err(super::SpawnError::from)?;
    // A source with a network device: each child gets a namespace and tap of its own
    // (sent to the source's VMM with the request; this process keeps no copy after).
    let status = call(&source, |c| c.status())?;
    let mut slots = Vec::new();
    if status.devices.iter().any(|k| k == "net") {
        for child in &mut children {
            let slot = crate::network::pool::take().map_err(super::SpawnError::from)?;
            child.tap = Some(slot.tap_source());
            slots.push(slot);
        }
    }
    let report: ForkReport = call(&source, |c| c.fork(children))?;
    // The source numbers its children in its jail's pid namespace; we need ours.
    let host_pids = forkvm_vmm::host::jail::host_pids_of_children(source.pid, &report.pids);
    if let Some(lost) = host_pids.iter().position(Option::is_none) {
        // The batch stops the children before `lost` as it unwinds; those after it are
        // stopped here (just forked, still the source's children: their pids are theirs).
        for (i, pid) in host_pids.iter().enumerate() {
            match pid {
                Some(pid) if i < lost => batch.started(i, *pid),
                // SAFETY: kill with a pid and a signal number; no memory is passed.
                Some(pid) => unsafe {
                    libc::kill(*pid, libc::SIGKILL);
                },
                None => {}
            }
        }
        return Err(LifecycleError::ForkedChildLost {
            source_id: source.id.clone(),
            index: lost,
            ns_pid: report.pids[lost],
        });
    }
    for (i, pid) in host_pids.into_iter().flatten().enumerate() {
        batch.started(i, pid);
    }
    drop(slots);
    // Born in the source's group; a VMM writes no cgroup file, so each is moved from here.
    for i in 0..batch.records().len() {
        batch.move_into_group(i)?;
    }
    let pending = batch.commit()?;
    let sandboxes = finish(registry, pending, started)?;
    Ok((sandboxes, report.pause_ms))
}

/// What the source's VMM needs to fork child `r`; notes in `r` the source's disks, in
/// the child's own directory (where the source's layers get their `inherited-*` names:
/// `inherited_layers`).
fn fork_child(
    source: &SandboxRecord,
    r: &mut SandboxRecord,
    rate_limits: forkvm_vmm::devices::attach::RateLimits,
) -> ForkChild {
    r.disks = source
        .disks
        .iter()
        .map(|d| RecordedDisk { dir: r.disk_dir().join(d.dir.file_name().unwrap_or_default()), ..d.clone() })
        .collect();
    ForkChild {
        socket: r.control_socket(),
        console_log: Some(r.console()),
        vsock_uds: Some(r.vsock()),
        labels: VmmLabels { sandbox_id: Some(r.id.clone()), template: source.template.clone() },
        disk_dir: Some(r.disk_dir()),
        run_dir: Some(r.run_dir.clone()),
        rate_limits: Some(rate_limits),
        tap: None,
    }
}
