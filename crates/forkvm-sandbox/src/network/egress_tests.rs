//! A slot's way out, checked from both ends (root only) against a fake internet this
//! test makes: frames written to the tap, as the guest would send them, reach the
//! internet host as the router's traffic and the answers come back to the guest; what
//! the rules forbid (another sandbox, the uplink itself, a forged source) never arrives.

use super::addressing::LINK_PREFIX;
use super::fake_internet::{FakeInternet, HOST_IP, ROUTER_IP};
use super::guest_frames::{is_root, recv_udp, send_udp, tap_of};
use super::*;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

fn udp_listener(timeout: Duration) -> UdpSocket {
    let s = UdpSocket::bind("0.0.0.0:9999").unwrap();
    s.set_read_timeout(Some(timeout)).unwrap();
    s
}

#[test]
fn the_guest_reaches_the_internet_as_the_router_and_hears_back() {
    if !is_root() {
        eprintln!("skipped: sandbox networks need root");
        return;
    }
    let internet = FakeInternet::create().unwrap();
    let uplink = internet.uplink().unwrap();
    let slot = NetSlot::create_with(&uplink).unwrap();
    let link = slot.link().expect("a slot made with an uplink is linked to it");
    assert!(link.outer_name().starts_with(LINK_PREFIX));
    let server = internet.run_inside(|| udp_listener(Duration::from_secs(5))).unwrap();
    let tap = tap_of(&slot);
    send_udp(&tap, GUEST_IP, (HOST_IP, 9999).into(), b"hello internet");
    let mut buf = [0u8; 64];
    let (n, peer) = server.recv_from(&mut buf).expect("the datagram reached the internet host");
    assert_eq!(&buf[..n], b"hello internet");
    assert_eq!(peer.ip(), std::net::IpAddr::V4(ROUTER_IP), "the router masquerades its sandboxes");
    server.send_to(b"hello guest", peer).unwrap();
    assert_eq!(recv_udp(&tap), (SocketAddr::from((HOST_IP, 9999)), b"hello guest".to_vec()));
}

#[test]
fn no_other_sandbox_no_uplink_service_and_no_forged_source_is_reached() {
    if !is_root() {
        eprintln!("skipped: sandbox networks need root");
        return;
    }
    let internet = FakeInternet::create().unwrap();
    let uplink = internet.uplink().unwrap();
    let (a, b) = (NetSlot::create_with(&uplink).unwrap(), NetSlot::create_with(&uplink).unwrap());
    let (la, lb) = (a.link().unwrap(), b.link().unwrap());
    assert_ne!(la, lb, "two sandboxes, two links");
    let quiet = Duration::from_millis(400);
    let in_b = b.run_inside(move || udp_listener(quiet)).unwrap();
    let in_router = internet.run_in_router(move || udp_listener(quiet)).unwrap();
    let on_host = internet.run_inside(move || udp_listener(Duration::from_secs(5))).unwrap();
    let tap = tap_of(&a);
    send_udp(&tap, GUEST_IP, (lb.inner_ip(), 9999).into(), b"to the other sandbox");
    send_udp(&tap, GUEST_IP, (la.outer_ip(), 9999).into(), b"to the uplink");
    send_udp(&tap, Ipv4Addr::new(172, 16, 0, 9), (HOST_IP, 9999).into(), b"forged");
    send_udp(&tap, GUEST_IP, (HOST_IP, 9999).into(), b"allowed");
    let mut buf = [0u8; 64];
    let (n, _) = on_host.recv_from(&mut buf).expect("the allowed datagram arrives");
    assert_eq!(&buf[..n], b"allowed", "the forged datagram arrived first");
    assert!(in_b.recv_from(&mut buf).is_err(), "a sandbox reached another");
    assert!(in_router.recv_from(&mut buf).is_err(), "a sandbox reached its uplink's own services");
    on_host.set_read_timeout(Some(quiet)).unwrap();
    assert!(on_host.recv_from(&mut buf).is_err(), "a forged source got out");
}

#[test]
fn every_slot_link_goes_with_its_slot() {
    if !is_root() {
        eprintln!("skipped: sandbox networks need root");
        return;
    }
    let internet = FakeInternet::create().unwrap();
    let uplink = internet.uplink().unwrap();
    let links_in_router = || {
        internet
            .run_in_router(|| {
                // /proc/thread-self/net is this thread's namespace (sysfs is the mounter's).
                let dev = std::fs::read_to_string("/proc/thread-self/net/dev").unwrap();
                dev.lines().filter(|l| l.trim_start().starts_with(LINK_PREFIX)).count()
            })
            .unwrap()
    };
    let slots: Vec<NetSlot> = (0..3).map(|_| NetSlot::create_with(&uplink).unwrap()).collect();
    assert_eq!(links_in_router(), 3);
    drop(slots);
    // A namespace is taken apart by the kernel after its last descriptor goes.
    let deadline = Instant::now() + Duration::from_secs(10);
    while links_in_router() != 0 {
        assert!(Instant::now() < deadline, "sandbox links stayed after their namespaces went");
        std::thread::sleep(Duration::from_millis(20));
    }
}
