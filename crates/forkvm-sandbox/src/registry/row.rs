//! One sandbox as the registry holds it: its record (identity, origin, VMM) and its
//! lifecycle (state and why, TTL, activity, branches). The CLI and the daemon read the
//! same row; what only a running daemon knows (calls in flight, disk snapshot outcomes)
//! stays in the daemon.

use super::{process_start_unix_ms, vmm_alive, SandboxRecord};
use crate::state::{SandboxState, StateReason};

/// A sandbox's row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxRow {
    /// Who it is and its VMM (`pid` 0: it has none, e.g. archived or not started yet).
    pub record: SandboxRecord,
    pub state: SandboxState,
    /// The call that made it (`spawn-…`, `fork-…`), when the daemon made it.
    pub op: Option<String>,
    /// Why it is paused or archived.
    pub reason: Option<StateReason>,
    /// The process that moved it into `starting` or `restoring`: when that process is
    /// gone and the sandbox is still there, the start was interrupted.
    pub owner: Option<Owner>,
    pub last_activity_unix_ms: u64,
    pub ttl_seconds: Option<u64>,
    pub expires_at_unix_ms: Option<u64>,
    pub archived_at_unix_ms: Option<u64>,
    pub branch_count: u32,
    pub last_branch_tag: Option<String>,
}

impl SandboxRow {
    pub fn id(&self) -> &str {
        &self.record.id
    }

    /// Whether it is in `starting` or `restoring` and the process that put it there is
    /// gone (a `kill -9` mid-start): nobody will finish the start.
    pub fn start_abandoned(&self) -> bool {
        self.state.is_starting() && !self.owner.as_ref().is_some_and(Owner::is_alive)
    }
}

/// A process, told apart from a later one with the same pid by its start time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    pub pid: i32,
    pub started_unix_ms: u64,
}

impl Owner {
    /// This process (`None` only when `/proc` cannot say when it started).
    pub fn this_process() -> Option<Owner> {
        let pid = std::process::id() as i32;
        Some(Owner { pid, started_unix_ms: process_start_unix_ms(pid)? })
    }

    /// Whether that process still runs (not a zombie, not a later one with its pid).
    pub fn is_alive(&self) -> bool {
        vmm_alive(self.pid) && process_start_unix_ms(self.pid).is_some_and(|t| t.abs_diff(self.started_unix_ms) <= 20)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    // The zombie is reaped by `vmm_alive`.
    #[allow(clippy::zombie_processes)]
    fn owners_are_alive_while_their_process_runs() {
        let me = Owner::this_process().unwrap();
        assert!(me.is_alive());
        assert!(!Owner { started_unix_ms: me.started_unix_ms + 60_000, ..me }.is_alive(), "a reused pid");
        let child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(!Owner { pid, started_unix_ms: 0 }.is_alive());
    }
}
