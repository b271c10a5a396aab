//! The [`VirtioDevice`] glue of virtio-vsock.
//!
//! [`Vsock::new`] binds the host listener at once (so a bad path fails at build time);
//! the backend thread starts on the first `activate` and lives until the device is
//! dropped, which also removes the listening socket file. `queue_notify` (vCPU thread)
//! only kicks the backend, which does all queue processing (see [`super::backend`]).
//!
//! What the VMM builder wires: the guest CID (config space, also the `src_cid` every
//! guest packet must carry), the host socket path, and, through the transport, the
//! memory, queues and used-buffer interrupt of [`ActivateContext`].

use super::backend::{lock, ActiveQueues, Backend, Shared};
use super::metrics::VsockMetrics;
use super::muxer::Muxer;
use super::{VsockError, NUM_QUEUES, QUEUE_SIZE};
use crate::devices::virtio::device::{TYPE_VSOCK, VIRTIO_F_VERSION_1};
use crate::devices::virtio::{ActivateContext, ActivateError, VirtioDevice, VirtioDeviceState};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use vmm_sys_util::eventfd::EventFd;

const QUEUE_SIZES: [u16; NUM_QUEUES] = [QUEUE_SIZE; NUM_QUEUES];

/// A virtio-vsock device backed by host Unix sockets.
#[derive(Debug)]
pub struct Vsock {
    guest_cid: u64,
    acked_features: u64,
    uds_path: PathBuf,
    shared: Arc<Mutex<Shared>>,
    kick: Arc<EventFd>,
    backend: Option<Backend>,
    metrics: Arc<VsockMetrics>,
    restored: bool,
}

/// Removes a socket file left behind at `path` by a dead process (never a regular file).
fn remove_stale_socket(path: &Path) -> Result<(), VsockError> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(path)
            .map_err(|source| VsockError::RemoveStaleSocket { path: path.to_path_buf(), source }),
        _ => Ok(()),
    }
}

impl Vsock {
    /// A device for a guest with CID `guest_cid` (3..=0xffff_fffe), listening for host
    /// clients on the Unix socket `uds_path` (a stale socket file there is replaced).
    pub fn new(guest_cid: u64, uds_path: PathBuf) -> Result<Vsock, VsockError> {
        if !(3..=0xffff_fffe).contains(&guest_cid) {
            return Err(VsockError::InvalidCid(guest_cid));
        }
        remove_stale_socket(&uds_path)?;
        let bind_err = |source| VsockError::BindListener { path: uds_path.clone(), source };
        let listener = UnixListener::bind(&uds_path).map_err(bind_err)?;
        listener.set_nonblocking(true).map_err(bind_err)?;
        let kick = EventFd::new(libc::EFD_NONBLOCK).map_err(VsockError::CreateEventFd)?;
        let metrics = Arc::new(VsockMetrics::default());
        let muxer = Muxer::new(guest_cid, uds_path.clone(), metrics.clone());
        let shared = Arc::new(Mutex::new(Shared::new(listener, muxer, metrics.clone())));
        let kick = Arc::new(kick);
        // Started here, by whoever builds the VM, rather than at activation, which runs
        // on a vCPU thread: a thread inherits its creator's seccomp filter, and a vCPU's
        // allows no socket work. It waits for the first activation before it serves.
        let backend = Backend::spawn(shared.clone(), kick.clone())?;
        Ok(Vsock {
            guest_cid,
            acked_features: 0,
            uds_path,
            shared,
            kick,
            backend: Some(backend),
            metrics,
            restored: false,
        })
    }

    pub fn guest_cid(&self) -> u64 {
        self.guest_cid
    }

    pub fn acked_features(&self) -> u64 {
        self.acked_features
    }

    pub fn uds_path(&self) -> &Path {
        &self.uds_path
    }

    /// The features this device offers.
    pub fn offered_features(&self) -> u64 {
        VIRTIO_F_VERSION_1
    }

    /// The device's counters.
    pub fn metrics(&self) -> Arc<VsockMetrics> {
        self.metrics.clone()
    }

    /// Number of open streams.
    pub fn connection_count(&self) -> usize {
        lock(&self.shared).muxer.len()
    }

    /// Marks the device as restored from a snapshot with `acked_features`: the next
    /// activation posts a transport-reset event.
    pub(super) fn set_restored(&mut self, acked_features: u64) {
        self.acked_features = acked_features;
        self.restored = true;
    }

    #[cfg(test)]
    pub(super) fn shared_for_tests(&self) -> Arc<Mutex<Shared>> {
        self.shared.clone()
    }

    fn kick_backend(&self) {
        if let Err(err) = self.kick.write(1) {
            tracing::error!(device = "vsock", "waking the backend: {err}");
        }
    }
}

impl VirtioDevice for Vsock {
    fn device_type(&self) -> u32 {
        TYPE_VSOCK
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &QUEUE_SIZES
    }

    fn device_features(&self) -> u64 {
        self.offered_features()
    }

    fn set_acked_features(&mut self, features: u64) {
        self.acked_features = features & self.offered_features();
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        let config = self.guest_cid.to_le_bytes();
        let start = offset.min(config.len() as u64) as usize;
        let n = data.len().min(config.len() - start);
        data[..n].copy_from_slice(&config[start..start + n]);
        data[n..].fill(0);
    }

    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}

    fn activate(&mut self, ctx: ActivateContext, queues: Vec<virtio_queue::Queue>) -> Result<(), ActivateError> {
        let [rx, tx, event]: [virtio_queue::Queue; NUM_QUEUES] = queues.try_into().map_err(|q: Vec<_>| {
            ActivateError::QueueCount { device: "virtio-vsock", want: NUM_QUEUES, got: q.len() }
        })?;
        {
            let mut shared = lock(&self.shared);
            shared.active = Some(ActiveQueues { mem: ctx.mem, rx, tx, event, irq: ctx.notify_used });
            if self.restored {
                shared.reset_event_pending = true;
                self.restored = false;
            }
        }
        if self.backend.is_none() {
            let backend = Backend::spawn(self.shared.clone(), self.kick.clone())
                .map_err(|e| ActivateError::Backend { device: "virtio-vsock", source: Box::new(e) })?;
            self.backend = Some(backend);
        }
        self.kick_backend();
        Ok(())
    }

    fn queue_notify(&mut self, _index: u16) {
        self.kick_backend();
    }

    fn reset(&mut self) {
        let mut shared = lock(&self.shared);
        shared.active = None;
        shared.reset_event_pending = false;
        shared.reset_ack = super::backend::ResetAck::Settled;
        shared.muxer.clear();
    }

    fn queue_states(&self) -> Vec<virtio_queue::QueueState> {
        let shared = lock(&self.shared);
        shared.active.iter().flat_map(|a| [a.rx.state(), a.tx.state(), a.event.state()]).collect()
    }

    fn save(&self) -> VirtioDeviceState {
        VirtioDeviceState::Vsock(self.state())
    }

    fn shutdown(&mut self) {
        self.backend = None; // stops and joins the thread
        let _ = std::fs::remove_file(&self.uds_path);
    }

    fn pause(&mut self) {
        lock(&self.shared).paused = true;
    }

    fn resume(&mut self) {
        lock(&self.shared).paused = false;
        let _ = self.kick.write(1);
    }
}

impl Drop for Vsock {
    fn drop(&mut self) {
        self.backend = None; // stops and joins the thread
        let _ = std::fs::remove_file(&self.uds_path);
    }
}
