//! A sandbox's network, host side: a network namespace of its own holding the tap its
//! VMM's virtio-net device is given (`docs/networking.md`).
//!
//! Every sandbox's guest is 172.16.0.2/30 with MAC [`GUEST_MAC`] behind gateway
//! 172.16.0.1, the tap, whose MAC is [`TAP_MAC`] in every namespace: clones of one
//! snapshot need no reconfiguration, and a guest's ARP entry for its gateway, saved in
//! the snapshot, stays right behind any tap. The guest gets its address from the kernel
//! command line ([`guest_ip_arg`]); no DHCP client or `ip` runs in the guest.
//!
//! The namespace has no IPv6, so nothing in it talks to the guest unasked.
//!
//! Nothing names a sandbox's namespace: the VMM's tap descriptor keeps it alive, and the
//! namespace, with everything in it, goes when the VMM does (a kill, a crash, a
//! `kill -9`), so there is nothing to clean up and nothing that can leak.
//!
//! The way out is a veth pair to the process's uplink ([`uplink`]: the host, a
//! namespace a test made, or none), with the guest's traffic translated to the link's
//! own address, so clones that share one guest address stay apart on the uplink.
//!
//! Files: [`slot`] (making one namespace and its tap), [`ifconfig`] (the interface
//! calls that set it up), [`egress`] (the link to the uplink), [`addressing`] (the
//! links' names and addresses), [`rules`] (the packet filter), [`pool`] (slots made ahead), [`enter`] (a running sandbox's
//! namespace, found again from its VMM), [`connect`] (sockets to a guest's ports), [`dns`] (the forwarder), [`uplink`] (choosing it), [`veth`] (pairs over netlink), [`fake_internet`]
//! (an uplink for tests: a router and one host, in namespaces of their own).

pub mod addressing;
pub mod attach;
pub mod connect;
pub mod dns;
mod egress;
pub mod enter;
pub mod fake_internet;
pub mod firewall;
pub mod ifconfig;
pub mod policy;
pub mod policy_rules;
pub mod pool;
pub mod rules;
pub mod slot;
pub mod uplink;
pub mod veth;

pub use slot::NetSlot;

use std::net::Ipv4Addr;

/// The guest's address, the same in every sandbox.
pub const GUEST_IP: Ipv4Addr = Ipv4Addr::new(172, 16, 0, 2);
/// The guest's gateway: the tap's address in the sandbox's namespace.
pub const GATEWAY_IP: Ipv4Addr = Ipv4Addr::new(172, 16, 0, 1);
/// The link's netmask (a /30: the guest and its gateway).
pub const NETMASK: Ipv4Addr = Ipv4Addr::new(255, 255, 255, 252);
/// The guest's MAC (locally administered), the device's in every VMM.
pub const GUEST_MAC: [u8; 6] = forkvm_vmm::devices::virtio::net::DEFAULT_GUEST_MAC;
/// The tap's MAC in every sandbox's namespace.
pub const TAP_MAC: [u8; 6] = [0x06, 0x00, 0xac, 0x10, 0x00, 0x01];
/// The tap's name inside the namespace.
pub const TAP_NAME: &str = "tap0";

/// The kernel command-line argument that configures the guest's `eth0` at boot
/// (`IP_PNP`): static address, gateway, netmask, no autoconfiguration.
pub fn guest_ip_arg() -> String {
    format!("ip={GUEST_IP}::{GATEWAY_IP}:{NETMASK}::eth0:off")
}

#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    #[error("making the sandbox's network namespace (unshare CLONE_NEWNET): {0}")]
    Unshare(std::io::Error),
    #[error("opening the sandbox's network namespace: {0}")]
    OpenNamespace(std::io::Error),
    #[error("entering the sandbox's network namespace (setns): {0}")]
    Enter(std::io::Error),
    #[error("making the sandbox's tap: {0}")]
    Tap(#[from] forkvm_vmm::devices::virtio::net::tap::TapError),
    #[error("setting up {interface} in the sandbox's namespace ({step}): {source}")]
    Interface { interface: String, step: &'static str, source: std::io::Error },
    #[error("the thread that sets up a sandbox's network: {0}")]
    Thread(std::io::Error),
    #[error("the sandboxes' uplink ({UPLINK_ENV}): {0}", UPLINK_ENV = uplink::UPLINK_ENV)]
    Uplink(String),
    #[error("installing {what} (nft; Debian package nftables, or {UPLINK_ENV}=none): {detail}", UPLINK_ENV = uplink::UPLINK_ENV)]
    Rules { what: &'static str, detail: String },
    #[error("sandbox DNS: {0}")]
    Dns(String),
    #[error("the fake internet (tests, benchmarks): {0}")]
    FakeInternet(String),
    #[error("the sandbox's egress policy: {0}")]
    Policy(#[from] policy::PolicyError),
    #[error(
        "the sandbox has no network (its template has no NIC; for a policy, also: this host gives sandboxes no uplink)"
    )]
    NoNetwork,
    #[error("the sandbox's egress policy could not be put in force: {0}")]
    Unenforced(String),
}

/// Puts `policy` in force in the sandbox `firewall` guards: checked, then the packet
/// filter, the forwarder's decisions and the addresses of the names it denies.
pub fn set_policy(
    firewall: &std::sync::Arc<firewall::Firewall>,
    policy: &forkvm_api::NetworkPolicy,
) -> Result<(), NetworkError> {
    let checked = policy::EgressPolicy::parse(policy)?;
    firewall.set_policy(checked)?;
    dns::block_denied_names(firewall)
}

/// Turns sandbox networks off for this process when set to `off` (templates then boot,
/// and are cached, without a NIC).
pub const NETWORK_ENV: &str = "FORKVM_NETWORK";

/// Whether this process gives sandboxes a network: it may make namespaces and taps
/// (root, with `/dev/net/tun`) and [`NETWORK_ENV`] does not say `off`. Checked once, by
/// making one without a link (a broken uplink is an error of each start that needs it,
/// naming what failed, not a template without a NIC).
pub fn available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        if std::env::var(NETWORK_ENV).is_ok_and(|v| v == "off") {
            return false;
        }
        match NetSlot::create_with(&uplink::Uplink::None) {
            Ok(_) => true,
            Err(e) => {
                tracing::info!(error = %e, "sandboxes get no network here");
                false
            }
        }
    })
}

#[cfg(test)]
mod egress_tests;
#[cfg(test)]
mod guest_frames;
#[cfg(test)]
mod tests;
