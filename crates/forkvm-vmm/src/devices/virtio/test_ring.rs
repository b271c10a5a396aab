//! A split virtqueue a simulated driver keeps in guest memory, each buffer in a slot of
//! its own: what the vsock and net unit tests' drivers post and read back (the rings
//! laid out by hand, so a device runs against the structures a Linux guest builds).
//!
//! Layout from `base`: descriptor table, avail ring at +4 KiB, used ring at +8 KiB,
//! slots from +16 KiB, `slot_bytes` each, one per descriptor.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

const F_NEXT: u16 = 1;
const F_WRITE: u16 = 2;

#[derive(Debug)]
pub struct SlotRing {
    base: u64,
    size: u16,
    slot_bytes: u64,
    free: Vec<u16>,
    chains: HashMap<u16, Vec<u16>>,
    avail_idx: u16,
    last_used: u16,
}

impl SlotRing {
    pub fn new(base: u64, size: u16, slot_bytes: u64) -> SlotRing {
        SlotRing {
            base,
            size,
            slot_bytes,
            free: (0..size).rev().collect(),
            chains: HashMap::new(),
            avail_idx: 0,
            last_used: 0,
        }
    }

    /// Bytes of guest memory the ring and its slots take from `base`.
    pub fn span(size: u16, slot_bytes: u64) -> u64 {
        0x4000 + slot_bytes * u64::from(size)
    }

    fn desc(&self) -> u64 {
        self.base
    }
    fn avail(&self) -> u64 {
        self.base + 0x1000
    }
    fn used(&self) -> u64 {
        self.base + 0x2000
    }
    /// Where descriptor `i`'s buffer lives.
    pub fn slot(&self, i: u16) -> u64 {
        self.base + 0x4000 + u64::from(i) * self.slot_bytes
    }

    /// A device-side `Queue` for these rings, ready.
    pub fn queue(&self, event_idx: bool) -> Queue {
        let mut q = Queue::new(self.size).unwrap();
        q.set_size(self.size);
        let split = |a: u64| (Some(a as u32), Some((a >> 32) as u32));
        let (lo, hi) = split(self.desc());
        q.set_desc_table_address(lo, hi);
        let (lo, hi) = split(self.avail());
        q.set_avail_ring_address(lo, hi);
        let (lo, hi) = split(self.used());
        q.set_used_ring_address(lo, hi);
        q.set_event_idx(event_idx);
        q.set_ready(true);
        q
    }

    /// Posts a chain of (bytes to copy in, length, device-writable) buffers, each in its
    /// descriptor's slot; its head, or `None` when the ring is full.
    pub fn add(&mut self, mem: &GuestMemoryMmap, parts: &[(&[u8], u32, bool)]) -> Option<u16> {
        self.add_at(mem, parts, None)
    }

    /// [`add`](Self::add), every buffer at `addr` if given (anything, as a hostile
    /// driver may).
    pub fn add_at(&mut self, mem: &GuestMemoryMmap, parts: &[(&[u8], u32, bool)], addr: Option<u64>) -> Option<u16> {
        if self.free.len() < parts.len() {
            return None;
        }
        let ids: Vec<u16> = (0..parts.len()).map(|_| self.free.pop().unwrap()).collect();
        for (i, (data, len, write)) in parts.iter().enumerate() {
            let at = addr.unwrap_or(self.slot(ids[i]));
            if !data.is_empty() {
                mem.write_slice(data, GuestAddress(at)).unwrap();
            }
            let mut flags = if *write { F_WRITE } else { 0 };
            let next = ids.get(i + 1).copied().unwrap_or(0);
            if i + 1 < parts.len() {
                flags |= F_NEXT;
            }
            let d = self.desc() + u64::from(ids[i]) * 16;
            mem.write_obj(at, GuestAddress(d)).unwrap();
            mem.write_obj(*len, GuestAddress(d + 8)).unwrap();
            mem.write_obj(flags, GuestAddress(d + 12)).unwrap();
            mem.write_obj(next, GuestAddress(d + 14)).unwrap();
        }
        let slot = self.avail() + 4 + u64::from(self.avail_idx % self.size) * 2;
        mem.write_obj(ids[0], GuestAddress(slot)).unwrap();
        self.avail_idx = self.avail_idx.wrapping_add(1);
        mem.store(self.avail_idx, GuestAddress(self.avail() + 2), Ordering::Release).unwrap();
        self.chains.insert(ids[0], ids.clone());
        Some(ids[0])
    }

    /// Sets the avail ring's index as a (hostile) driver may: anything.
    pub fn set_avail_idx(&mut self, mem: &GuestMemoryMmap, idx: u16) {
        self.avail_idx = idx;
        mem.store(idx, GuestAddress(self.avail() + 2), Ordering::Release).unwrap();
    }

    /// Used entries since the last call: (head, length); their descriptors are free again.
    pub fn take_used(&mut self, mem: &GuestMemoryMmap) -> Vec<(u16, u32)> {
        let idx: u16 = mem.load(GuestAddress(self.used() + 2), Ordering::Acquire).unwrap();
        let mut out = Vec::new();
        while self.last_used != idx {
            let e = self.used() + 4 + u64::from(self.last_used % self.size) * 8;
            let id: u32 = mem.read_obj(GuestAddress(e)).unwrap();
            let len: u32 = mem.read_obj(GuestAddress(e + 4)).unwrap();
            let ids = self.chains.remove(&(id as u16)).expect("device used an unknown head");
            out.push((id as u16, len));
            self.free.extend(ids);
            self.last_used = self.last_used.wrapping_add(1);
        }
        out
    }
}
