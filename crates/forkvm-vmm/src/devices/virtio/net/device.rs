//! The [`VirtioDevice`] glue of virtio-net.
//!
//! [`Net::new`] takes the host side (a tap, as a [`FrameEndpoint`]) and starts the
//! backend thread at once, on the thread that builds the VM: a thread inherits its
//! creator's seccomp filter, and a vCPU's may not start threads. The thread waits for
//! the first activation. `queue_notify` (vCPU thread) only kicks it.
//!
//! Configuration space: the guest's MAC (`VIRTIO_NET_F_MAC`), read-only.

use super::backend::{lock, ActiveQueues, Backend, FrameEndpoint, NetRateLimits, Shared};
use super::metrics::NetMetrics;
use super::persist::NetState;
use super::{NetError, Tap, NUM_QUEUES, OFFERED_FEATURES, QUEUE_SIZE};
use crate::devices::virtio::device::TYPE_NET;
use crate::devices::virtio::{ActivateContext, ActivateError, VirtioDevice, VirtioDeviceState};
use std::sync::{Arc, Mutex};
use vmm_sys_util::eventfd::EventFd;

const QUEUE_SIZES: [u16; NUM_QUEUES] = [QUEUE_SIZE; NUM_QUEUES];

/// A virtio-net device over a tap.
#[derive(Debug)]
pub struct Net {
    mac: [u8; 6],
    shared: Arc<Mutex<Shared>>,
    kick: Arc<EventFd>,
    backend: Option<Backend>,
    metrics: Arc<NetMetrics>,
}

impl Net {
    /// A device whose frames go to and come from `ep`, for a guest with MAC `mac`.
    pub fn new(ep: Arc<dyn FrameEndpoint>, mac: [u8; 6], limits: NetRateLimits) -> Result<Net, NetError> {
        let kick = Arc::new(EventFd::new(libc::EFD_NONBLOCK).map_err(NetError::CreateEventFd)?);
        let metrics = Arc::new(NetMetrics::default());
        let shared = Arc::new(Mutex::new(Shared::new(limits, metrics.clone())));
        let backend = Backend::spawn(shared.clone(), kick.clone(), ep).map_err(NetError::SpawnThread)?;
        Ok(Net { mac, shared, kick, backend: Some(backend), metrics })
    }

    /// A device over `tap`.
    pub fn with_tap(tap: Tap, mac: [u8; 6], limits: NetRateLimits) -> Result<Net, NetError> {
        Net::new(Arc::new(tap), mac, limits)
    }

    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }

    pub fn acked_features(&self) -> u64 {
        lock(&self.shared).acked_features
    }

    /// The device's counters.
    pub fn metrics(&self) -> Arc<NetMetrics> {
        self.metrics.clone()
    }

    fn kick_backend(&self) {
        if let Err(err) = self.kick.write(1) {
            tracing::error!(device = "net", "waking the backend: {err}");
        }
    }
}

impl VirtioDevice for Net {
    fn device_type(&self) -> u32 {
        TYPE_NET
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &QUEUE_SIZES
    }

    fn device_features(&self) -> u64 {
        OFFERED_FEATURES
    }

    fn set_acked_features(&mut self, features: u64) {
        lock(&self.shared).acked_features = features & OFFERED_FEATURES;
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        let config = self.mac;
        let start = offset.min(config.len() as u64) as usize;
        let n = data.len().min(config.len() - start);
        data[..n].copy_from_slice(&config[start..start + n]);
        data[n..].fill(0);
    }

    fn write_config(&mut self, _offset: u64, _data: &[u8]) {
        // The MAC is the device's (a modern driver never writes it).
    }

    fn activate(&mut self, ctx: ActivateContext, queues: Vec<virtio_queue::Queue>) -> Result<(), ActivateError> {
        let [rx, tx]: [virtio_queue::Queue; NUM_QUEUES] = queues
            .try_into()
            .map_err(|q: Vec<_>| ActivateError::QueueCount { device: "virtio-net", want: NUM_QUEUES, got: q.len() })?;
        lock(&self.shared).activate(ActiveQueues { mem: ctx.mem, rx, tx, irq: ctx.notify_used });
        self.kick_backend();
        Ok(())
    }

    fn queue_notify(&mut self, _index: u16) {
        self.kick_backend();
    }

    fn reset(&mut self) {
        lock(&self.shared).reset();
    }

    fn queue_states(&self) -> Vec<virtio_queue::QueueState> {
        let shared = lock(&self.shared);
        shared.active.iter().flat_map(|a| [a.rx.state(), a.tx.state()]).collect()
    }

    fn save(&self) -> VirtioDeviceState {
        VirtioDeviceState::Net(NetState { acked_features: self.acked_features(), mac: self.mac })
    }

    fn shutdown(&mut self) {
        self.backend = None; // stops and joins the thread
    }

    fn pause(&mut self) {
        lock(&self.shared).paused = true;
    }

    fn resume(&mut self) {
        lock(&self.shared).paused = false;
        self.kick_backend();
    }
}
