//! virtio-vsock (virtio 1.2 §5.10) with a userspace host backend.
//!
//! There is no `/dev/vhost-vsock` on our hosts, so the whole transport lives in the VMM:
//! the guest's packets are parsed from the tx queue, connections are multiplexed onto
//! host Unix sockets, and host data is packed into the guest's rx buffers. Only stream
//! sockets exist (`VIRTIO_VSOCK_F_STREAM` is implied, no feature bit is offered).
//!
//! Host side, with the device listening on `uds_path`:
//! * **host → guest**: a client connects to `uds_path` and writes `CONNECT <port>\n`.
//!   The device sends `OP_REQUEST` to guest port `<port>`; on `OP_RESPONSE` the client
//!   reads `OK <host_port>\n` (`host_port` is the device's local port for the stream,
//!   allocated upwards from [`HOST_PORT_BASE`]) and bytes then flow both ways. If the
//!   guest answers `OP_RST` the client's socket is closed.
//! * **guest → host**: the guest connects to CID 2 port `P`; the device connects to the
//!   Unix socket `<uds_path>_<P>`, answering `OP_RST` if nothing listens there.
//!
//! Files: [`packet`] (header encode/decode, descriptor chains), [`connection`] (one
//! stream's state machine and credit accounting, no I/O), [`muxer`] (the connection
//! table and packet routing), [`backend`] (the I/O thread), [`device`] (the
//! [`VirtioDevice`](super::VirtioDevice) glue), [`persist`] and [`metrics`].

pub mod backend;
pub mod connection;
pub mod device;
pub mod metrics;
pub mod muxer;
pub mod packet;
pub mod persist;

#[cfg(test)]
mod test_guest;
#[cfg(test)]
mod tests;

pub use device::Vsock;
pub use metrics::VsockMetrics;
pub use persist::VsockState;

use std::path::PathBuf;

/// The host's CID (`VMADDR_CID_HOST`).
pub const HOST_CID: u64 = 2;
/// Number of queues and their order.
pub const NUM_QUEUES: usize = 3;
pub const RX_QUEUE: u16 = 0;
pub const TX_QUEUE: u16 = 1;
pub const EVENT_QUEUE: u16 = 2;
/// Maximum size of each queue.
pub const QUEUE_SIZE: u16 = 256;

/// Packet operations (`VIRTIO_VSOCK_OP_*`).
pub const OP_REQUEST: u16 = 1;
pub const OP_RESPONSE: u16 = 2;
pub const OP_RST: u16 = 3;
pub const OP_SHUTDOWN: u16 = 4;
pub const OP_RW: u16 = 5;
pub const OP_CREDIT_UPDATE: u16 = 6;
pub const OP_CREDIT_REQUEST: u16 = 7;

/// Socket type of a stream (`VIRTIO_VSOCK_TYPE_STREAM`).
pub const TYPE_STREAM: u16 = 1;

/// `OP_SHUTDOWN` flags: the sender will receive no more / send no more.
pub const SHUTDOWN_RCV: u32 = 1;
pub const SHUTDOWN_SEND: u32 = 2;
pub const SHUTDOWN_BOTH: u32 = SHUTDOWN_RCV | SHUTDOWN_SEND;

/// Event queue event ID telling the driver to drop all connections.
pub const EVENT_TRANSPORT_RESET: u32 = 0;

/// Largest payload accepted from, or sent to, the guest in one packet.
pub const MAX_PKT_PAYLOAD: usize = 64 * 1024;
/// Receive buffer the device advertises per connection (`buf_alloc`): how many bytes
/// the guest may have in flight towards a host socket.
pub const CONN_BUF_ALLOC: u32 = 256 * 1024;
/// Host bytes buffered per connection while the guest has no credit or no rx buffers;
/// the host socket is not read while this is full.
pub const TO_GUEST_CAP: usize = 64 * 1024;
/// First local port handed to host-initiated connections (the range
/// `HOST_PORT_BASE..=u32::MAX` is ours; guest-initiated streams use the guest's
/// destination port as the local port, which is normally far below it).
pub const HOST_PORT_BASE: u32 = 1 << 30;
/// Most streams alive at once; further requests are refused with `OP_RST`.
pub const MAX_CONNECTIONS: usize = 4096;
/// Most host clients that have connected but not yet sent their `CONNECT` line.
pub const MAX_PENDING_CLIENTS: usize = 256;
/// Longest accepted `CONNECT <port>\n` line.
pub const MAX_CONNECT_LINE: usize = 32;

/// Errors building or restoring the device.
#[derive(Debug, thiserror::Error)]
pub enum VsockError {
    #[error("guest CID {0} is reserved or out of range (must be 3..=0xffff_fffe)")]
    InvalidCid(u64),
    #[error("removing stale socket {path}: {source}")]
    RemoveStaleSocket { path: PathBuf, source: std::io::Error },
    #[error("binding the vsock listener at {path}: {source}")]
    BindListener { path: PathBuf, source: std::io::Error },
    #[error("creating the backend wake-up eventfd: {0}")]
    CreateEventFd(std::io::Error),
    #[error(transparent)]
    Backend(#[from] backend::BackendError),
    #[error("snapshot acked features {acked:#x} are not a subset of offered {offered:#x}")]
    RestoreFeatures { acked: u64, offered: u64 },
}
