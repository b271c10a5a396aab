//! virtio-net (virtio 1.2 §5.1) over a tap device, with a userspace backend.
//!
//! A sandbox's network is a tap in a network namespace of its own (made by the daemon,
//! see `docs/networking.md`); the VMM only gets the tap's descriptor, already open and
//! set up, and never opens `/dev/net/tun` itself (a tap fd works from any namespace: it
//! keeps the one it was opened in). Every clone of a snapshot has the same MAC and guest
//! address; only the tap behind the device changes.
//!
//! Frames cross with the 12-byte `virtio_net_hdr_v1` in front, which the tap reads and
//! writes as it is (`IFF_VNET_HDR`, header size 12), so checksum and segmentation
//! offloads pass through without the VMM touching a packet: the guest hands the host
//! 64 KiB TCP segments and gets them back the same way. On these hosts the guest's
//! kernel runs ~1000x slower than native, so the work per packet in the guest is what
//! bounds throughput, and offloads are what make it usable.
//!
//! Files: [`tap`] (the tap descriptor), [`frames`] (moving one frame between a queue and
//! a buffer: no I/O, no threads), [`backend`] (the thread that moves frames between the
//! queues and the tap, with the rate limits), [`device`] (the
//! [`VirtioDevice`](super::VirtioDevice) glue), [`persist`] and [`metrics`].

pub mod backend;
pub mod device;
pub mod frames;
pub mod metrics;
pub mod persist;
pub mod tap;

#[cfg(test)]
mod test_guest;
#[cfg(test)]
pub(crate) mod test_net;
#[cfg(test)]
mod tests;

pub use backend::FrameEndpoint;
pub use device::Net;
pub use metrics::{NetMetrics, NetMetricsSnapshot};
pub use persist::NetState;
pub use tap::Tap;

use virtio_bindings::virtio_net as vn;

/// Queue order: receive (device to driver), transmit.
pub const RX_QUEUE: u16 = 0;
pub const TX_QUEUE: u16 = 1;
pub const NUM_QUEUES: usize = 2;
/// Maximum size of each queue.
pub const QUEUE_SIZE: u16 = 256;

/// `virtio_net_hdr_v1`: the header in front of every frame (virtio 1.x always uses it).
pub const VNET_HDR_LEN: usize = 12;
/// Where `num_buffers` sits in the header.
pub const NUM_BUFFERS_OFFSET: usize = 10;
/// The largest frame either way: a 64 KiB IP packet with an Ethernet and a VLAN header.
pub const MAX_FRAME_LEN: usize = 65550;
/// The largest header-and-frame the device moves.
pub const MAX_BUFFER_LEN: usize = VNET_HDR_LEN + MAX_FRAME_LEN;
/// The smallest frame worth sending: an Ethernet header.
pub const MIN_FRAME_LEN: usize = 14;

/// The MAC every sandbox's guest has unless told otherwise (locally administered).
pub const DEFAULT_GUEST_MAC: [u8; 6] = [0x06, 0x00, 0xac, 0x10, 0x00, 0x02];

const fn bit(b: u32) -> u64 {
    1 << b
}

/// The guest sends partially checksummed frames (the host, or its NIC, completes them).
pub const F_CSUM: u64 = bit(vn::VIRTIO_NET_F_CSUM);
/// The guest takes partially checksummed frames.
pub const F_GUEST_CSUM: u64 = bit(vn::VIRTIO_NET_F_GUEST_CSUM);
/// The configuration space holds the guest's MAC.
pub const F_MAC: u64 = bit(vn::VIRTIO_NET_F_MAC);
/// The guest takes TCP segments of up to 64 KiB (v4, v6, with ECN).
pub const F_GUEST_TSO4: u64 = bit(vn::VIRTIO_NET_F_GUEST_TSO4);
pub const F_GUEST_TSO6: u64 = bit(vn::VIRTIO_NET_F_GUEST_TSO6);
pub const F_GUEST_ECN: u64 = bit(vn::VIRTIO_NET_F_GUEST_ECN);
/// The guest sends TCP segments of up to 64 KiB (v4, v6, with ECN).
pub const F_HOST_TSO4: u64 = bit(vn::VIRTIO_NET_F_HOST_TSO4);
pub const F_HOST_TSO6: u64 = bit(vn::VIRTIO_NET_F_HOST_TSO6);
pub const F_HOST_ECN: u64 = bit(vn::VIRTIO_NET_F_HOST_ECN);
/// A received frame may span several of the guest's buffers (`num_buffers`).
pub const F_MRG_RXBUF: u64 = bit(vn::VIRTIO_NET_F_MRG_RXBUF);
/// `used_event`/`avail_event`: interrupts and notifications only when the other side
/// asks, which saves a VM exit per frame.
pub const F_EVENT_IDX: u64 = bit(virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX);

/// Every feature the device offers. Each offload comes with what the spec says it needs
/// (TSO needs its checksum feature, ECN needs TSO).
pub const OFFERED_FEATURES: u64 = super::device::VIRTIO_F_VERSION_1
    | F_MAC
    | F_EVENT_IDX
    | F_CSUM
    | F_HOST_TSO4
    | F_HOST_TSO6
    | F_HOST_ECN
    | F_GUEST_CSUM
    | F_GUEST_TSO4
    | F_GUEST_TSO6
    | F_GUEST_ECN
    | F_MRG_RXBUF;

/// The tap offloads (`TUN_F_*`) that match what the guest accepted: the tap may hand
/// over only frames the guest said it takes.
pub fn tap_offloads(acked: u64) -> u32 {
    if acked & F_GUEST_CSUM == 0 {
        return 0;
    }
    let mut flags = libc::TUN_F_CSUM;
    for (feature, flag) in
        [(F_GUEST_TSO4, libc::TUN_F_TSO4), (F_GUEST_TSO6, libc::TUN_F_TSO6), (F_GUEST_ECN, libc::TUN_F_TSO_ECN)]
    {
        if acked & feature != 0 {
            flags |= flag;
        }
    }
    flags
}

/// Errors building, restoring or running the device.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error(transparent)]
    Tap(#[from] tap::TapError),
    #[error("creating the backend wake-up eventfd: {0}")]
    CreateEventFd(std::io::Error),
    #[error("spawning the net backend thread: {0}")]
    SpawnThread(std::io::Error),
    #[error("snapshot acked features {acked:#x} are not a subset of offered {offered:#x}")]
    RestoreFeatures { acked: u64, offered: u64 },
}
