//! A simulated virtio-vsock guest driver for unit tests: split rings laid out in guest
//! memory by hand, so the device runs against the same structures a Linux guest builds.

use super::packet::{PacketHeader, HDR_SIZE};
use super::{Vsock, EVENT_QUEUE, HOST_CID, OP_RW, RX_QUEUE, TX_QUEUE, TYPE_STREAM};
use crate::devices::virtio::{ActivateContext, Interrupt, VirtioDevice};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

const RING_SIZE: u16 = 128;
const BUF_SIZE: u64 = 8192;
const RX_BUF_LEN: u32 = 4096 + HDR_SIZE as u32;
const F_NEXT: u16 = 1;
const F_WRITE: u16 = 2;
/// Each ring gets 2 MiB: descriptor table, avail, used, then one buffer per descriptor.
const RING_SPAN: u64 = 2 << 20;

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
struct Ring {
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
    fn buf(&self, i: u16) -> u64 {
        self.base + 0x4000 + u64::from(i) * BUF_SIZE
    }

    fn queue(&self) -> Queue {
        let mut q = Queue::new(RING_SIZE).unwrap();
        q.set_size(RING_SIZE);
        let split = |a: u64| (Some(a as u32), Some((a >> 32) as u32));
        let (lo, hi) = split(self.desc());
        q.set_desc_table_address(lo, hi);
        let (lo, hi) = split(self.avail());
        q.set_avail_ring_address(lo, hi);
        let (lo, hi) = split(self.used());
        q.set_used_ring_address(lo, hi);
        q.set_ready(true);
        q
    }

    /// Posts a chain of (bytes to copy in, length, device-writable) buffers.
    fn add(&mut self, mem: &GuestMemoryMmap, parts: &[(&[u8], u32, bool)]) -> bool {
        if self.free.len() < parts.len() {
            return false;
        }
        let ids: Vec<u16> = (0..parts.len()).map(|_| self.free.pop().unwrap()).collect();
        for (i, (data, len, write)) in parts.iter().enumerate() {
            let addr = self.buf(ids[i]);
            mem.write_slice(data, GuestAddress(addr)).unwrap();
            let mut flags = if *write { F_WRITE } else { 0 };
            let next = ids.get(i + 1).copied().unwrap_or(0);
            if i + 1 < parts.len() {
                flags |= F_NEXT;
            }
            let d = self.desc() + u64::from(ids[i]) * 16;
            mem.write_obj(addr, GuestAddress(d)).unwrap();
            mem.write_obj(*len, GuestAddress(d + 8)).unwrap();
            mem.write_obj(flags, GuestAddress(d + 12)).unwrap();
            mem.write_obj(next, GuestAddress(d + 14)).unwrap();
        }
        let slot = self.avail() + 4 + u64::from(self.avail_idx % RING_SIZE) * 2;
        mem.write_obj(ids[0], GuestAddress(slot)).unwrap();
        self.avail_idx = self.avail_idx.wrapping_add(1);
        mem.store(self.avail_idx, GuestAddress(self.avail() + 2), Ordering::Release).unwrap();
        self.chains.insert(ids[0], ids);
        true
    }

    /// Used entries since the last call: (first descriptor's buffer address, length).
    fn take_used(&mut self, mem: &GuestMemoryMmap) -> Vec<(u64, u32)> {
        let idx: u16 = mem.load(GuestAddress(self.used() + 2), Ordering::Acquire).unwrap();
        let mut out = Vec::new();
        while self.last_used != idx {
            let e = self.used() + 4 + u64::from(self.last_used % RING_SIZE) * 8;
            let id: u32 = mem.read_obj(GuestAddress(e)).unwrap();
            let len: u32 = mem.read_obj(GuestAddress(e + 4)).unwrap();
            let ids = self.chains.remove(&(id as u16)).expect("device used an unknown head");
            out.push((self.buf(id as u16), len));
            self.free.extend(ids);
            self.last_used = self.last_used.wrapping_add(1);
        }
        out
    }
}

/// The simulated guest: memory, three rings, per-stream `fwd_cnt`.
#[derive(Debug)]
pub struct Guest {
    pub mem: GuestMemoryMmap,
    pub cid: u64,
    pub irq: Arc<CountingIrq>,
    /// The receive buffer advertised in every header.
    pub buf_alloc: u32,
    rx: Ring,
    tx: Ring,
    event: Ring,
    received: VecDeque<(PacketHeader, Vec<u8>)>,
    /// Bytes consumed per (guest port, host port).
    fwd: HashMap<(u32, u32), u32>,
}

impl Guest {
    pub fn new(cid: u64) -> Guest {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 3 * RING_SPAN as usize)]).unwrap();
        Guest {
            mem,
            cid,
            irq: Arc::new(CountingIrq::default()),
            buf_alloc: 1 << 20,
            rx: Ring::new(0),
            tx: Ring::new(RING_SPAN),
            event: Ring::new(2 * RING_SPAN),
            received: VecDeque::new(),
            fwd: HashMap::new(),
        }
    }

    /// Posts rx buffers, then activates `dev` with the three queues.
    pub fn activate(&mut self, dev: &mut Vsock, rx_buffers: usize) {
        for _ in 0..rx_buffers {
            assert!(self.rx.add(&self.mem, &[(&[], RX_BUF_LEN, true)]));
        }
        let queues = vec![self.rx.queue(), self.tx.queue(), self.event.queue()];
        let ctx = ActivateContext { mem: self.mem.clone(), notify_used: self.irq.clone() };
        dev.activate(ctx, queues).unwrap();
    }

    /// A header from guest port `src` to host port `dst` carrying our credit.
    pub fn hdr(&self, op: u16, src: u32, dst: u32, len: usize) -> PacketHeader {
        PacketHeader {
            src_cid: self.cid,
            dst_cid: HOST_CID,
            src_port: src,
            dst_port: dst,
            len: len as u32,
            type_: TYPE_STREAM,
            op,
            flags: 0,
            buf_alloc: self.buf_alloc,
            fwd_cnt: self.fwd.get(&(src, dst)).copied().unwrap_or(0),
        }
    }

    /// Sends a packet (header and payload in separate descriptors) and kicks tx.
    pub fn send(&mut self, dev: &mut Vsock, hdr: PacketHeader, payload: &[u8]) {
        let header = hdr.encode();
        let mut parts: Vec<(&[u8], u32, bool)> = vec![(&header, HDR_SIZE as u32, false)];
        if !payload.is_empty() {
            parts.push((payload, payload.len() as u32, false));
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.tx.add(&self.mem, &parts) {
            self.tx.take_used(&self.mem);
            assert!(Instant::now() < deadline, "tx ring never drained");
            std::thread::sleep(Duration::from_millis(1));
        }
        dev.queue_notify(TX_QUEUE);
    }

    /// The next packet the device put on rx, reposting its buffer; `None` on timeout.
    pub fn recv(&mut self, dev: &mut Vsock, timeout: Duration) -> Option<(PacketHeader, Vec<u8>)> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(p) = self.received.pop_front() {
                return Some(p);
            }
            let used = self.rx.take_used(&self.mem);
            for (addr, len) in &used {
                let mut bytes = vec![0u8; *len as usize];
                self.mem.read_slice(&mut bytes, GuestAddress(*addr)).unwrap();
                let hdr = PacketHeader::decode(&bytes).unwrap();
                assert_eq!((hdr.src_cid, hdr.dst_cid, hdr.len as usize), (HOST_CID, self.cid, bytes.len() - HDR_SIZE));
                if hdr.op == OP_RW {
                    *self.fwd.entry((hdr.dst_port, hdr.src_port)).or_default() += hdr.len;
                }
                self.received.push_back((hdr, bytes[HDR_SIZE..].to_vec()));
                assert!(self.rx.add(&self.mem, &[(&[], RX_BUF_LEN, true)]));
            }
            if !used.is_empty() {
                dev.queue_notify(RX_QUEUE);
                continue;
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Posts one 8-byte event buffer and kicks the event queue.
    pub fn add_event_buffer(&mut self, dev: Option<&mut Vsock>) {
        assert!(self.event.add(&self.mem, &[(&[], 8, true)]));
        if let Some(dev) = dev {
            dev.queue_notify(EVENT_QUEUE);
        }
    }

    /// Waits for an event; returns its id.
    pub fn recv_event(&mut self, timeout: Duration) -> Option<u32> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some((addr, len)) = self.event.take_used(&self.mem).first().copied() {
                assert_eq!(len, 4);
                return Some(self.mem.read_obj(GuestAddress(addr)).unwrap());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        None
    }
}
