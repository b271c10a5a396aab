//! The API's view of a sandbox ([`forkvm_api::SandboxInfo`]) from what the registry and
//! the store hold, so that the CLI prints the daemon's shapes without a daemon. The
//! daemon starts from these and adds what only it keeps (idle pause, TTLs, branch counts,
//! activity, disk snapshot outcomes).

use crate::registry::SandboxRecord;
use crate::state::SandboxState;
use forkvm_api::SandboxInfo;

/// A running sandbox, as its record says.
pub fn running_info(r: &SandboxRecord) -> SandboxInfo {
    let created = r.created_at_unix_ms / 1000;
    SandboxInfo {
        id: r.id.clone(),
        snapshot_tag: r.source_tag.clone(),
        netns: None,
        guest_addr: format!("unix:{}", r.vsock().display()),
        created_at_unix: created,
        pid: Some(r.pid),
        memory_limit_mib: r.memory_limit_bytes.map(|b| b >> 20),
        has_branched: false,
        last_branch_memory_path: None,
        branch_count: 0,
        state: SandboxState::Running.as_str().into(),
        template: r.template.clone(),
        forked_from: r.forked_from.clone(),
        last_active_unix: created,
        last_disk_snapshot: None,
        reason: None,
        last_activity_unix_ms: r.created_at_unix_ms,
        ttl_seconds: None,
        expires_at_unix_ms: None,
        archived_at_unix_ms: None,
    }
}

/// An archived sandbox, from the record its archive keeps: no process, no address.
pub fn archived_info(r: &SandboxRecord) -> SandboxInfo {
    SandboxInfo {
        guest_addr: String::new(),
        pid: None,
        state: SandboxState::Archived.as_str().into(),
        ..running_info(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_map_onto_the_api_view() {
        let r = SandboxRecord {
            id: "sb1".into(),
            pid: 42,
            run_dir: "/run/forkvm/sandboxes/sb1".into(),
            template: Some("python".into()),
            source_tag: Some("py".into()),
            forked_from: Some("sb0".into()),
            created_at_unix_ms: 5_500,
            memory_limit_bytes: Some(256 << 20),
            cgroup: None,
            disks: Vec::new(),
        };
        let i = running_info(&r);
        assert_eq!((i.id.as_str(), i.pid, i.state.as_str()), ("sb1", Some(42), "running"));
        assert_eq!((i.snapshot_tag.as_deref(), i.forked_from.as_deref()), (Some("py"), Some("sb0")));
        assert_eq!((i.created_at_unix, i.memory_limit_mib, i.last_activity_unix_ms), (5, Some(256), 5_500));
        assert_eq!(i.guest_addr, "unix:/run/forkvm/sandboxes/sb1/vsock.sock");
        let a = archived_info(&r);
        assert_eq!((a.pid, a.state.as_str(), a.guest_addr.as_str()), (None, "archived", ""));
    }
}
