//! The API's view of a sandbox ([`forkvm_api::SandboxInfo`]) from its registry row, so
//! that the CLI and the daemon print the same shape from the same data. The daemon adds
//! only what a running daemon alone knows (the outcome of its last disk snapshot).

use crate::registry::{vmm_runs, Registry, SandboxRecord, SandboxRow};
use crate::state::SandboxState;
use forkvm_api::SandboxInfo;
use std::collections::HashSet;

/// Sandbox `row` as the API shows it.
pub fn sandbox_info(row: &SandboxRow) -> SandboxInfo {
    let r = &row.record;
    let has_vmm = row.state != SandboxState::Archived && r.pid > 0;
    // What its group holds: what was asked, the defaults for the rest.
    let group_limits = r.cgroup.as_ref().map(|_| crate::SpawnOptions::of_record(r).limits(r.vcpus));
    SandboxInfo {
        id: r.id.clone(),
        snapshot_tag: r.source_tag.clone(),
        netns: None,
        guest_addr: if has_vmm { format!("unix:{}", r.vsock().display()) } else { String::new() },
        created_at_unix: r.created_at_unix_ms / 1000,
        pid: has_vmm.then_some(r.pid),
        memory_limit_mib: r.memory_limit_bytes.map(|b| b >> 20),
        cpu_limit_millis: group_limits.and_then(|l| l.cpu_millis),
        pids_limit: group_limits.and_then(|l| l.pids_max),
        io_limits: r.io_limits.asked(),
        has_branched: row.branch_count > 0,
        last_branch_memory_path: None,
        branch_count: row.branch_count,
        state: row.state.as_str().into(),
        template: r.template.clone(),
        forked_from: r.forked_from.clone(),
        last_active_unix: row.last_activity_unix_ms / 1000,
        last_disk_snapshot: None,
        reason: row.reason.map(|r| r.as_str().to_string()),
        last_activity_unix_ms: row.last_activity_unix_ms,
        ttl_seconds: row.ttl_seconds,
        expires_at_unix_ms: row.expires_at_unix_ms,
        archived_at_unix_ms: row.archived_at_unix_ms,
        jail: None,
        network: r.network.clone().filter(|p| !p.is_default()),
        vcpus: Some(r.vcpus),
    }
}

/// How the VMM process `pid` is confined (`SandboxInfo::jail`); None when it is gone.
pub fn vmm_jail(pid: i32) -> Option<forkvm_api::VmmJail> {
    let c = forkvm_vmm::host::confinement::Confinement::of(pid)?;
    let seccomp = match c.seccomp_filtered_threads {
        0 => "off",
        n if n == c.threads => "filter",
        _ => "partial",
    };
    Some(forkvm_api::VmmJail {
        uid: c.uid,
        gid: c.gid,
        no_capabilities: c.no_capabilities,
        no_new_privs: c.no_new_privs,
        seccomp: seccomp.into(),
        threads: c.threads as u32,
        seccomp_filtered_threads: c.seccomp_filtered_threads as u32,
        own_namespaces: c.own_namespaces,
        root: c.root,
    })
}

/// An agent's eval reply as the API returns it (`POST /v1/sandboxes/{id}/eval`, `forkvm
/// eval --json`): the value's `repr()`, or the traceback (the exception line alone when
/// there is none) with exit code 1.
pub fn eval_response(r: forkvm_proto::EvalResponse) -> forkvm_api::EvalResponse {
    let (result, error, exit_code) = match r.outcome {
        forkvm_proto::EvalOutcome::Value { value_repr } => (value_repr, None, 0),
        forkvm_proto::EvalOutcome::Exception { exception, traceback } => {
            (None, Some(if traceback.trim().is_empty() { exception } else { traceback }), 1)
        }
    };
    forkvm_api::EvalResponse { result, error, exit_code, stdout: r.stdout, stderr: r.stderr }
}

/// The rows `GET /v1/sandboxes` and `forkvm ps` list, oldest first: running and paused
/// sandboxes whose VMM lives, and archived ones (not those still starting). An archive
/// in the store without a row (made on an earlier boot: the registry lives in the run
/// root) is listed from the record it keeps, as recovery will record it.
pub fn listed(registry: &Registry) -> Vec<SandboxRow> {
    // One read of the registry: what is listed, and which ids it knows.
    let all = registry.rows();
    let known: HashSet<String> = all.iter().map(|r| r.record.id.clone()).collect();
    let mut rows: Vec<SandboxRow> = all
        .into_iter()
        .filter(|r| r.state == SandboxState::Archived || (r.state.is_live() && vmm_runs(&r.record)))
        .collect();
    if let Some(root) = registry.store_root() {
        let store = forkvm_snapshot::Store::open(root);
        for id in crate::archive::list(registry, &store).into_iter().filter(|id| !known.contains(id)) {
            let Some(record) = crate::archive::archived_record(&store, &id).filter(|r| r.id == id) else { continue };
            rows.push(SandboxRow {
                last_activity_unix_ms: record.created_at_unix_ms,
                record: SandboxRecord { pid: 0, ..record },
                state: SandboxState::Archived,
                op: None,
                reason: None,
                owner: None,
                ttl_seconds: None,
                expires_at_unix_ms: None,
                archived_at_unix_ms: None,
                branch_count: 0,
                last_branch_tag: None,
            });
        }
    }
    rows.sort_by(|a, b| (a.record.created_at_unix_ms, a.id()).cmp(&(b.record.created_at_unix_ms, b.id())));
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(state: SandboxState) -> SandboxRow {
        SandboxRow {
            record: SandboxRecord {
                id: "sb1".into(),
                pid: 42,
                run_dir: "/run/forkvm/sandboxes/sb1".into(),
                template: Some("python".into()),
                source_tag: Some("py".into()),
                forked_from: Some("sb0".into()),
                created_at_unix_ms: 5_500,
                memory_limit_bytes: Some(256 << 20),
                cpu_millis: Some(500),
                pids_max: None,
                io_limits: Default::default(),
                cgroup: Some("sb-sb1".into()),
                disks: Vec::new(),
                uid: None,
                network: None,
                vcpus: 1,
            },
            state,
            op: None,
            reason: None,
            owner: None,
            last_activity_unix_ms: 7_250,
            ttl_seconds: Some(60),
            expires_at_unix_ms: Some(67_250),
            archived_at_unix_ms: None,
            branch_count: 2,
            last_branch_tag: Some("t".into()),
        }
    }

    #[test]
    fn rows_map_onto_the_api_view() {
        let i = sandbox_info(&row(SandboxState::Running));
        assert_eq!((i.id.as_str(), i.pid, i.state.as_str()), ("sb1", Some(42), "running"));
        assert_eq!((i.snapshot_tag.as_deref(), i.forked_from.as_deref()), (Some("py"), Some("sb0")));
        assert_eq!((i.created_at_unix, i.memory_limit_mib, i.last_activity_unix_ms), (5, Some(256), 7_250));
        assert_eq!((i.last_active_unix, i.branch_count, i.has_branched), (7, 2, true));
        // The limits its cgroup holds: the CPU asked for, the default tasks limit.
        assert_eq!((i.cpu_limit_millis, i.pids_limit), (Some(500), Some(crate::start::DEFAULT_PIDS_MAX)));
        let without_group = SandboxRow {
            record: SandboxRecord { cgroup: None, ..row(SandboxState::Running).record },
            ..row(SandboxState::Running)
        };
        assert_eq!(
            (sandbox_info(&without_group).cpu_limit_millis, sandbox_info(&without_group).pids_limit),
            (None, None)
        );
        assert_eq!((i.ttl_seconds, i.expires_at_unix_ms), (Some(60), Some(67_250)));
        assert_eq!(i.guest_addr, "unix:/run/forkvm/sandboxes/sb1/vsock.sock");
        let p = sandbox_info(&SandboxRow { reason: Some(crate::StateReason::Idle), ..row(SandboxState::Paused) });
        assert_eq!((p.state.as_str(), p.reason.as_deref(), p.pid), ("paused", Some("idle"), Some(42)));
        let a = sandbox_info(&SandboxRow { archived_at_unix_ms: Some(9_000), ..row(SandboxState::Archived) });
        assert_eq!((a.pid, a.state.as_str(), a.guest_addr.as_str()), (None, "archived", ""));
        assert_eq!(a.archived_at_unix_ms, Some(9_000));
    }
}
