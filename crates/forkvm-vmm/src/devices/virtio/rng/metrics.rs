//! Counters for the virtio-rng device, read by the control plane while the VM runs.
//!
//! Every device keeps the same shape: a struct of atomic counters shared through an
//! `Arc` (the device increments, anyone reads), and a plain serializable snapshot.

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct RngMetrics {
    /// Descriptor chains served.
    pub requests: AtomicU64,
    /// Random bytes written into guest memory.
    pub bytes: AtomicU64,
    /// Requests that failed (getrandom or guest-memory errors).
    pub errors: AtomicU64,
}

/// A point-in-time copy of [`RngMetrics`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RngMetricsSnapshot {
    pub requests: u64,
    pub bytes: u64,
    pub errors: u64,
}

impl RngMetrics {
    pub fn snapshot(&self) -> RngMetricsSnapshot {
        RngMetricsSnapshot {
            requests: self.requests.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
        }
    }
}

/// Adds `n` to a counter.
pub fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}
