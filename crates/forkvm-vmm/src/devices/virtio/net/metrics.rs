//! Counters for the virtio-net device (same shape as every device's: atomics shared
//! through an `Arc`, and a plain serializable snapshot).

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct NetMetrics {
    /// Frames the guest sent that went to the tap, and their bytes (headers included).
    pub tx_frames: AtomicU64,
    pub tx_bytes: AtomicU64,
    /// Transmit chains refused (malformed: see `frames::FrameError`).
    pub tx_malformed: AtomicU64,
    /// Frames the tap refused (a bad offload header, the interface down).
    pub tx_errors: AtomicU64,
    /// Frames from the tap written into the guest's buffers, and their bytes.
    pub rx_frames: AtomicU64,
    pub rx_bytes: AtomicU64,
    /// Frames from the tap dropped (no room in the guest's buffer, bad buffers).
    pub rx_dropped: AtomicU64,
    /// Times a frame waited for the guest to post receive buffers.
    pub rx_no_buffers: AtomicU64,
    /// Times a rate limit held frames back, by direction.
    pub tx_throttled: AtomicU64,
    pub rx_throttled: AtomicU64,
    /// Used-buffer interrupts raised.
    pub interrupts: AtomicU64,
    /// Passes of the backend over the queues (each wake-up that found the device running).
    pub passes: AtomicU64,
}

/// A point-in-time copy of [`NetMetrics`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetMetricsSnapshot {
    pub tx_frames: u64,
    pub tx_bytes: u64,
    pub tx_malformed: u64,
    pub tx_errors: u64,
    pub rx_frames: u64,
    pub rx_bytes: u64,
    pub rx_dropped: u64,
    pub rx_no_buffers: u64,
    pub tx_throttled: u64,
    pub rx_throttled: u64,
    pub interrupts: u64,
    pub passes: u64,
}

impl NetMetrics {
    pub fn snapshot(&self) -> NetMetricsSnapshot {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        NetMetricsSnapshot {
            tx_frames: l(&self.tx_frames),
            tx_bytes: l(&self.tx_bytes),
            tx_malformed: l(&self.tx_malformed),
            tx_errors: l(&self.tx_errors),
            rx_frames: l(&self.rx_frames),
            rx_bytes: l(&self.rx_bytes),
            rx_dropped: l(&self.rx_dropped),
            rx_no_buffers: l(&self.rx_no_buffers),
            tx_throttled: l(&self.tx_throttled),
            rx_throttled: l(&self.rx_throttled),
            interrupts: l(&self.interrupts),
            passes: l(&self.passes),
        }
    }
}

/// Adds `n` to a counter.
pub fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}
