//! The DNS forwarder of sandbox networks. A guest asks 172.16.0.1 (its image's
//! `resolv.conf`; the namespace's rules redirect port 53 to any other address there
//! too); sockets bound at that address inside the sandbox's namespace hand each query to
//! this process's forwarder, which asks the upstream resolvers from the uplink's
//! namespace and returns the answer.
//!
//! Guest bytes are untrusted: a query is read whole (UDP: one datagram of at most
//! [`relay::MAX_MESSAGE`]; TCP: a length and that many bytes, with time limits), parsed
//! (`hickory-proto`) and checked (one question, a standard query) before anything goes
//! upstream, under a fresh random id; an answer must carry that id and the same
//! question to be handed back. Queries in flight are bounded per sandbox.
//!
//! One runtime thread per process serves every sandbox it started; a sandbox's sockets
//! are served for as long as its VMM lives ([`Lifetime::UntilExit`], a pidfd) or its
//! owner holds a guard ([`Lifetime::WhileHeld`]), then closed, so they never keep a
//! namespace alive after its sandbox.
//!
//! Each question is decided by the sandbox's egress policy ([`crate::network::firewall`]):
//! asked upstream as is, asked and its answer's addresses handed to the packet filter
//! before the guest sees it (a name a rule allows or denies), or refused (NXDOMAIN).
//!
//! Files: [`upstream`] (which resolvers), [`relay`] (one query, checked, there and
//! back), [`serve`] (a sandbox's sockets, and the policy's decisions).

pub mod relay;
pub mod serve;
pub mod upstream;

pub use serve::{block_denied_names, serve, DnsGuard, DnsSockets, Lifetime};

use crate::network::NetworkError;
use std::sync::Arc;

#[cfg(test)]
mod tests;

/// Serves the DNS of `slot`'s sandbox for `lifetime`, if the slot is linked to an
/// uplink: binds the forwarder's sockets inside its namespace and serves them under a
/// firewall of its own, returned with the guard, to change the sandbox's policy by. A
/// forwarder that cannot run leaves the sandbox without DNS, said in the log; the
/// sandbox itself is not refused for it.
pub fn serve_slot(
    slot: &crate::network::NetSlot,
    lifetime: Lifetime,
) -> Option<(DnsGuard, Arc<crate::network::firewall::Firewall>)> {
    let uplink = slot.uplink()?;
    match serve_slot_with(slot, uplink, lifetime) {
        Ok(served) => Some(served),
        Err(e) => {
            tracing::warn!(error = %e, "a sandbox without DNS");
            None
        }
    }
}

fn serve_slot_with(
    slot: &crate::network::NetSlot,
    uplink: &crate::network::uplink::Uplink,
    lifetime: Lifetime,
) -> Result<(DnsGuard, Arc<crate::network::firewall::Firewall>), NetworkError> {
    let uplink = uplink.try_clone().map_err(NetworkError::OpenNamespace)?;
    let sockets = slot
        .run_inside(move || DnsSockets::bind_here(&uplink))?
        .map_err(|e| NetworkError::Dns(format!("binding the forwarder's sockets: {e}")))?;
    let netns = slot.namespace().try_clone().map_err(NetworkError::OpenNamespace)?;
    let firewall = Arc::new(crate::network::firewall::Firewall::new(netns, sockets.uplink()));
    Ok((serve(sockets, lifetime, firewall.clone())?, firewall))
}
