//! Tests acting as a sandbox's guest on its tap: frames written as the guest sends them,
//! and the ones the guest would receive.

use super::*;
use etherparse::{PacketBuilder, SlicedPacket, TransportSlice};
use forkvm_vmm::devices::attach::TapSource;
use forkvm_vmm::devices::virtio::net::Tap;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

pub fn tap_of(slot: &NetSlot) -> Tap {
    let TapSource::Fd(fd) = slot.tap_source() else { unreachable!("a slot's tap is a descriptor") };
    Tap::from_fd(fd.try_clone().unwrap()).unwrap()
}

/// Writes a UDP datagram to `tap` as the guest would send it (from `src`).
pub fn send_udp(tap: &Tap, src: Ipv4Addr, dst: SocketAddr, payload: &[u8]) {
    let SocketAddr::V4(dst) = dst else { unreachable!("IPv4 only") };
    let mut frame = vec![0u8; 12];
    PacketBuilder::ethernet2(GUEST_MAC, TAP_MAC)
        .ipv4(src.octets(), dst.ip().octets(), 64)
        .udp(4000, dst.port())
        .write(&mut frame, payload)
        .unwrap();
    tap.write(&frame).unwrap();
}

/// The payload of the next UDP datagram the guest receives on `tap`, with its source.
pub fn recv_udp(tap: &Tap) -> (SocketAddr, Vec<u8>) {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut buf = vec![0u8; 65562];
    loop {
        assert!(Instant::now() < deadline, "no datagram came back to the guest");
        let Ok(n) = tap.read(&mut buf) else {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        };
        let Ok(p) = SlicedPacket::from_ethernet(&buf[12..n]) else { continue };
        let (Some(etherparse::NetSlice::Ipv4(ip)), Some(TransportSlice::Udp(udp))) = (&p.net, &p.transport) else {
            continue;
        };
        let from = SocketAddr::from((ip.header().source_addr(), udp.source_port()));
        assert_eq!(ip.header().destination_addr(), GUEST_IP);
        return (from, udp.payload().to_vec());
    }
}

/// The next UDP datagram the guest receives within `wait`, if any.
pub fn try_recv_udp(tap: &Tap, wait: Duration) -> Option<(SocketAddr, Vec<u8>)> {
    let deadline = Instant::now() + wait;
    let mut buf = vec![0u8; 65562];
    while Instant::now() < deadline {
        let Ok(n) = tap.read(&mut buf) else {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        };
        let Ok(p) = SlicedPacket::from_ethernet(&buf[12..n]) else { continue };
        if let (Some(etherparse::NetSlice::Ipv4(ip)), Some(TransportSlice::Udp(udp))) = (&p.net, &p.transport) {
            return Some((SocketAddr::from((ip.header().source_addr(), udp.source_port())), udp.payload().to_vec()));
        }
    }
    None
}
