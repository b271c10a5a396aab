//! Counters for one vsock device, shared by the device and its backend thread.
//!
//! "tx" is guest → host (the guest's transmit queue), "rx" is host → guest.

use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Live counters (relaxed atomics; read with [`VsockMetrics::snapshot`]).
#[derive(Debug, Default)]
pub struct VsockMetrics {
    pub tx_packets: AtomicU64,
    pub tx_bytes: AtomicU64,
    pub rx_packets: AtomicU64,
    pub rx_bytes: AtomicU64,
    pub conns_opened: AtomicU64,
    pub conns_closed: AtomicU64,
    pub rst_sent: AtomicU64,
    pub host_connect_failures: AtomicU64,
    /// Malformed or protocol-violating packets from the guest.
    pub guest_errors: AtomicU64,
    pub host_clients_rejected: AtomicU64,
    pub interrupts: AtomicU64,
    /// Interrupts raised again while a restored guest had not taken its reset in.
    pub reset_nudges: AtomicU64,
}

/// A point-in-time copy of [`VsockMetrics`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct VsockMetricsSnapshot {
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub conns_opened: u64,
    pub conns_closed: u64,
    pub rst_sent: u64,
    pub host_connect_failures: u64,
    pub guest_errors: u64,
    pub host_clients_rejected: u64,
    pub interrupts: u64,
    pub reset_nudges: u64,
}

impl VsockMetrics {
    pub fn snapshot(&self) -> VsockMetricsSnapshot {
        VsockMetricsSnapshot {
            tx_packets: self.tx_packets.load(Relaxed),
            tx_bytes: self.tx_bytes.load(Relaxed),
            rx_packets: self.rx_packets.load(Relaxed),
            rx_bytes: self.rx_bytes.load(Relaxed),
            conns_opened: self.conns_opened.load(Relaxed),
            conns_closed: self.conns_closed.load(Relaxed),
            rst_sent: self.rst_sent.load(Relaxed),
            host_connect_failures: self.host_connect_failures.load(Relaxed),
            guest_errors: self.guest_errors.load(Relaxed),
            host_clients_rejected: self.host_clients_rejected.load(Relaxed),
            interrupts: self.interrupts.load(Relaxed),
            reset_nudges: self.reset_nudges.load(Relaxed),
        }
    }
}
