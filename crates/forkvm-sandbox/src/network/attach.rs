//! Serving a sandbox's network from the process that answers for it (the daemon, or
//! the CLI that spawned it), whichever process made its VMM: the sandbox's namespace is
//! found again from its VMM ([`super::enter`]), the DNS forwarder's sockets are bound
//! there, and its firewall is kept here by sandbox id, for policy changes.
//!
//! The same path serves a sandbox just started and one a restarted daemon finds
//! running ([`adopt`]): nothing of a sandbox's network lives only in the process that
//! made it.

use super::dns::{self, DnsSockets, Lifetime};
use super::firewall::Firewall;
use super::policy::EgressPolicy;
use super::{enter, uplink, NetworkError};
use forkvm_api::NetworkPolicy;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};

/// Firewalls of the sandboxes this process serves, by id; each lives while its DNS is
/// served (until its VMM ends).
fn served() -> &'static Mutex<HashMap<String, Weak<Firewall>>> {
    static SERVED: OnceLock<Mutex<HashMap<String, Weak<Firewall>>>> = OnceLock::new();
    SERVED.get_or_init(Default::default)
}

/// Serves the network of sandbox `id` (VMM `pid`), just started: its DNS until the VMM
/// ends, under `policy` (put in force first). A fork's child (`forked_from`) also gets
/// what its source learned from DNS that the policy still rules on, as its guest
/// remembers those answers. `Ok(false)`: the sandbox has no network.
pub fn attach(
    id: &str,
    pid: i32,
    policy: Option<&NetworkPolicy>,
    forked_from: Option<&str>,
) -> Result<bool, NetworkError> {
    let policy = policy.filter(|p| !p.is_default());
    let firewall = match serve(id, pid, None)? {
        Some(f) => f,
        // A policy never goes unenforced: the sandbox is refused, not left open. Its
        // VMM has its tap from birth, so the tap's absence is a fault (named here).
        None if policy.is_some() && !matches!(uplink::current()?, uplink::Uplink::None) => {
            return Err(NetworkError::Unenforced(format!(
                "sandbox {id} asks for an egress policy, but its VMM (pid {pid}) holds no tap"
            )))
        }
        None => return Ok(false),
    };
    if let Some(policy) = policy {
        super::set_policy(&firewall, policy)?;
        if let Some(source) = forked_from.and_then(served_firewall) {
            firewall.inherit(&source)?;
        }
    }
    Ok(true)
}

/// The firewall of sandbox `id`, if this process serves it.
fn served_firewall(id: &str) -> Option<Arc<Firewall>> {
    served().lock().unwrap_or_else(|p| p.into_inner()).get(id).and_then(Weak::upgrade)
}

/// A copy of the namespace descriptor of sandbox `id`, if this process serves it.
pub fn served_namespace(id: &str) -> Option<std::os::fd::OwnedFd> {
    served_firewall(id).and_then(|f| f.namespace().try_clone().ok())
}

/// Serves the network of sandbox `id` (VMM `pid`), found running by a process that did
/// not start it: its namespace's filter already holds `policy`, which only the
/// forwarder needs to learn again.
pub fn adopt(id: &str, pid: i32, policy: Option<&NetworkPolicy>) -> Result<bool, NetworkError> {
    let policy = match policy {
        Some(p) => EgressPolicy::parse(p)?,
        None => EgressPolicy::default(),
    };
    Ok(serve(id, pid, Some(policy))?.is_some())
}

/// Puts `policy` in force for sandbox `id` (VMM `pid`), serving it first if this process
/// does not yet (a sandbox the CLI spawned, asked through the daemon).
pub fn update(id: &str, pid: i32, policy: &NetworkPolicy) -> Result<(), NetworkError> {
    let firewall = match served_firewall(id) {
        Some(f) => f,
        None => serve(id, pid, Some(EgressPolicy::default()))?.ok_or(NetworkError::NoNetwork)?,
    };
    super::set_policy(&firewall, policy)
}

/// Binds the forwarder's sockets in the namespace of VMM `pid` and serves them until it
/// ends, deciding by `in_force` (`None`: the namespace was just made, with no policy);
/// `None` when the VMM has no tap. A sandbox this process did not just start may hold
/// any policy: its chain is rewritten whole when one is set.
fn serve(id: &str, pid: i32, in_force: Option<EgressPolicy>) -> Result<Option<Arc<Firewall>>, NetworkError> {
    let uplink = uplink::current()?;
    if matches!(uplink, uplink::Uplink::None) {
        // No way out: nothing to resolve or to filter.
        return Ok(None);
    }
    let netns = match enter::namespace_of_vmm(pid) {
        Ok(ns) => ns,
        Err(NetworkError::Enter(e)) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let sockets = enter::run_in(&netns, move || DnsSockets::bind_here(uplink))?
        .map_err(|e| NetworkError::Dns(format!("binding the forwarder's sockets in sandbox {id}: {e}")))?;
    let firewall = Arc::new(match in_force {
        None => Firewall::new(netns, sockets.uplink()),
        Some(policy) => Firewall::with_policy(netns, sockets.uplink(), policy),
    });
    dns::serve(sockets, Lifetime::UntilExit(pid), firewall.clone())?;
    let mut served = served().lock().unwrap_or_else(|p| p.into_inner());
    served.retain(|_, f| f.strong_count() > 0);
    served.insert(id.to_string(), Arc::downgrade(&firewall));
    Ok(Some(firewall))
}
