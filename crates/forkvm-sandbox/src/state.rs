//! A sandbox's lifecycle state: the one definition of the states the registry records
//! and the API shows, with the questions the code asks of them, and of the reasons a
//! sandbox is in its state. The registry stores [`SandboxState::as_str`] and refuses
//! anything else (its CHECK lists exactly [`SandboxState::ALL`], a test keeps the two
//! equal).

use serde::{Deserialize, Serialize};
use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SandboxState {
    /// Its VMM is being started (spawn, fork, disk fork) and its agent is not ready yet.
    Starting,
    /// Its VMM runs and serves calls.
    Running,
    /// Its vCPUs are paused (idle); the next call resumes it.
    Paused,
    /// Moved to the store, no VMM; a restore brings it back.
    Archived,
    /// Coming back from its archive.
    Restoring,
}

impl SandboxState {
    pub const ALL: [SandboxState; 5] = [
        SandboxState::Starting,
        SandboxState::Running,
        SandboxState::Paused,
        SandboxState::Archived,
        SandboxState::Restoring,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SandboxState::Starting => "starting",
            SandboxState::Running => "running",
            SandboxState::Paused => "paused",
            SandboxState::Archived => "archived",
            SandboxState::Restoring => "restoring",
        }
    }

    /// The state named `s`, if it is one.
    pub fn parse(s: &str) -> Option<SandboxState> {
        SandboxState::ALL.into_iter().find(|state| state.as_str() == s)
    }

    /// Its VMM is up (running or paused): listed, looked after by the lifecycle tick, and
    /// forgotten by the sweep once the VMM is gone.
    pub fn is_live(self) -> bool {
        matches!(self, SandboxState::Running | SandboxState::Paused)
    }

    /// Still coming up (a start or a restore): calls to it are refused as `starting`.
    pub fn is_starting(self) -> bool {
        matches!(self, SandboxState::Starting | SandboxState::Restoring)
    }
}

/// Why a sandbox is paused or archived.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StateReason {
    /// Paused: no call used it for the daemon's `--idle-pause`.
    Idle,
    /// Archived by a call (`POST .../archive`, `forkvm archive`).
    Api,
    /// Archived because its TTL ran out.
    Ttl,
    /// Archived again after its VMM died or its restore was interrupted.
    Recovered,
}

impl StateReason {
    pub const ALL: [StateReason; 4] = [StateReason::Idle, StateReason::Api, StateReason::Ttl, StateReason::Recovered];

    pub fn as_str(self) -> &'static str {
        match self {
            StateReason::Idle => "idle",
            StateReason::Api => "api",
            StateReason::Ttl => "ttl",
            StateReason::Recovered => "recovered",
        }
    }

    /// The reason named `s`, if it is one.
    pub fn parse(s: &str) -> Option<StateReason> {
        StateReason::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

impl fmt::Display for StateReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for SandboxState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_nothing_else_parses() {
        for s in SandboxState::ALL {
            assert_eq!(SandboxState::parse(s.as_str()), Some(s));
            assert_eq!(serde_json::to_string(&s).unwrap(), format!("\"{s}\""));
        }
        for bad in ["", "Running", "stopped", "running "] {
            assert_eq!(SandboxState::parse(bad), None, "{bad:?}");
        }
        let live: Vec<_> = SandboxState::ALL.into_iter().filter(|s| s.is_live()).collect();
        assert_eq!(live, [SandboxState::Running, SandboxState::Paused]);
        let starting: Vec<_> = SandboxState::ALL.into_iter().filter(|s| s.is_starting()).collect();
        assert_eq!(starting, [SandboxState::Starting, SandboxState::Restoring]);
        for r in StateReason::ALL {
            assert_eq!(StateReason::parse(r.as_str()), Some(r));
            assert_eq!(serde_json::to_string(&r).unwrap(), format!("\"{r}\""));
        }
        assert_eq!(StateReason::parse("Idle"), None);
    }
}
