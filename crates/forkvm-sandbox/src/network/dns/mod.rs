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
//! Files: [`upstream`] (which resolvers), [`relay`] (one query, checked, there and
//! back), [`serve`] (a sandbox's sockets).

pub mod relay;
pub mod serve;
pub mod upstream;

pub use serve::{block_denied_names, serve, DnsGuard, DnsSockets, Lifetime};

#[cfg(test)]
mod tests;

/// Serves the DNS of `slot`'s sandbox for `lifetime`, if the slot has a forwarder's
/// sockets (a linked slot), under a firewall of its own: returned with the guard, to
/// change the sandbox's policy by. A forwarder that cannot run leaves the sandbox
/// without DNS, said in the log; the sandbox itself is not refused for it.
pub fn serve_slot(
    slot: &mut crate::network::NetSlot,
    lifetime: Lifetime,
) -> Option<(DnsGuard, std::sync::Arc<crate::network::firewall::Firewall>)> {
    let sockets = slot.take_dns()?;
    let netns = match slot.namespace().try_clone() {
        Ok(fd) => fd,
        Err(e) => {
            tracing::warn!(error = %e, "a sandbox without DNS");
            return None;
        }
    };
    let firewall = std::sync::Arc::new(crate::network::firewall::Firewall::new(netns, sockets.uplink()));
    match serve(sockets, lifetime, firewall.clone()) {
        Ok(guard) => Some((guard, firewall)),
        Err(e) => {
            tracing::warn!(error = %e, "a sandbox without DNS");
            None
        }
    }
}
