//! The queue address registers: each ring address is a 64-bit value the driver writes
//! as two 32-bit halves (QueueDescLow/High and friends), in either order.
//!
//! Alignment is checked on every half-write (`virtio_queue` refuses misaligned rings);
//! whether the rings lie in guest memory is checked when the device is activated.

use virtio_queue::{Queue, QueueT};
use vm_memory::GuestAddress;

#[derive(Debug, Clone, Copy)]
pub(super) enum Ring {
    Desc,
    Avail,
    Used,
}

fn ring_addr(q: &Queue, ring: Ring) -> u64 {
    match ring {
        Ring::Desc => q.desc_table(),
        Ring::Avail => q.avail_ring(),
        Ring::Used => q.used_ring(),
    }
}

pub(super) fn set_low(q: &mut Queue, ring: Ring, value: u32) -> bool {
    let old = ring_addr(q, ring);
    store_addr(q, ring, (old & !0xffff_ffff) | u64::from(value))
}

pub(super) fn set_high(q: &mut Queue, ring: Ring, value: u32) -> bool {
    let old = ring_addr(q, ring);
    store_addr(q, ring, (old & 0xffff_ffff) | (u64::from(value) << 32))
}

fn store_addr(q: &mut Queue, ring: Ring, addr: u64) -> bool {
    let addr = GuestAddress(addr);
    let result = match ring {
        Ring::Desc => q.try_set_desc_table_address(addr),
        Ring::Avail => q.try_set_avail_ring_address(addr),
        Ring::Used => q.try_set_used_ring_address(addr),
    };
    result.is_ok()
}
