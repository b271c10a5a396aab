//! A fake internet for tests and benchmarks: sandbox traffic must never reach a real
//! address under test, so tests make their own uplink. Two namespaces of this process's
//! own, joined by a veth pair `wan0`:
//! * the **router** ([`FakeInternet::uplink`]), which sandboxes' links end in, with
//!   [`ROUTER_IP`] on its side and its default route to the host;
//! * the **host** ([`HOST_IP`] and [`OTHER_HOST_IP`], [`FakeInternet::run_inside`]),
//!   where a test runs the servers the sandboxes talk to.
//!
//! The host can answer DNS ([`FakeInternet::serve_dns`], at [`HOST_IP`] port 53) and
//! HTTP ([`FakeInternet::serve_http`], on both its addresses).
//!
//! Only descriptors keep them: dropping the value (and every uplink made from it, and
//! every sandbox linked to it) removes everything, also when a test fails.

mod dns;
mod http;

pub use dns::FakeDns;
pub use http::FakeHttp;

use super::enter::run_in;
use super::ifconfig::Ifconfig;
use super::slot::unshare_thread;
use super::uplink::Uplink;
use super::veth::Netlink;
use super::NetworkError;
use std::net::{Ipv4Addr, TcpListener};
use std::os::fd::OwnedFd;

/// The router's address on the fake internet: sandbox traffic arrives from it.
pub const ROUTER_IP: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 1);
/// The fake internet's host (TEST-NET-3, RFC 5737).
pub const HOST_IP: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 2);
/// A second address of that host (`wan0:1`): another server, as far as sandboxes see.
pub const OTHER_HOST_IP: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 7);
const WAN_NETMASK: Ipv4Addr = Ipv4Addr::new(255, 255, 255, 0);
const WAN: &str = "wan0";

/// A router namespace and an internet host behind it.
#[derive(Debug)]
pub struct FakeInternet {
    router: OwnedFd,
    host: OwnedFd,
}

impl FakeInternet {
    /// Makes both namespaces and the link between them (a thread of its own does it
    /// and ends).
    pub fn create() -> Result<FakeInternet, NetworkError> {
        let made =
            std::thread::Builder::new().name("fake-internet".into()).spawn(build).map_err(NetworkError::Thread)?.join();
        made.unwrap_or_else(|_| Err(NetworkError::Thread(std::io::Error::other("it panicked"))))
    }

    /// The router, as an uplink for sandboxes.
    pub fn uplink(&self) -> Result<Uplink, NetworkError> {
        Uplink::namespace(self.router.try_clone().map_err(NetworkError::OpenNamespace)?)
    }

    /// A path to the router's namespace that another process of this host may open as
    /// its uplink (`FORKVM_UPLINK`), for as long as this value lives.
    pub fn router_path(&self) -> String {
        use std::os::fd::AsRawFd;
        format!("/proc/{}/fd/{}", std::process::id(), self.router.as_raw_fd())
    }

    /// Runs `f` on a thread inside the host's namespace (servers bind there).
    pub fn run_inside<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> Result<T, NetworkError> {
        run_in(&self.host, f)
    }

    /// Answers DNS at [`HOST_IP`]:53 for `names` (`www.example.test`, or `*.example.test`
    /// for every name under it) with their addresses, NXDOMAIN for the rest, until the
    /// returned server is dropped.
    pub fn serve_dns(&self, names: &[(&str, Ipv4Addr)]) -> Result<FakeDns, NetworkError> {
        let sock = self
            .run_inside(|| std::net::UdpSocket::bind((HOST_IP, 53)))?
            .map_err(|e| NetworkError::Dns(format!("the fake internet's DNS socket: {e}")))?;
        let names = names.iter().map(|(n, ip)| (n.to_ascii_lowercase(), *ip)).collect();
        dns::start(sock, names).map_err(|e| NetworkError::Dns(format!("the fake internet's DNS server: {e}")))
    }

    /// Answers HTTP on `port` of both the host's addresses with `body`, until the
    /// returned server is dropped.
    pub fn serve_http(&self, port: u16, body: &'static str) -> Result<FakeHttp, NetworkError> {
        let listener = self
            .run_inside(move || TcpListener::bind(("0.0.0.0", port)))?
            .map_err(|e| NetworkError::FakeInternet(format!("its HTTP socket: {e}")))?;
        http::start(listener, body).map_err(|e| NetworkError::FakeInternet(format!("its HTTP server: {e}")))
    }

    /// Runs `f` on a thread inside the router's namespace.
    pub fn run_in_router<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> Result<T, NetworkError> {
        run_in(&self.router, f)
    }
}

fn build() -> Result<FakeInternet, NetworkError> {
    let failed = |interface: &str, step: &'static str| {
        let interface = interface.to_string();
        move |source| NetworkError::Interface { interface, step, source }
    };
    let router = unshare_thread()?;
    let router_ifc = Ifconfig::new().map_err(failed("lo", "a socket in the router"))?;
    let router_links = Netlink::here().map_err(failed(WAN, "a netlink socket in the router"))?;
    router_ifc.up("lo").map_err(failed("lo", "up in the router"))?;
    let host = unshare_thread()?;
    let host_ifc = Ifconfig::new().map_err(failed("lo", "a socket in the host"))?;
    host_ifc.up("lo").map_err(failed("lo", "up in the host"))?;
    router_links.add_pair(WAN, WAN, &host).map_err(|e| NetworkError::Interface {
        interface: WAN.into(),
        step: "the pair",
        source: std::io::Error::other(format!("{e:?}")),
    })?;
    router_ifc.set_ipv4(WAN, ROUTER_IP, WAN_NETMASK).map_err(failed(WAN, "the router's address"))?;
    router_ifc.up(WAN).map_err(failed(WAN, "up in the router"))?;
    router_ifc.add_default_route(HOST_IP).map_err(failed(WAN, "the router's default route"))?;
    host_ifc.set_ipv4(WAN, HOST_IP, WAN_NETMASK).map_err(failed(WAN, "the host's address"))?;
    host_ifc.up(WAN).map_err(failed(WAN, "up in the host"))?;
    let alias = format!("{WAN}:1");
    host_ifc.set_ipv4(&alias, OTHER_HOST_IP, WAN_NETMASK).map_err(failed(&alias, "the host's other address"))?;
    Ok(FakeInternet { router, host })
}
