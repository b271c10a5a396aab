//! virtio-rng: the guest's entropy source (virtio 1.2 §5.4).
//!
//! A guest without a hardware RNG starves its entropy pool at boot; this device hands
//! it bytes from the host's `getrandom`. One queue, no configuration space, no feature
//! bits beyond VERSION_1. Queue logic is in `device.rs`, saved state in `persist.rs`,
//! counters in `metrics.rs`.

pub mod device;
pub mod metrics;
pub mod persist;

pub use device::Rng;
pub use metrics::{RngMetrics, RngMetricsSnapshot};
pub use persist::RngState;

/// Size of the one request queue.
pub const RNG_QUEUE_SIZE: u16 = 256;
/// The most bytes served per descriptor chain, so one request cannot keep the vCPU
/// thread busy for long (the spec lets the device fill less than offered).
pub const MAX_BYTES_PER_REQUEST: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum RngError {
    #[error("saved acked features {acked:#x} are not a subset of the offered {offered:#x}")]
    RestoreFeatures { acked: u64, offered: u64 },
    #[error("the device is not active")]
    NotActive,
    #[error("reading entropy with getrandom")]
    GetRandom(#[source] std::io::Error),
    #[error("writing entropy into guest memory")]
    WriteGuestMemory(#[source] vm_memory::GuestMemoryError),
    #[error("adding to the used ring")]
    AddUsed(#[source] virtio_queue::Error),
}

#[cfg(test)]
mod tests;
