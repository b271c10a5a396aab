//! Moving one frame between a virtqueue and a host buffer, with every length and
//! address the guest gave checked: the only place guest-written descriptors are read.
//!
//! tx: a chain's device-readable buffers, in order, are the header and the frame.
//! rx: the frame (header included) is written over the writable buffers of one chain,
//! or of several when the driver accepted `MRG_RXBUF`, and `num_buffers` says how many.
//! No I/O and no threads here: [`super::backend`] does those.

use super::{MAX_BUFFER_LEN, MIN_FRAME_LEN, NUM_BUFFERS_OFFSET, VNET_HDR_LEN};
use virtio_queue::{DescriptorChain, Queue, QueueOwnedT, QueueT};
use vm_memory::{GuestAddress, GuestMemoryMmap};

/// Why a chain's frame was not used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("a transmit chain has a device-writable buffer")]
    WritableInTx,
    #[error("a transmit chain of {0} bytes is shorter than a header and an Ethernet header")]
    TooShort(usize),
    #[error("a transmit chain of more than {MAX_BUFFER_LEN} bytes")]
    TooLong,
    #[error("a buffer at {addr:#x} ({len} bytes) is not in guest memory")]
    BadAddress { addr: u64, len: u32 },
    #[error("a receive chain has a device-readable buffer")]
    ReadableInRx,
    #[error("a {frame}-byte frame does not fit the guest's {room}-byte receive buffer")]
    NoRoom { frame: usize, room: usize },
}

/// Copies the frame of tx chain `chain` (header first) into `buf`; its length.
pub fn read_tx_chain(chain: DescriptorChain<&GuestMemoryMmap>, buf: &mut Vec<u8>) -> Result<usize, FrameError> {
    buf.clear();
    let mem = chain.memory();
    for desc in chain.clone() {
        if desc.is_write_only() {
            return Err(FrameError::WritableInTx);
        }
        let len = desc.len() as usize;
        if buf.len() + len > MAX_BUFFER_LEN {
            return Err(FrameError::TooLong);
        }
        let start = buf.len();
        buf.resize(start + len, 0);
        use vm_memory::Bytes;
        mem.read_slice(&mut buf[start..], desc.addr())
            .map_err(|_| FrameError::BadAddress { addr: desc.addr().0, len: desc.len() })?;
    }
    if buf.len() < VNET_HDR_LEN + MIN_FRAME_LEN {
        return Err(FrameError::TooShort(buf.len()));
    }
    Ok(buf.len())
}

/// What became of one received frame.
#[derive(Debug, PartialEq, Eq)]
pub enum Delivery {
    /// Written into this many chains, each added to the used ring.
    Delivered { chains: u16 },
    /// The driver has not posted enough buffers: nothing was taken, the frame waits.
    NoBuffers,
    /// The frame cannot be delivered (the buffers it got back are in the used ring or,
    /// if unused, still available): it is dropped.
    Dropped(FrameError),
}

/// One taken rx chain: its head and writable buffers.
struct Taken {
    head: u16,
    bufs: Vec<(GuestAddress, u32)>,
}

/// Writes `frame` (header first, `num_buffers` filled in here) into the rx queue `q`.
pub fn write_rx_frame(q: &mut Queue, mem: &GuestMemoryMmap, frame: &mut [u8], mergeable: bool) -> Delivery {
    let mut taken: Vec<Taken> = Vec::new();
    let mut room = 0usize;
    while room < frame.len() && (mergeable || taken.is_empty()) {
        let Some(chain) = q.pop_descriptor_chain(mem) else {
            for _ in &taken {
                q.go_to_previous_position();
            }
            return Delivery::NoBuffers;
        };
        let head = chain.head_index();
        let mut bufs = Vec::new();
        let mut readable = false;
        for desc in chain {
            if desc.is_write_only() {
                room = room.saturating_add(desc.len() as usize);
                bufs.push((desc.addr(), desc.len()));
            } else {
                readable = true;
            }
        }
        taken.push(Taken { head, bufs });
        if readable {
            // A malformed chain is given back empty, and the frame goes.
            used_empty(q, mem, &taken);
            return Delivery::Dropped(FrameError::ReadableInRx);
        }
    }
    if room < frame.len() {
        // One chain (no MRG_RXBUF) too small for this frame: the frame goes, the buffer
        // stays for a smaller one.
        for _ in &taken {
            q.go_to_previous_position();
        }
        return Delivery::Dropped(FrameError::NoRoom { frame: frame.len(), room });
    }
    let chains = taken.len() as u16;
    frame[NUM_BUFFERS_OFFSET..VNET_HDR_LEN].copy_from_slice(&chains.to_le_bytes());
    let mut rest: &[u8] = frame;
    let mut failed = None;
    for t in &taken {
        let mut written = 0u32;
        for &(addr, len) in &t.bufs {
            if rest.is_empty() {
                break;
            }
            let n = rest.len().min(len as usize);
            use vm_memory::Bytes;
            if mem.write_slice(&rest[..n], addr).is_err() {
                failed.get_or_insert(FrameError::BadAddress { addr: addr.0, len });
                rest = &[];
                break;
            }
            rest = &rest[n..];
            written += n as u32;
        }
        if q.add_used(mem, t.head, written).is_err() {
            failed.get_or_insert(FrameError::BadAddress { addr: 0, len: 0 });
        }
    }
    match failed {
        Some(e) => Delivery::Dropped(e),
        None => Delivery::Delivered { chains },
    }
}

/// Returns `taken` chains to the driver with nothing written.
fn used_empty(q: &mut Queue, mem: &GuestMemoryMmap, taken: &[Taken]) {
    for t in taken {
        let _ = q.add_used(mem, t.head, 0);
    }
}
