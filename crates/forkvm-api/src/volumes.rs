//! Volumes (`/v1/volumes*`): named ext4 disks that outlive sandboxes, and how a spawn
//! attaches them (`CreateSandboxRequest::volumes`). docs/volumes.md.

use serde::{Deserialize, Serialize};

/// How a sandbox sees a volume.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum VolumeMode {
    /// Its writes go to the volume; one writer at a time (so only for a spawn of one).
    #[default]
    Rw,
    /// Read-only: the guest mounts it read-only and the device refuses writes.
    Ro,
    /// Writable, but its writes go to a top of its own, thrown away with the sandbox.
    Cow,
}

/// One volume to attach to each sandbox of a spawn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct VolumeMount {
    /// The volume's name.
    pub name: String,
    /// Absolute guest path it is mounted at (made if missing); not `/`, `/proc`, `/sys`,
    /// `/dev` or `/overlay`.
    pub mount: String,
    #[serde(default)]
    pub mode: VolumeMode,
}

/// `POST /v1/volumes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateVolumeRequest {
    /// 1 to 128 ASCII letters, digits, `.`, `_` or `-`, starting with a letter or digit
    /// (the tag rule).
    pub name: String,
    /// Its size in MiB, 16 to 1048576; absent: 4096. The file is sparse.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_mib: Option<u64>,
}

/// `POST /v1/volumes/{name}/snapshot`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotVolumeRequest {
    /// The new volume's name: it gets the volume's data as of now (layers shared).
    pub to: String,
}

/// A volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct VolumeInfo {
    pub name: String,
    pub size_bytes: u64,
    pub created_at_unix_ms: u64,
    /// Sealed layers (each a set of writes taken in).
    pub layers: usize,
    /// Bytes its files take on the host's disk.
    pub stored_bytes: u64,
    /// The sandbox writing it now, if any.
    pub writer: Option<String>,
    /// Live sandboxes reading it (read-only or copy-on-write).
    pub readers: Vec<String>,
    /// The volume it was snapshotted from, if any.
    pub snapshot_of: Option<String>,
}
