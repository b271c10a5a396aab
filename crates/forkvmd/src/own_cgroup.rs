//! The daemon and its spawner each move into a cgroup of their own as they start
//! (`forkvm/daemon`, `forkvm/spawner`: [`forkvm_vmm::host::cgroup::Service`]), beside
//! the sandboxes' groups and weighted above them.

use forkvm_vmm::host::cgroup::{CgroupRoot, Service};

/// Moves this process into `service`'s group; where that cannot be done (no cgroup, not
/// root) it stays where it is, and says why.
pub fn join(service: Service) {
    let joined = CgroupRoot::detected().and_then(|root| root.join_service(service));
    match joined {
        Ok(dir) => tracing::debug!(group = %dir.display(), "the {} runs in its own cgroup", service.name()),
        Err(e) => tracing::warn!(error = %e, "the {} stays in the cgroup it was started in", service.name()),
    }
}
