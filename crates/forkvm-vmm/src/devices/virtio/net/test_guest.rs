//! A simulated virtio-net driver for unit tests: split rings laid out in guest memory by
//! hand, so the device runs against the structures a Linux guest builds.

use super::{Net, RX_QUEUE, TX_QUEUE, VNET_HDR_LEN};
use crate::devices::virtio::test_ring::SlotRing;
use crate::devices::virtio::test_utils::CountingInterrupt;
use crate::devices::virtio::{ActivateContext, VirtioDevice};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

const RING_SIZE: u16 = 64;
/// Each ring's buffers: one slot of this size per descriptor.
const SLOT: u64 = 68 << 10;

/// The simulated guest: memory, the rx and tx rings.
#[derive(Debug)]
pub struct Guest {
    pub mem: GuestMemoryMmap,
    pub irq: Arc<CountingInterrupt>,
    pub rx: SlotRing,
    pub tx: SlotRing,
    /// Bytes each posted rx buffer holds.
    pub rx_buf_len: u32,
    /// Used rx entries not yet read as frames.
    rx_used: VecDeque<(u16, u32)>,
}

impl Guest {
    pub fn new(rx_buf_len: u32) -> Guest {
        let span = SlotRing::span(RING_SIZE, SLOT);
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 2 * span as usize)]).unwrap();
        let (rx, tx) = (SlotRing::new(0, RING_SIZE, SLOT), SlotRing::new(span, RING_SIZE, SLOT));
        Guest { mem, irq: Arc::new(CountingInterrupt::default()), rx, tx, rx_buf_len, rx_used: VecDeque::new() }
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
