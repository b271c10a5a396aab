//! The vsock packet header (virtio 1.2 §5.10.6) and moving packets through descriptor
//! chains.
//!
//! The header is 44 little-endian bytes. A tx chain (driver → device) holds the header
//! followed by `len` payload bytes, spread over any number of read-only descriptors; an
//! rx chain (device → driver) is one or more write-only descriptors that the device
//! fills the same way. Nothing here trusts the guest: lengths are capped, short chains
//! and wrong descriptor directions are errors, never panics.

use super::MAX_PKT_PAYLOAD;
use std::ops::Deref;
use virtio_queue::DescriptorChain;
use vm_memory::{Bytes, GuestAddress, GuestMemory};

/// Size of the header on the wire.
pub const HDR_SIZE: usize = 44;

/// Errors reading a packet from the guest or writing one to it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PacketError {
    #[error("tx descriptor chain holds {0} bytes, less than a header")]
    ShortHeader(usize),
    #[error("tx descriptor chain has a device-writable descriptor")]
    WritableTxDescriptor,
    #[error("rx descriptor chain has a device-readable descriptor")]
    ReadableRxDescriptor,
    #[error("reading tx descriptor at {addr:#x} ({len} bytes) from guest memory")]
    ReadGuestMemory { addr: u64, len: u32 },
    #[error("writing rx descriptor at {addr:#x} ({len} bytes) to guest memory")]
    WriteGuestMemory { addr: u64, len: u32 },
    #[error("packet payload length {} exceeds the maximum {MAX_PKT_PAYLOAD}", .0.len)]
    PayloadTooLarge(PacketHeader),
    #[error("packet header says {} payload bytes but the chain holds {available}", hdr.len)]
    ShortPayload { hdr: PacketHeader, available: usize },
    #[error("rx buffer of {capacity} bytes cannot hold a {needed}-byte packet")]
    RxBufferTooSmall { capacity: usize, needed: usize },
}

impl PacketError {
    /// The parsed header, when the error happened after the header was read (so the
    /// device can answer the offending connection with a reset).
    pub fn header(&self) -> Option<&PacketHeader> {
        match self {
            PacketError::PayloadTooLarge(hdr) | PacketError::ShortPayload { hdr, .. } => Some(hdr),
            _ => None,
        }
    }
}

/// `struct virtio_vsock_hdr`, decoded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PacketHeader {
    pub src_cid: u64,
    pub dst_cid: u64,
    pub src_port: u32,
    pub dst_port: u32,
    pub len: u32,
    pub type_: u16,
    pub op: u16,
    pub flags: u32,
    pub buf_alloc: u32,
    pub fwd_cnt: u32,
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn le_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

impl PacketHeader {
    /// Decodes the first [`HDR_SIZE`] bytes of `bytes`.
    pub fn decode(bytes: &[u8]) -> Result<PacketHeader, PacketError> {
        if bytes.len() < HDR_SIZE {
            return Err(PacketError::ShortHeader(bytes.len()));
        }
        Ok(PacketHeader {
            src_cid: le_u64(bytes, 0),
            dst_cid: le_u64(bytes, 8),
            src_port: le_u32(bytes, 16),
            dst_port: le_u32(bytes, 20),
            len: le_u32(bytes, 24),
            type_: le_u16(bytes, 28),
            op: le_u16(bytes, 30),
            flags: le_u32(bytes, 32),
            buf_alloc: le_u32(bytes, 36),
            fwd_cnt: le_u32(bytes, 40),
        })
    }

    /// Encodes the header in wire format.
    pub fn encode(&self) -> [u8; HDR_SIZE] {
        let mut b = [0u8; HDR_SIZE];
        b[0..8].copy_from_slice(&self.src_cid.to_le_bytes());
        b[8..16].copy_from_slice(&self.dst_cid.to_le_bytes());
        b[16..20].copy_from_slice(&self.src_port.to_le_bytes());
        b[20..24].copy_from_slice(&self.dst_port.to_le_bytes());
        b[24..28].copy_from_slice(&self.len.to_le_bytes());
        b[28..30].copy_from_slice(&self.type_.to_le_bytes());
        b[30..32].copy_from_slice(&self.op.to_le_bytes());
        b[32..36].copy_from_slice(&self.flags.to_le_bytes());
        b[36..40].copy_from_slice(&self.buf_alloc.to_le_bytes());
        b[40..44].copy_from_slice(&self.fwd_cnt.to_le_bytes());
        b
    }
}

/// A packet the guest sent: header plus exactly `hdr.len` payload bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    pub hdr: PacketHeader,
    pub payload: Vec<u8>,
}

/// Parses a packet from the bytes of a tx chain (header, then payload; extra trailing
/// bytes are ignored).
pub fn parse_packet(bytes: &[u8]) -> Result<Packet, PacketError> {
    let hdr = PacketHeader::decode(bytes)?;
    let len = hdr.len as usize;
    if len > MAX_PKT_PAYLOAD {
        return Err(PacketError::PayloadTooLarge(hdr));
    }
    let available = bytes.len() - HDR_SIZE;
    if available < len {
        return Err(PacketError::ShortPayload { hdr, available });
    }
    Ok(Packet { hdr, payload: bytes[HDR_SIZE..HDR_SIZE + len].to_vec() })
}

/// Reads a tx chain (at most a header plus [`MAX_PKT_PAYLOAD`] bytes) and parses it.
pub fn read_tx_chain<M>(chain: DescriptorChain<M>) -> Result<Packet, PacketError>
where
    M: Deref + Clone,
    M::Target: GuestMemory,
{
    let limit = HDR_SIZE + MAX_PKT_PAYLOAD;
    let mem = chain.memory();
    let mut bytes = Vec::new();
    for desc in chain.clone() {
        if desc.is_write_only() {
            return Err(PacketError::WritableTxDescriptor);
        }
        let take = (desc.len() as usize).min(limit - bytes.len());
        let start = bytes.len();
        bytes.resize(start + take, 0);
        mem.read_slice(&mut bytes[start..], desc.addr())
            .map_err(|_| PacketError::ReadGuestMemory { addr: desc.addr().0, len: desc.len() })?;
        if bytes.len() == limit {
            break;
        }
    }
    parse_packet(&bytes)
}

/// The write-only buffers of an rx chain, in order.
#[derive(Debug, Clone, Default)]
pub struct RxBuffers {
    bufs: Vec<(GuestAddress, u32)>,
}

impl RxBuffers {
    /// Collects the descriptors of an rx chain; a read-only descriptor is an error.
    pub fn from_chain<M>(chain: DescriptorChain<M>) -> Result<RxBuffers, PacketError>
    where
        M: Deref,
        M::Target: GuestMemory,
    {
        let mut bufs = Vec::new();
        for desc in chain {
            if !desc.is_write_only() {
                return Err(PacketError::ReadableRxDescriptor);
            }
            bufs.push((desc.addr(), desc.len()));
        }
        Ok(RxBuffers { bufs })
    }

    /// Total bytes the chain can hold.
    pub fn capacity(&self) -> usize {
        self.bufs.iter().map(|&(_, len)| len as usize).sum()
    }

    /// Writes `hdr` and `payload` into the buffers; returns the bytes written.
    pub fn write_packet<G: GuestMemory>(
        &self,
        mem: &G,
        hdr: &PacketHeader,
        payload: &[u8],
    ) -> Result<u32, PacketError> {
        let mut bytes = Vec::with_capacity(HDR_SIZE + payload.len());
        bytes.extend_from_slice(&hdr.encode());
        bytes.extend_from_slice(payload);
        self.write_all(mem, &bytes)
    }

    /// Writes `data` across the buffers in order; returns the bytes written.
    pub fn write_all<G: GuestMemory>(&self, mem: &G, data: &[u8]) -> Result<u32, PacketError> {
        let capacity = self.capacity();
        if capacity < data.len() {
            return Err(PacketError::RxBufferTooSmall { capacity, needed: data.len() });
        }
        let mut rest = data;
        for &(addr, len) in &self.bufs {
            if rest.is_empty() {
                break;
            }
            let n = rest.len().min(len as usize);
            mem.write_slice(&rest[..n], addr).map_err(|_| PacketError::WriteGuestMemory { addr: addr.0, len })?;
            rest = &rest[n..];
        }
        Ok(data.len() as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::vsock::{OP_RW, TYPE_STREAM};

    fn sample() -> PacketHeader {
        PacketHeader {
            src_cid: 3,
            dst_cid: 2,
            src_port: 0x1234_5678,
            dst_port: 1234,
            len: 5,
            type_: TYPE_STREAM,
            op: OP_RW,
            flags: 0,
            buf_alloc: 65536,
            fwd_cnt: 77,
        }
    }

    #[test]
    fn header_round_trips_with_wire_offsets() {
        let hdr = sample();
        let bytes = hdr.encode();
        assert_eq!(&bytes[0..8], &3u64.to_le_bytes());
        assert_eq!(&bytes[16..20], &0x1234_5678u32.to_le_bytes());
        assert_eq!(&bytes[30..32], &OP_RW.to_le_bytes());
        assert_eq!(&bytes[40..44], &77u32.to_le_bytes());
        assert_eq!(PacketHeader::decode(&bytes).unwrap(), hdr);
    }

    #[test]
    fn short_header_and_bad_lengths_are_errors() {
        assert_eq!(PacketHeader::decode(&[0u8; 43]), Err(PacketError::ShortHeader(43)));
        let mut hdr = sample();
        let mut bytes = hdr.encode().to_vec();
        bytes.extend_from_slice(b"hel");
        let err = parse_packet(&bytes).unwrap_err();
        assert_eq!(err, PacketError::ShortPayload { hdr, available: 3 });
        assert_eq!(err.header(), Some(&hdr));
        bytes.extend_from_slice(b"loXX");
        assert_eq!(parse_packet(&bytes).unwrap().payload, b"hello");
        hdr.len = MAX_PKT_PAYLOAD as u32 + 1;
        assert_eq!(parse_packet(&hdr.encode()), Err(PacketError::PayloadTooLarge(hdr)));
    }

    #[test]
    fn rx_write_spans_buffers_and_checks_capacity() {
        let mem = vm_memory::GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap();
        let rx = RxBuffers { bufs: vec![(GuestAddress(0x1000), 10), (GuestAddress(0x2000), 100)] };
        let hdr = sample();
        assert_eq!(rx.write_packet(&mem, &hdr, b"hello").unwrap(), 49);
        let mut first = [0u8; 10];
        mem.read_slice(&mut first, GuestAddress(0x1000)).unwrap();
        let mut rest = [0u8; 39];
        mem.read_slice(&mut rest, GuestAddress(0x2000)).unwrap();
        let all: Vec<u8> = first.iter().chain(rest.iter()).copied().collect();
        assert_eq!(PacketHeader::decode(&all).unwrap(), hdr);
        assert_eq!(&all[HDR_SIZE..], b"hello");
        let big = vec![0u8; 100];
        assert!(matches!(rx.write_packet(&mem, &hdr, &big), Err(PacketError::RxBufferTooSmall { .. })));
    }
}
