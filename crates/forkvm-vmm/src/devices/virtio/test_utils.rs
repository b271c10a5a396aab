//! Test helpers that play the guest driver: guest memory, a split virtqueue laid out in
//! it, an interrupt that counts, and the Linux virtio-mmio probe sequence.
//!
//! Written from the driver's side on purpose, so the device code is exercised through
//! the same bytes a real guest would produce.

use super::mmio::MmioTransport;
use super::Interrupt;
use std::sync::atomic::{AtomicUsize, Ordering};
use virtio_bindings::virtio_mmio as reg;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

/// Size of [`test_memory`].
pub const TEST_MEM_SIZE: usize = 4 << 20;

/// 4 MiB of anonymous guest memory at address 0.
pub fn test_memory() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), TEST_MEM_SIZE)]).unwrap()
}

/// An interrupt line that counts its edges.
#[derive(Debug, Default)]
pub struct CountingInterrupt {
    pub count: AtomicUsize,
}

impl CountingInterrupt {
    pub fn count(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }
}

impl Interrupt for CountingInterrupt {
    fn trigger(&self) -> std::io::Result<()> {
        self.count.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// One descriptor as the driver posts it.
#[derive(Debug, Clone, Copy)]
pub struct Desc {
    pub addr: u64,
    pub len: u32,
    pub writable: bool,
}

impl Desc {
    /// Device-readable.
    pub fn r(addr: u64, len: u32) -> Desc {
        Desc { addr, len, writable: false }
    }
    /// Device-writable.
    pub fn w(addr: u64, len: u32) -> Desc {
        Desc { addr, len, writable: true }
    }
}

const F_NEXT: u16 = 1;
const F_WRITE: u16 = 2;

/// A split virtqueue in guest memory, driven from the driver side.
#[derive(Debug, Clone)]
pub struct TestQueue {
    pub size: u16,
    pub desc: GuestAddress,
    pub avail: GuestAddress,
    pub used: GuestAddress,
    next_desc: u16,
    avail_idx: u16,
}

impl TestQueue {
    /// Descriptor table at `base`, then the available ring, then the used ring.
    pub fn new(base: GuestAddress, size: u16) -> TestQueue {
        let desc = base;
        let avail = GuestAddress(base.0 + 16 * u64::from(size));
        let used = GuestAddress((avail.0 + 6 + 2 * u64::from(size) + 3) & !3);
        TestQueue { size, desc, avail, used, next_desc: 0, avail_idx: 0 }
    }

    /// Writes `descs` as one chain and publishes it; returns the head index.
    pub fn add_chain(&mut self, mem: &GuestMemoryMmap, descs: &[Desc]) -> u16 {
        let head = self.next_desc;
        for (i, d) in descs.iter().enumerate() {
            let index = (head + i as u16) % self.size;
            let at = self.desc.0 + 16 * u64::from(index);
            let mut flags = if d.writable { F_WRITE } else { 0 };
            let next = (index + 1) % self.size;
            if i + 1 < descs.len() {
                flags |= F_NEXT;
            }
            mem.write_obj(d.addr.to_le(), GuestAddress(at)).unwrap();
            mem.write_obj(d.len.to_le(), GuestAddress(at + 8)).unwrap();
            mem.write_obj(flags.to_le(), GuestAddress(at + 12)).unwrap();
            mem.write_obj(next.to_le(), GuestAddress(at + 14)).unwrap();
        }
        self.next_desc = (head + descs.len() as u16) % self.size;
        let slot = self.avail.0 + 4 + 2 * u64::from(self.avail_idx % self.size);
        mem.write_obj(head.to_le(), GuestAddress(slot)).unwrap();
        self.avail_idx = self.avail_idx.wrapping_add(1);
        mem.write_obj(self.avail_idx.to_le(), GuestAddress(self.avail.0 + 2)).unwrap();
        head
    }

    /// The used ring's `idx`.
    pub fn used_idx(&self, mem: &GuestMemoryMmap) -> u16 {
        u16::from_le(mem.read_obj(GuestAddress(self.used.0 + 2)).unwrap())
    }

    /// Used-ring entry `i`: (head index, bytes written).
    pub fn used_elem(&self, mem: &GuestMemoryMmap, i: u16) -> (u32, u32) {
        let at = self.used.0 + 4 + 8 * u64::from(i % self.size);
        let id = u32::from_le(mem.read_obj(GuestAddress(at)).unwrap());
        let len = u32::from_le(mem.read_obj(GuestAddress(at + 4)).unwrap());
        (id, len)
    }

    /// A device-side `Queue` for these rings, ready.
    pub fn queue(&self) -> Queue {
        let mut q = Queue::new(self.size).unwrap();
        q.set_size(self.size);
        q.try_set_desc_table_address(self.desc).unwrap();
        q.try_set_avail_ring_address(self.avail).unwrap();
        q.try_set_used_ring_address(self.used).unwrap();
        q.set_ready(true);
        q
    }
}

pub fn reg_read(t: &mut MmioTransport, offset: u32) -> u32 {
    let mut b = [0u8; 4];
    t.read(u64::from(offset), &mut b);
    u32::from_le_bytes(b)
}

pub fn reg_write(t: &mut MmioTransport, offset: u32, value: u32) {
    t.write(u64::from(offset), &value.to_le_bytes());
}

/// Runs the Linux probe up to FEATURES_OK, acking `features`; returns the status read
/// back (FEATURES_OK clear if the device refused).
pub fn negotiate(t: &mut MmioTransport, features: u64) -> u32 {
    reg_write(t, reg::VIRTIO_MMIO_STATUS, 0);
    reg_write(t, reg::VIRTIO_MMIO_STATUS, 1);
    reg_write(t, reg::VIRTIO_MMIO_STATUS, 1 | 2);
    for sel in 0..2 {
        reg_write(t, reg::VIRTIO_MMIO_DRIVER_FEATURES_SEL, sel);
        reg_write(t, reg::VIRTIO_MMIO_DRIVER_FEATURES, (features >> (32 * sel)) as u32);
    }
    reg_write(t, reg::VIRTIO_MMIO_STATUS, 1 | 2 | 8);
    reg_read(t, reg::VIRTIO_MMIO_STATUS)
}

/// Reads the 64 offered feature bits.
pub fn offered_features(t: &mut MmioTransport) -> u64 {
    let mut features = 0u64;
    for sel in 0..2 {
        reg_write(t, reg::VIRTIO_MMIO_DEVICE_FEATURES_SEL, sel);
        features |= u64::from(reg_read(t, reg::VIRTIO_MMIO_DEVICE_FEATURES)) << (32 * sel);
    }
    features
}

/// Negotiates all offered features, sets up `queues` and sets DRIVER_OK.
pub fn bring_up(t: &mut MmioTransport, queues: &[TestQueue]) {
    let features = offered_features(t);
    assert_eq!(negotiate(t, features) & 8, 8, "device refused its own features");
    for (i, q) in queues.iter().enumerate() {
        reg_write(t, reg::VIRTIO_MMIO_QUEUE_SEL, i as u32);
        assert!(reg_read(t, reg::VIRTIO_MMIO_QUEUE_NUM_MAX) >= u32::from(q.size));
        reg_write(t, reg::VIRTIO_MMIO_QUEUE_NUM, u32::from(q.size));
        for (low, addr) in [
            (reg::VIRTIO_MMIO_QUEUE_DESC_LOW, q.desc),
            (reg::VIRTIO_MMIO_QUEUE_AVAIL_LOW, q.avail),
            (reg::VIRTIO_MMIO_QUEUE_USED_LOW, q.used),
        ] {
            reg_write(t, low, addr.0 as u32);
            reg_write(t, low + 4, (addr.0 >> 32) as u32);
        }
        reg_write(t, reg::VIRTIO_MMIO_QUEUE_READY, 1);
    }
    reg_write(t, reg::VIRTIO_MMIO_STATUS, 1 | 2 | 8 | 4);
    assert!(t.is_activated(), "device did not activate");
}

/// Writes QueueNotify for queue `index`.
pub fn notify(t: &mut MmioTransport, index: u32) {
    reg_write(t, reg::VIRTIO_MMIO_QUEUE_NOTIFY, index);
}
