//! The virtio-rng device: fills each buffer the driver posts with host entropy.
//!
//! Requests are served synchronously on the vCPU thread that wrote QueueNotify; each is
//! at most [`MAX_BYTES_PER_REQUEST`] bytes, so this stays cheap. A rate limit
//! (`virtio::throttle`) leaves a request it holds back in the queue, and the device timer
//! thread serves it later (`devices::deferred`).

use super::metrics::{add, RngMetrics};
use super::persist::RngState;
use super::{RngError, MAX_BYTES_PER_REQUEST, RNG_QUEUE_SIZE};
use crate::devices::virtio::device::{TYPE_RNG, VIRTIO_F_VERSION_1};
use crate::devices::virtio::ratelimit::LogLimiter;
use crate::devices::virtio::throttle::{queue_has_pending, RateLimit, Throttle};
use crate::devices::virtio::{ActivateContext, ActivateError, Interrupt, VirtioDevice, VirtioDeviceState};
use std::sync::Arc;
use virtio_queue::{Queue, QueueOwnedT, QueueState, QueueT};
use vm_memory::{Address, Bytes, GuestMemoryMmap};

/// Bytes drawn from getrandom per call.
const CHUNK: usize = 4096;

/// What the device holds while the driver has it running.
#[derive(Debug)]
struct Active {
    mem: GuestMemoryMmap,
    notify_used: Arc<dyn Interrupt>,
    queue: Queue,
}

#[derive(Debug)]
pub struct Rng {
    acked_features: u64,
    active: Option<Active>,
    metrics: Arc<RngMetrics>,
    log_limit: LogLimiter,
    throttle: Throttle,
}

impl Default for Rng {
    fn default() -> Self {
        Rng::new()
    }
}

impl Rng {
    pub fn new() -> Rng {
        Rng {
            acked_features: 0,
            active: None,
            metrics: Arc::default(),
            log_limit: LogLimiter::default(),
            throttle: Throttle::default(),
        }
    }

    /// The same device with its requests capped by `limit`.
    pub fn with_rate_limit(mut self, limit: RateLimit) -> Rng {
        self.throttle = Throttle::new(limit);
        self
    }

    /// The device's counters, shared with whoever reports them.
    pub fn metrics(&self) -> Arc<RngMetrics> {
        self.metrics.clone()
    }

    /// Serves every available chain, then notifies the driver if it wants to be.
    pub fn process_queue(&mut self) -> Result<(), RngError> {
        let active = self.active.as_mut().ok_or(RngError::NotActive)?;
        let mut used_any = false;
        while let Some(chain) = active.queue.pop_descriptor_chain(&active.mem) {
            let head = chain.head_index();
            let asked: usize = chain.clone().filter(|d| d.is_write_only()).map(|d| d.len() as usize).sum();
            if !self.throttle.admit(asked.min(MAX_BYTES_PER_REQUEST) as u64) {
                // Left in the queue for the pass the throttle asked for.
                active.queue.go_to_previous_position();
                break;
            }
            let mut written = 0usize;
            let mut failure = None;
            for desc in chain.filter(|d| d.is_write_only()) {
                let room = MAX_BYTES_PER_REQUEST - written;
                let len = (desc.len() as usize).min(room);
                match fill_guest(&active.mem, desc.addr(), len) {
                    Ok(()) => written += len,
                    Err(e) => {
                        failure = Some(e);
                        break;
                    }
                }
                if written == MAX_BYTES_PER_REQUEST {
                    break;
                }
            }
            add(&self.metrics.requests, 1);
            add(&self.metrics.bytes, written as u64);
            if let Some(e) = failure {
                add(&self.metrics.errors, 1);
                if let Some(suppressed) = self.log_limit.allow() {
                    tracing::warn!(error = %e, head, suppressed, "virtio-rng request failed");
                }
            }
            active.queue.add_used(&active.mem, head, written as u32).map_err(RngError::AddUsed)?;
            used_any = true;
        }
        // Without EVENT_IDX this is always true; with it, it honours used_event.
        if used_any && active.queue.needs_notification(&active.mem).map_err(RngError::AddUsed)? {
            if let Err(e) = active.notify_used.trigger() {
                if let Some(suppressed) = self.log_limit.allow() {
                    tracing::warn!(error = %e, suppressed, "virtio-rng interrupt failed");
                }
            }
        }
        Ok(())
    }
}

/// Writes `len` random bytes at `addr`.
fn fill_guest(mem: &GuestMemoryMmap, addr: vm_memory::GuestAddress, len: usize) -> Result<(), RngError> {
    let mut buf = [0u8; CHUNK];
    let mut done = 0usize;
    while done < len {
        let n = (len - done).min(CHUNK);
        fill_random(&mut buf[..n]).map_err(RngError::GetRandom)?;
        let at = addr
            .checked_add(done as u64)
            .ok_or(RngError::WriteGuestMemory(vm_memory::GuestMemoryError::InvalidGuestAddress(addr)))?;
        mem.write_slice(&buf[..n], at).map_err(RngError::WriteGuestMemory)?;
        done += n;
    }
    Ok(())
}

/// Fills `buf` from the kernel's CSPRNG (blocks only before the host pool is seeded).
pub fn fill_random(buf: &mut [u8]) -> std::io::Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        let rest = &mut buf[filled..];
        // SAFETY: `rest` is a live, exclusively borrowed buffer of `rest.len()` bytes;
        // getrandom writes at most that many bytes into it and keeps no pointer.
        let ret = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if ret < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        filled += ret as usize;
    }
    Ok(())
}

impl VirtioDevice for Rng {
    fn device_type(&self) -> u32 {
        TYPE_RNG
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[RNG_QUEUE_SIZE]
    }

    fn device_features(&self) -> u64 {
        VIRTIO_F_VERSION_1
    }

    fn set_acked_features(&mut self, features: u64) {
        self.acked_features = features & self.device_features();
    }

    fn read_config(&self, _offset: u64, _data: &mut [u8]) {
        // No configuration space: the transport has zeroed `data`.
    }

    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}

    fn activate(&mut self, ctx: ActivateContext, queues: Vec<Queue>) -> Result<(), ActivateError> {
        let [queue]: [Queue; 1] = queues.try_into().map_err(|q: Vec<Queue>| ActivateError::QueueCount {
            device: "virtio-rng",
            want: 1,
            got: q.len(),
        })?;
        self.active = Some(Active { mem: ctx.mem, notify_used: ctx.notify_used, queue });
        Ok(())
    }

    fn queue_notify(&mut self, index: u16) {
        if index != 0 {
            return;
        }
        if let Err(e) = self.process_queue() {
            add(&self.metrics.errors, 1);
            if let Some(suppressed) = self.log_limit.allow() {
                tracing::warn!(error = %e, suppressed, "virtio-rng queue processing failed");
            }
        }
    }

    fn reset(&mut self) {
        self.active = None;
        self.acked_features = 0;
    }

    fn queue_states(&self) -> Vec<QueueState> {
        self.active.iter().map(|a| a.queue.state()).collect()
    }

    fn save(&self) -> VirtioDeviceState {
        VirtioDeviceState::Rng(RngState { acked_features: self.acked_features })
    }

    fn throttle(&self) -> Option<&Throttle> {
        Some(&self.throttle)
    }

    fn throttle_mut(&mut self) -> Option<&mut Throttle> {
        Some(&mut self.throttle)
    }

    fn has_pending(&self) -> bool {
        self.active.as_ref().is_some_and(|a| queue_has_pending(&a.queue, &a.mem))
    }
}
