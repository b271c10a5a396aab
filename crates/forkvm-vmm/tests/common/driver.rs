//! A virtio driver the tests run from the host: the monitor guest reads and writes the
//! device registers for them (32-bit loads and stores from ring 3), and the test writes
//! the rings in guest memory itself. Used by the hostile-driver and rate-limit tests.

use super::{Console, T};
use forkvm_testguest::{monitor, TestGuest, IMAGE_BASE};
use forkvm_vmm::arch::x86_64::layout::{VIRTIO_MMIO_SIZE, VIRTIO_MMIO_START};
use forkvm_vmm::devices::attach::DeviceConfig;
use forkvm_vmm::vstate::irqchip::IrqchipMode;
use forkvm_vmm::{boot, BootConfig, Payload, Vmm};
use std::time::{Duration, Instant};
use vm_memory::{Bytes, GuestAddress};

/// Guest memory of the monitor guest these tests boot.
pub const MEM_MIB: u64 = 16;

// virtio-mmio registers (version 2).
pub const MAGIC: u64 = 0x000;
pub const DEVICE_ID: u64 = 0x008;
pub const DRIVER_FEATURES: u64 = 0x020;
pub const DRIVER_FEATURES_SEL: u64 = 0x024;
pub const QUEUE_SEL: u64 = 0x030;
pub const QUEUE_NUM_MAX: u64 = 0x034;
pub const QUEUE_NUM: u64 = 0x038;
pub const QUEUE_READY: u64 = 0x044;
pub const QUEUE_NOTIFY: u64 = 0x050;
pub const STATUS: u64 = 0x070;
pub const QUEUE_DESC: u64 = 0x080;
pub const QUEUE_AVAIL: u64 = 0x090;
pub const QUEUE_USED: u64 = 0x0a0;

pub const S_ACK: u32 = 1;
pub const S_DRIVER: u32 = 2;
pub const S_DRIVER_OK: u32 = 4;
pub const S_FEATURES_OK: u32 = 8;
pub const S_NEEDS_RESET: u32 = 64;

pub const F_NEXT: u16 = 1;
pub const F_WRITE: u16 = 2;
pub const F_INDIRECT: u16 = 4;

pub const BLOCK: u32 = 2;
pub const RNG: u32 = 4;
pub const VSOCK: u32 = 19;
pub const NET: u32 = 1;

/// Entries per queue the test sets up.
pub const QSIZE: u16 = 8;
pub struct Guest {
    pub vmm: Vmm,
    pub console: Console,
}

impl Guest {
    pub fn ask(&mut self, cmd: Vec<u8>) -> String {
        self.vmm.send_serial_input(&cmd).expect("the VMM takes serial input");
        self.console.line(T)
    }

    pub fn w32(&mut self, addr: u64, value: u32) {
        assert_eq!(self.ask(monitor::write32(addr, value)), "ok", "write {value:#x} at {addr:#x}");
    }

    pub fn r32(&mut self, addr: u64) -> u32 {
        let line = self.ask(monitor::read32(addr));
        let hex = line.strip_prefix('=').unwrap_or_else(|| panic!("read {addr:#x}: {line:?}"));
        u64::from_str_radix(hex, 16).unwrap() as u32
    }

    pub fn ping(&mut self) -> Duration {
        let t = Instant::now();
        assert_eq!(self.ask(monitor::ping()), "pong");
        t.elapsed()
    }

    /// The VMM still runs and its guest still answers.
    pub fn alive(&mut self, what: &str) {
        let exited = self.vmm.exit_latch().wait(Some(Duration::ZERO));
        assert_eq!(exited, None, "the VMM stopped after {what}");
        self.ping();
    }

    pub fn put<T: vm_memory::ByteValued>(&self, addr: u64, value: T) {
        self.vmm.memory().write_obj(value, GuestAddress(addr)).unwrap();
    }

    pub fn get<T: vm_memory::ByteValued>(&self, addr: u64) -> T {
        self.vmm.memory().read_obj(GuestAddress(addr)).unwrap()
    }
}

/// One queue's rings in guest memory.
#[derive(Clone, Copy)]
pub struct Rings {
    pub desc: u64,
    pub avail: u64,
    pub used: u64,
    /// Buffers for requests.
    pub data: u64,
    /// Entries in the queue.
    pub size: u16,
}

impl Rings {
    pub fn at(area: u64, size: u16) -> Rings {
        Rings { desc: area, avail: area + 0x1000, used: area + 0x2000, data: area + 0x4000, size }
    }

    pub fn desc(&self, g: &Guest, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let d = self.desc + 16 * u64::from(i);
        g.put(d, addr);
        g.put(d + 8, len);
        g.put(d + 12, flags);
        g.put(d + 14, next);
    }

    /// Puts `head` in the avail ring and moves its index on by one.
    pub fn offer(&self, g: &Guest, head: u16) {
        let idx: u16 = g.get(self.avail + 2);
        g.put(self.avail + 4 + 2 * u64::from(idx % self.size), head);
        g.put(self.avail + 2, idx.wrapping_add(1));
    }

    pub fn used_idx(&self, g: &Guest) -> u16 {
        g.get(self.used + 2)
    }
}

/// A device's register window.
pub fn window(slot: usize) -> u64 {
    VIRTIO_MMIO_START + slot as u64 * VIRTIO_MMIO_SIZE
}

/// Resets device `base`, negotiates VERSION_1 only and sets up queues `0..queues` (each
/// in its own 64 KiB at `area`); returns their rings.
pub fn set_up(g: &mut Guest, base: u64, queues: u32, area: u64) -> Vec<Rings> {
    set_up_sized(g, base, queues, area, QSIZE)
}

/// [`set_up`] with queues of `size` entries (at most 256: the rings get 4 KiB each).
pub fn set_up_sized(g: &mut Guest, base: u64, queues: u32, area: u64, size: u16) -> Vec<Rings> {
    g.w32(base + STATUS, 0);
    g.w32(base + STATUS, S_ACK | S_DRIVER);
    g.w32(base + DRIVER_FEATURES_SEL, 1);
    g.w32(base + DRIVER_FEATURES, 1); // VIRTIO_F_VERSION_1 (bit 32)
    g.w32(base + DRIVER_FEATURES_SEL, 0);
    g.w32(base + DRIVER_FEATURES, 0);
    g.w32(base + STATUS, S_ACK | S_DRIVER | S_FEATURES_OK);
    assert_ne!(g.r32(base + STATUS) & S_FEATURES_OK, 0, "device {base:#x} refused VERSION_1");
    let mut rings = Vec::new();
    for q in 0..queues {
        let r = Rings::at(area + u64::from(q) * 0x1_0000, size);
        // Clean rings: nothing offered, nothing used.
        g.vmm.memory().write_slice(&[0u8; 0x4000], GuestAddress(r.desc)).unwrap();
        g.w32(base + QUEUE_SEL, q);
        assert!(g.r32(base + QUEUE_NUM_MAX) >= u32::from(size));
        g.w32(base + QUEUE_NUM, u32::from(size));
        for (reg, addr) in [(QUEUE_DESC, r.desc), (QUEUE_AVAIL, r.avail), (QUEUE_USED, r.used)] {
            g.w32(base + reg, addr as u32);
            g.w32(base + reg + 4, (addr >> 32) as u32);
        }
        g.w32(base + QUEUE_READY, 1);
        rings.push(r);
    }
    g.w32(base + STATUS, S_ACK | S_DRIVER | S_FEATURES_OK | S_DRIVER_OK);
    rings
}

/// Waits (bounded) for the used index of `r` to reach `want`.
pub fn wait_used(g: &Guest, r: &Rings, want: u16) -> bool {
    let deadline = Instant::now() + T;
    while Instant::now() < deadline {
        if r.used_idx(g) == want {
            return true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    false
}

/// Boots the monitor guest (`MEM_MIB` of memory) with `devices`, ready for commands.
pub fn boot_with(devices: DeviceConfig) -> Guest {
    let (console, out) = Console::pair();
    let vmm = boot(
        &super::kvm(),
        BootConfig {
            mem_size: MEM_MIB << 20,
            vcpu_count: 1,
            irqchip: IrqchipMode::Split,
            cpu_template: super::template(),
            payload: Payload::Flat {
                name: "monitor".into(),
                image: TestGuest::Monitor.image().to_vec(),
                image_base: IMAGE_BASE,
                args: vec![0, 0, 0],
            },
            console: out,
            devices,
            start_paused: false,
        },
    )
    .expect("boot the monitor guest with devices");
    let mut g = Guest { vmm, console };
    g.console.wait_for("ready\n", T);
    g
}
