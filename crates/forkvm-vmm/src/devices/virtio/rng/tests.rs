//! virtio-rng tests through the MMIO transport, as a guest driver would use it.

use super::*;
use crate::devices::virtio::mmio::MmioTransport;
use crate::devices::virtio::test_utils::{bring_up, notify, test_memory, CountingInterrupt, Desc, TestQueue};
use crate::devices::virtio::VirtioDeviceState;
use std::sync::Arc;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

fn read(mem: &GuestMemoryMmap, addr: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    mem.read_slice(&mut buf, GuestAddress(addr)).unwrap();
    buf
}

#[test]
fn fills_writable_buffers_with_random_bytes() {
    let mem = test_memory();
    let irq = Arc::new(CountingInterrupt::default());
    let rng = Rng::new();
    let metrics = rng.metrics();
    let mut t = MmioTransport::new(Box::new(rng), mem.clone(), irq.clone());
    let mut q = TestQueue::new(GuestAddress(0), 16);
    bring_up(&mut t, std::slice::from_ref(&q));

    let first = q.add_chain(&mem, &[Desc::w(0x10000, 64), Desc::w(0x20000, 64)]);
    let second = q.add_chain(&mem, &[Desc::r(0x30000, 8), Desc::w(0x40000, 4096)]);
    notify(&mut t, 0);

    assert_eq!(q.used_idx(&mem), 2);
    assert_eq!(q.used_elem(&mem, 0), (u32::from(first), 128));
    assert_eq!(q.used_elem(&mem, 1), (u32::from(second), 4096), "readable descriptors are not filled");
    assert_eq!(irq.count(), 1, "one interrupt for the batch");
    let a = read(&mem, 0x10000, 64);
    let b = read(&mem, 0x20000, 64);
    assert_ne!(a, b);
    assert!(a.iter().any(|&x| x != a[0]), "not a constant fill");
    assert_eq!(read(&mem, 0x30000, 8), vec![0; 8], "device-readable buffer untouched");
    let page = read(&mem, 0x40000, 4096);
    assert!(page.iter().filter(|&&x| x == 0).count() < 100);
    assert_eq!(metrics.snapshot(), RngMetricsSnapshot { requests: 2, bytes: 4224, errors: 0 });
}

#[test]
fn caps_bytes_per_request() {
    let mem = test_memory();
    let irq = Arc::new(CountingInterrupt::default());
    let mut t = MmioTransport::new(Box::new(Rng::new()), mem.clone(), irq);
    let mut q = TestQueue::new(GuestAddress(0), 16);
    bring_up(&mut t, std::slice::from_ref(&q));
    q.add_chain(&mem, &[Desc::w(0x100000, 1 << 20)]);
    notify(&mut t, 0);
    assert_eq!(q.used_elem(&mem, 0).1, MAX_BYTES_PER_REQUEST as u32);
}

#[test]
fn bad_buffer_is_answered_not_fatal() {
    let mem = test_memory();
    let irq = Arc::new(CountingInterrupt::default());
    let rng = Rng::new();
    let metrics = rng.metrics();
    let mut t = MmioTransport::new(Box::new(rng), mem.clone(), irq);
    let mut q = TestQueue::new(GuestAddress(0), 16);
    bring_up(&mut t, std::slice::from_ref(&q));
    q.add_chain(&mem, &[Desc::w(0x1_0000_0000, 64)]);
    q.add_chain(&mem, &[Desc::w(0x10000, 16)]);
    notify(&mut t, 0);
    assert_eq!(q.used_idx(&mem), 2);
    assert_eq!(q.used_elem(&mem, 0).1, 0);
    assert_eq!(q.used_elem(&mem, 1).1, 16);
    assert_eq!(metrics.snapshot().errors, 1);
}

#[test]
fn save_restore_save_round_trip() {
    let mem = test_memory();
    let irq = Arc::new(CountingInterrupt::default());
    let mut t = MmioTransport::new(Box::new(Rng::new()), mem.clone(), irq.clone());
    let mut q = TestQueue::new(GuestAddress(0), 16);
    bring_up(&mut t, std::slice::from_ref(&q));
    q.add_chain(&mem, &[Desc::w(0x10000, 32)]);
    notify(&mut t, 0);

    let saved = t.save();
    assert!(saved.activated);
    assert_eq!((saved.queues[0].next_avail, saved.queues[0].next_used), (1, 1));
    // Through the wire format, as a snapshot would carry it.
    let bytes = bincode::serialize(&saved).unwrap();
    let saved: crate::devices::virtio::mmio::MmioTransportState = bincode::deserialize(&bytes).unwrap();
    let VirtioDeviceState::Rng(ref rng_state) = saved.device else { panic!("not an rng state") };
    let device = Rng::restore(rng_state).unwrap();
    let mut restored = MmioTransport::restore(&saved, Box::new(device), mem.clone(), irq.clone()).unwrap();
    assert_eq!(restored.save(), saved);

    // The restored device carries on where the original stopped.
    q.add_chain(&mem, &[Desc::w(0x20000, 48)]);
    notify(&mut restored, 0);
    assert_eq!(q.used_idx(&mem), 2);
    assert_eq!(q.used_elem(&mem, 1).1, 48);
    assert_eq!(irq.count(), 2);
}

#[test]
fn restore_rejects_unoffered_features() {
    assert!(matches!(Rng::restore(&RngState { acked_features: 1 }), Err(RngError::RestoreFeatures { .. })));
}
