//! forkvm: the lineage of what a daemon holds — which snapshot each sandbox was started
//! from, which running sandbox it was forked from, which snapshots each sandbox branched
//! into, and which snapshot each diff link of a chain stores its changes over — as one
//! graph (`GET /v1/lineage`), so a console or a client can draw the tree of forks and
//! branches without joining three lists itself. And one sample of a sandbox's use of its
//! host (`GET /v1/sandboxes/{id}/usage`), which a console turns into sparklines.

use serde::{Deserialize, Serialize};

/// `GET /v1/lineage`: every sandbox and snapshot, and the edges between them. An edge
/// is listed only when both its ends are (a sandbox killed since it branched leaves its
/// snapshot without a `branch` edge).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Lineage {
    pub nodes: Vec<LineageNode>,
    pub edges: Vec<LineageEdge>,
}

/// A sandbox (`sandbox:ID`) or a snapshot (`snapshot:TAG`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LineageNode {
    /// `sandbox:ID` or `snapshot:TAG`, unique in the graph.
    pub id: String,
    /// `sandbox` or `snapshot`.
    pub kind: String,
    /// The sandbox's id or the snapshot's tag.
    pub name: String,
    /// A sandbox's (`running`, `paused`, `archived`) or a snapshot's (`ready`,
    /// `writing`, `failed`).
    pub state: String,
    /// Guest memory: a snapshot's, a sandbox's (its snapshot's; its memory limit, or 0,
    /// when that snapshot is gone).
    pub memory_bytes: u64,
    /// Bytes a snapshot's memory occupies in the store (`null` for a sandbox).
    pub stored_bytes: Option<u64>,
    pub created_at_unix: u64,
    /// A branch's mode (`full`, `live`, `diff`), when the daemon recorded one.
    pub mode: Option<String>,
    /// Links below a snapshot in its chain (0: whole; 1: a diff over a whole one...);
    /// 0 for a sandbox.
    pub chain_depth: u32,
}

/// Who came from what.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LineageEdge {
    pub from: String,
    pub to: String,
    /// `spawn` (snapshot → a sandbox started from it), `fork` (sandbox → a sandbox
    /// forked from it while it ran), `branch` (sandbox → a snapshot it branched into) or
    /// `chain` (snapshot → a diff link stored over it) or `compact` (a chain's head → the
    /// whole snapshot it was compacted into).
    pub kind: String,
}

/// `GET /v1/sandboxes/{id}/usage`: what its VMM uses of the host now, from its cgroup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SandboxUsage {
    /// When it was read.
    pub at_unix_ms: u64,
    /// Memory charged to its VMM (guest memory it touched, and the VMM's own).
    pub memory_bytes: u64,
    /// Its memory limit, when it has one.
    pub memory_limit_bytes: Option<u64>,
    /// CPU time its VMM used since it started (cumulative: a rate is the difference of
    /// two samples over their interval).
    pub cpu_usage_usec: u64,
    pub vcpus: u32,
}
