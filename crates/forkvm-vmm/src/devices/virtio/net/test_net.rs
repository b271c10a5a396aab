//! Test helpers shared by the device's unit tests and the VMM's integration tests
//! (`tests/net.rs` includes this file by path; the includer has `Tap` in scope): a tap
//! in a network namespace the test makes, and the frames the tests send and expect.
//!
//! Traffic stays in that namespace: it has no route anywhere but the tap.

// Each includer uses its own part of these.
#![allow(dead_code)]

use super::Tap;
use etherparse::{ArpHardwareId, ArpOperation, ArpPacket, EtherType, Icmpv4Type, PacketBuilder, SlicedPacket};

pub const GUEST_MAC: [u8; 6] = [0x06, 0x00, 0xac, 0x10, 0x00, 0x02];
const GUEST_MAC_STR: &str = "06:00:ac:10:00:02";
pub const GUEST_IP: [u8; 4] = [172, 16, 0, 2];
pub const HOST_IP: [u8; 4] = [172, 16, 0, 1];
/// The tap's own MAC, the same in every namespace the tests make (as in every sandbox's),
/// so a guest's ARP entry stays right when it moves to another tap.
pub const TAP_MAC: &str = "06:00:ac:10:00:01";

/// Tap `tap0` in a network namespace of its own with [`TAP_MAC`] and 172.16.0.1/30, up,
/// the guest's address a permanent neighbour.
/// The namespace lives as long as the tap: the thread that made it is gone and nothing
/// names it, so closing the tap's last descriptor removes everything.
pub fn tap_in_test_netns() -> Tap {
    tap_and_udp_in_test_netns(None).0
}

/// [`tap_in_test_netns`], and with `udp_port` a UDP socket bound to 172.16.0.1 on it in
/// that namespace: what the guest sends there, the test reads.
pub fn tap_and_udp_in_test_netns(udp_port: Option<u16>) -> (Tap, Option<std::net::UdpSocket>) {
    std::thread::spawn(move || {
        // SAFETY: unshare affects this thread only (the namespace is left with it).
        let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "unshare: {}", std::io::Error::last_os_error());
        let tap = Tap::open_named("tap0").unwrap();
        let steps: [&[&str]; 5] = [
            &["link", "set", "lo", "up"],
            &["link", "set", "tap0", "address", TAP_MAC],
            &["addr", "add", "172.16.0.1/30", "dev", "tap0"],
            &["link", "set", "tap0", "up"],
            // The guest's address is known for good: a restored guest is not asked
            // (it may not answer at once), and no ARP costs the guest time.
            &["neigh", "add", "172.16.0.2", "lladdr", GUEST_MAC_STR, "dev", "tap0", "nud", "permanent"],
        ];
        for args in steps {
            // A child process starts in the namespace of the thread that spawns it.
            let status = std::process::Command::new("ip").args(args).status().expect("running ip");
            assert!(status.success(), "ip {args:?}: {status}");
        }
        // A socket belongs to the namespace of the thread that makes it.
        let udp =
            udp_port.map(|port| std::net::UdpSocket::bind(("172.16.0.1", port)).expect("binding in the namespace"));
        (tap, udp)
    })
    .join()
    .unwrap()
}

/// Whether the tests run as root (a tap in a namespace needs it).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// "Who has 172.16.0.1? Tell 172.16.0.2", from the guest.
pub fn arp_request() -> Vec<u8> {
    let arp = ArpPacket::new(
        ArpHardwareId::ETHERNET,
        EtherType::IPV4,
        ArpOperation::REQUEST,
        &GUEST_MAC,
        &GUEST_IP,
        &[0; 6],
        &HOST_IP,
    )
    .unwrap();
    let mut f = Vec::new();
    PacketBuilder::ethernet2(GUEST_MAC, [0xff; 6]).arp(arp).write(&mut f).unwrap();
    f
}

/// An ICMP echo request (id 7) from the guest to the host address.
pub fn echo_request(dst_mac: [u8; 6], seq: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    PacketBuilder::ethernet2(GUEST_MAC, dst_mac)
        .ipv4(GUEST_IP, HOST_IP, 64)
        .icmpv4_echo_request(7, seq)
        .write(&mut f, payload)
        .unwrap();
    f
}

/// The sender MAC of an ARP reply for the host address.
pub fn arp_reply(frame: &[u8]) -> Option<[u8; 6]> {
    if frame.len() < 14 || frame[12..14] != [0x08, 0x06] {
        return None;
    }
    let arp = ArpPacket::from_slice(&frame[14..]).ok()?;
    let ours = arp.sender_protocol_addr() == HOST_IP && arp.target_hw_addr() == GUEST_MAC;
    (arp.operation == ArpOperation::REPLY && ours).then(|| arp.sender_hw_addr().try_into().unwrap())
}

/// The sequence number and payload of an echo reply (id 7) from the host address.
pub fn echo_reply(frame: &[u8]) -> Option<(u16, Vec<u8>)> {
    let p = SlicedPacket::from_ethernet(frame).ok()?;
    let Some(etherparse::NetSlice::Ipv4(ip)) = &p.net else { return None };
    if ip.header().source() != HOST_IP {
        return None;
    }
    let Some(etherparse::TransportSlice::Icmpv4(icmp)) = &p.transport else { return None };
    match icmp.icmp_type() {
        Icmpv4Type::EchoReply(h) if h.id == 7 => Some((h.seq, icmp.payload().to_vec())),
        _ => None,
    }
}

/// A UDP datagram from the guest's port 5555 to `port` on the host address.
pub fn udp_frame(port: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    PacketBuilder::ethernet2(GUEST_MAC, tap_mac())
        .ipv4(GUEST_IP, HOST_IP, 64)
        .udp(5555, port)
        .write(&mut f, payload)
        .unwrap();
    f
}

/// The tap's MAC as bytes.
pub fn tap_mac() -> [u8; 6] {
    let mut mac = [0u8; 6];
    for (b, hex) in mac.iter_mut().zip(TAP_MAC.split(':')) {
        *b = u8::from_str_radix(hex, 16).unwrap();
    }
    mac
}
