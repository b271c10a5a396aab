//! Test-guest tier: a hostile driver against the VMM's virtio devices (the network
//! device too, over a tap in a namespace the test makes, when run as root).
//!
//! The monitor guest reads and writes the device registers for the test (32-bit loads,
//! stores and store storms from ring 3, at native speed); the test writes the rings in
//! guest memory itself. Each device (block, rng, vsock) is first driven correctly — one
//! valid request must complete, which shows the driver works — then given garbage:
//! descriptors outside guest memory, of length 4 GiB, in a loop, chained to indices
//! past the queue, an avail index far ahead of the ring, block requests past the disk's
//! end and of unknown types, a vsock packet claiming 4 GiB of payload, and a storm of
//! notifications. After each the VMM must still run and answer on its console, and the
//! disk file must be unchanged; during the storm a neighbour VM must keep answering near
//! its idle latency. The numbers are printed (`--nocapture`).
//!
//! Bounded: every storm has a fixed count, every wait a timeout.

mod common;
#[path = "../src/devices/virtio/net/test_net.rs"]
mod test_net;

use common::driver::*;
use common::{boot_guest, T};
use forkvm_testguest::{monitor, TestGuest};
use forkvm_vmm::devices::attach::{BlockConfig, DeviceConfig, NetConfig, TapSource, VsockConfig};
// `test_net` makes taps through `super::Tap`.
use forkvm_vmm::devices::virtio::net::Tap;
use forkvm_vmm::vstate::irqchip::IrqchipMode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use test_net::is_root;
use vm_memory::{Bytes, GuestAddress};

/// Where the test's rings and buffers live in guest memory.
const AREA: u64 = 8 << 20;
/// The disk: 64 KiB.
const DISK_BYTES: usize = 64 << 10;
/// Notifications in the storm.
const STORM: u64 = 30_000;

/// The garbage every queue is given, one case at a time: (name, what to write).
type Case = (&'static str, fn(&Guest, &Rings));

fn garbage() -> Vec<Case> {
    vec![
        ("a descriptor outside guest memory", |g, r| {
            r.desc(g, 0, 0xffff_ffff_0000, 4096, F_WRITE, 0);
            r.offer(g, 0);
        }),
        ("a descriptor 4 GiB long", |g, r| {
            r.desc(g, 0, r.data, u32::MAX, F_WRITE, 0);
            r.offer(g, 0);
        }),
        ("a descriptor chained to itself", |g, r| {
            r.desc(g, 0, r.data, 16, F_NEXT, 0);
            r.offer(g, 0);
        }),
        ("a chain that runs past the queue", |g, r| {
            r.desc(g, 0, r.data, 16, F_NEXT, 1);
            r.desc(g, 1, r.data, 16, F_NEXT | F_WRITE, 999);
            r.offer(g, 0);
        }),
        ("a head index past the queue", |g, r| r.offer(g, 0xffff)),
        ("an avail index 1000 ahead of the ring", |g, r| {
            let idx: u16 = g.get(r.avail + 2);
            g.put(r.avail + 2, idx.wrapping_add(1000));
        }),
        ("an indirect table that was not negotiated", |g, r| {
            r.desc(g, 0, r.data, 64, F_INDIRECT, 0);
            r.offer(g, 0);
        }),
    ]
}

/// Block requests a driver should never send.
fn block_garbage() -> Vec<Case> {
    fn request(g: &Guest, r: &Rings, kind: u32, sector: u64, len: u32, data_flags: u16) {
        g.put(r.data, kind);
        g.put(r.data + 4, 0u32);
        g.put(r.data + 8, sector);
        r.desc(g, 0, r.data, 16, F_NEXT, 1);
        r.desc(g, 1, r.data + 0x1000, len, F_NEXT | data_flags, 2);
        r.desc(g, 2, r.data + 0x800, 1, F_WRITE, 0);
        r.offer(g, 0);
    }
    vec![
        ("a write at the last sector a u64 can name", |g, r| request(g, r, 1, u64::MAX, 512, 0)),
        ("a write that ends past the disk", |g, r| request(g, r, 1, (DISK_BYTES / 512) as u64 - 1, 4096, 0)),
        ("a read of 4 GiB", |g, r| request(g, r, 0, 0, u32::MAX, F_WRITE)),
        ("a read into a device-readable buffer", |g, r| request(g, r, 0, 0, 512, 0)),
        ("a request of unknown type", |g, r| request(g, r, 0x1234, 0, 512, F_WRITE)),
        ("a header of 3 bytes", |g, r| {
            r.desc(g, 0, r.data, 3, F_NEXT, 1);
            r.desc(g, 1, r.data + 0x800, 1, F_WRITE, 0);
            r.offer(g, 0);
        }),
    ]
}

/// A vsock packet header (44 bytes) claiming `len` bytes of payload, op `op`.
fn vsock_packet(g: &Guest, r: &Rings, len: u32, op: u16) {
    let h = r.data;
    g.put(h, 3u64); // src_cid: the guest's
    g.put(h + 8, 2u64); // dst_cid: the host
    g.put(h + 16, 1234u32);
    g.put(h + 20, 4321u32);
    g.put(h + 24, len);
    g.put(h + 28, 1u16); // stream
    g.put(h + 30, op);
    g.put(h + 32, 0u32);
    g.put(h + 36, 65536u32);
    g.put(h + 40, 0u32);
    r.desc(g, 0, h, 44, F_NEXT, 1);
    r.desc(g, 1, r.data + 0x1000, 64, 0, 0);
    r.offer(g, 0);
}

fn boot_with_devices(dir: &std::path::Path) -> Guest {
    boot_with(DeviceConfig {
        vsock: Some(VsockConfig { guest_cid: 3, uds_path: dir.join("vsock.sock") }),
        rng: true,
        blocks: vec![BlockConfig { path: dir.join("disk.img"), read_only: false, id: "hostile".into(), layers: None }],
        net: is_root().then(|| NetConfig {
            tap: TapSource::Fd(Arc::new(test_net::tap_in_test_netns().into_fd())),
            mac: test_net::GUEST_MAC,
        }),
        rate_limits: Default::default(),
    })
}

/// What the device made of a case: it asked for a reset, answered (used an entry), or
/// neither (left the entry where it was).
fn reaction(g: &mut Guest, base: u64, r: &Rings) -> &'static str {
    if g.r32(base + STATUS) & S_NEEDS_RESET != 0 {
        "needs reset"
    } else if r.used_idx(g) != 0 {
        "answered"
    } else {
        "left pending"
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[test]
fn garbage_from_a_hostile_driver_leaves_the_vmm_running_and_its_neighbour_answering() {
    let dir = tempfile::tempdir().unwrap();
    let disk: Vec<u8> = (0..DISK_BYTES).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(dir.path().join("disk.img"), &disk).unwrap();
    let mut g = boot_with_devices(dir.path());

    let mut slots = std::collections::HashMap::new();
    let slots_made = if is_root() { 4 } else { 3 };
    for slot in 0..slots_made {
        let base = window(slot);
        assert_eq!(g.r32(base + MAGIC), 0x7472_6976, "slot {slot} is a virtio-mmio window");
        slots.insert(g.r32(base + DEVICE_ID), base);
    }
    let (blk, rng, vsock) = (slots[&BLOCK], slots[&RNG], slots[&VSOCK]);
    let net = slots.get(&NET).copied();

    // Driven correctly, each device answers: the driver is right, so what follows tests
    // the device, not the test.
    let r = set_up(&mut g, blk, 1, AREA)[0];
    g.put(r.data, 0u32); // read
    g.put(r.data + 8, 1u64); // sector 1
    r.desc(&g, 0, r.data, 16, F_NEXT, 1);
    r.desc(&g, 1, r.data + 0x1000, 512, F_NEXT | F_WRITE, 2);
    r.desc(&g, 2, r.data + 0x800, 1, F_WRITE, 0);
    r.offer(&g, 0);
    g.w32(blk + QUEUE_NOTIFY, 0);
    assert!(wait_used(&g, &r, 1), "the block device did not answer a valid read");
    let mut sector = vec![0u8; 512];
    g.vmm.memory().read_slice(&mut sector, GuestAddress(r.data + 0x1000)).unwrap();
    assert_eq!((g.get::<u8>(r.data + 0x800), &sector[..]), (0, &disk[512..1024]), "the valid read's result");
    let r = set_up(&mut g, rng, 1, AREA + 0x10_0000)[0];
    r.desc(&g, 0, r.data, 64, F_WRITE, 0);
    r.offer(&g, 0);
    g.w32(rng + QUEUE_NOTIFY, 0);
    assert!(wait_used(&g, &r, 1), "the rng did not answer a valid request");

    // Garbage, one case at a time, each on a freshly set-up device.
    let mut cases = 0;
    let mut reactions = Vec::new();
    let mut devices = vec![
        ("block", blk, 1, 0, [garbage(), block_garbage()].concat()),
        ("rng", rng, 1, 0, garbage()),
        ("vsock tx", vsock, 3, 1, garbage()),
    ];
    if let Some(net) = net {
        devices.push(("net tx", net, 2, 1, garbage()));
    } else {
        println!("hostile: the network device is left out (a tap in a namespace needs root)");
    }
    let driven: Vec<&str> = devices.iter().map(|d| d.0).collect();
    for (name, base, queues, kick, list) in devices {
        for (case, write) in list {
            let rings = set_up(&mut g, base, queues, AREA + 0x20_0000);
            write(&g, &rings[kick as usize]);
            g.w32(base + QUEUE_NOTIFY, kick);
            g.alive(&format!("{name}: {case}"));
            reactions.push(format!("{name}: {case}: {}", reaction(&mut g, base, &rings[kick as usize])));
            cases += 1;
        }
    }
    for (case, len, op) in [("a packet claiming 4 GiB", u32::MAX, 5u16), ("an unknown op", 16, 0xffff)] {
        let rings = set_up(&mut g, vsock, 3, AREA + 0x20_0000);
        vsock_packet(&g, &rings[1], len, op);
        g.w32(vsock + QUEUE_NOTIFY, 1);
        g.alive(&format!("vsock: {case}"));
        reactions.push(format!("vsock: {case}: {}", reaction(&mut g, vsock, &rings[1])));
        cases += 1;
    }
    for r in &reactions {
        println!("hostile: {r}");
    }
    // Each device looked at its garbage (a device that never answered was not driven).
    for device in driven {
        let answered = reactions.iter().any(|r| r.starts_with(&format!("{device}: ")) && r.ends_with("answered"));
        assert!(answered, "the {device} device answered no case: {reactions:#?}");
    }
    assert_eq!(std::fs::read(dir.path().join("disk.img")).unwrap(), disk, "garbage changed the disk file");

    // A storm of notifications on a queue full of garbage, while a neighbour answers.
    let (vmm, mut console) = boot_guest(TestGuest::Monitor, &[0, 0, 0], 16, IrqchipMode::Split);
    console.wait_for("ready\n", T);
    let mut neighbour = Guest { vmm, console };
    let idle = median((0..9).map(|_| neighbour.ping()).collect());
    let rings = set_up(&mut g, blk, 1, AREA + 0x20_0000);
    rings[0].desc(&g, 0, rings[0].data, 16, F_NEXT, 0);
    rings[0].offer(&g, 0);
    let stop = Arc::new(AtomicBool::new(false));
    let pinger = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut during = Vec::new();
            while !stop.load(Ordering::SeqCst) || during.len() < 3 {
                during.push(neighbour.ping());
            }
            during
        })
    };
    let started = Instant::now();
    g.vmm.send_serial_input(&monitor::repeat32(blk + QUEUE_NOTIFY, 0, STORM)).unwrap();
    let done = g.console.line(Duration::from_secs(120));
    let storm = started.elapsed();
    stop.store(true, Ordering::SeqCst);
    let during = pinger.join().expect("the neighbour's pinger");
    assert_eq!(done, "ok", "the storm did not finish");
    g.alive("the notification storm");
    let pings = during.len();
    let loaded = median(during);
    println!(
        "hostile: {cases} garbage cases survived; storm of {STORM} notifications in {:.0} ms ({:.1} µs each); \
         neighbour ping median {:.2} ms idle, {:.2} ms over {pings} pings during the storm",
        storm.as_secs_f64() * 1e3,
        storm.as_secs_f64() * 1e6 / STORM as f64,
        idle.as_secs_f64() * 1e3,
        loaded.as_secs_f64() * 1e3,
    );
    assert!(loaded <= idle * 5 + Duration::from_millis(50), "the neighbour slowed from {idle:?} to {loaded:?}");
    assert_eq!(std::fs::read(dir.path().join("disk.img")).unwrap(), disk, "the storm changed the disk file");
}
