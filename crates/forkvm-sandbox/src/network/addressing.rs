//! The link between a sandbox's namespace and its uplink: a veth pair per sandbox, each
//! with a /30 of its own out of [`LINKS_CIDR`] (RFC 6598 shared address space, which no
//! host network routes), named after its index so that the name is what reserves it:
//! two processes sharing an uplink cannot take the same index, because the kernel
//! refuses a second link of one name.

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU32, Ordering};

/// The sandbox links' addresses: 100.64.0.0/10, a /30 per sandbox.
pub const LINKS_NET: Ipv4Addr = Ipv4Addr::new(100, 64, 0, 0);
/// The prefix length of [`LINKS_NET`].
pub const LINKS_PREFIX: u8 = 10;
/// The CIDR of every sandbox link, as the uplink's rules name it.
pub const LINKS_CIDR: &str = "100.64.0.0/10";
/// The prefix every uplink-side link name starts with (the uplink's rules match it).
pub const LINK_PREFIX: &str = "fvm";
/// How many /30s [`LINKS_NET`] holds.
pub const LINK_COUNT: u32 = 1 << (32 - LINKS_PREFIX as u32 - 2);
/// The link's netmask (/30).
pub const LINK_NETMASK: Ipv4Addr = Ipv4Addr::new(255, 255, 255, 252);

/// One sandbox link: the /30 with index `i` in [`LINKS_NET`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkIndex(u32);

impl LinkIndex {
    /// The link with index `i`, if [`LINKS_NET`] has one.
    pub fn new(i: u32) -> Option<LinkIndex> {
        (i < LINK_COUNT).then_some(LinkIndex(i))
    }

    pub fn get(self) -> u32 {
        self.0
    }

    fn base(self) -> u32 {
        u32::from(LINKS_NET) + 4 * self.0
    }

    /// The uplink side's address: the sandbox namespace's gateway.
    pub fn outer_ip(self) -> Ipv4Addr {
        Ipv4Addr::from(self.base() + 1)
    }

    /// The sandbox side's address: what the guest's traffic is translated to.
    pub fn inner_ip(self) -> Ipv4Addr {
        Ipv4Addr::from(self.base() + 2)
    }

    /// The uplink side's link name (at most 10 bytes, under `IFNAMSIZ`).
    pub fn outer_name(self) -> String {
        format!("{LINK_PREFIX}{:x}", self.0)
    }
}

/// The sandbox side's link name.
pub const INNER_NAME: &str = "eth0";

/// The next index to try, spread by process so that processes sharing an uplink rarely
/// try the same one (a clash only costs a retry).
pub fn next_index() -> LinkIndex {
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let seed = std::process::id().wrapping_mul(2_654_435_761) % LINK_COUNT;
    let _ = NEXT.compare_exchange(u32::MAX, seed, Ordering::Relaxed, Ordering::Relaxed);
    LinkIndex(NEXT.fetch_add(1, Ordering::Relaxed) % LINK_COUNT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_index_has_its_own_slash_30_inside_the_links_net_and_a_short_name() {
        let first = LinkIndex::new(0).unwrap();
        assert_eq!(
            (first.outer_ip(), first.inner_ip()),
            ("100.64.0.1".parse().unwrap(), "100.64.0.2".parse().unwrap())
        );
        let last = LinkIndex::new(LINK_COUNT - 1).unwrap();
        assert_eq!(last.inner_ip(), "100.127.255.254".parse::<Ipv4Addr>().unwrap());
        assert!(last.outer_name().len() < libc::IFNAMSIZ);
        assert_eq!(LinkIndex::new(LINK_COUNT), None);
        assert_ne!(LinkIndex::new(1).unwrap().outer_name(), first.outer_name());
    }

    #[test]
    fn indexes_handed_out_are_distinct_and_in_range() {
        let seen: std::collections::HashSet<u32> = (0..1000).map(|_| next_index().get()).collect();
        assert_eq!(seen.len(), 1000);
        assert!(seen.iter().all(|&i| i < LINK_COUNT));
    }
}
