//! virtio-net tests: the device against a simulated driver (`test_guest`), over a real
//! tap in a network namespace each test makes for itself (root only; the namespace goes
//! with the tap's last descriptor), and over a socket pair where the test plays the
//! host side frame by frame.

use super::backend::{FrameEndpoint, NetRateLimits};
use super::test_guest::Guest;
use super::test_net::*;
use super::*;
use crate::devices::virtio::throttle::RateLimit;
use crate::devices::virtio::VirtioDevice;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixDatagram;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(5);
/// Features a Linux guest acks without offloads.
const PLAIN: u64 = crate::devices::virtio::device::VIRTIO_F_VERSION_1 | F_MAC | F_EVENT_IDX;

/// The next received frame `pick` accepts (the namespace's kernel sends IPv6 chatter
/// of its own, skipped); panics after [`WAIT`].
fn recv_where<T>(g: &mut Guest, dev: &mut Net, mut pick: impl FnMut(&[u8]) -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let (_, frame) = g.recv(dev, left).expect("an answer from the namespace");
        if let Some(t) = pick(&frame) {
            return t;
        }
    }
}

/// ARP, then pings of `sizes` bytes, through `dev` into the test namespace and back.
fn ping_through(dev: &mut Net, g: &mut Guest, sizes: &[usize]) {
    g.send(dev, &arp_request());
    let host_mac = recv_where(g, dev, arp_reply);
    assert_eq!(host_mac, tap_mac(), "the namespace's tap answers");
    for (seq, &size) in sizes.iter().enumerate() {
        let payload: Vec<u8> = (0..size).map(|i| (i * 7 + seq) as u8).collect();
        g.send(dev, &echo_request(host_mac, seq as u16, &payload));
        let (got_seq, got) = recv_where(g, dev, echo_reply);
        assert_eq!((got_seq, got.len()), (seq as u16, size));
        assert!(got == payload, "echo payload of {size} bytes differs");
    }
}

#[test]
fn a_guest_reaches_its_namespace_over_a_tap_and_gets_answers() {
    if !is_root() {
        eprintln!("skipped: a tap in a network namespace needs root");
        return;
    }
    let tap = tap_in_test_netns();
    assert_eq!(tap.name(), "tap0");
    let mut dev = Net::with_tap(tap, GUEST_MAC, NetRateLimits::default()).unwrap();
    let metrics = dev.metrics();
    let mut g = Guest::new(1526);
    g.activate(&mut dev, PLAIN, 32);
    ping_through(&mut dev, &mut g, &[0, 56, 1400]);
    let m = metrics.snapshot();
    assert!(m.tx_frames >= 4 && m.rx_frames >= 4, "{m:?}");
    assert_eq!((m.tx_malformed, m.tx_errors, m.rx_dropped), (0, 0, 0), "{m:?}");
    assert!(m.interrupts > 0);
}

#[test]
fn with_every_offload_acked_the_namespace_still_answers() {
    if !is_root() {
        eprintln!("skipped: a tap in a network namespace needs root");
        return;
    }
    let tap = tap_in_test_netns();
    let mut dev = Net::with_tap(tap, GUEST_MAC, NetRateLimits::default()).unwrap();
    let metrics = dev.metrics();
    let mut g = Guest::new(1526);
    g.activate(&mut dev, OFFERED_FEATURES, 48);
    assert_eq!(dev.acked_features(), OFFERED_FEATURES);
    ping_through(&mut dev, &mut g, &[1400, 32]);
    assert_eq!(metrics.snapshot().tx_errors, 0);
}

#[test]
fn a_tap_is_checked_before_it_is_used() {
    let (r, _w) = pipe();
    let err = Tap::from_fd(r).unwrap_err();
    assert!(matches!(err, tap::TapError::NotATap(_)), "{err}");
    assert!(matches!(Tap::open_named("a-name-far-too-long"), Err(tap::TapError::BadName(_))));
    if !is_root() {
        eprintln!("skipped the tap cases: they need root");
        return;
    }
    // A tap without virtio headers, made by hand in a namespace of its own.
    let plain = std::thread::spawn(|| {
        // SAFETY: unshare affects this thread only.
        assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0);
        open_tap_with_flags("plain0", libc::IFF_TAP | libc::IFF_NO_PI)
    })
    .join()
    .unwrap();
    let err = Tap::from_fd(plain).unwrap_err();
    assert!(err.to_string().contains("must be a tap without packet info and with virtio headers"), "{err}");
    // A good one, passed as a descriptor as the daemon will.
    let good = tap_in_test_netns();
    // SAFETY: dup of a descriptor we own; the copy is owned by `fd`.
    let fd = unsafe { OwnedFd::from_raw_fd(libc::dup(good.as_raw_fd())) };
    assert_eq!(Tap::from_fd(fd).unwrap().name(), "tap0");
}

fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into `fds`, which we then own.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both were just created and nothing else owns them.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

/// A tap named `name` with exactly `flags`, in the calling thread's namespace.
fn open_tap_with_flags(name: &str, flags: libc::c_int) -> OwnedFd {
    // SAFETY: a NUL-terminated path.
    let raw = unsafe { libc::open(c"/dev/net/tun".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    assert!(raw >= 0);
    // SAFETY: just opened, owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let mut req = [0u8; 40];
    req[..name.len()].copy_from_slice(name.as_bytes());
    req[16..18].copy_from_slice(&(flags as i16).to_ne_bytes());
    // SAFETY: TUNSETIFF reads and writes a 40-byte ifreq.
    assert_eq!(unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETIFF, req.as_mut_ptr()) }, 0);
    fd
}

/// The host side of a device as a datagram socket the test reads and writes: frames
/// one by one, offloads recorded.
#[derive(Debug)]
struct PairEndpoint {
    sock: UnixDatagram,
    offloads: Mutex<Vec<u32>>,
}

impl FrameEndpoint for PairEndpoint {
    fn raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }
    fn read_frame(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.sock.recv(buf)
    }
    fn write_frame(&self, frame: &[u8]) -> io::Result<usize> {
        self.sock.send(frame)
    }
    fn set_offload(&self, flags: u32) -> io::Result<()> {
        self.offloads.lock().unwrap().push(flags);
        Ok(())
    }
}

/// A device over a socket pair, and the host's end.
fn paired(limits: NetRateLimits) -> (Net, Arc<PairEndpoint>, UnixDatagram) {
    let (dev_side, host) = UnixDatagram::pair().unwrap();
    dev_side.set_nonblocking(true).unwrap();
    for s in [&dev_side, &host] {
        let size: libc::c_int = 4 << 20;
        // SAFETY: SO_SNDBUF/SO_RCVBUF read an int.
        unsafe {
            for opt in [libc::SO_SNDBUF, libc::SO_RCVBUF] {
                libc::setsockopt(s.as_raw_fd(), libc::SOL_SOCKET, opt, (&size as *const libc::c_int).cast(), 4);
            }
        }
    }
    host.set_read_timeout(Some(WAIT)).unwrap();
    let ep = Arc::new(PairEndpoint { sock: dev_side, offloads: Mutex::default() });
    (Net::new(ep.clone(), GUEST_MAC, limits).unwrap(), ep, host)
}

/// A frame from the host: a zero header and `len` bytes of a pattern from `seed`.
fn host_frame(len: usize, seed: u8) -> Vec<u8> {
    let mut f = vec![0u8; VNET_HDR_LEN];
    f.extend((0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)));
    f
}

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn malformed_transmit_chains_are_refused_and_counted_and_the_queue_goes_on() {
    let (mut dev, _ep, host) = paired(NetRateLimits::default());
    let metrics = dev.metrics();
    let mut g = Guest::new(1526);
    g.activate(&mut dev, PLAIN, 4);
    let hdr = [0u8; VNET_HDR_LEN];
    let frame = vec![0x5a; 60];
    g.send_parts(&mut dev, &[(&hdr, 12, false), (&frame, 60, true)]); // writable
    g.send_parts(&mut dev, &[(&hdr, 12, false)]); // no frame
    g.tx.add_at(&g.mem, &[(&[], 0x1000_0000, false)], Some(0x1000)).unwrap(); // 256 MiB
    g.tx.add_at(&g.mem, &[(&[], 100, false)], Some(1 << 40)).unwrap(); // outside memory
    g.send(&mut dev, &frame);
    let mut buf = vec![0u8; 1 << 16];
    let n = host.recv(&mut buf).expect("the good frame after the bad ones");
    assert_eq!(&buf[..n], [&hdr[..], &frame[..]].concat());
    wait_until("five used chains", || g.tx.take_used(&g.mem).len() == 5 || metrics.snapshot().tx_malformed == 4);
    let m = metrics.snapshot();
    assert_eq!((m.tx_malformed, m.tx_frames, m.tx_bytes), (4, 1, 72), "{m:?}");
}

#[test]
fn received_frames_wait_for_buffers_and_arrive_in_order() {
    let (mut dev, _ep, host) = paired(NetRateLimits::default());
    let metrics = dev.metrics();
    let mut g = Guest::new(1526);
    g.activate(&mut dev, PLAIN, 0);
    let frames: Vec<Vec<u8>> = (0..3).map(|i| host_frame(100 + i * 200, i as u8)).collect();
    for f in &frames {
        host.send(f).unwrap();
    }
    wait_until("the device to find no buffers", || metrics.snapshot().rx_no_buffers > 0);
    assert!(g.recv(&mut dev, Duration::from_millis(50)).is_none());
    g.post_rx(3);
    dev.queue_notify(RX_QUEUE);
    for f in &frames {
        let (hdr, got) = g.recv(&mut dev, WAIT).expect("a frame once buffers are posted");
        assert_eq!(u16::from_le_bytes([hdr[10], hdr[11]]), 1, "num_buffers");
        assert!(got == f[VNET_HDR_LEN..], "frame content");
    }
    assert_eq!(metrics.snapshot().rx_frames, 3);
}

#[test]
fn a_frame_too_big_for_the_buffer_is_dropped_and_the_buffer_kept() {
    let (mut dev, _ep, host) = paired(NetRateLimits::default());
    let metrics = dev.metrics();
    let mut g = Guest::new(1526);
    g.activate(&mut dev, PLAIN, 1);
    host.send(&host_frame(3000, 1)).unwrap();
    let small = host_frame(100, 2);
    host.send(&small).unwrap();
    let (_, got) = g.recv(&mut dev, WAIT).expect("the small frame");
    assert!(got == small[VNET_HDR_LEN..]);
    assert_eq!(metrics.snapshot().rx_dropped, 1);
}

#[test]
fn a_queue_whose_index_ran_ahead_neither_spins_nor_holds_the_device() {
    let (mut dev, _ep, host) = paired(NetRateLimits::default());
    let metrics = dev.metrics();
    let mut g = Guest::new(1526);
    g.activate(&mut dev, PLAIN, 0);
    g.tx.set_avail_idx(&g.mem, 1000);
    g.rx.set_avail_idx(&g.mem, 1000);
    dev.queue_notify(TX_QUEUE);
    host.send(&host_frame(64, 1)).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let before = metrics.snapshot().passes;
    std::thread::sleep(Duration::from_millis(200));
    let passes = metrics.snapshot().passes - before;
    assert!(passes < 20, "the backend made {passes} passes in 200 ms over queues it cannot use");
    // And it does not hold the device: a pause (as a snapshot makes) returns at once.
    let (done, paused) = std::sync::mpsc::channel();
    let pauser = std::thread::spawn(move || {
        dev.pause();
        done.send(()).unwrap();
        dev
    });
    assert!(paused.recv_timeout(WAIT).is_ok(), "pausing the device hung");
    drop(pauser.join().unwrap());
}

#[test]
fn a_receive_chain_the_device_may_not_write_is_given_back_empty() {
    let (mut dev, _ep, host) = paired(NetRateLimits::default());
    let metrics = dev.metrics();
    let mut g = Guest::new(1526);
    g.activate(&mut dev, PLAIN, 0);
    // A device-readable buffer where a receive buffer belongs, then a good one.
    g.rx.add(&g.mem, &[(&[], 1526, false)]).unwrap();
    g.post_rx(1);
    dev.queue_notify(RX_QUEUE);
    host.send(&host_frame(100, 1)).unwrap();
    let second = host_frame(80, 2);
    host.send(&second).unwrap();
    wait_until("the bad chain back", || metrics.snapshot().rx_dropped == 1);
    let (_, got) = g.recv(&mut dev, WAIT).expect("the next frame, in the good buffer");
    assert!(got == second[VNET_HDR_LEN..]);
}

#[test]
fn with_mergeable_buffers_a_large_frame_spans_several() {
    let (mut dev, ep, host) = paired(NetRateLimits::default());
    let mut g = Guest::new(1526);
    g.activate(&mut dev, OFFERED_FEATURES, 8);
    let big = host_frame(4000, 3);
    host.send(&big).unwrap();
    let (hdr, got) = g.recv(&mut dev, WAIT).expect("the large frame");
    assert_eq!(u16::from_le_bytes([hdr[10], hdr[11]]), 3, "4012 bytes over 1526-byte buffers");
    assert!(got == big[VNET_HDR_LEN..]);
    // The same frame with no buffers to merge into waits, and then arrives.
    let (mut dev2, _ep2, host2) = paired(NetRateLimits::default());
    let mut g2 = Guest::new(1526);
    g2.activate(&mut dev2, OFFERED_FEATURES, 2);
    host2.send(&big).unwrap();
    assert!(g2.recv(&mut dev2, Duration::from_millis(100)).is_none(), "two buffers do not hold it");
    g2.post_rx(1);
    dev2.queue_notify(RX_QUEUE);
    let (_, got) = g2.recv(&mut dev2, WAIT).expect("the frame once a third buffer is posted");
    assert!(got == big[VNET_HDR_LEN..]);
    let all = libc::TUN_F_CSUM | libc::TUN_F_TSO4 | libc::TUN_F_TSO6 | libc::TUN_F_TSO_ECN;
    assert_eq!(*ep.offloads.lock().unwrap(), [all], "the tap takes what the guest acked");
}

#[test]
fn the_tap_hands_over_only_what_the_guest_acked() {
    assert_eq!(tap_offloads(PLAIN), 0);
    assert_eq!(tap_offloads(PLAIN | F_GUEST_TSO4), 0, "TSO without checksum offload is nothing");
    assert_eq!(tap_offloads(PLAIN | F_GUEST_CSUM), libc::TUN_F_CSUM);
    assert_eq!(tap_offloads(PLAIN | F_GUEST_CSUM | F_GUEST_TSO6), libc::TUN_F_CSUM | libc::TUN_F_TSO6);
    let (mut dev, ep, _host) = paired(NetRateLimits::default());
    let mut g = Guest::new(1526);
    g.activate(&mut dev, PLAIN, 1);
    wait_until("the offloads to be set", || !ep.offloads.lock().unwrap().is_empty());
    assert_eq!(*ep.offloads.lock().unwrap(), [0]);
}

#[test]
fn a_paused_device_moves_no_frame_until_resumed() {
    let (mut dev, _ep, host) = paired(NetRateLimits::default());
    let mut g = Guest::new(1526);
    g.activate(&mut dev, PLAIN, 4);
    dev.pause();
    host.send(&host_frame(64, 9)).unwrap();
    g.send(&mut dev, &[0x11; 60]);
    std::thread::sleep(Duration::from_millis(50));
    assert!(g.rx.take_used(&g.mem).is_empty() && g.tx.take_used(&g.mem).is_empty(), "no queue moved while paused");
    dev.resume();
    assert!(g.recv(&mut dev, WAIT).is_some());
    let mut buf = [0u8; 256];
    assert_eq!(host.recv(&mut buf).unwrap(), 72);
}

#[test]
fn rate_limits_hold_each_direction_to_its_cap() {
    let cap = RateLimit { bytes_per_sec: Some(40_000), ops_per_sec: None };
    let (mut dev, _ep, host) = paired(NetRateLimits { tx: cap, rx: cap });
    let metrics = dev.metrics();
    let mut g = Guest::new(1526);
    g.activate(&mut dev, PLAIN, 60);
    // 60 frames of 1012 bytes: the first 40 000 bytes at once, the rest at 40 000/s.
    let started = Instant::now();
    let frame = vec![0x33; 1000];
    let mut buf = vec![0u8; 2048];
    for _ in 0..60 {
        g.send(&mut dev, &frame);
    }
    for _ in 0..60 {
        host.recv(&mut buf).expect("every frame, in time");
    }
    let tx_time = started.elapsed();
    assert!(tx_time >= Duration::from_millis(400), "60 720 bytes at 40 000/s took only {tx_time:?}");
    assert!(metrics.snapshot().tx_throttled > 0);
    let started = Instant::now();
    for i in 0..60 {
        host.send(&host_frame(1000, i)).unwrap();
    }
    for _ in 0..60 {
        g.recv(&mut dev, WAIT).expect("every frame, in time");
    }
    let rx_time = started.elapsed();
    assert!(rx_time >= Duration::from_millis(400), "60 720 bytes at 40 000/s took only {rx_time:?}");
    assert!(metrics.snapshot().rx_throttled > 0);
}

#[test]
fn state_round_trips_and_a_restore_refuses_features_never_offered() {
    let (mut dev, ep, _host) = paired(NetRateLimits::default());
    let mut g = Guest::new(1526);
    g.activate(&mut dev, OFFERED_FEATURES, 1);
    let mac = [2, 0, 0, 0, 0, 9];
    let state = NetState { acked_features: dev.acked_features(), mac };
    let bytes = bincode::serialize(&crate::devices::virtio::VirtioDeviceState::Net(state.clone())).unwrap();
    let back: crate::devices::virtio::VirtioDeviceState = bincode::deserialize(&bytes).unwrap();
    assert_eq!(back, crate::devices::virtio::VirtioDeviceState::Net(state.clone()));
    assert_eq!(back.device_type(), crate::devices::virtio::device::TYPE_NET);
    let restored = Net::restore(&state, ep.clone(), NetRateLimits::default()).unwrap();
    assert_eq!((restored.acked_features(), restored.mac()), (OFFERED_FEATURES, mac));
    let mut config = [0xffu8; 8];
    restored.read_config(0, &mut config);
    assert_eq!(config, [2, 0, 0, 0, 0, 9, 0, 0]);
    let bad = NetState { acked_features: OFFERED_FEATURES | (1 << 22), mac };
    let err = Net::restore(&bad, ep, NetRateLimits::default()).unwrap_err();
    assert!(matches!(err, NetError::RestoreFeatures { .. }), "{err}");
}

#[test]
fn the_device_runs_under_the_vmm_filters() {
    if !is_root() {
        eprintln!("skipped: a tap in a network namespace needs root");
        return;
    }
    let tap = tap_in_test_netns();
    // SAFETY: the child builds and drives the device, and leaves through `_exit`.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let code = match crate::host::seccomp::enforce() {
            Ok(()) => {
                // As a jailed VMM gets it: a descriptor, checked under the control filter;
                // offloads set and frames moved under the device filter.
                let fd = tap.as_fd().try_clone_to_owned().unwrap();
                let mut dev = Net::with_tap(Tap::from_fd(fd).unwrap(), GUEST_MAC, NetRateLimits::default()).unwrap();
                let mut g = Guest::new(1526);
                g.activate(&mut dev, OFFERED_FEATURES, 32);
                ping_through(&mut dev, &mut g, &[56]);
                0
            }
            Err(_) => 99,
        };
        // SAFETY: ends the child without the harness's destructors.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waits for the child forked above.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status), "the child ended by signal: {status:#x}");
    let code = libc::WEXITSTATUS(status);
    assert_ne!(code, crate::host::seccomp::EXIT_SECCOMP_DENIED, "a filter denied a call the device makes");
    assert_eq!(code, 0);
}
