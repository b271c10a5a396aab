//! Test-guest tier: rate limits on the block and rng devices (`virtio::throttle`).
//!
//! A driver run from the host (`common::driver`) posts a batch of requests and notifies
//! once. The bucket's first second goes at once; the rest wait in the queue and the
//! device timer serves them at the rate, while the guest keeps running; a paused VM
//! serves none; and a snapshot taken while requests wait gives a VM that serves them
//! after its restore (its guest would never notify them again). The numbers are printed
//! (`--nocapture`). Bounded: every wait has a timeout.

mod common;

use common::driver::*;
use common::{Console, T};
use forkvm_vmm::devices::attach::{BlockConfig, DeviceConfig, RateLimits};
use forkvm_vmm::devices::virtio::throttle::RateLimit;
use std::time::{Duration, Instant};
use vm_memory::{Bytes, GuestAddress};

const AREA: u64 = 8 << 20;
/// Entries in the test's queues: room for a batch of 3-descriptor requests.
const QUEUE: u16 = 64;
/// Disk requests in a batch.
const BATCH: u16 = 16;
/// The disk cap: the first 10 requests at once, then one every 100 ms.
const OPS_PER_SEC: u64 = 10;
/// The rng cap, and its requests: 4 at once, then one every 250 ms.
const RNG_BYTES_PER_SEC: u64 = 2048;
const RNG_REQUEST: u32 = 512;
const RNG_BATCH: u16 = 8;

fn devices(dir: &std::path::Path, rate_limits: RateLimits) -> DeviceConfig {
    DeviceConfig {
        vsock: None,
        rng: true,
        blocks: vec![BlockConfig { path: dir.join("disk.img"), read_only: false, id: "limited".into(), layers: None }],
        net: None,
        rate_limits,
    }
}

fn capped() -> RateLimits {
    RateLimits {
        disk: RateLimit { ops_per_sec: Some(OPS_PER_SEC), bytes_per_sec: None },
        rng: RateLimit { bytes_per_sec: Some(RNG_BYTES_PER_SEC), ops_per_sec: None },
        ..RateLimits::default()
    }
}

/// A guest whose disk holds sector `i` filled with byte `i`.
fn booted(dir: &std::path::Path, limits: RateLimits) -> Guest {
    let disk: Vec<u8> = (0..64u8).flat_map(|i| [i; 512]).collect();
    std::fs::write(dir.join("disk.img"), disk).unwrap();
    boot_with(devices(dir, limits))
}

/// Request `i`'s header, status byte and data buffer.
fn request_at(r: &Rings, i: u16) -> (u64, u64, u64) {
    let base = r.data + u64::from(i) * 0x400;
    (base, base + 0x10, base + 0x200)
}

/// Posts `BATCH` one-sector reads (request `i` reads sector `i`), one notification.
fn post_reads(g: &mut Guest, base: u64, r: &Rings) {
    for i in 0..BATCH {
        let (header, status, data) = request_at(r, i);
        g.put(header, 0u32);
        g.put(header + 8, u64::from(i));
        g.put(status, 0xffu8);
        let d = i * 3;
        r.desc(g, d, header, 16, F_NEXT, d + 1);
        r.desc(g, d + 1, data, 512, F_NEXT | F_WRITE, d + 2);
        r.desc(g, d + 2, status, 1, F_WRITE, 0);
        r.offer(g, d);
    }
    g.w32(base + QUEUE_NOTIFY, 0);
}

/// When (since `t0`) each of the first `want` used entries of `r` appeared.
fn completions(g: &Guest, r: &Rings, want: u16, t0: Instant) -> Vec<Duration> {
    let mut at = Vec::new();
    while (at.len() as u16) < want && t0.elapsed() < T {
        let used = r.used_idx(g);
        while (at.len() as u16) < used {
            at.push(t0.elapsed());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    at
}

fn window_of(g: &mut Guest, device_id: u32) -> u64 {
    (0..2).map(window).find(|b| g.r32(b + DEVICE_ID) == device_id).expect("the device's window")
}

/// Every read of the batch succeeded with its sector's bytes.
fn check_reads(mem: &vm_memory::GuestMemoryMmap, r: &Rings) {
    for i in 0..BATCH {
        let (_, status, data) = request_at(r, i);
        assert_eq!(mem.read_obj::<u8>(GuestAddress(status)).unwrap(), 0, "request {i}'s status");
        let mut sector = [0u8; 512];
        mem.read_slice(&mut sector, GuestAddress(data)).unwrap();
        assert!(sector.iter().all(|b| *b == i as u8), "request {i} read the wrong bytes");
    }
}

#[test]
fn a_capped_disk_and_rng_serve_a_batch_at_their_rate_while_the_guest_runs() {
    let dir = tempfile::tempdir().unwrap();
    let mut g = booted(dir.path(), capped());
    let (blk, rng) = (window_of(&mut g, BLOCK), window_of(&mut g, RNG));

    let r = set_up_sized(&mut g, blk, 1, AREA, QUEUE)[0];
    let t0 = Instant::now();
    post_reads(&mut g, blk, &r);
    let served_at_once = r.used_idx(&g);
    // The guest answers while its disk requests wait.
    let ping = g.ping();
    let at = completions(&g, &r, BATCH, t0);
    assert_eq!(at.len() as u16, BATCH, "served {} of {BATCH} in {T:?}: {at:?}", at.len());
    let last = *at.last().unwrap();
    // 10 at once; the other 6 at 100 ms intervals.
    let expected = Duration::from_millis(1000 * (u64::from(BATCH) - OPS_PER_SEC) / OPS_PER_SEC);
    println!(
        "rate-limit: disk, {BATCH} requests at {OPS_PER_SEC}/s: {served_at_once} at once, the last after {last:?} \
         (expected {expected:?}); guest ping meanwhile {ping:?}"
    );
    assert_eq!(u64::from(served_at_once), OPS_PER_SEC, "the bucket's first second");
    assert!(last >= expected.mul_f64(0.9), "the cap did not hold: {at:?}");
    assert!(last <= expected * 3, "requests were held back too long: {at:?}");
    assert!(ping < Duration::from_millis(500), "the guest stalled while its disk was capped: {ping:?}");
    check_reads(g.vmm.memory(), &r);

    let q = set_up_sized(&mut g, rng, 1, AREA + 0x10_0000, QUEUE)[0];
    let t0 = Instant::now();
    for i in 0..RNG_BATCH {
        q.desc(&g, i, q.data + u64::from(i) * 0x400, RNG_REQUEST, F_WRITE, 0);
        q.offer(&g, i);
    }
    g.w32(rng + QUEUE_NOTIFY, 0);
    let at = completions(&g, &q, RNG_BATCH, t0);
    assert_eq!(at.len() as u16, RNG_BATCH, "rng served {at:?}");
    let last = *at.last().unwrap();
    println!("rate-limit: rng, {RNG_BATCH} × {RNG_REQUEST} B at {RNG_BYTES_PER_SEC} B/s: the last after {last:?} (expected 1 s)");
    assert!(last >= Duration::from_millis(900) && last <= Duration::from_secs(3), "the rng cap: {at:?}");
}

#[test]
fn held_back_requests_wait_out_a_pause_and_survive_a_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let mut g = booted(dir.path(), capped());
    let blk = window_of(&mut g, BLOCK);
    let r = set_up_sized(&mut g, blk, 1, AREA, QUEUE)[0];
    post_reads(&mut g, blk, &r);
    g.vmm.pause().unwrap();
    let held = r.used_idx(&g);
    assert_eq!(u64::from(held), OPS_PER_SEC);
    // Well past the time they were due: a paused VM's device serves nothing.
    std::thread::sleep(Duration::from_millis(900));
    assert_eq!(r.used_idx(&g), held, "a paused VM's disk served requests");

    // A snapshot now holds requests its guest will never notify again.
    let snap = dir.path().join("snap");
    g.vmm.snapshot(&snap).unwrap();

    // Resumed, the source serves them.
    g.vmm.resume().unwrap();
    let at = completions(&g, &r, BATCH, Instant::now());
    assert_eq!(at.len() as u16, BATCH, "after the resume: {at:?}");
    check_reads(g.vmm.memory(), &r);

    // Restored without any cap, the copy serves them at once.
    let (_console, out) = Console::pair();
    let prepared = forkvm_vmm::prepare(&snap).unwrap();
    let restored =
        forkvm_vmm::restore(&common::kvm(), &prepared, out, &devices(dir.path(), RateLimits::default()), false)
            .unwrap();
    let deadline = Instant::now() + T;
    let used = || restored.memory().read_obj::<u16>(GuestAddress(r.used + 2)).unwrap();
    while used() != BATCH && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(used(), BATCH, "the restored VM did not serve the requests its snapshot held");
    check_reads(restored.memory(), &r);
}
