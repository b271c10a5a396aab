//! A jailed VMM serves forkvm's clients only, on its control socket and its vsock
//! listener.
//!
//! Every VMM of a jail can name the run directories of the others, and VMMs are uid 0
//! (without capabilities) for now, so a guest that took over its VMM could otherwise
//! connect to a neighbour's control socket (and stop, branch or fork it) or to its
//! vsock listener (and reach its agent). forkvm's clients connect with a credential no
//! VMM can forge (`forkvm_proto::trusted_peer`), and a jailed VMM drops every other
//! connection as it accepts it, with a log line. A VMM outside a jail (a user's CLI, a
//! test) accepts every peer, as the socket files' modes allow; so does one whose jail
//! cannot use the client gid (a user namespace that does not map it), which it says
//! when it enters.

use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Whether this process checks its peers (set once, as it enters its jail; a fork of
/// the process keeps it).
static CHECKED: AtomicBool = AtomicBool::new(false);
/// Connections refused so far.
static REFUSED: AtomicU64 = AtomicU64::new(0);

/// In a VMM entering its jail, still privileged: from now on it admits forkvm's clients
/// only, if they can connect as such here.
pub(crate) fn arm() {
    let usable = forkvm_proto::trusted_peer::can_vouch();
    if !usable {
        eprintln!(
            "[forkvm] the client gid {} cannot be used here (user namespace): this VMM accepts any peer on its sockets",
            forkvm_proto::trusted_peer::CLIENT_GID
        );
    }
    CHECKED.store(usable, Ordering::SeqCst);
}

/// Whether this VMM checks its peers.
pub fn armed() -> bool {
    CHECKED.load(Ordering::SeqCst)
}

/// Whether to serve the peer of a just-accepted connection on `socket` (a name for the
/// log): always when unarmed, else only forkvm's clients.
pub fn admits(stream: &UnixStream, socket: &str) -> bool {
    if !armed() || forkvm_proto::trusted_peer::is_client(stream) {
        return true;
    }
    let n = REFUSED.fetch_add(1, Ordering::Relaxed) + 1;
    // The first few and then every thousandth: a flood must not fill the console log.
    if n <= 5 || n.is_multiple_of(1000) {
        eprintln!("[forkvm] refused a connection to the {socket} socket from a process that is not a forkvm client ({n} so far)");
    }
    false
}
