//! A slot, checked from both ends (root only): frames written to its tap, as the guest
//! would send them, are answered by the namespace's kernel as a guest expects; sockets
//! made inside it see the guest's network and the host's does not; and once the slot
//! and its tap are closed, nothing of it is left in this process.

use super::guest_frames::{is_root, tap_of};
use super::*;
use etherparse::{Icmpv4Type, PacketBuilder, SlicedPacket};
use forkvm_vmm::devices::attach::TapSource;
use forkvm_vmm::devices::virtio::net::Tap;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// The next frame from `tap` (header stripped) that `pick` accepts.
fn read_where<T>(tap: &Tap, mut pick: impl FnMut(&[u8]) -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut buf = vec![0u8; 65562];
    loop {
        assert!(Instant::now() < deadline, "no answer from the namespace");
        match tap.read(&mut buf) {
            Ok(n) if n > 12 => {
                if let Some(t) = pick(&buf[12..n]) {
                    return t;
                }
            }
            _ => std::thread::sleep(Duration::from_millis(1)),
        }
    }
}

#[test]
fn the_namespace_answers_the_guest_at_once_without_asking_who_it_is() {
    if !is_root() {
        eprintln!("skipped: making a network namespace needs root");
        return;
    }
    let host_ipv6 = std::fs::read_to_string("/proc/sys/net/ipv6/conf/all/disable_ipv6").ok();
    let slot = NetSlot::create_with(&uplink::Uplink::None).unwrap();
    let tap = tap_of(&slot);
    assert_eq!(tap.name(), TAP_NAME);
    // Nothing talks to the guest unasked (no IPv6 solicitations or reports).
    std::thread::sleep(Duration::from_millis(300));
    let mut buf = vec![0u8; 65562];
    assert!(tap.read(&mut buf).is_err(), "the namespace sent the guest a frame unasked");
    let inside = slot.run_inside(|| std::fs::read_to_string("/proc/sys/net/ipv6/conf/tap0/disable_ipv6").ok()).unwrap();
    assert!(inside.is_none() || inside.as_deref() == Some("1\n"), "IPv6 on the tap: {inside:?}");
    assert_eq!(
        std::fs::read_to_string("/proc/sys/net/ipv6/conf/all/disable_ipv6").ok(),
        host_ipv6,
        "the host's IPv6 setting changed"
    );
    // An echo request straight to the gateway's MAC, as a restored guest sends one: the
    // reply must come without an ARP request first (the guest is a permanent neighbour).
    let mut frame = vec![0u8; 12];
    PacketBuilder::ethernet2(GUEST_MAC, TAP_MAC)
        .ipv4(GUEST_IP.octets(), GATEWAY_IP.octets(), 64)
        .icmpv4_echo_request(9, 1)
        .write(&mut frame, b"are you there")
        .unwrap();
    tap.write(&frame).unwrap();
    let reply = read_where(&tap, |f| {
        assert!(f.len() < 14 || f[12..14] != [0x08, 0x06], "the namespace asked who the guest is");
        let p = SlicedPacket::from_ethernet(f).ok()?;
        let Some(etherparse::TransportSlice::Icmpv4(icmp)) = &p.transport else { return None };
        let Icmpv4Type::EchoReply(h) = icmp.icmp_type() else { return None };
        (h.id == 9).then(|| (f[..6].to_vec(), f[6..12].to_vec(), icmp.payload().to_vec()))
    });
    assert_eq!(reply, (GUEST_MAC.to_vec(), TAP_MAC.to_vec(), b"are you there".to_vec()));
}

#[test]
fn sockets_made_inside_are_on_the_guests_link_and_nothing_is_left_after() {
    if !is_root() {
        eprintln!("skipped: making a network namespace needs root");
        return;
    }
    let slot = NetSlot::create_with(&uplink::Uplink::None).unwrap();
    let inside = slot.run_inside(|| std::net::TcpListener::bind((GATEWAY_IP, 0)).map(|l| l.local_addr().unwrap()));
    assert!(inside.unwrap().is_ok(), "the gateway address is bound inside");
    assert!(std::net::TcpListener::bind((GATEWAY_IP, 0)).is_err(), "the host's namespace has no such address");
    // SAFETY: stat is plain data; all zeroes is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat on a descriptor we own into a stat we own.
    assert_eq!(unsafe { libc::fstat(slot.namespace().as_raw_fd(), &mut st) }, 0);
    let name = format!("net:[{}]", st.st_ino);
    let refs = || {
        let fds = std::fs::read_dir("/proc/self/fd").unwrap().flatten();
        let fd_refs = fds.filter(|e| std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy() == name)).count();
        let tasks = std::fs::read_dir("/proc/self/task").unwrap().flatten();
        let task_refs = tasks
            .filter(|t| std::fs::read_link(t.path().join("ns/net")).is_ok_and(|l| l.to_string_lossy() == name))
            .count();
        fd_refs + task_refs
    };
    assert_eq!(refs(), 1, "the slot's namespace descriptor (its tap reads as /dev/net/tun)");
    drop(slot);
    assert_eq!(refs(), 0, "nothing in this process keeps the namespace");
}

#[test]
fn the_guest_is_configured_from_the_command_line() {
    assert_eq!(guest_ip_arg(), "ip=172.16.0.2::172.16.0.1:255.255.255.252::eth0:off");
}

#[test]
fn a_running_sandboxs_namespace_is_found_again_from_its_vmm_alone() {
    if !is_root() {
        eprintln!("skipped: making a network namespace needs root");
        return;
    }
    use std::os::unix::process::CommandExt;
    let slot = NetSlot::create_with(&uplink::Uplink::None).unwrap();
    let TapSource::Fd(tap) = slot.tap_source() else { unreachable!("a slot's tap is a descriptor") };
    let raw = tap.as_raw_fd();
    // A stand-in VMM: a process whose only tap is the slot's, at descriptor 3.
    let mut cmd = std::process::Command::new("sleep");
    cmd.arg("30");
    // SAFETY: dup2 is async-signal-safe; it runs in the child between fork and exec.
    unsafe {
        cmd.pre_exec(move || if libc::dup2(raw, 3) < 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) });
    }
    let mut vmm = cmd.spawn().unwrap();
    let mut without_tap = std::process::Command::new("sleep").arg("30").spawn().unwrap();
    let inode = |fd: &std::os::fd::OwnedFd| {
        let meta = std::fs::metadata(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap();
        std::os::unix::fs::MetadataExt::ino(&meta)
    };
    let found = enter::namespace_of_vmm(vmm.id() as i32);
    let refused = enter::namespace_of_vmm(without_tap.id() as i32);
    for child in [&mut vmm, &mut without_tap] {
        let _ = child.kill();
        let _ = child.wait();
    }
    assert_eq!(inode(&found.unwrap()), inode(slot.namespace()));
    let refused = refused.expect_err("a process without a tap has no sandbox namespace").to_string();
    assert!(refused.contains("no tap"), "{refused}");
}

#[test]
fn a_vmm_still_holding_inherited_taps_is_read_once_its_taps_are_in_one_namespace() {
    if !is_root() {
        eprintln!("skipped: making a network namespace needs root");
        return;
    }
    use std::os::unix::process::CommandExt;
    let own = NetSlot::create_with(&uplink::Uplink::None).unwrap();
    let inherited = NetSlot::create_with(&uplink::Uplink::None).unwrap();
    let raw = |slot: &NetSlot| {
        let TapSource::Fd(tap) = slot.tap_source() else { unreachable!("a slot's tap is a descriptor") };
        tap.as_raw_fd()
    };
    let (own_fd, inherited_fd) = (raw(&own), raw(&inherited));
    // Stand-in VMMs holding another sandbox's tap first (descriptor 3) and their own
    // (4): one sheds the other's after a while, as a VMM forked from the daemon does
    // once it runs; one never does.
    let stand_in = |script: &str, first: i32| {
        let mut cmd = std::process::Command::new("sh");
        cmd.args(["-c", script]);
        // SAFETY: dup2 is async-signal-safe; it runs in the child between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                // Both copied above 3 and 4 first: a source that is itself 3 or 4 would
                // be overwritten by the other's dup2.
                let (a, b) = (libc::fcntl(first, libc::F_DUPFD, 100), libc::fcntl(own_fd, libc::F_DUPFD, 100));
                if a < 0 || b < 0 || libc::dup2(a, 3) < 0 || libc::dup2(b, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::close(a);
                libc::close(b);
                Ok(())
            });
        }
        cmd.spawn().unwrap()
    };
    let mut shedding = stand_in("sleep 0.3; exec 3>&-; sleep 30", inherited_fd);
    let mut holding = stand_in("sleep 30", inherited_fd);
    // Its own tap twice (its device works on a duplicate): one namespace, at once.
    let mut twice = stand_in("sleep 30", own_fd);
    let inode = |fd: &std::os::fd::OwnedFd| {
        let meta = std::fs::metadata(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap();
        std::os::unix::fs::MetadataExt::ino(&meta)
    };
    let found = enter::namespace_of_vmm(shedding.id() as i32);
    let unknown = enter::namespace_of_vmm_within(holding.id() as i32, std::time::Duration::from_millis(200));
    let started = std::time::Instant::now();
    let doubled = enter::namespace_of_vmm_within(twice.id() as i32, std::time::Duration::from_secs(5));
    let doubled_took = started.elapsed();
    for child in [&mut shedding, &mut holding, &mut twice] {
        let _ = child.kill();
        let _ = child.wait();
    }
    assert_eq!(inode(&found.unwrap()), inode(own.namespace()), "the VMM's own tap's namespace");
    let unknown = unknown.expect_err("a VMM holding taps of two namespaces has no known one").to_string();
    assert!(unknown.contains("more than one namespace"), "{unknown}");
    assert_eq!(inode(&doubled.unwrap()), inode(own.namespace()));
    assert!(doubled_took < std::time::Duration::from_secs(1), "one namespace twice is no wait: {doubled_took:?}");
}
