//! The daemon's remote (`/v1/remote*`): a tag's chain pushed to object storage and pulled
//! back, the remote's tags, locks and collection. The remote is the daemon's own
//! (`forkvm daemon --remote URL`, else its `--replicate` one): no URL or key comes from a
//! request. docs/object-storage.md.

use serde::{Deserialize, Serialize};

/// `POST /v1/remote/push`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PushRequest {
    /// The snapshot (template or branch) whose chain to push.
    pub tag: String,
}

/// `POST /v1/remote/pull`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PullRequest {
    /// The tag to bring into the daemon's store (every link it lacks, memory included).
    pub tag: String,
}

/// `POST /v1/remote/gc`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CollectRequest {
    /// Keep unreferenced blocks younger than this many seconds (a cut-off push resumes
    /// with them); absent: 86400 (a day).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_age_s: Option<u64>,
    /// Count what would go; delete nothing.
    #[serde(default)]
    pub dry_run: bool,
}

/// `GET /v1/remote`: the daemon's remote and its tags.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RemoteInfo {
    /// Its URL (`s3://bucket/prefix`, `file:///dir`, ...).
    pub url: String,
    /// The tags pushed there, sorted.
    pub tags: Vec<String>,
}

/// What a push did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PushReport {
    pub tag: String,
    pub remote: String,
    /// Tags from the base to the head.
    pub links: Vec<String>,
    pub entries: u64,
    /// Blocks the chain is made of (holes are not blocks).
    pub blocks: u64,
    /// Blocks uploaded: the remote lacked them.
    pub blocks_uploaded: u64,
    /// Blocks the remote held already (another tag's, or an earlier cut-off push's).
    pub blocks_present: u64,
    /// Blocks repeated within the chain, uploaded once.
    pub blocks_repeated: u64,
    /// Bytes uploaded (sealed blocks and the manifest).
    pub bytes_uploaded: u64,
    /// Bytes of the entries' blocks before compression.
    pub logical_bytes: u64,
    pub ms: f64,
}

/// What a pull did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PullReport {
    pub tag: String,
    pub remote: String,
    /// Links written into the store, base first.
    pub imported: Vec<String>,
    /// Links the store had with the same content.
    pub reused: Vec<String>,
    /// Blocks the chain is made of.
    pub blocks: u64,
    /// Blocks not needed: the store had them (memory chunks, or the whole chain).
    pub blocks_local: u64,
    /// Blocks read from the host's block cache.
    pub blocks_cached: u64,
    /// Blocks downloaded.
    pub blocks_fetched: u64,
    /// Bytes downloaded (sealed blocks and the manifest).
    pub bytes_fetched: u64,
    /// Memory chunks the store gained.
    pub chunks_new: u64,
    /// Memory chunks left on the remote (`--lazy`): fetched by the sandboxes that touch them.
    pub chunks_left_remote: u64,
    pub ms: f64,
}

/// What a collection did (or, with `dry_run`, would do).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct GcReport {
    pub remote: String,
    pub dry_run: bool,
    /// Tags whose manifests were read.
    pub tags: u64,
    /// Blocks on the remote before.
    pub blocks: u64,
    /// Blocks some manifest names.
    pub blocks_referenced: u64,
    /// Blocks no manifest names but younger than the minimum age (kept).
    pub blocks_young: u64,
    /// Blocks deleted (or that would be).
    pub blocks_deleted: u64,
    pub bytes_deleted: u64,
    pub ms: f64,
}

/// Which side a lock on a remote is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LockKind {
    /// A push: many at once.
    Shared,
    /// A collection: alone.
    Exclusive,
}

/// One lock object on a remote (`GET /v1/remote/locks`, `forkvm remote-locks`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LockInfo {
    /// The object's name under `locks/` (what `DELETE /v1/remote/locks/{name}` takes).
    pub name: String,
    pub kind: LockKind,
    /// Who wrote it, when it could be read (a lock being written, or another tool's
    /// object, reads as nothing).
    pub host: Option<String>,
    pub pid: Option<u32>,
    pub purpose: Option<String>,
    /// Seconds since the holder last rewrote it, by the store's clock against the host's.
    pub age_s: u64,
    /// Not rewritten for 30 minutes: a crashed holder's, which nothing waits for.
    pub stale: bool,
}
