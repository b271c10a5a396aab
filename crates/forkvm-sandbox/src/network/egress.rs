//! A sandbox namespace's way out: a veth pair from the uplink ([`super::uplink`]) into
//! the namespace, addressed from its index ([`super::addressing`]), the default route
//! through it, forwarding on, and the namespace's rules ([`super::rules`]).
//!
//! Made in two halves on the thread that makes the slot: [`Outside::here`] while the
//! thread is still in the uplink's namespace (sockets belong to the namespace they were
//! made in: a netlink socket and an interface socket there), then [`Outside::join`]
//! after the thread moved into the sandbox's new namespace. The pair is made from the
//! uplink's side with its inner end born inside the sandbox's namespace, so a name
//! already taken on the uplink is refused at once, and the next index tried.

use super::addressing::{next_index, LinkIndex, INNER_NAME, LINK_NETMASK};
use super::ifconfig::Ifconfig;
use super::veth::{Netlink, PairError};
use super::{rules, uplink, NetworkError};
use std::os::fd::OwnedFd;

/// How long a slot waits for its link to turn operational.
const LINK_READY: std::time::Duration = std::time::Duration::from_secs(2);

/// How many taken names a slot skips before it gives up.
const INDEX_TRIES: usize = 64;

/// The uplink's half: sockets made in its namespace.
pub(super) struct Outside {
    links: Netlink,
    ifc: Ifconfig,
}

impl Outside {
    /// Sockets in the calling thread's namespace, which becomes an uplink (set up once
    /// per process: [`uplink::prepare_here`]).
    pub(super) fn here() -> Result<Outside, NetworkError> {
        uplink::prepare_here()?;
        let links = Netlink::here().map_err(|e| link_failed("a netlink socket", e))?;
        let ifc = Ifconfig::new().map_err(|e| link_failed("an interface socket", e))?;
        Ok(Outside { links, ifc })
    }

    /// Links the namespace `sandbox` (the calling thread's by now, whose interface
    /// socket is `inside`) to the uplink.
    pub(super) fn join(self, sandbox: &OwnedFd, inside: &Ifconfig) -> Result<LinkIndex, NetworkError> {
        let link = self.add_pair(sandbox)?;
        let outer = link.outer_name();
        self.ifc.set_ipv4(&outer, link.outer_ip(), LINK_NETMASK).map_err(step("its address", &outer))?;
        self.ifc.up(&outer).map_err(step("up", &outer))?;
        inside.set_ipv4(INNER_NAME, link.inner_ip(), LINK_NETMASK).map_err(step("its address", INNER_NAME))?;
        inside.up(INNER_NAME).map_err(step("up", INNER_NAME))?;
        inside.add_default_route(link.outer_ip()).map_err(step("the default route", INNER_NAME))?;
        // A net sysctl acts in the namespace of the thread that opens it: the sandbox's.
        std::fs::write("/proc/sys/net/ipv4/ip_forward", "1").map_err(step("forwarding", INNER_NAME))?;
        rules::apply(&rules::sandbox_rules(link), "the sandbox's table")?;
        // The kernel makes a new link operational in a work item of its own (link
        // watch), usually within a millisecond; until then the pair drops what it gets.
        let deadline = std::time::Instant::now() + LINK_READY;
        while !(self.ifc.is_running(&outer).unwrap_or(true) && inside.is_running(INNER_NAME).unwrap_or(true)) {
            if std::time::Instant::now() > deadline {
                tracing::warn!(link = %outer, "the sandbox's link is not operational after {LINK_READY:?}");
                break;
            }
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
        Ok(link)
    }

    /// The veth pair: the outer end here under a free index's name, the inner end
    /// [`INNER_NAME`] in `sandbox`.
    fn add_pair(&self, sandbox: &OwnedFd) -> Result<LinkIndex, NetworkError> {
        for _ in 0..INDEX_TRIES {
            let link = next_index();
            match self.links.add_pair(&link.outer_name(), INNER_NAME, sandbox) {
                Ok(()) => return Ok(link),
                Err(PairError::NameTaken) => continue,
                Err(PairError::Other(e)) => return Err(link_failed("the veth pair", e)),
            }
        }
        Err(link_failed(
            "the veth pair",
            std::io::Error::other(format!("{INDEX_TRIES} link names in a row were taken")),
        ))
    }
}

/// What a failed interface call on `iface` at `step` is reported as.
fn step(step: &'static str, iface: &str) -> impl FnOnce(std::io::Error) -> NetworkError {
    let interface = iface.to_string();
    move |source| NetworkError::Interface { interface, step, source }
}

fn link_failed(step: &'static str, source: std::io::Error) -> NetworkError {
    NetworkError::Interface { interface: "the link to the uplink".into(), step, source }
}
