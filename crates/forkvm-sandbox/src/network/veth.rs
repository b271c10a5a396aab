//! Veth pairs over netlink (`rtnetlink`), from a thread that is not async: a
//! current-thread runtime drives one netlink socket, made in the calling thread's
//! namespace and acting there for as long as it lives, wherever the thread goes next.

use rtnetlink::packet_route::link::{InfoData, InfoKind, InfoVeth};
use rtnetlink::{LinkMessageBuilder, LinkUnspec, LinkVeth};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

/// A netlink socket of the namespace it was made in.
pub struct Netlink {
    rt: tokio::runtime::Runtime,
    handle: rtnetlink::Handle,
}

impl std::fmt::Debug for Netlink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Netlink")
    }
}

/// Why a pair was not made.
#[derive(Debug)]
pub enum PairError {
    /// A link of that name is already in this namespace.
    NameTaken,
    Other(io::Error),
}

impl Netlink {
    /// A socket in the calling thread's namespace.
    pub fn here() -> io::Result<Netlink> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_io().build()?;
        let (conn, handle, _) = rt.block_on(async { rtnetlink::new_connection() })?;
        rt.spawn(conn);
        Ok(Netlink { rt, handle })
    }

    /// A veth pair: `name` in this socket's namespace, its peer `peer` born in the
    /// namespace `peer_ns`.
    pub fn add_pair(&self, name: &str, peer: &str, peer_ns: &OwnedFd) -> Result<(), PairError> {
        let inner = LinkMessageBuilder::<LinkUnspec>::new().name(peer).setns_by_fd(peer_ns.as_raw_fd()).build();
        let pair = LinkMessageBuilder::<LinkVeth>::new_with_info_kind(InfoKind::Veth)
            .name(name.to_string())
            .set_info_data(InfoData::Veth(InfoVeth::Peer(inner)))
            .build();
        match self.rt.block_on(self.handle.link().add(pair).execute()) {
            Ok(()) => Ok(()),
            Err(rtnetlink::Error::NetlinkError(m)) if m.raw_code() == -libc::EEXIST => Err(PairError::NameTaken),
            Err(e) => Err(PairError::Other(io::Error::other(e.to_string()))),
        }
    }
}
