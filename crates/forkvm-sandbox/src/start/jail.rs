//! Which host paths a sandbox's VMM sees in its jail (`forkvm_vmm::host::jail`), and the
//! one jail of that layout this process makes for the VMMs it starts.
//!
//! The VMM gets forkvm's own files at their usual paths — the sandboxes' run directories
//! (not the registry or the daemon's socket beside them), the snapshot store (not the
//! daemon's state directory inside it), the artefact cache, `/dev/kvm` and `/dev/null`
//! — plus, for a start from files elsewhere (a CLI given a disk image by path), the
//! directories of its devices. The keys directory is hidden if it lies inside one of
//! them. Everything else of the host is absent, cgroup files included: a VMM is moved
//! into its group by its starter and never writes one.

use crate::registry::Registry;
use forkvm_vmm::devices::attach::DeviceConfig;
use forkvm_vmm::host::jail::{Jail, JailError, JailLayout, JailNamespaces};
use std::path::Path;
use std::sync::Arc;

/// The layout for VMMs of `registry` with `devices`.
pub fn layout(registry: &Registry, devices: &DeviceConfig) -> JailLayout {
    let sandboxes = registry.root().join("sandboxes");
    let store = registry.store_root().map(Path::to_path_buf).unwrap_or_else(forkvm_snapshot::Store::default_root);
    let cache = forkvm_image::kernel::cache_dir();
    for dir in [&sandboxes, &store, &cache] {
        let _ = std::fs::create_dir_all(dir);
    }
    let kvm = std::env::var_os(forkvm_vmm::host::KVM_DEVICE_ENV).unwrap_or_else(|| "/dev/kvm".into());
    let mut l = JailLayout::new()
        .bind(&sandboxes, true)
        .bind(&store, true)
        .bind(&cache, true)
        .bind(Path::new(&kvm), true)
        .bind(Path::new("/dev/null"), true);
    for b in &devices.blocks {
        let mut paths = vec![b.path.clone()];
        if let Some(layers) = &b.layers {
            paths.push(layers.dir.clone());
            paths.extend(layers.sealed.iter().cloned());
            if let Some(lazy) = &layers.lazy {
                paths.push(lazy.vault.clone());
                paths.push(lazy.cache.clone());
                paths.extend(lazy.playbook.iter().cloned());
            }
        }
        for p in paths {
            if !l.covers(&p) {
                if let Some(parent) = p.parent() {
                    l = l.bind(parent, !b.read_only);
                }
            }
        }
    }
    if let Some(v) = &devices.vsock {
        if let Some(parent) = v.uds_path.parent().filter(|p| !l.covers(p)) {
            l = l.bind(parent, true);
        }
    }
    l.hide(&store.join("forkvmd")).hide(&crate::disk_snapshots::keys_dir())
}

/// The jail this process's VMMs of `registry` with `devices` enter, or none: turned off
/// (`--no-jail`), or this process is not root (it warns once: VMMs then run unjailed,
/// as the user they already are).
pub fn for_vmms(registry: &Registry, devices: &DeviceConfig) -> Result<Option<Arc<JailNamespaces>>, JailError> {
    if registry.jail() == Jail::Off {
        return Ok(None);
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        static WARNED: std::sync::Once = std::sync::Once::new();
        WARNED.call_once(|| {
            tracing::warn!("not root: sandbox VMMs run without their jail (namespaces and a root of their own)")
        });
        return Ok(None);
    }
    JailNamespaces::shared(&layout(registry, devices)).map(Some)
}
