//! Transport tests: the register window driven the way the Linux virtio-mmio driver
//! drives it, with virtio-rng as the device behind it.

use super::*;
use crate::devices::virtio::rng::Rng;
use crate::devices::virtio::test_utils::{
    bring_up, negotiate, notify, offered_features, reg_read, reg_write, test_memory, CountingInterrupt, Desc, TestQueue,
};
use vm_memory::GuestAddress;

fn rng_transport() -> (MmioTransport, Arc<CountingInterrupt>) {
    let irq = Arc::new(CountingInterrupt::default());
    (MmioTransport::new(Box::new(Rng::new()), test_memory(), irq.clone()), irq)
}

#[test]
fn identity_registers() {
    let (mut t, _) = rng_transport();
    assert_eq!(reg_read(&mut t, reg::VIRTIO_MMIO_MAGIC_VALUE), 0x7472_6976);
    assert_eq!(reg_read(&mut t, reg::VIRTIO_MMIO_VERSION), 2);
    assert_eq!(reg_read(&mut t, reg::VIRTIO_MMIO_DEVICE_ID), 4);
    assert_eq!(reg_read(&mut t, reg::VIRTIO_MMIO_VENDOR_ID), MMIO_VENDOR_ID);
    assert_eq!(offered_features(&mut t), crate::devices::virtio::device::VIRTIO_F_VERSION_1);
    reg_write(&mut t, reg::VIRTIO_MMIO_QUEUE_SEL, 0);
    assert_eq!(reg_read(&mut t, reg::VIRTIO_MMIO_QUEUE_NUM_MAX), 256);
    reg_write(&mut t, reg::VIRTIO_MMIO_QUEUE_SEL, 1);
    assert_eq!(reg_read(&mut t, reg::VIRTIO_MMIO_QUEUE_NUM_MAX), 0, "no second queue");
}

#[test]
fn refuses_features_it_did_not_offer() {
    let (mut t, _) = rng_transport();
    let version_1 = crate::devices::virtio::device::VIRTIO_F_VERSION_1;
    let status = negotiate(&mut t, version_1 | (1 << 40));
    assert_eq!(status & S_FEATURES_OK, 0, "FEATURES_OK must read back clear");
    assert_eq!(status, S_ACKNOWLEDGE | S_DRIVER);
    // Without VERSION_1 the modern transport refuses as well.
    assert_eq!(negotiate(&mut t, 0) & S_FEATURES_OK, 0);
    // A driver that ignores the refusal cannot reach DRIVER_OK.
    reg_write(&mut t, reg::VIRTIO_MMIO_STATUS, S_ACKNOWLEDGE | S_DRIVER | S_FEATURES_OK | S_DRIVER_OK);
    assert!(!t.is_activated());
    // After a reset, a correct negotiation succeeds.
    assert_ne!(negotiate(&mut t, version_1) & S_FEATURES_OK, 0);
}

#[test]
fn status_bits_must_come_in_order() {
    let (mut t, _) = rng_transport();
    reg_write(&mut t, reg::VIRTIO_MMIO_STATUS, S_ACKNOWLEDGE | S_DRIVER_OK);
    assert_eq!(reg_read(&mut t, reg::VIRTIO_MMIO_STATUS), 0);
    reg_write(&mut t, reg::VIRTIO_MMIO_STATUS, S_ACKNOWLEDGE);
    reg_write(&mut t, reg::VIRTIO_MMIO_STATUS, S_DRIVER); // drops ACKNOWLEDGE: ignored
    assert_eq!(reg_read(&mut t, reg::VIRTIO_MMIO_STATUS), S_ACKNOWLEDGE);
    reg_write(&mut t, reg::VIRTIO_MMIO_STATUS, S_ACKNOWLEDGE | S_FAILED);
    assert_eq!(reg_read(&mut t, reg::VIRTIO_MMIO_STATUS), S_ACKNOWLEDGE | S_FAILED);
}

#[test]
fn bad_accesses_are_ignored() {
    let (mut t, _) = rng_transport();
    let mut two = [0xffu8; 2];
    t.read(0, &mut two);
    assert_eq!(two, [0, 0], "2-byte register read returns zeros");
    t.write(u64::from(reg::VIRTIO_MMIO_STATUS), &[1, 0]);
    assert_eq!(reg_read(&mut t, reg::VIRTIO_MMIO_STATUS), 0);
    assert_eq!(reg_read(&mut t, 0x0e8), 0, "unknown register");
    reg_write(&mut t, 0x0e8, 7);
    reg_write(&mut t, reg::VIRTIO_MMIO_MAGIC_VALUE, 0);
    assert_eq!(reg_read(&mut t, reg::VIRTIO_MMIO_MAGIC_VALUE), MMIO_MAGIC_VALUE);
    notify(&mut t, 0); // before activation
    notify(&mut t, 9);
    let mut cfg = [0xffu8; 8];
    t.read(MMIO_CONFIG_OFFSET + 0x50, &mut cfg);
    assert_eq!(cfg, [0; 8], "rng has no config space");
    // Queue setup before FEATURES_OK is refused.
    reg_write(&mut t, reg::VIRTIO_MMIO_QUEUE_NUM, 16);
    reg_write(&mut t, reg::VIRTIO_MMIO_QUEUE_READY, 1);
    assert_eq!(reg_read(&mut t, reg::VIRTIO_MMIO_QUEUE_READY), 0);
}

#[test]
fn interrupt_status_is_set_on_use_and_cleared_by_ack() {
    let mem = test_memory();
    let irq = Arc::new(CountingInterrupt::default());
    let mut t = MmioTransport::new(Box::new(Rng::new()), mem.clone(), irq.clone());
    let mut q = TestQueue::new(GuestAddress(0), 16);
    bring_up(&mut t, std::slice::from_ref(&q));
    q.add_chain(&mem, &[Desc::w(0x10000, 32)]);
    notify(&mut t, 0);
    assert_eq!(irq.count(), 1);
    assert_eq!(reg_read(&mut t, reg::VIRTIO_MMIO_INTERRUPT_STATUS), INT_USED_RING);
    reg_write(&mut t, reg::VIRTIO_MMIO_INTERRUPT_ACK, INT_USED_RING);
    assert_eq!(reg_read(&mut t, reg::VIRTIO_MMIO_INTERRUPT_STATUS), 0);
}

#[test]
fn reset_forgets_driver_and_queues() {
    let (mut t, _) = rng_transport();
    bring_up(&mut t, &[TestQueue::new(GuestAddress(0), 16)]);
    reg_write(&mut t, reg::VIRTIO_MMIO_STATUS, 0);
    assert!(!t.is_activated());
    assert_eq!(reg_read(&mut t, reg::VIRTIO_MMIO_STATUS), 0);
    assert_eq!(reg_read(&mut t, reg::VIRTIO_MMIO_QUEUE_READY), 0);
    assert!(t.device().queue_states().is_empty());
    // The driver can bring it up again.
    bring_up(&mut t, &[TestQueue::new(GuestAddress(0x8000), 16)]);
}

#[test]
fn activation_without_ready_queue_needs_reset() {
    let (mut t, irq) = rng_transport();
    negotiate(&mut t, crate::devices::virtio::device::VIRTIO_F_VERSION_1);
    reg_write(&mut t, reg::VIRTIO_MMIO_STATUS, S_ACKNOWLEDGE | S_DRIVER | S_FEATURES_OK | S_DRIVER_OK);
    assert!(!t.is_activated());
    assert_ne!(reg_read(&mut t, reg::VIRTIO_MMIO_STATUS) & S_NEEDS_RESET, 0);
    assert_eq!(reg_read(&mut t, reg::VIRTIO_MMIO_INTERRUPT_STATUS), INT_CONFIG);
    assert_eq!(irq.count(), 1);
}

#[test]
fn queue_outside_guest_memory_is_not_activated() {
    let (mut t, _) = rng_transport();
    negotiate(&mut t, crate::devices::virtio::device::VIRTIO_F_VERSION_1);
    reg_write(&mut t, reg::VIRTIO_MMIO_QUEUE_NUM, 16);
    reg_write(&mut t, reg::VIRTIO_MMIO_QUEUE_DESC_HIGH, 1); // 4 GiB: beyond the 4 MiB
    reg_write(&mut t, reg::VIRTIO_MMIO_QUEUE_READY, 1);
    reg_write(&mut t, reg::VIRTIO_MMIO_STATUS, S_ACKNOWLEDGE | S_DRIVER | S_FEATURES_OK | S_DRIVER_OK);
    assert!(!t.is_activated());
}

#[test]
fn restore_rejects_tampered_state() {
    let mem = test_memory();
    let (mut t, irq) = rng_transport();
    bring_up(&mut t, &[TestQueue::new(GuestAddress(0), 16)]);
    let good = t.save();
    let restore =
        |s: &MmioTransportState| MmioTransport::restore(s, Box::new(Rng::new()), mem.clone(), irq.clone()).map(|_| ());
    restore(&good).unwrap();

    let mut s = good.clone();
    s.queues[0].size = 12;
    assert!(matches!(restore(&s), Err(MmioError::InvalidQueue { .. })));
    let mut s = good.clone();
    s.queues[0].size = 512;
    assert!(matches!(restore(&s), Err(MmioError::InvalidQueue { .. })));
    let mut s = good.clone();
    s.queues[0].max_size = 512;
    assert!(matches!(restore(&s), Err(MmioError::InvalidQueue { .. })));
    let mut s = good.clone();
    s.queues[0].used_ring = 0x1_0000_0000;
    assert!(matches!(restore(&s), Err(MmioError::InvalidQueue { .. })));
    let mut s = good.clone();
    s.queues.push(s.queues[0]);
    assert!(matches!(restore(&s), Err(MmioError::QueueCountMismatch { .. })));
    let mut s = good.clone();
    s.driver_features |= 1 << 40;
    assert!(matches!(restore(&s), Err(MmioError::UnofferedFeatures { .. })));
    let mut s = good.clone();
    s.status = S_ACKNOWLEDGE | S_DRIVER_OK;
    assert!(matches!(restore(&s), Err(MmioError::InvalidStatus(_))));
    let mut s = good.clone();
    s.interrupt_status = 0x80;
    assert!(matches!(restore(&s), Err(MmioError::InvalidInterruptStatus(_))));
    let mut s = good.clone();
    s.device_type = 2;
    assert!(matches!(restore(&s), Err(MmioError::DeviceTypeMismatch { .. })));
}
