//! One sandbox's network namespace and the tap in it, made on a thread of its own: the
//! thread leaves this process's namespace (`unshare`), makes and sets up the tap there,
//! and ends; the namespace stays for as long as a descriptor refers to it.
//!
//! Where the process has an uplink ([`super::uplink`]), the namespace is linked to it
//! ([`super::egress`]) while it is made: the slot comes ready, or not at all.
//!
//! A slot holds two: the tap, which goes to the VMM, and the namespace itself, with
//! which this process can act inside it later ([`NetSlot::run_inside`]: a listener a test
//! talks to, and later the DNS forwarder and exposed ports). Dropping the slot closes
//! both here; the VMM's tap alone then keeps the namespace, until the VMM ends.

use super::addressing::LinkIndex;
use super::egress::Outside;
use super::enter::{enter_thread, thread_namespace};
use super::ifconfig::Ifconfig;
use super::uplink::{self, Uplink};
use super::{NetworkError, GATEWAY_IP, GUEST_IP, GUEST_MAC, NETMASK, TAP_MAC, TAP_NAME};
use forkvm_vmm::devices::attach::TapSource;
use forkvm_vmm::devices::virtio::net::Tap;
use std::os::fd::OwnedFd;
use std::sync::Arc;

/// A sandbox's network namespace with its tap, set up.
#[derive(Debug)]
pub struct NetSlot {
    tap: Arc<OwnedFd>,
    netns: OwnedFd,
    link: Option<LinkIndex>,
    /// The uplink a linked slot's link ends in.
    uplink: Option<Uplink>,
}

impl NetSlot {
    /// The namespace's descriptor (its inode names it in `/proc/*/ns/net`).
    pub fn namespace(&self) -> &OwnedFd {
        &self.netns
    }

    /// The uplink the slot is linked to, if it is: where its DNS asks upstream from.
    /// (The forwarder's sockets are not made with the slot: a process that forks a VMM
    /// while it holds a slot hands the child a copy of everything it has open, and a
    /// copy of a socket bound at the gateway keeps the address from the forwarder until
    /// the child closes it.)
    pub fn uplink(&self) -> Option<&Uplink> {
        self.uplink.as_ref()
    }

    /// The link to the uplink, if the namespace has a way out.
    pub fn link(&self) -> Option<LinkIndex> {
        self.link
    }
}

impl NetSlot {
    /// Makes a namespace with the tap [`TAP_NAME`] in it: MAC [`TAP_MAC`], address
    /// [`GATEWAY_IP`], up, the guest a permanent neighbour; loopback up; linked to this
    /// process's uplink ([`uplink::current`]).
    pub fn create() -> Result<NetSlot, NetworkError> {
        NetSlot::create_with(uplink::current()?)
    }

    /// [`NetSlot::create`], linked to `uplink`.
    pub fn create_with(uplink: &Uplink) -> Result<NetSlot, NetworkError> {
        std::thread::scope(|scope| {
            let made = std::thread::Builder::new()
                .name("net-slot".into())
                .spawn_scoped(scope, || make_in_new_namespace(uplink))
                .map_err(NetworkError::Thread)?
                .join();
            made.unwrap_or_else(|_| Err(NetworkError::Thread(std::io::Error::other("it panicked"))))
        })
    }

    /// The tap, as a VMM's device config takes it.
    pub fn tap_source(&self) -> TapSource {
        TapSource::Fd(self.tap.clone())
    }

    /// Runs `f` on a thread inside the slot's namespace (sockets it makes belong there)
    /// and returns what it returns.
    pub fn run_inside<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> Result<T, NetworkError> {
        super::enter::run_in(&self.netns, f)
    }
}

/// On a thread of its own: a new namespace, and the slot in it.
fn make_in_new_namespace(uplink: &Uplink) -> Result<NetSlot, NetworkError> {
    let outside = match uplink {
        Uplink::None => None,
        Uplink::Host => Some(Outside::here()?),
        Uplink::Namespace(fd) => {
            // This thread ends after this function.
            enter_thread(fd).map_err(|e| NetworkError::Uplink(format!("entering it: {e}")))?;
            Some(Outside::here()?)
        }
    };
    // This thread ends after this function.
    let netns = unshare_thread()?;
    // No IPv6 in a sandbox's namespace (the guest has none): without this, the tap's
    // link-local address sends solicitations and reports the emulated guest kernel pays
    // for. A net sysctl acts in the namespace of the thread that opens it.
    for conf in ["all", "default"] {
        match std::fs::write(format!("/proc/sys/net/ipv6/conf/{conf}/disable_ipv6"), "1") {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(failed("ipv6", "turning it off", e)),
            _ => {}
        }
    }
    let tap = Tap::open_named(TAP_NAME)?;
    let ifc = Ifconfig::new().map_err(|e| failed("lo", "a socket for interface calls", e))?;
    ifc.up("lo").map_err(|e| failed("lo", "up", e))?;
    ifc.set_mac(TAP_NAME, TAP_MAC).map_err(|e| failed(TAP_NAME, "its MAC", e))?;
    ifc.set_ipv4(TAP_NAME, GATEWAY_IP, NETMASK).map_err(|e| failed(TAP_NAME, "its address", e))?;
    ifc.up(TAP_NAME).map_err(|e| failed(TAP_NAME, "up", e))?;
    ifc.add_permanent_neighbour(TAP_NAME, GUEST_IP, GUEST_MAC)
        .map_err(|e| failed(TAP_NAME, "the guest as neighbour", e))?;
    let (link, uplink) = match outside {
        Some(outside) => {
            let link = outside.join(&netns, &ifc)?;
            let uplink = uplink.try_clone().map_err(|e| failed(TAP_NAME, "a descriptor of the uplink", e))?;
            (Some(link), Some(uplink))
        }
        None => (None, None),
    };
    Ok(NetSlot { tap: Arc::new(tap.into_fd()), netns, link, uplink })
}

/// Moves the calling thread into a new network namespace and returns its descriptor.
/// The caller's thread should end soon after (or never do anything else): it has left
/// the process's namespace for good.
pub fn unshare_thread() -> Result<OwnedFd, NetworkError> {
    // SAFETY: unshare affects only this thread.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        return Err(NetworkError::Unshare(std::io::Error::last_os_error()));
    }
    thread_namespace().map_err(NetworkError::OpenNamespace)
}

fn failed(interface: &str, step: &'static str, source: std::io::Error) -> NetworkError {
    NetworkError::Interface { interface: interface.to_string(), step, source }
}
