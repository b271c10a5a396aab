//! Test-guest tier: virtio-net in a real VM. The monitor guest does the device's register
//! reads and writes for the test, which writes the rings and frames in guest memory
//! itself; each VM's tap lives in a network namespace the test makes (root only), the
//! only place its frames can go.
//!
//! What it shows: the device in its slot, its MAC in the configuration space, ARP and
//! ICMP answered by the namespace's kernel; a snapshot names the device (`NetMeta`), and
//! a restore given a new tap in another namespace goes on with the rings as they were
//! and no new ARP (the tap MAC is the same in every namespace); a restore without a
//! tap, or with a descriptor that is not a tap, fails naming the step. Children of a
//! fork of the running VM each send through their own tap only, with the same guest
//! address and MAC, and a fork without a tap per child is refused.

mod common;
#[path = "../src/devices/virtio/net/test_net.rs"]
mod test_net;

use common::children::*;
use common::driver::*;
use common::{kvm, Console, T};
use forkvm_testguest::monitor;
use forkvm_vmm::devices::attach::{DeviceConfig, NetConfig, TapSource};
use forkvm_vmm::vmm::{ForkChild, ForkRunningError, VmmLabels};
// `test_net` makes taps through `super::Tap`.
use forkvm_vmm::devices::virtio::net::Tap;
use forkvm_vmm::{prepare, restore};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Instant;
use test_net::*;
use vm_memory::{Bytes, GuestAddress};

/// Where the rings and frames live in guest memory.
const AREA: u64 = 8 << 20;
/// Bytes per frame slot (rx buffers and tx frames alike).
const SLOT: u64 = 2048;
/// Where the device's configuration space (its MAC) is in the register window.
const CONFIG: u64 = 0x100;

fn net_config(fd: OwnedFd) -> DeviceConfig {
    let net = NetConfig { tap: TapSource::Fd(Arc::new(fd)), mac: GUEST_MAC };
    DeviceConfig { net: Some(net), ..Default::default() }
}

/// The test's driver state: both rings, what it sent and what it has read.
struct NetDriver {
    base: u64,
    rx: Rings,
    tx: Rings,
    sent: u16,
    seen: u16,
}

impl NetDriver {
    /// Sets the device up (VERSION_1 only) and posts a buffer in every rx entry.
    fn start(g: &mut Guest, base: u64) -> NetDriver {
        let rings = set_up(g, base, 2, AREA);
        let (rx, tx) = (rings[0], rings[1]);
        for i in 0..rx.size {
            rx.desc(g, i, rx.data + u64::from(i) * SLOT, SLOT as u32, F_WRITE, 0);
            rx.offer(g, i);
        }
        g.w32(base + QUEUE_NOTIFY, 0);
        NetDriver { base, rx, tx, sent: 0, seen: 0 }
    }

    fn send(&mut self, g: &mut Guest, frame: &[u8]) {
        let slot = self.sent % self.tx.size;
        let addr = self.tx.data + u64::from(slot) * SLOT;
        let bytes = [&[0u8; 12][..], frame].concat();
        g.vmm.memory().write_slice(&bytes, GuestAddress(addr)).unwrap();
        self.tx.desc(g, slot, addr, bytes.len() as u32, 0, 0);
        self.tx.offer(g, slot);
        g.w32(self.base + QUEUE_NOTIFY, 1);
        self.sent += 1;
    }

    /// The next frame the device put on rx (header stripped); its buffer is posted again.
    fn recv(&mut self, g: &mut Guest) -> Vec<u8> {
        let deadline = Instant::now() + T;
        while self.rx.used_idx(g) == self.seen {
            assert!(Instant::now() < deadline, "no frame came in");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let elem = self.rx.used + 4 + 8 * u64::from(self.seen % self.rx.size);
        let (id, len): (u32, u32) = (g.get(elem), g.get(elem + 4));
        let mut frame = vec![0u8; len as usize];
        g.vmm.memory().read_slice(&mut frame, GuestAddress(self.rx.data + u64::from(id) * SLOT)).unwrap();
        self.rx.offer(g, id as u16);
        g.w32(self.base + QUEUE_NOTIFY, 0);
        self.seen = self.seen.wrapping_add(1);
        frame.split_off(12)
    }

    fn recv_where<R>(&mut self, g: &mut Guest, mut pick: impl FnMut(&[u8]) -> Option<R>) -> R {
        let deadline = Instant::now() + T;
        loop {
            assert!(Instant::now() < deadline, "no matching frame came in");
            if let Some(r) = pick(&self.recv(g)) {
                return r;
            }
        }
    }

    fn ping(&mut self, g: &mut Guest, seq: u16) {
        let payload = format!("ping {seq}").into_bytes();
        self.send(g, &echo_request(tap_mac(), seq, &payload));
        let (got_seq, got) = self.recv_where(g, echo_reply);
        assert_eq!((got_seq, got), (seq, payload));
    }
}

#[test]
fn a_vm_reaches_its_namespace_and_after_a_restore_the_namespace_of_its_new_tap() {
    if !is_root() {
        eprintln!("skipped: a tap in a network namespace needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut g = boot_with(net_config(tap_in_test_netns().into_fd()));
    let base = window(0);
    assert_eq!(g.r32(base + DEVICE_ID), NET);
    let (lo, hi) = (g.r32(base + CONFIG), g.r32(base + CONFIG + 4));
    assert_eq!([&lo.to_le_bytes()[..], &hi.to_le_bytes()[..2]].concat(), GUEST_MAC, "the MAC in the config space");
    let mut d = NetDriver::start(&mut g, base);
    d.send(&mut g, &arp_request());
    assert_eq!(d.recv_where(&mut g, arp_reply), tap_mac());
    d.ping(&mut g, 1);

    let snap = dir.path().join("net-snap");
    g.vmm.snapshot(&snap).unwrap();
    let meta = forkvm_snapshot::read_meta(&snap.join(forkvm_snapshot::SNAPSHOT_JSON)).unwrap();
    assert_eq!(meta.devices.unwrap().net, Some(forkvm_snapshot::NetMeta { mac: GUEST_MAC }));
    drop(g); // its tap and namespace go with it

    let prepared = prepare(&snap).unwrap();
    // Without a network device, or with a descriptor that is not a tap: refused by name.
    let (_c, out) = Console::pair();
    let err = restore(&kvm(), &prepared, out, &DeviceConfig::default(), true).unwrap_err().to_string();
    assert!(err.contains("[net]") && err.contains("given []"), "{err}");
    let (_c, out) = Console::pair();
    let not_a_tap: OwnedFd = std::fs::File::open("/dev/null").unwrap().into();
    let err = restore(&kvm(), &prepared, out, &net_config(not_a_tap), true).unwrap_err().to_string();
    assert!(err.contains("net") && err.contains("not a tap"), "{err}");

    // In a new namespace, through a new tap: the rings go on where they were.
    let (console, out) = Console::pair();
    let mut vmm = restore(&kvm(), &prepared, out, &net_config(tap_in_test_netns().into_fd()), true).unwrap();
    vmm.resume().unwrap();
    let mut g = Guest { vmm, console };
    g.alive("the restore");
    d.ping(&mut g, 2);
    d.ping(&mut g, 3);
}

#[test]
fn forked_children_each_send_through_their_own_tap_only() {
    if !is_root() {
        eprintln!("skipped: a tap in a network namespace needs root");
        return;
    }
    const PORT: u16 = 9999;
    let dir = tempfile::tempdir().unwrap();
    let (tap, source_udp) = tap_and_udp_in_test_netns(Some(PORT));
    let mut g = boot_with(net_config(tap.into_fd()));
    let base = window(0);
    let d = NetDriver::start(&mut g, base);
    // The datagram every VM will send: in tx slot 0, described, not yet offered.
    let payload = b"hello from a clone";
    let bytes = [&[0u8; 12][..], &udp_frame(PORT, payload)].concat();
    g.vmm.memory().write_slice(&bytes, GuestAddress(d.tx.data)).unwrap();
    d.tx.desc(&g, 0, d.tx.data, bytes.len() as u32, 0, 0);

    let child = |i: usize, tap: Option<TapSource>| ForkChild {
        socket: dir.path().join(format!("c{i}.sock")),
        console_log: Some(dir.path().join(format!("c{i}.log"))),
        vsock_uds: None,
        labels: VmmLabels { sandbox_id: Some(format!("child{i}")), template: None },
        run_dir: None,
        rate_limits: None,
        disk_dir: None,
        tap,
    };
    let err = g.vmm.fork_running(&[child(0, None)]).unwrap_err();
    assert!(matches!(err, ForkRunningError::MissingTap { index: 0 }), "{err}");

    let mut udps = Vec::new();
    let mut specs = Vec::new();
    for i in 0..2 {
        let (tap, udp) = tap_and_udp_in_test_netns(Some(PORT));
        udps.push(udp.unwrap());
        specs.push(child(i, Some(TapSource::Fd(Arc::new(tap.into_fd())))));
    }
    let report = g.vmm.fork_running(&specs).unwrap();
    let logs: Vec<_> = specs.iter().map(|c| c.console_log.clone().unwrap()).collect();
    let sockets: Vec<_> = specs.iter().map(|c| c.socket.clone()).collect();
    drop(specs); // each child has its own tap now; the test keeps none
    let mut clients: Vec<_> = sockets.iter().map(|s| wait_socket(s)).collect();
    // Each child offers slot 0 (avail idx 1, ring[0] = 0) and notifies tx.
    for (c, log) in clients.iter_mut().zip(&logs) {
        c.send_input(&monitor::write(d.tx.avail, 1 << 16)).unwrap();
        wait_log(log, "ok\n", 1);
        c.send_input(&monitor::write32(base + QUEUE_NOTIFY, 1)).unwrap();
        wait_log(log, "ok\n", 2);
    }
    let mut buf = [0u8; 256];
    for (i, udp) in udps.iter().enumerate() {
        udp.set_read_timeout(Some(T)).unwrap();
        let n = udp.recv(&mut buf).unwrap_or_else(|e| panic!("child {i}'s namespace got nothing: {e}"));
        assert_eq!(&buf[..n], payload);
    }
    let quiet = |udp: &std::net::UdpSocket, who: &str| {
        udp.set_read_timeout(Some(std::time::Duration::from_millis(200))).unwrap();
        assert!(udp.recv(&mut [0u8; 256]).is_err(), "{who}'s namespace got a datagram it should not have");
    };
    for (i, udp) in udps.iter().enumerate() {
        quiet(udp, &format!("child {i}"));
    }
    quiet(source_udp.as_ref().unwrap(), "the source");
    // The source sends the same datagram through its own tap.
    d.tx.offer(&g, 0);
    g.w32(base + QUEUE_NOTIFY, 1);
    source_udp.as_ref().unwrap().set_read_timeout(Some(T)).unwrap();
    let n = source_udp.as_ref().unwrap().recv(&mut buf).expect("the source's datagram");
    assert_eq!(&buf[..n], payload);
    for udp in &udps {
        quiet(udp, "a child");
    }
    for (c, pid) in clients.iter_mut().zip(&report.pids) {
        shutdown(c, *pid);
    }
}
