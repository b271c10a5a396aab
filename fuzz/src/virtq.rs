//! Guest memory with split virtqueues laid out from fuzz input, for the virtio targets.
//!
//! The fuzz input plays the guest driver. Its layout (all integers little endian; a
//! short input reads as zeros past its end):
//!
//! | field | bytes | meaning |
//! |-------|-------|---------|
//! | flags | 1 | [`FLAG_RAW_FEATURES`], [`FLAG_RAW_ADDRESSES`]; bits 4–7 are the target's |
//! | device byte | 1 | the target's (e.g. virtio-blk: read-only, layered) |
//! | features | 8 | only with [`FLAG_RAW_FEATURES`]: what the driver acks (else: all offered) |
//! | per queue | | in the device's queue order |
//! | · size code | 1 | bit 7 clear: size `1 << (code % 5)` (1..=16); set: a raw u16 follows |
//! | · addresses | 24 | only with [`FLAG_RAW_ADDRESSES`]: desc, avail, used (else [`queue_base`] + 0/0x200/0x400) |
//! | · descriptors | 16 × min(size, [`MAX_WRITTEN`]) | `addr u64, len u32, flags u16, next u16`, written as given except that an `addr` below 2^63 is taken modulo [`MEM_SPAN`] and a `len` below 2^31 modulo 16 KiB |
//! | · avail ring | 6 + 2 × min(size, [`MAX_WRITTEN`]) | `flags, idx, ring[..], used_event` |
//! | op count | 1 | `% 17` ops follow |
//! | ops | 8 each | `kind u8, queue u8, arg u16, value u32` (see [`Op`]) |
//! | data | rest | written at [`DATA_BASE`]: request headers and payloads |
//!
//! Guest memory is two regions with a hole between them ([`REGION_A`], [`REGION_B`]),
//! so descriptors can straddle the end of memory and a hole. [`Builder`] writes inputs in
//! this format for the seed corpus.

use crate::Bytes;
use std::sync::atomic::{AtomicUsize, Ordering};
use vm_memory::{Bytes as _, GuestAddress, GuestMemoryMmap};

/// First guest memory region: (start, length).
pub const REGION_A: (u64, usize) = (0, 0x40000);
/// Second region, after a 64 KiB hole.
pub const REGION_B: (u64, usize) = (0x50000, 0x10000);
/// Descriptor addresses below 2^63 are reduced modulo this (memory, the hole, a bit past).
pub const MEM_SPAN: u64 = 0x70000;
/// Where the input's data bytes are written.
pub const DATA_BASE: u64 = 0x8000;
/// At most this many descriptors and ring entries per queue come from the input.
pub const MAX_WRITTEN: usize = 64;

/// The driver acks the features given in the input instead of all offered ones.
pub const FLAG_RAW_FEATURES: u8 = 1 << 0;
/// Queue addresses come from the input instead of the canonical layout.
pub const FLAG_RAW_ADDRESSES: u8 = 1 << 1;

/// Descriptor flags (virtio 1.2 §2.7.5).
pub const DESC_NEXT: u16 = 1;
pub const DESC_WRITE: u16 = 2;
pub const DESC_INDIRECT: u16 = 4;

/// virtio-mmio register offsets (virtio 1.2 §4.2.2).
pub mod reg {
    pub const DEVICE_FEATURES: u64 = 0x010;
    pub const DEVICE_FEATURES_SEL: u64 = 0x014;
    pub const DRIVER_FEATURES: u64 = 0x020;
    pub const DRIVER_FEATURES_SEL: u64 = 0x024;
    pub const QUEUE_SEL: u64 = 0x030;
    pub const QUEUE_NUM: u64 = 0x038;
    pub const QUEUE_READY: u64 = 0x044;
    pub const QUEUE_NOTIFY: u64 = 0x050;
    pub const STATUS: u64 = 0x070;
    pub const QUEUE_DESC_LOW: u64 = 0x080;
    pub const QUEUE_AVAIL_LOW: u64 = 0x090;
    pub const QUEUE_USED_LOW: u64 = 0x0a0;
}

/// Device status bits.
pub const S_ACKNOWLEDGE: u32 = 1;
pub const S_DRIVER: u32 = 2;
pub const S_DRIVER_OK: u32 = 4;
pub const S_FEATURES_OK: u32 = 8;

/// Where queue `q`'s rings go in the canonical layout.
pub fn queue_base(q: usize) -> u64 {
    0x1000 * q as u64
}

/// Fresh, zeroed guest memory: [`REGION_A`] and [`REGION_B`].
pub fn memory() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(REGION_A.0), REGION_A.1), (GuestAddress(REGION_B.0), REGION_B.1)])
        .expect("harness: guest memory")
}

/// An interrupt line that counts its edges.
#[derive(Debug, Default)]
pub struct CountingInterrupt(pub AtomicUsize);

impl forkvm_vmm::devices::virtio::Interrupt for CountingInterrupt {
    fn trigger(&self) -> std::io::Result<()> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// One queue as the input configured it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueSpec {
    pub size: u16,
    pub desc: u64,
    pub avail: u64,
    pub used: u64,
    /// The avail ring's `idx` as written.
    pub avail_idx: u16,
}

/// What the driver does after bring-up, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// kind 0: QueueNotify for `queue`.
    Notify { queue: u16 },
    /// kind 1: a 4-byte register write at `arg` (anything in the 512-byte window).
    Write { offset: u64, value: u32 },
    /// kind 2: a register read at `arg`, `value & 7` bytes wide (0 → 4).
    Read { offset: u64, width: usize },
    /// kind 3: avail `idx += value % 17` (the ring slots past the old `idx`, as the input
    /// left them, become available: chains held back, or re-posted heads), then a notify.
    Repost { queue: u16, count: u16 },
}

/// A parsed input; its rings are already in guest memory.
#[derive(Debug, Clone)]
pub struct Case {
    pub flags: u8,
    pub device_byte: u8,
    /// What the driver acks; `None`: everything offered.
    pub features: Option<u64>,
    pub queues: Vec<QueueSpec>,
    pub ops: Vec<Op>,
}

fn remap_addr(raw: u64) -> u64 {
    if raw >> 63 == 0 {
        raw % MEM_SPAN
    } else {
        raw
    }
}

fn remap_len(raw: u32) -> u32 {
    if raw >> 31 == 0 {
        raw % 0x4000
    } else {
        raw
    }
}

impl Case {
    /// Parses `data` for a device with `queues` queues and writes its rings and data into
    /// `mem` (writes outside memory are dropped, as a guest's would fault).
    pub fn parse(data: &[u8], queues: usize, mem: &GuestMemoryMmap) -> Case {
        let mut b = Bytes::new(data);
        let flags = b.u8();
        let device_byte = b.u8();
        let features = (flags & FLAG_RAW_FEATURES != 0).then(|| b.u64());
        let mut specs = Vec::with_capacity(queues);
        for q in 0..queues {
            let code = b.u8();
            let size = if code & 0x80 == 0 { 1u16 << (code % 5) } else { b.u16() };
            let (desc, avail, used) = if flags & FLAG_RAW_ADDRESSES != 0 {
                (b.u64(), b.u64(), b.u64())
            } else {
                let base = queue_base(q);
                (base, base + 0x200, base + 0x400)
            };
            let n = usize::from(size).min(MAX_WRITTEN);
            for i in 0..n {
                let addr = remap_addr(b.u64());
                let len = remap_len(b.u32());
                let (dflags, next) = (b.u16(), b.u16());
                let at = desc.wrapping_add(16 * i as u64);
                let mut raw = [0u8; 16];
                raw[..8].copy_from_slice(&addr.to_le_bytes());
                raw[8..12].copy_from_slice(&len.to_le_bytes());
                raw[12..14].copy_from_slice(&dflags.to_le_bytes());
                raw[14..].copy_from_slice(&next.to_le_bytes());
                let _ = mem.write_slice(&raw, GuestAddress(at));
            }
            let avail_flags = b.u16();
            let avail_idx = b.u16();
            let _ = mem.write_obj(avail_flags, GuestAddress(avail));
            let _ = mem.write_obj(avail_idx, GuestAddress(avail.wrapping_add(2)));
            for i in 0..n {
                let _ = mem.write_obj(b.u16(), GuestAddress(avail.wrapping_add(4 + 2 * i as u64)));
            }
            let used_event = b.u16();
            let _ = mem.write_obj(used_event, GuestAddress(avail.wrapping_add(4 + 2 * u64::from(size))));
            specs.push(QueueSpec { size, desc, avail, used, avail_idx });
        }
        let count = b.u8() % 17;
        let mut ops = Vec::with_capacity(usize::from(count));
        for _ in 0..count {
            let (kind, queue, arg, value) = (b.u8(), b.u8(), b.u16(), b.u32());
            let queue = u16::from(queue) % (queues as u16).max(1);
            ops.push(match kind % 4 {
                0 => Op::Notify { queue },
                1 => Op::Write { offset: u64::from(arg) % 0x200, value },
                2 => Op::Read {
                    offset: u64::from(arg) % 0x200,
                    width: match value & 7 {
                        0 => 4,
                        w => w as usize,
                    },
                },
                _ => Op::Repost { queue, count: (value % 17) as u16 },
            });
        }
        let rest = b.rest();
        let room = (REGION_A.0 + REGION_A.1 as u64 - DATA_BASE) as usize;
        let _ = mem.write_slice(&rest[..rest.len().min(room)], GuestAddress(DATA_BASE));
        Case { flags, device_byte, features, queues: specs, ops }
    }
}

/// Advances queue `spec`'s avail `idx` by `count` (the driver posting more chains).
pub fn repost(mem: &GuestMemoryMmap, spec: &mut QueueSpec, count: u16) {
    spec.avail_idx = spec.avail_idx.wrapping_add(count);
    let _ = mem.write_obj(spec.avail_idx, GuestAddress(spec.avail.wrapping_add(2)));
}

/// Drives a device through its virtio-mmio transport the way Linux's driver does.
pub mod mmio {
    use super::*;
    use forkvm_vmm::devices::virtio::mmio::MmioTransport;

    pub fn write(t: &mut MmioTransport, offset: u64, value: u32) {
        t.write(offset, &value.to_le_bytes());
    }

    pub fn read(t: &mut MmioTransport, offset: u64) -> u32 {
        let mut b = [0u8; 4];
        t.read(offset, &mut b);
        u32::from_le_bytes(b)
    }

    /// Reset, ACKNOWLEDGE, DRIVER, features, FEATURES_OK, queue setup, DRIVER_OK: every
    /// step as the driver would do it, whatever the device answers (a refused step is
    /// part of what is fuzzed).
    pub fn bring_up(t: &mut MmioTransport, case: &Case) {
        write(t, reg::STATUS, 0);
        write(t, reg::STATUS, S_ACKNOWLEDGE);
        write(t, reg::STATUS, S_ACKNOWLEDGE | S_DRIVER);
        let mut offered = 0u64;
        for sel in 0..2 {
            write(t, reg::DEVICE_FEATURES_SEL, sel);
            offered |= u64::from(read(t, reg::DEVICE_FEATURES)) << (32 * sel);
        }
        let acked = case.features.unwrap_or(offered);
        for sel in 0..2 {
            write(t, reg::DRIVER_FEATURES_SEL, sel);
            write(t, reg::DRIVER_FEATURES, (acked >> (32 * sel)) as u32);
        }
        write(t, reg::STATUS, S_ACKNOWLEDGE | S_DRIVER | S_FEATURES_OK);
        let _ = read(t, reg::STATUS);
        for (i, q) in case.queues.iter().enumerate() {
            write(t, reg::QUEUE_SEL, i as u32);
            write(t, reg::QUEUE_NUM, u32::from(q.size));
            for (low, addr) in
                [(reg::QUEUE_DESC_LOW, q.desc), (reg::QUEUE_AVAIL_LOW, q.avail), (reg::QUEUE_USED_LOW, q.used)]
            {
                write(t, low, addr as u32);
                write(t, low + 4, (addr >> 32) as u32);
            }
            write(t, reg::QUEUE_READY, 1);
        }
        write(t, reg::STATUS, S_ACKNOWLEDGE | S_DRIVER | S_FEATURES_OK | S_DRIVER_OK);
    }

    /// Notifies every queue once, then runs the ops.
    pub fn run(t: &mut MmioTransport, mem: &GuestMemoryMmap, case: &mut Case) {
        for q in 0..case.queues.len() {
            write(t, reg::QUEUE_NOTIFY, q as u32);
        }
        for op in case.ops.clone() {
            match op {
                Op::Notify { queue } => write(t, reg::QUEUE_NOTIFY, u32::from(queue)),
                Op::Write { offset, value } => write(t, offset, value),
                Op::Read { offset, width } => {
                    let mut buf = vec![0u8; width];
                    t.read(offset, &mut buf);
                }
                Op::Repost { queue, count } => {
                    if let Some(spec) = case.queues.get_mut(usize::from(queue)) {
                        repost(mem, spec, count);
                    }
                    write(t, reg::QUEUE_NOTIFY, u32::from(queue));
                }
            }
        }
    }
}

/// One descriptor for [`Builder`].
#[derive(Debug, Clone, Copy)]
pub struct Desc {
    pub addr: u64,
    pub len: u32,
    pub flags: u16,
    pub next: u16,
}

/// One queue for [`Builder`].
#[derive(Debug, Clone, Default)]
pub struct QueueBuild {
    pub size: u16,
    pub descs: Vec<Desc>,
    pub ring: Vec<u16>,
    pub avail_idx: u16,
}

/// Writes inputs in the format of [`Case::parse`] (for the seed corpus).
#[derive(Debug, Clone, Default)]
pub struct Builder {
    pub flags: u8,
    pub device_byte: u8,
    pub queues: Vec<QueueBuild>,
    pub ops: Vec<(u8, u8, u16, u32)>,
    pub data: Vec<u8>,
}

impl Builder {
    /// `queues` queues of `size` (a power of two, 1..=16).
    pub fn new(queues: usize, size: u16) -> Builder {
        assert!(size.is_power_of_two() && size <= 16);
        let q = QueueBuild { size, ..QueueBuild::default() };
        Builder { queues: vec![q; queues], ..Builder::default() }
    }

    /// Appends `bytes` to the data area; returns their guest address.
    pub fn data(&mut self, bytes: &[u8]) -> u64 {
        // Keep buffers 16-byte aligned, as drivers do.
        while !self.data.len().is_multiple_of(16) {
            self.data.push(0);
        }
        let at = DATA_BASE + self.data.len() as u64;
        self.data.extend_from_slice(bytes);
        at
    }

    /// Reserves `len` zero bytes in the data area (a buffer for the device to fill).
    pub fn buffer(&mut self, len: usize) -> u64 {
        self.data(&vec![0u8; len])
    }

    /// Posts a chain of `(addr, len, writable)` buffers on queue `q`; returns its head.
    pub fn chain(&mut self, q: usize, bufs: &[(u64, u32, bool)]) -> u16 {
        let queue = &mut self.queues[q];
        let head = queue.descs.len() as u16;
        for (i, &(addr, len, writable)) in bufs.iter().enumerate() {
            let last = i + 1 == bufs.len();
            let mut flags = if writable { DESC_WRITE } else { 0 };
            if !last {
                flags |= DESC_NEXT;
            }
            let next = if last { 0 } else { head + i as u16 + 1 };
            queue.descs.push(Desc { addr, len, flags, next });
        }
        assert!(queue.descs.len() <= usize::from(queue.size), "seed: queue {q} overflows");
        queue.ring.push(head);
        queue.avail_idx += 1;
        head
    }

    /// Un-publishes the last `n` chains of queue `q`: they stay in the ring, and a later
    /// `Repost` op (kind 3) makes them available.
    pub fn hold(&mut self, q: usize, n: u16) {
        self.queues[q].avail_idx -= n;
    }

    /// Appends an op (see [`Op`]).
    pub fn op(&mut self, kind: u8, queue: u8, arg: u16, value: u32) {
        self.ops.push((kind, queue, arg, value));
    }

    pub fn encode(&self) -> Vec<u8> {
        assert_eq!(self.flags & (FLAG_RAW_FEATURES | FLAG_RAW_ADDRESSES), 0, "seed builder: canonical layout only");
        let mut out = vec![self.flags, self.device_byte];
        for q in &self.queues {
            out.push(q.size.trailing_zeros() as u8);
            for i in 0..usize::from(q.size) {
                let d = q.descs.get(i).copied().unwrap_or(Desc { addr: 0, len: 0, flags: 0, next: 0 });
                out.extend_from_slice(&d.addr.to_le_bytes());
                out.extend_from_slice(&d.len.to_le_bytes());
                out.extend_from_slice(&d.flags.to_le_bytes());
                out.extend_from_slice(&d.next.to_le_bytes());
            }
            out.extend_from_slice(&0u16.to_le_bytes());
            out.extend_from_slice(&q.avail_idx.to_le_bytes());
            for i in 0..usize::from(q.size) {
                out.extend_from_slice(&q.ring.get(i).copied().unwrap_or(0).to_le_bytes());
            }
            out.extend_from_slice(&0u16.to_le_bytes());
        }
        out.push(self.ops.len() as u8);
        for &(kind, queue, arg, value) in &self.ops {
            out.push(kind);
            out.push(queue);
            out.extend_from_slice(&arg.to_le_bytes());
            out.extend_from_slice(&value.to_le_bytes());
        }
        out.extend_from_slice(&self.data);
        out
    }
}
