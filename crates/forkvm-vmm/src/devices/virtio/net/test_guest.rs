//! A simulated virtio-net driver for unit tests: split rings laid out in guest memory by
//! hand, so the device runs against the structures a Linux guest builds.

use super::{Net, RX_QUEUE, TX_QUEUE, VNET_HDR_LEN};
use crate::devices::virtio::{ActivateContext, Interrupt, VirtioDevice};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

const RING_SIZE: u16 = 64;
/// Each ring's buffers: one slot of this size per descriptor.
const SLOT: u64 = 68 << 10;
const F_NEXT: u16 = 1;
const F_WRITE: u16 = 2;
/// Each ring: descriptor table, avail, used in the first 16 KiB, then the slots.
const RING_SPAN: u64 = 0x4000 + SLOT * RING_SIZE as u64;

/// Counts used-buffer interrupts.
#[derive(Debug, Default)]
pub struct CountingIrq(pub AtomicUsize);

impl Interrupt for CountingIrq {
    fn trigger(&self) -> std::io::Result<()> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

#[derive(Debug)]
pub struct Ring {
    base: u64,
    free: Vec<u16>,
    chains: HashMap<u16, Vec<u16>>,
    avail_idx: u16,
    last_used: u16,
}

impl Ring {
    fn new(base: u64) -> Ring {
        Ring { base, free: (0..RING_SIZE).rev().collect(), chains: HashMap::new(), avail_idx: 0, last_used: 0 }
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
    pub fn slot(&self, i: u16) -> u64 {
        self.base + 0x4000 + u64::from(i) * SLOT
    }

    fn queue(&self, event_idx: bool) -> Queue {
        let mut q = Queue::new(RING_SIZE).unwrap();
        q.set_size(RING_SIZE);
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

    /// Posts a chain of (bytes to copy in, length, device-writable) buffers, each in a
    /// slot of its own, or at the address given.
    pub fn add(&mut self, mem: &GuestMemoryMmap, parts: &[(&[u8], u32, bool)]) -> Option<u16> {
        self.add_at(mem, parts, None)
    }

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
        let slot = self.avail() + 4 + u64::from(self.avail_idx % RING_SIZE) * 2;
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

    /// Used entries since the last call: (head, length).
    pub fn take_used(&mut self, mem: &GuestMemoryMmap) -> Vec<(u16, u32)> {
        let idx: u16 = mem.load(GuestAddress(self.used() + 2), Ordering::Acquire).unwrap();
        let mut out = Vec::new();
        while self.last_used != idx {
            let e = self.used() + 4 + u64::from(self.last_used % RING_SIZE) * 8;
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

/// The simulated guest: memory, the rx and tx rings.
#[derive(Debug)]
pub struct Guest {
    pub mem: GuestMemoryMmap,
    pub irq: Arc<CountingIrq>,
    pub rx: Ring,
    pub tx: Ring,
    /// Bytes each posted rx buffer holds.
    pub rx_buf_len: u32,
    /// Used rx entries not yet read as frames.
    rx_used: VecDeque<(u16, u32)>,
}

impl Guest {
    pub fn new(rx_buf_len: u32) -> Guest {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 2 * RING_SPAN as usize)]).unwrap();
        Guest {
            mem,
            irq: Arc::new(CountingIrq::default()),
            rx: Ring::new(0),
            tx: Ring::new(RING_SPAN),
            rx_buf_len,
            rx_used: VecDeque::new(),
        }
    }

    /// Acks `features`, posts `rx_buffers` receive buffers, activates `dev`.
    pub fn activate(&mut self, dev: &mut Net, features: u64, rx_buffers: usize) {
        dev.set_acked_features(features);
        self.post_rx(rx_buffers);
        let event_idx = features & super::F_EVENT_IDX != 0;
        let queues = vec![self.rx.queue(event_idx), self.tx.queue(event_idx)];
        let ctx = ActivateContext { mem: self.mem.clone(), notify_used: self.irq.clone() };
        dev.activate(ctx, queues).unwrap();
    }

    pub fn post_rx(&mut self, n: usize) {
        for _ in 0..n {
            self.rx.add(&self.mem, &[(&[], self.rx_buf_len, true)]).expect("room in the rx ring");
        }
    }

    /// Sends `frame` behind a zero header (header and frame in separate descriptors).
    pub fn send(&mut self, dev: &mut Net, frame: &[u8]) {
        let hdr = [0u8; VNET_HDR_LEN];
        self.send_parts(dev, &[(&hdr, VNET_HDR_LEN as u32, false), (frame, frame.len() as u32, false)]);
    }

    /// Posts one tx chain of `parts` and notifies.
    pub fn send_parts(&mut self, dev: &mut Net, parts: &[(&[u8], u32, bool)]) -> u16 {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(head) = self.tx.add(&self.mem, parts) {
                dev.queue_notify(TX_QUEUE);
                return head;
            }
            self.tx.take_used(&self.mem);
            assert!(Instant::now() < deadline, "the tx ring never drained");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The next received frame (header, frame), reposting the buffers it used;
    /// `None` after `timeout`. Frames over several buffers (MRG_RXBUF) are joined.
    pub fn recv(&mut self, dev: &mut Net, timeout: Duration) -> Option<([u8; VNET_HDR_LEN], Vec<u8>)> {
        let deadline = Instant::now() + timeout;
        loop {
            let used = self.rx.take_used(&self.mem);
            self.rx_used.extend(used);
            if let Some(&(head, len)) = self.rx_used.front() {
                if (len as usize) < VNET_HDR_LEN {
                    // A buffer given back empty (a frame dropped): a driver skips it.
                    self.rx_used.pop_front();
                    continue;
                }
                let first = self.read(self.rx.slot(head), len);
                let mut hdr = [0u8; VNET_HDR_LEN];
                hdr.copy_from_slice(&first[..VNET_HDR_LEN]);
                let buffers = usize::from(u16::from_le_bytes([hdr[10], hdr[11]])).max(1);
                if self.rx_used.len() >= buffers {
                    let mut frame = first[VNET_HDR_LEN..].to_vec();
                    self.rx_used.pop_front();
                    for _ in 1..buffers {
                        let (h, l) = self.rx_used.pop_front().unwrap();
                        frame.extend(self.read(self.rx.slot(h), l));
                    }
                    self.post_rx(buffers);
                    dev.queue_notify(RX_QUEUE);
                    return Some((hdr, frame));
                }
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    pub fn read(&self, addr: u64, len: u32) -> Vec<u8> {
        let mut v = vec![0u8; len as usize];
        self.mem.read_slice(&mut v, GuestAddress(addr)).unwrap();
        v
    }
}
