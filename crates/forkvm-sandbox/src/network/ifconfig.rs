//! The interface calls that set up a sandbox's namespace: links up, the tap's MAC and
//! address, the guest as a permanent neighbour. Classic `ioctl`s on an `AF_INET` socket
//! made in the namespace (a socket acts in the namespace it was made in), a few
//! microseconds each: no `ip` process, no netlink round trip.

use std::ffi::c_int;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// `ATF_COM | ATF_PERM` (`<net/if_arp.h>`): a complete, permanent neighbour entry.
const ATF_COM: c_int = 0x02;
const ATF_PERM: c_int = 0x04;

/// An `AF_INET` socket of the calling thread's namespace, for interface calls.
#[derive(Debug)]
pub struct Ifconfig {
    sock: OwnedFd,
}

fn name_bytes(name: &str) -> [libc::c_char; libc::IFNAMSIZ] {
    let mut out = [0 as libc::c_char; libc::IFNAMSIZ];
    for (o, b) in out.iter_mut().zip(name.bytes().take(libc::IFNAMSIZ - 1)) {
        *o = b as libc::c_char;
    }
    out
}

fn sockaddr_in(ip: Ipv4Addr) -> libc::sockaddr {
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr { s_addr: u32::from(ip).to_be() },
        sin_zero: [0; 8],
    };
    // SAFETY: sockaddr_in and sockaddr have the same size; every bit pattern is valid.
    unsafe { std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(sin) }
}

fn sockaddr_ether(mac: [u8; 6]) -> libc::sockaddr {
    let mut data = [0 as libc::c_char; 14];
    for (d, b) in data.iter_mut().zip(mac) {
        *d = b as libc::c_char;
    }
    libc::sockaddr { sa_family: libc::ARPHRD_ETHER, sa_data: data }
}

impl Ifconfig {
    /// A socket in the calling thread's namespace.
    pub fn new() -> io::Result<Ifconfig> {
        // SAFETY: socket(2) with constant arguments; the descriptor is ours.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: just made, owned by nothing else.
        Ok(Ifconfig { sock: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    fn ifreq(name: &str) -> libc::ifreq {
        // SAFETY: ifreq is plain data; all zeroes is a valid value.
        let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
        req.ifr_name = name_bytes(name);
        req
    }

    /// `ioctl(sock, request, arg)`.
    fn call<T>(&self, request: libc::c_ulong, arg: &mut T) -> io::Result<()> {
        // SAFETY: every request used here reads (and may write) exactly a `T` (an
        // ifreq or an arpreq) at a valid, exclusively borrowed pointer.
        if unsafe { libc::ioctl(self.sock.as_raw_fd(), request, arg as *mut T) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Brings `name` up.
    pub fn up(&self, name: &str) -> io::Result<()> {
        let mut req = Self::ifreq(name);
        self.call(libc::SIOCGIFFLAGS, &mut req)?;
        // SAFETY: SIOCGIFFLAGS filled the flags member of the union.
        unsafe { req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short };
        self.call(libc::SIOCSIFFLAGS, &mut req)
    }

    /// Whether `name` is up with its carrier on and the kernel has made it operational
    /// (`IFF_RUNNING`): until then a veth drops what it is given.
    pub fn is_running(&self, name: &str) -> io::Result<bool> {
        let mut req = Self::ifreq(name);
        self.call(libc::SIOCGIFFLAGS, &mut req)?;
        // SAFETY: SIOCGIFFLAGS filled the flags member of the union.
        Ok(unsafe { req.ifr_ifru.ifru_flags } & libc::IFF_RUNNING as libc::c_short != 0)
    }

    /// Sets `name`'s Ethernet address.
    pub fn set_mac(&self, name: &str, mac: [u8; 6]) -> io::Result<()> {
        let mut req = Self::ifreq(name);
        req.ifr_ifru.ifru_hwaddr = sockaddr_ether(mac);
        self.call(libc::SIOCSIFHWADDR, &mut req)
    }

    /// Gives `name` the address `ip` with `netmask` (which adds the link's route).
    pub fn set_ipv4(&self, name: &str, ip: Ipv4Addr, netmask: Ipv4Addr) -> io::Result<()> {
        let mut req = Self::ifreq(name);
        req.ifr_ifru.ifru_addr = sockaddr_in(ip);
        self.call(libc::SIOCSIFADDR, &mut req)?;
        let mut req = Self::ifreq(name);
        req.ifr_ifru.ifru_netmask = sockaddr_in(netmask);
        self.call(libc::SIOCSIFNETMASK, &mut req)
    }

    /// Adds `ip` at `mac` on `name` as a permanent neighbour: never asked for, never
    /// expired.
    pub fn add_permanent_neighbour(&self, name: &str, ip: Ipv4Addr, mac: [u8; 6]) -> io::Result<()> {
        let mut req = libc::arpreq {
            arp_pa: sockaddr_in(ip),
            arp_ha: sockaddr_ether(mac),
            arp_flags: ATF_COM | ATF_PERM,
            arp_netmask: sockaddr_in(Ipv4Addr::UNSPECIFIED),
            arp_dev: name_bytes(name),
        };
        self.call(libc::SIOCSARP, &mut req)
    }

    /// Adds the default route through `gateway` (on the link whose subnet holds it).
    pub fn add_default_route(&self, gateway: Ipv4Addr) -> io::Result<()> {
        // SAFETY: rtentry is plain data (a null device pointer means "any"); zeroes are valid.
        let mut route: libc::rtentry = unsafe { std::mem::zeroed() };
        route.rt_dst = sockaddr_in(Ipv4Addr::UNSPECIFIED);
        route.rt_genmask = sockaddr_in(Ipv4Addr::UNSPECIFIED);
        route.rt_gateway = sockaddr_in(gateway);
        route.rt_flags = libc::RTF_UP | libc::RTF_GATEWAY;
        self.call(libc::SIOCADDRT, &mut route)
    }
}
