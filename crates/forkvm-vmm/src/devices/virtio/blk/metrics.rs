//! Counters for a virtio-blk device, read by the control plane while the VM runs.
//!
//! Same shape as every device: atomic counters behind an `Arc`, and a plain
//! serializable snapshot.

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct BlockMetrics {
    /// Requests seen (any type, including malformed ones).
    pub requests: AtomicU64,
    pub read_bytes: AtomicU64,
    pub write_bytes: AtomicU64,
    pub flushes: AtomicU64,
    /// Requests answered IOERR or dropped as malformed.
    pub errors: AtomicU64,
    /// Requests answered UNSUPP.
    pub unsupported: AtomicU64,
}

/// A point-in-time copy of [`BlockMetrics`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockMetricsSnapshot {
    pub requests: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub flushes: u64,
    pub errors: u64,
    pub unsupported: u64,
}

impl BlockMetrics {
    pub fn snapshot(&self) -> BlockMetricsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        BlockMetricsSnapshot {
            requests: get(&self.requests),
            read_bytes: get(&self.read_bytes),
            write_bytes: get(&self.write_bytes),
            flushes: get(&self.flushes),
            errors: get(&self.errors),
            unsupported: get(&self.unsupported),
        }
    }
}

/// Adds `n` to a counter.
pub fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}
