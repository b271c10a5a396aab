//! forkd's workspaces: named, long-lived sandboxes a client suspends and resumes by
//! name (`/v1/workspaces*`). Here a workspace is one sandbox: suspend archives it (memory,
//! processes and disks, sealed in the store), resume restores the same sandbox.

use serde::{Deserialize, Serialize};

/// `POST /v1/workspaces`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateWorkspaceRequest {
    /// 1 to 64 ASCII letters, digits, `-` or `_` (the tag rule).
    pub name: String,
    /// The snapshot its sandbox is spawned from.
    pub snapshot_tag: String,
    /// forkd: a network namespace of its own. Accepted: every sandbox has one.
    #[serde(default)]
    pub per_child_netns: bool,
    #[serde(default)]
    pub memory_limit_mib: Option<u64>,
}

/// `POST /v1/workspaces/{name}/suspend`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SuspendWorkspaceRequest {
    /// forkd: store the state as a diff. Accepted: an archive stores memory as the
    /// vault's deduplicated chunks either way.
    #[serde(default)]
    pub diff: bool,
}

/// A workspace, as forkd shapes it, plus the sandbox it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct WorkspaceInfo {
    /// `ws-` and the first 16 characters of its sandbox's id.
    pub id: String,
    pub name: String,
    pub source_snapshot_tag: String,
    /// forkd: the snapshot its state was suspended into. Never set here: a suspended
    /// workspace is an archived sandbox, not a tag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_state_tag: Option<String>,
    /// `running`, `suspended`, or `stale` (its sandbox was deleted behind its back).
    pub status: String,
    /// Its sandbox while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live_sandbox_id: Option<String>,
    pub created_at_unix: u64,
    /// When it was last created, suspended or resumed.
    pub last_active_unix: u64,
    /// forkvm: its sandbox, running or archived (the same across suspend and resume).
    pub sandbox_id: String,
}
