//! `forkvm bench net`: what a sandbox's network costs and carries, as one JSON object.
//!
//! * `setup`: making one sandbox's network (`network::NetSlot::create_with`), wall time
//!   and host CPU (this process's, all threads, and the `nft` it runs), medians of
//!   `--runs`: `bare`, a namespace and its tap without a way out; `linked`, the same
//!   linked to an uplink (veth pair, addresses, route, the namespace's rules). The
//!   uplink is a fake internet this benchmark makes, so it never touches the host's
//!   network; `uplink_first_us` is the one-time setup of that uplink (forwarding, its
//!   table). Host-side and real on any host: what each child adds to a spawn while
//!   slots are made on the critical path.
//! * `policy`: on linked slots, medians of `--runs` (wall and host CPU, `nft` included):
//!   `dns_serve`, binding the DNS forwarder's sockets inside a namespace and serving them
//!   (what the process that makes a sandbox ready adds per sandbox, but for finding the
//!   namespace from the VMM); `set` and `set_again`, an egress policy put in force on a
//!   fresh namespace and changed on one that has one (two names, a network); `learn`,
//!   one allowed name's address added to the filter (what a guest's DNS answer waits
//!   for under a name rule). Host-side, real on any host.
//! * `ports`: `socket`, a TCP socket made inside a sandbox's namespace (a thread enters
//!   it): what the daemon adds per connection to an exposed port or a forwarded one,
//!   but for the connect itself. Medians of `--runs`, host-side.
//! * `guest`: in one sandbox of `--image`, against a listener in its own namespace:
//!   `rtt_us`, ICMP echo round trips answered by the guest kernel (median of `--pings`);
//!   `to_guest_mib_s` and `from_guest_mib_s`, one TCP transfer of `--mib` each way
//!   (`wget` in the guest fetching, `nc` in the guest sending), timed host-side. These
//!   run through the guest kernel's network stack, which PVM hosts emulate (~1000x slow
//!   ring-0 code): they bound nothing but this host.

use crate::util::{machine, median, r2};
use anyhow::{bail, Context, Result};
use clap::Args;
use forkvm_image::progress::ProgressView;
use forkvm_proto::ExecRequest;
use forkvm_sandbox::network::fake_internet::FakeInternet;
use forkvm_sandbox::network::uplink::Uplink;
use forkvm_sandbox::network::{NetSlot, GATEWAY_IP, GUEST_IP};
use forkvm_sandbox::{ensure_template_snapshot, Artifacts, Sandbox};
use serde_json::json;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct BenchNetArgs {
    /// Template the guest measurements run in.
    #[arg(long, default_value = "tiny")]
    pub image: String,
    /// Slots made for the setup medians.
    #[arg(long, default_value_t = 21)]
    pub runs: usize,
    /// ICMP round trips timed.
    #[arg(long, default_value_t = 20)]
    pub pings: usize,
    /// MiB moved each way (slow here: the guest's TCP stack is emulated).
    #[arg(long, default_value_t = 1)]
    pub mib: usize,
    /// Skip the guest measurements (setup only).
    #[arg(long)]
    pub no_guest: bool,
    /// Print JSON only.
    #[arg(long)]
    pub json: bool,
}

/// Medians of wall time and host CPU of making `runs` slots linked to `uplink`.
fn time_slots(uplink: &Uplink, runs: usize) -> Result<serde_json::Value> {
    let (mut wall, mut cpu) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let (t, c) = (Instant::now(), crate::procstat::process_cpu_us());
        let slot = NetSlot::create_with(uplink).context("making a sandbox network (root, /dev/net/tun, nft)")?;
        wall.push(t.elapsed().as_secs_f64() * 1e6);
        cpu.push(crate::procstat::process_cpu_us() - c);
        drop(slot);
    }
    Ok(json!({ "wall_us": r2(median(&mut wall)), "host_cpu_us": r2(median(&mut cpu)) }))
}

/// A wall/CPU pair of medians.
#[derive(Default)]
struct Timed {
    wall: Vec<f64>,
    cpu: Vec<f64>,
}

impl Timed {
    fn time<T>(&mut self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let (t, c) = (Instant::now(), crate::procstat::process_cpu_us());
        let out = f()?;
        self.wall.push(t.elapsed().as_secs_f64() * 1e6);
        self.cpu.push(crate::procstat::process_cpu_us() - c);
        Ok(out)
    }

    fn json(mut self) -> serde_json::Value {
        json!({ "wall_us": r2(median(&mut self.wall)), "host_cpu_us": r2(median(&mut self.cpu)) })
    }
}

/// The `policy` section: forwarder and filter costs on `runs` slots linked to `uplink`.
fn time_policy(uplink: &Uplink, runs: usize) -> Result<serde_json::Value> {
    use forkvm_sandbox::network::dns::{serve, DnsSockets, Lifetime};
    use forkvm_sandbox::network::firewall::Firewall;
    use std::sync::Arc;
    let policy = |allow_internet| forkvm_client::api::NetworkPolicy {
        allow_internet,
        allow: vec!["pypi.org".into(), "*.pythonhosted.org".into()],
        deny: vec!["198.51.100.0/24".into()],
    };
    let (mut dns_serve, mut set, mut set_again, mut learn) =
        (Timed::default(), Timed::default(), Timed::default(), Timed::default());
    for i in 0..runs {
        let slot = NetSlot::create_with(uplink).context("making a sandbox network")?;
        let netns = slot.namespace().try_clone()?;
        let uplink_here = uplink.try_clone()?;
        let (_guard, firewall) = dns_serve.time(|| {
            let sockets = forkvm_sandbox::network::enter::run_in(&netns, move || DnsSockets::bind_here(&uplink_here))??;
            let firewall = Arc::new(Firewall::new(netns.try_clone()?, sockets.uplink()));
            Ok((serve(sockets, Lifetime::WhileHeld, firewall.clone())?, firewall))
        })?;
        set.time(|| Ok(forkvm_sandbox::network::set_policy(&firewall, &policy(false))?))?;
        set_again.time(|| Ok(forkvm_sandbox::network::set_policy(&firewall, &policy(true))?))?;
        let addr = std::net::Ipv4Addr::new(203, 0, 113, (i % 200) as u8 + 10);
        learn.time(|| Ok(firewall.learn("files.pythonhosted.org", &[(addr, 60)])?))?;
    }
    Ok(json!({
        "dns_serve": dns_serve.json(),
        "set": set.json(),
        "set_again": set_again.json(),
        "learn": learn.json(),
    }))
}

/// The `ports` section: a socket made inside a namespace, `runs` times on one slot.
fn time_ports(runs: usize) -> Result<serde_json::Value> {
    let slot = NetSlot::create_with(&Uplink::None).context("making a sandbox network")?;
    let mut socket = Timed::default();
    for _ in 0..runs {
        socket.time(|| Ok(forkvm_sandbox::network::connect::socket_in(slot.namespace())?))?;
    }
    Ok(json!({ "socket": socket.json() }))
}

pub fn run(a: BenchNetArgs) -> Result<i32> {
    if a.runs == 0 || a.pings == 0 || a.mib == 0 {
        bail!("--runs, --pings and --mib must be at least 1");
    }
    let bare = time_slots(&Uplink::None, a.runs)?;
    let internet = FakeInternet::create().context("a fake internet to link the slots to")?;
    let uplink = internet.uplink()?;
    let first = Instant::now();
    drop(NetSlot::create_with(&uplink).context("the first slot on the uplink")?);
    let uplink_first_us = first.elapsed().as_secs_f64() * 1e6;
    let linked = time_slots(&uplink, a.runs)?;
    let policy = time_policy(&uplink, a.runs)?;
    let ports = time_ports(a.runs)?;
    let mut out = json!({
        "benchmark": "net",
        "machine": machine(),
        "setup": { "runs": a.runs, "bare": bare, "linked": linked, "uplink_first_us": r2(uplink_first_us) },
        "policy": policy,
        "ports": ports,
    });
    if !a.no_guest {
        out["guest"] = guest(&a)?;
    }
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(0)
}

fn guest(a: &BenchNetArgs) -> Result<serde_json::Value> {
    let mut view = ProgressView::new();
    let artifacts = Artifacts::ensure(&a.image, &mut |e| view.show(&e));
    view.finish();
    let template = ensure_template_snapshot(artifacts?).context("template snapshot")?;
    let sb = Sandbox::start(&template).context("starting a sandbox")?;
    let net = sb.network().context("the template has no network (made where sandboxes could not get one)")?;
    let mut rtts = pings(net, a.pings)?;
    let bytes = a.mib << 20;
    let to_guest = to_guest_mib_s(&sb, net, bytes)?;
    let from_guest = from_guest_mib_s(&sb, net, bytes)?;
    Ok(json!({
        "image": a.image,
        "rtt_us": r2(median(&mut rtts)),
        "pings": rtts.len(),
        "to_guest_mib_s": r2(to_guest),
        "from_guest_mib_s": r2(from_guest),
        "mib": a.mib,
        "note": "through the guest kernel's network stack, emulated on PVM hosts",
    }))
}

/// The Internet checksum of `data`.
fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = data.chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]))).sum();
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// `n` ICMP echo round trips from the namespace to the guest, in microseconds.
fn pings(net: &NetSlot, n: usize) -> Result<Vec<f64>> {
    let rtts = net.run_inside(move || -> Result<Vec<f64>> {
        // SAFETY: socket(2) with constant arguments; the descriptor is ours.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::IPPROTO_ICMP) };
        if fd < 0 {
            bail!("a raw ICMP socket: {}", std::io::Error::last_os_error());
        }
        // SAFETY: just made, owned by nothing else.
        let sock = unsafe { OwnedFd::from_raw_fd(fd) };
        let timeout = libc::timeval { tv_sec: 5, tv_usec: 0 };
        // SAFETY: SO_RCVTIMEO reads a timeval.
        unsafe {
            libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVTIMEO, (&timeout as *const libc::timeval).cast(), 16)
        };
        let to = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: 0,
            sin_addr: libc::in_addr { s_addr: u32::from(GUEST_IP).to_be() },
            sin_zero: [0; 8],
        };
        let mut rtts = Vec::new();
        for seq in 0..n as u16 {
            let mut pkt = vec![8u8, 0, 0, 0, 0x46, 0x56, (seq >> 8) as u8, seq as u8];
            pkt.extend_from_slice(b"forkvm bench net");
            let c = checksum(&pkt);
            pkt[2..4].copy_from_slice(&c.to_be_bytes());
            let t = Instant::now();
            // SAFETY: sendto with a buffer and address we own, of the sizes given.
            let sent = unsafe {
                libc::sendto(
                    sock.as_raw_fd(),
                    pkt.as_ptr().cast(),
                    pkt.len(),
                    0,
                    (&to as *const libc::sockaddr_in).cast(),
                    std::mem::size_of::<libc::sockaddr_in>() as u32,
                )
            };
            if sent < 0 {
                bail!("sending an echo request: {}", std::io::Error::last_os_error());
            }
            let mut buf = [0u8; 1500];
            loop {
                // SAFETY: recv into a buffer we own, of its size.
                let got = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
                if got < 0 {
                    bail!("no echo reply from the guest: {}", std::io::Error::last_os_error());
                }
                // IP header, then ICMP: type 0 (reply), our id and sequence number.
                let ihl = usize::from(buf[0] & 0x0f) * 4;
                let icmp = &buf[ihl..got as usize];
                if icmp.len() >= 8 && icmp[0] == 0 && icmp[4..6] == [0x46, 0x56] && icmp[6..8] == seq.to_be_bytes() {
                    break;
                }
            }
            rtts.push(t.elapsed().as_secs_f64() * 1e6);
        }
        Ok(rtts)
    })?;
    rtts
}

/// A listener on the gateway address in the sandbox's namespace.
fn listener(net: &NetSlot, port: u16) -> Result<TcpListener> {
    Ok(net.run_inside(move || TcpListener::bind((GATEWAY_IP, port)))??)
}

/// Accepts one connection (bounded wait).
fn accept(l: &TcpListener) -> Result<TcpStream> {
    l.set_nonblocking(true)?;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        match l.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)?;
                s.set_read_timeout(Some(Duration::from_secs(120)))?;
                return Ok(s);
            }
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(2)),
            Err(e) => bail!("the guest never connected: {e}"),
        }
    }
}

/// The guest fetches `bytes` over HTTP from the namespace; MiB/s from the request to the
/// guest's hang-up, host side.
fn to_guest_mib_s(sb: &Sandbox, net: &NetSlot, bytes: usize) -> Result<f64> {
    let l = listener(net, 8081)?;
    let server = std::thread::spawn(move || -> Result<f64> {
        let mut s = accept(&l)?;
        let mut req = [0u8; 1024];
        let _ = s.read(&mut req)?;
        let t = Instant::now();
        s.write_all(format!("HTTP/1.0 200 OK\r\nContent-Length: {bytes}\r\n\r\n").as_bytes())?;
        let chunk = vec![0x5au8; 64 << 10];
        let mut left = bytes;
        while left > 0 {
            let n = left.min(chunk.len());
            s.write_all(&chunk[..n])?;
            left -= n;
        }
        s.shutdown(std::net::Shutdown::Write)?;
        let _ = s.read(&mut req); // the guest's close
        Ok(bytes as f64 / (1 << 20) as f64 / t.elapsed().as_secs_f64())
    });
    let cmd = format!("wget -q -O /dev/null http://{GATEWAY_IP}:8081/");
    let out = sb.client.exec_collect(&ExecRequest::shell(&cmd), b"")?;
    if out.status.code != Some(0) {
        bail!("wget in the guest: {}", String::from_utf8_lossy(&out.stderr));
    }
    server.join().map_err(|_| anyhow::anyhow!("the server thread panicked"))?
}

/// The guest sends `bytes` with `nc`; MiB/s from the first byte to the end, host side.
fn from_guest_mib_s(sb: &Sandbox, net: &NetSlot, bytes: usize) -> Result<f64> {
    let l = listener(net, 8082)?;
    let server = std::thread::spawn(move || -> Result<f64> {
        let mut s = accept(&l)?;
        let mut buf = vec![0u8; 64 << 10];
        let mut got = s.read(&mut buf)?;
        let t = Instant::now();
        loop {
            match s.read(&mut buf)? {
                0 => break,
                n => got += n,
            }
        }
        let secs = t.elapsed().as_secs_f64();
        if got != bytes {
            bail!("{got} bytes came, {bytes} were sent");
        }
        Ok(bytes as f64 / (1 << 20) as f64 / secs)
    });
    let cmd = format!("dd if=/dev/zero bs=64k count={} 2>/dev/null | nc {GATEWAY_IP} 8082", bytes >> 16);
    let out = sb.client.exec_collect(&ExecRequest::shell(&cmd), b"")?;
    if out.status.code != Some(0) {
        bail!("nc in the guest: {}", String::from_utf8_lossy(&out.stderr));
    }
    server.join().map_err(|_| anyhow::anyhow!("the server thread panicked"))?
}
