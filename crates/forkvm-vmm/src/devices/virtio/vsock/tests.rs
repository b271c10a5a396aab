//! End-to-end tests without KVM: a simulated guest driver ([`super::test_guest`]) on
//! real split rings in guest memory, real host Unix sockets, the real backend thread.

use super::muxer::Muxer;
use super::packet::PacketHeader;
use super::test_guest::Guest;
use super::*;
use crate::devices::virtio::{VirtioDevice, VirtioDeviceState};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const CID: u64 = 3;
const ECHO_PORT: u32 = 1234;
const CLOSED_PORT: u32 = 9999;
const WAIT: Duration = Duration::from_secs(10);

fn setup(dir: &Path) -> (Vsock, Guest) {
    let mut dev = Vsock::new(CID, dir.join("vm.sock")).unwrap();
    let mut guest = Guest::new(CID);
    guest.activate(&mut dev, 64);
    (dev, guest)
}

/// Connects as a host client; returns the stream and the `OK` port, or `None` if the
/// device closed the socket instead.
fn host_connect(path: &Path, port: u32) -> (UnixStream, Option<u32>) {
    let mut stream = UnixStream::connect(path).unwrap();
    stream.set_read_timeout(Some(WAIT)).unwrap();
    stream.write_all(format!("CONNECT {port}\n").as_bytes()).unwrap();
    let mut line = String::new();
    BufReader::new(stream.try_clone().unwrap()).read_line(&mut line).unwrap();
    let port = line.strip_prefix("OK ").map(|p| p.trim_end().parse().unwrap());
    (stream, port)
}

/// Plays a guest that echoes on `ECHO_PORT`, refuses other ports, and resets streams
/// the host shuts down, until `done` says stop.
fn serve_echo(dev: &mut Vsock, guest: &mut Guest, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "echo guest timed out");
        let Some((hdr, payload)) = guest.recv(dev, Duration::from_millis(20)) else { continue };
        let (me, peer) = (hdr.dst_port, hdr.src_port);
        match hdr.op {
            OP_REQUEST if me == ECHO_PORT => guest.send(dev, guest.hdr(OP_RESPONSE, me, peer, 0), &[]),
            OP_REQUEST => guest.send(dev, guest.hdr(OP_RST, me, peer, 0), &[]),
            OP_RW => guest.send(dev, guest.hdr(OP_RW, me, peer, payload.len()), &payload),
            OP_SHUTDOWN => guest.send(dev, guest.hdr(OP_RST, me, peer, 0), &[]),
            OP_CREDIT_REQUEST => guest.send(dev, guest.hdr(OP_CREDIT_UPDATE, me, peer, 0), &[]),
            _ => {}
        }
    }
}

fn wait_for(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn echo_client(path: &Path, data: Vec<u8>) -> JoinHandle<(Option<u32>, Vec<u8>)> {
    let path = path.to_path_buf();
    std::thread::spawn(move || {
        let (mut stream, port) = host_connect(&path, ECHO_PORT);
        let mut echoed = vec![0u8; data.len()];
        if port.is_some() {
            stream.write_all(&data).unwrap();
            stream.read_exact(&mut echoed).unwrap();
        }
        (port, echoed)
    })
}

#[test]
fn host_initiated_stream_echoes_and_tears_down() {
    let dir = tempfile::tempdir().unwrap();
    let (mut dev, mut guest) = setup(dir.path());
    let data: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
    let client = echo_client(dev.uds_path(), data.clone());
    serve_echo(&mut dev, &mut guest, || client.is_finished());
    let (port, echoed) = client.join().unwrap();
    assert!(port.unwrap() >= HOST_PORT_BASE);
    assert_eq!(echoed, data);
    // The client closed: host EOF → SHUTDOWN to the guest → guest RST → stream freed.
    let shared = dev.shared_for_tests();
    serve_echo(&mut dev, &mut guest, || super::backend::lock(&shared).muxer.is_empty());
    assert!(guest.irq.0.load(Ordering::SeqCst) > 0);
    let m = dev.metrics().snapshot();
    assert_eq!((m.conns_opened, m.conns_closed), (1, 1));
    assert_eq!(m.tx_bytes, data.len() as u64);
}

#[test]
fn many_concurrent_streams_carry_distinct_data() {
    let dir = tempfile::tempdir().unwrap();
    let (mut dev, mut guest) = setup(dir.path());
    let datas: Vec<Vec<u8>> =
        (0..32usize).map(|i| (0..1000 + i * 397).map(|j| (i * 7 + j % 13) as u8).collect()).collect();
    let clients: Vec<_> = datas.iter().map(|d| echo_client(dev.uds_path(), d.clone())).collect();
    serve_echo(&mut dev, &mut guest, || clients.iter().all(|c| c.is_finished()));
    let mut ports = std::collections::BTreeSet::new();
    for (client, data) in clients.into_iter().zip(&datas) {
        let (port, echoed) = client.join().unwrap();
        assert!(ports.insert(port.unwrap()), "host ports are distinct");
        assert_eq!(&echoed, data);
    }
}

#[test]
fn guest_rst_closes_the_host_client() {
    let dir = tempfile::tempdir().unwrap();
    let (mut dev, mut guest) = setup(dir.path());
    let path = dev.uds_path().to_path_buf();
    let client = std::thread::spawn(move || {
        let (mut stream, port) = host_connect(&path, CLOSED_PORT);
        let mut rest = Vec::new();
        stream.read_to_end(&mut rest).unwrap();
        (port, rest)
    });
    serve_echo(&mut dev, &mut guest, || client.is_finished());
    assert_eq!(client.join().unwrap(), (None, Vec::new()), "closed without an OK line");
    assert_eq!(dev.connection_count(), 0);
}

#[test]
fn guest_initiated_stream_reaches_host_listener_or_gets_rst() {
    let dir = tempfile::tempdir().unwrap();
    let (mut dev, mut guest) = setup(dir.path());
    let listener = UnixListener::bind(Muxer::host_socket_path(dev.uds_path(), 5000)).unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut buf = [0u8; 5];
        s.read_exact(&mut buf).unwrap();
        s.write_all(&buf.to_ascii_uppercase()).unwrap();
        let mut rest = Vec::new();
        s.read_to_end(&mut rest).unwrap(); // until the guest shuts down
        rest
    });
    guest.send(&mut dev, guest.hdr(OP_REQUEST, 40000, 5000, 0), &[]);
    let (hdr, _) = guest.recv(&mut dev, WAIT).unwrap();
    assert_eq!((hdr.op, hdr.src_port, hdr.dst_port), (OP_RESPONSE, 5000, 40000));
    guest.send(&mut dev, guest.hdr(OP_RW, 40000, 5000, 5), b"hello");
    let (hdr, payload) = guest.recv(&mut dev, WAIT).unwrap();
    assert_eq!((hdr.op, payload.as_slice()), (OP_RW, &b"HELLO"[..]));
    let mut shut = guest.hdr(OP_SHUTDOWN, 40000, 5000, 0);
    shut.flags = SHUTDOWN_BOTH;
    guest.send(&mut dev, shut, &[]);
    let (hdr, _) = guest.recv(&mut dev, WAIT).unwrap();
    assert_eq!(hdr.op, OP_RST, "full shutdown is acknowledged with RST");
    assert_eq!(server.join().unwrap(), Vec::<u8>::new());
    wait_for("stream teardown", || dev.connection_count() == 0);

    guest.send(&mut dev, guest.hdr(OP_REQUEST, 40001, 5001, 0), &[]);
    let (hdr, _) = guest.recv(&mut dev, WAIT).unwrap();
    assert_eq!((hdr.op, hdr.src_port, hdr.dst_port), (OP_RST, 5001, 40001));
    assert_eq!(dev.metrics().snapshot().host_connect_failures, 1);
}

#[test]
fn host_to_guest_bulk_transfer_never_exceeds_guest_credit() {
    let dir = tempfile::tempdir().unwrap();
    let (mut dev, mut guest) = setup(dir.path());
    guest.buf_alloc = 8192;
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
    let path = dev.uds_path().to_path_buf();
    let sent = data.clone();
    let client = std::thread::spawn(move || {
        let (mut stream, port) = host_connect(&path, ECHO_PORT);
        assert!(port.is_some());
        stream.write_all(&sent).unwrap();
    });
    let (hdr, _) = guest.recv(&mut dev, WAIT).unwrap();
    assert_eq!(hdr.op, OP_REQUEST);
    let (me, peer) = (hdr.dst_port, hdr.src_port);
    guest.send(&mut dev, guest.hdr(OP_RESPONSE, me, peer, 0), &[]);
    let (mut received, mut advertised) = (Vec::new(), 0usize);
    while received.len() < data.len() {
        let (hdr, payload) = guest.recv(&mut dev, WAIT).expect("data stalled");
        match hdr.op {
            OP_RW => received.extend_from_slice(&payload),
            OP_CREDIT_REQUEST => {}
            op => panic!("unexpected op {op}"),
        }
        assert!(received.len() - advertised <= 8192, "device overran the guest's credit");
        if received.len() - advertised >= 4096 || hdr.op == OP_CREDIT_REQUEST {
            guest.send(&mut dev, guest.hdr(OP_CREDIT_UPDATE, me, peer, 0), &[]);
            advertised = received.len();
        }
    }
    assert_eq!(received, data);
    client.join().unwrap();
}

#[test]
fn malformed_and_unknown_packets_get_rst() {
    let dir = tempfile::tempdir().unwrap();
    let (mut dev, mut guest) = setup(dir.path());
    let mut oversized = guest.hdr(OP_RW, 41000, 6000, 0);
    oversized.len = MAX_PKT_PAYLOAD as u32 + 1;
    guest.send(&mut dev, oversized, &[]);
    let (hdr, _) = guest.recv(&mut dev, WAIT).unwrap();
    assert_eq!((hdr.op, hdr.dst_port), (OP_RST, 41000));
    guest.send(&mut dev, guest.hdr(42, 41001, 6000, 0), &[]);
    let (hdr, _) = guest.recv(&mut dev, WAIT).unwrap();
    assert_eq!((hdr.op, hdr.dst_port), (OP_RST, 41001));
    let mut wrong_cid: PacketHeader = guest.hdr(OP_REQUEST, 41002, 6000, 0);
    wrong_cid.src_cid = 77;
    guest.send(&mut dev, wrong_cid, &[]);
    let (hdr, _) = guest.recv(&mut dev, WAIT).unwrap();
    assert_eq!((hdr.op, hdr.dst_port), (OP_RST, 41002));
    assert!(dev.metrics().snapshot().guest_errors >= 2);
}

#[test]
fn save_restore_save_round_trip_and_transport_reset_event() {
    let dir = tempfile::tempdir().unwrap();
    let mut dev = Vsock::new(CID, dir.path().join("a.sock")).unwrap();
    dev.set_acked_features(dev.device_features());
    let mut config = [0u8; 8];
    dev.read_config(0, &mut config);
    assert_eq!(u64::from_le_bytes(config), CID);
    let saved = dev.save();
    let VirtioDeviceState::Vsock(state) = &saved else { panic!("not a vsock state") };
    let mut restored = Vsock::restore(state, dir.path().join("b.sock")).unwrap();
    assert_eq!(restored.save(), saved);

    let mut guest = Guest::new(CID);
    guest.add_event_buffer(None);
    guest.activate(&mut restored, 4);
    assert_eq!(guest.recv_event(WAIT), Some(EVENT_TRANSPORT_RESET));
    // A fresh (not restored) device posts no event.
    let mut guest = Guest::new(CID);
    guest.add_event_buffer(None);
    guest.activate(&mut dev, 4);
    assert_eq!(guest.recv_event(Duration::from_millis(200)), None);

    let bad = VsockState { guest_cid: CID, acked_features: 1 << 40 };
    assert!(matches!(Vsock::restore(&bad, dir.path().join("c.sock")), Err(VsockError::RestoreFeatures { .. })));
    let bad = VsockState { guest_cid: 2, acked_features: 0 };
    assert!(matches!(Vsock::restore(&bad, dir.path().join("c.sock")), Err(VsockError::InvalidCid(2))));
}

#[test]
fn connect_line_parsing() {
    use super::backend::parse_connect_line;
    assert_eq!(parse_connect_line(b"CONNECT 1234"), Some(1234));
    assert_eq!(parse_connect_line(b"CONNECT 52\r"), Some(52));
    assert_eq!(parse_connect_line(b"CONNECT -1"), None);
    assert_eq!(parse_connect_line(b"connect 1"), None);
    assert_eq!(parse_connect_line(b"CONNECT 99999999999"), None);
}

/// A device restored in `dir` and activated by a guest that has received (not yet
/// acknowledged) its transport reset; and the device's socket.
fn restored_and_reset(dir: &Path) -> (Vsock, Guest, std::path::PathBuf) {
    let dev = Vsock::new(CID, dir.join("a.sock")).unwrap();
    let VirtioDeviceState::Vsock(state) = dev.save() else { panic!("not a vsock state") };
    let sock = dir.join("b.sock");
    let mut restored = Vsock::restore(&state, sock.clone()).unwrap();
    let mut guest = Guest::new(CID);
    guest.add_event_buffer(None);
    guest.activate(&mut restored, 4);
    assert_eq!(guest.recv_event(WAIT), Some(EVENT_TRANSPORT_RESET));
    (restored, guest, sock)
}

/// A restored device sends the guest nothing before it has taken the transport reset in
/// (a request that reached it first would be killed by the reset without a word to the
/// host): the host's connection request waits for the guest's event-queue refill.
#[test]
fn after_a_restore_requests_wait_for_the_guest_to_take_the_reset_in() {
    let dir = tempfile::tempdir().unwrap();
    let (mut restored, mut guest, sock) = restored_and_reset(dir.path());
    let mut client = UnixStream::connect(&sock).unwrap();
    client.write_all(format!("CONNECT {ECHO_PORT}\n").as_bytes()).unwrap();
    assert!(
        guest.recv(&mut restored, Duration::from_millis(300)).is_none(),
        "a request reached the guest before its reset ack"
    );
    // The guest handled the event and gives the buffer back: the request follows.
    guest.add_event_buffer(Some(&mut restored));
    let (hdr, _) = guest.recv(&mut restored, WAIT).expect("the request after the reset ack");
    assert_eq!((hdr.op, hdr.dst_port), (OP_REQUEST, ECHO_PORT));
}

/// A guest that never gives its event buffer back still gets the request, late (after
/// the backend's 10 s limit).
#[test]
fn a_guest_that_never_acknowledges_the_reset_gets_requests_after_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let (mut restored, mut guest, sock) = restored_and_reset(dir.path());
    let started = Instant::now();
    let mut client = UnixStream::connect(&sock).unwrap();
    client.write_all(format!("CONNECT {ECHO_PORT}\n").as_bytes()).unwrap();
    let (hdr, _) = guest.recv(&mut restored, WAIT * 2).expect("the request once the limit passed");
    assert_eq!((hdr.op, hdr.dst_port), (OP_REQUEST, ECHO_PORT));
    assert!(started.elapsed() >= Duration::from_secs(9), "came after {:?}", started.elapsed());
}

/// A restored guest that missed the interrupt of its transport reset (raised while its
/// vCPU and interrupt state were being put back) is interrupted again until it takes the
/// reset in, and no more once it has: an idle guest does not sleep out the 10 s limit.
#[test]
fn an_unacknowledged_reset_raises_the_interrupt_again_until_it_is_taken_in() {
    let dir = tempfile::tempdir().unwrap();
    let (mut restored, mut guest, _sock) = restored_and_reset(dir.path());
    let before = guest.irq.0.load(Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(300));
    let nudged = guest.irq.0.load(Ordering::SeqCst) - before;
    assert!((3..=20).contains(&nudged), "{nudged} interrupts in 300 ms while the reset waited (one per 20 ms)");
    assert!(restored.metrics().snapshot().reset_nudges as usize >= nudged);
    guest.add_event_buffer(Some(&mut restored));
    std::thread::sleep(Duration::from_millis(50));
    let settled = guest.irq.0.load(Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(guest.irq.0.load(Ordering::SeqCst), settled, "no interrupts once the reset is taken in");
}
