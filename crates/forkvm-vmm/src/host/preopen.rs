//! What a VMM opens while it is still root, for after it has become its sandbox's uid
//! (`forkvm_snapshot::preopened` finds them again by path): its disks' base images and
//! the tag's sealed layers they stack on (root's files in the store), a lazily restored
//! disk's vault snapshot and playbook (`devices::virtio::blk::lazy::preopen`), a cold
//! boot's kernel and initrd, and the KVM device node (root's, for a fork of the running VM to
//! build its own). Its own run directory (writable tops, sockets, the console log) is
//! its uid's and is opened as usual.
//!
//! Nothing is offered that the VMM's devices do not name, so a VMM holds no more of the
//! store than a VMM that could still open files would use.

use crate::builder::Payload;
use crate::devices::attach::DeviceConfig;
use forkvm_snapshot::layered_disk::{BITMAP_FILE, DATA_FILE};
use forkvm_snapshot::preopened::offer;
use std::path::Path;

/// Offers the files `devices` read (see the module doc); `payload`'s kernel and initrd
/// for a cold boot; `kvm`, the process's KVM descriptor. A file that cannot be opened is
/// left out: the device that needs it fails later with its own error.
pub fn offer_for(devices: &DeviceConfig, payload: Option<&Payload>, kvm: Option<&kvm_ioctls::Kvm>) {
    let read = |path: &Path| offer_file(path, false);
    for b in &devices.blocks {
        match &b.layers {
            Some(l) => {
                read(&b.path);
                if let Some(source) = &l.lazy {
                    crate::devices::virtio::blk::lazy::preopen(source);
                }
                for dir in l.sealed.iter().filter(|d| !d.starts_with(&l.dir)) {
                    read(&dir.join(DATA_FILE));
                    read(&dir.join(BITMAP_FILE));
                }
            }
            None => offer_file(&b.path, !b.read_only),
        }
    }
    if let Some(Payload::Linux { kernel, initrd, .. }) = payload {
        read(kernel);
        if let Some(i) = initrd {
            read(i);
        }
    }
    if let Some(kvm) = kvm {
        use std::os::fd::{AsRawFd, BorrowedFd};
        // SAFETY: the Kvm owns the descriptor for the duration of this borrow.
        let fd = unsafe { BorrowedFd::borrow_raw(kvm.as_raw_fd()) };
        if let Ok(own) = fd.try_clone_to_owned() {
            offer(&crate::host::kvm_device(), std::fs::File::from(own), true);
        }
    }
}

fn offer_file(path: &Path, write: bool) {
    if let Ok(f) = std::fs::OpenOptions::new().read(true).write(write).open(path) {
        offer(path, f, write);
    }
}
