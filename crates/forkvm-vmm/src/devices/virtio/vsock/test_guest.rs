//! A simulated virtio-vsock guest driver for unit tests: split rings laid out in guest
//! memory by hand, so the device runs against the same structures a Linux guest builds.

use super::packet::{PacketHeader, HDR_SIZE};
use super::{Vsock, EVENT_QUEUE, HOST_CID, OP_RW, RX_QUEUE, TX_QUEUE, TYPE_STREAM};
use crate::devices::virtio::test_ring::SlotRing;
use crate::devices::virtio::{ActivateContext, Interrupt, VirtioDevice};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

const RING_SIZE: u16 = 128;
const BUF_SIZE: u64 = 8192;
const RX_BUF_LEN: u32 = 4096 + HDR_SIZE as u32;
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

/// The simulated guest: memory, three rings, per-stream `fwd_cnt`.
#[derive(Debug)]
pub struct Guest {
    pub mem: GuestMemoryMmap,
    pub cid: u64,
    pub irq: Arc<CountingIrq>,
    /// The receive buffer advertised in every header.
    pub buf_alloc: u32,
    rx: SlotRing,
    tx: SlotRing,
    event: SlotRing,
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
            rx: SlotRing::new(0, RING_SIZE, BUF_SIZE),
            tx: SlotRing::new(RING_SPAN, RING_SIZE, BUF_SIZE),
            event: SlotRing::new(2 * RING_SPAN, RING_SIZE, BUF_SIZE),
            received: VecDeque::new(),
            fwd: HashMap::new(),
        }
    }

    /// Posts rx buffers, then activates `dev` with the three queues.
    pub fn activate(&mut self, dev: &mut Vsock, rx_buffers: usize) {
        for _ in 0..rx_buffers {
            assert!(self.rx.add(&self.mem, &[(&[], RX_BUF_LEN, true)]).is_some());
        }
        let queues = vec![self.rx.queue(false), self.tx.queue(false), self.event.queue(false)];
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
        while self.tx.add(&self.mem, &parts).is_none() {
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
            for &(head, ref len) in &used {
                let addr = self.rx.slot(head);
                let mut bytes = vec![0u8; *len as usize];
                self.mem.read_slice(&mut bytes, GuestAddress(addr)).unwrap();
                let hdr = PacketHeader::decode(&bytes).unwrap();
                assert_eq!((hdr.src_cid, hdr.dst_cid, hdr.len as usize), (HOST_CID, self.cid, bytes.len() - HDR_SIZE));
                if hdr.op == OP_RW {
                    *self.fwd.entry((hdr.dst_port, hdr.src_port)).or_default() += hdr.len;
                }
                self.received.push_back((hdr, bytes[HDR_SIZE..].to_vec()));
                assert!(self.rx.add(&self.mem, &[(&[], RX_BUF_LEN, true)]).is_some());
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
        assert!(self.event.add(&self.mem, &[(&[], 8, true)]).is_some());
        if let Some(dev) = dev {
            dev.queue_notify(EVENT_QUEUE);
        }
    }

    /// Waits for an event; returns its id.
    pub fn recv_event(&mut self, timeout: Duration) -> Option<u32> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some((head, len)) = self.event.take_used(&self.mem).first().copied() {
                assert_eq!(len, 4);
                return Some(self.mem.read_obj(GuestAddress(self.event.slot(head))).unwrap());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        None
    }
}
