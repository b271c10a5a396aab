//! `snapshot.json`: the human-readable description of a snapshot.
//!
//! It records what the snapshot is (tag, lineage, guest identity, machine
//! shape) and whether it was completely written. It is parsed strictly —
//! unknown fields and unknown format versions are refused — because a
//! snapshot directory is untrusted input and a misread description could
//! restore the wrong machine.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Format version of `snapshot.json` written by this build. Readers accept
/// exactly this version; any incompatible change bumps it.
pub const METADATA_FORMAT_VERSION: u32 = 1;

/// Largest `snapshot.json` accepted (1 MiB).
pub const METADATA_MAX_BYTES: u64 = 1 << 20;

/// Whether a snapshot's files are complete.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum SnapshotStatus {
    /// The snapshot is still being written; it must not be restored.
    Writing,
    /// All files are written and synced.
    Ready,
}

/// Which guest the snapshot was taken from.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct GuestIdentity {
    /// Guest kind: `"testguest"` or `"linux"`.
    pub kind: String,
    /// Guest name (e.g. kernel image name).
    pub name: String,
    /// Hash of the guest image contents, if known.
    #[serde(default)]
    pub content_hash: Option<String>,
}

/// Contents of `snapshot.json`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SnapshotMeta {
    /// Must equal [`METADATA_FORMAT_VERSION`].
    pub format_version: u32,
    /// The snapshot's tag (also its directory name).
    pub tag: String,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_at_unix_ms: u64,
    /// Whether the snapshot is complete.
    pub status: SnapshotStatus,
    /// Guest memory size in bytes (= logical size of `memory.img`).
    pub mem_size_bytes: u64,
    /// Number of vCPUs.
    pub vcpu_count: u8,
    /// Interrupt controller model.
    pub irqchip: String,
    /// The guest this snapshot was taken from.
    pub guest: GuestIdentity,
    /// Tag of the snapshot this one was derived from.
    #[serde(default)]
    pub parent_tag: Option<String>,
    /// Content hash of the parent snapshot.
    #[serde(default)]
    pub parent_hash: Option<String>,
    /// Tag of the snapshot this one was forked (branched) from.
    #[serde(default)]
    pub branched_from: Option<String>,
    /// Volumes attached to the VM.
    #[serde(default)]
    pub volumes: Vec<String>,
    /// Bytes of disk actually allocated to `memory.img`.
    pub memory_bytes_allocated: u64,
    /// Process writing a `writing` snapshot (a live branch's VMM), so a crashed writer's
    /// leftover can be told from one still in progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writer_pid: Option<u32>,
    /// The VM's devices, so the snapshot can be restored without outside knowledge.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub devices: Option<DevicesMeta>,
    /// Template the sandbox was made from (Linux sandboxes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// Where the guest memory is: `memory.img` in the directory, or `memory.map` over
    /// the store's chunks.
    #[serde(default, skip_serializing_if = "MemoryFormat::is_image")]
    pub memory_format: MemoryFormat,
    /// The snapshot's content hash (chunked snapshots): what a child's `parent_hash`
    /// names and what assembled images are cached under. See `chain::content_hash`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_hash: Option<String>,
    /// The cgroup limits a sandbox spawned from this snapshot gets unless its spawn asks
    /// for others (a template tag's defaults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_limits: Option<DefaultLimits>,
    /// Where a sandbox spawned from this snapshot may connect to unless its spawn asks
    /// for another policy (a template tag's default, or the policy of the sandbox a
    /// branch was taken from). Absent: anywhere (`NetworkPolicy::default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_network: Option<forkvm_api::NetworkPolicy>,
    /// The sandbox whose key seals this snapshot's own memory chunks (a checkpoint's:
    /// `ChunkStore::with_seal`); reading them needs that sandbox's key. Absent: plain
    /// chunks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_sealed_by: Option<String>,
}

/// A snapshot's default limits for the sandboxes spawned from it; `None`: forkvm's own
/// default for that resource.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields)]
pub struct DefaultLimits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_limit_bytes: Option<u64>,
    /// Thousandths of a CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_millis: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids_max: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io: Option<forkvm_api::IoLimits>,
}

/// How a snapshot's guest memory is stored.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum MemoryFormat {
    /// `memory.img`: the whole memory, sparse, mapped directly at restore.
    #[default]
    Image,
    /// `memory.map`: extents of chunks in the store's chunk store; a diff over the
    /// parent's memory when `parent_tag` is set. Restores map an assembled image.
    Chunked,
}

impl MemoryFormat {
    /// True for [`MemoryFormat::Image`] (the default, not written to JSON).
    pub fn is_image(&self) -> bool {
        *self == MemoryFormat::Image
    }
}

/// The devices a snapshot's VM had: enough to rebuild a [`DeviceConfig`]-like list at
/// restore, with per-child paths for sockets.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields)]
pub struct DevicesMeta {
    /// Guest CID of the vsock device, if there is one.
    #[serde(default)]
    pub vsock_cid: Option<u64>,
    /// Whether the VM has a virtio-rng device.
    #[serde(default)]
    pub rng: bool,
    /// Block devices, in slot order.
    #[serde(default)]
    pub disks: Vec<DiskMeta>,
    /// The network device (after the disks), if there is one. Its tap is not part of
    /// the snapshot: every restore brings one of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net: Option<NetMeta>,
}

/// The network device of a snapshot.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct NetMeta {
    /// The guest's MAC, the same in every restore.
    pub mac: [u8; 6],
}

/// One block device of a snapshot. Read-only disks are kept inside the snapshot
/// directory (`disk/<file>`, hard-linked when possible) so a snapshot never depends on
/// a cache that is safe to delete.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct DiskMeta {
    /// File name under the snapshot's `disk/` directory.
    pub file: String,
    /// Whether the guest sees the disk read-only.
    pub read_only: bool,
    /// Serial the guest sees.
    pub id: String,
    /// A layered disk (DESIGN §5): `file` is its base image and these are its sealed
    /// layers, oldest first, each the directory `disk/<file>.layers/<name>/` holding the
    /// layer's `data` and `bitmap`; names are layer ids (32 lowercase hex digits). A
    /// restored layered disk gets a fresh writable top over them. `None`: a plain image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layers: Option<Vec<String>>,
}

impl DiskMeta {
    /// Whether `file` is a plain file name (so `disk/<file>` stays inside the snapshot):
    /// `snapshot.json` is untrusted.
    pub fn has_plain_name(&self) -> bool {
        let f = self.file.as_str();
        let plain = !f.is_empty() && f != "." && f != ".." && !f.contains('/') && !f.contains('\0');
        plain && self.layers.iter().flatten().all(|l| is_layer_name(l))
    }

    /// Where the sealed layer `name` of this disk lives inside the snapshot's `disk/`.
    pub fn layer_dir(&self, disk_dir: &std::path::Path, name: &str) -> std::path::PathBuf {
        disk_dir.join(format!("{}.layers", self.file)).join(name)
    }

    /// The directories of this disk's sealed layers inside `disk_dir`, oldest first
    /// (empty for a plain image).
    pub fn layer_dirs(&self, disk_dir: &std::path::Path) -> Vec<std::path::PathBuf> {
        self.layers.iter().flatten().map(|l| self.layer_dir(disk_dir, l)).collect()
    }
}

/// Whether `name` is a layer id as written in `snapshot.json`: 32 lowercase hex digits.
pub fn is_layer_name(name: &str) -> bool {
    name.len() == 32 && name.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Why `snapshot.json` could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum MetadataError {
    /// The file does not exist.
    #[error("snapshot.json missing: {0} does not exist")]
    Missing(PathBuf),
    /// Opening, stat-ing or reading the file failed.
    #[error("snapshot.json: cannot read {path}: {source}")]
    ReadFile {
        /// The file.
        path: PathBuf,
        /// Underlying error.
        source: io::Error,
    },
    /// The file is larger than [`METADATA_MAX_BYTES`].
    #[error("snapshot.json: {path} is {size} bytes, over the {max}-byte limit: the file is corrupt")]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size.
        size: u64,
        /// The limit.
        max: u64,
    },
    /// The file is not valid JSON or does not match the expected schema.
    #[error("snapshot.json: cannot parse {path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Parser error (includes line and column).
        source: serde_json::Error,
    },
    /// The file declares a format version this build does not know.
    #[error("snapshot.json: format version {found} is not supported (this build reads version {supported}): {path}")]
    UnsupportedVersion {
        /// The file.
        path: PathBuf,
        /// Version stored in the file.
        found: u32,
        /// Version this build supports.
        supported: u32,
    },
    /// Serialising the metadata failed.
    #[error("snapshot.json: cannot serialise metadata: {0}")]
    Serialize(serde_json::Error),
    /// Creating, writing or syncing the file failed.
    #[error("snapshot.json: cannot write {path}: {source}")]
    WriteFile {
        /// The file.
        path: PathBuf,
        /// Underlying error.
        source: io::Error,
    },
}

/// Writes `meta` to `path` as pretty JSON and fsyncs the file.
pub fn write_meta(path: &Path, meta: &SnapshotMeta) -> Result<(), MetadataError> {
    write_meta_file(path, meta, true)
}

/// Writes `meta` to `path` without fsync (for a `writing` snapshot, synced before it is
/// marked `ready`).
pub fn write_meta_unsynced(path: &Path, meta: &SnapshotMeta) -> Result<(), MetadataError> {
    write_meta_file(path, meta, false)
}

fn write_meta_file(path: &Path, meta: &SnapshotMeta, sync: bool) -> Result<(), MetadataError> {
    let mut json = serde_json::to_vec_pretty(meta).map_err(MetadataError::Serialize)?;
    json.push(b'\n');
    let err = |source| MetadataError::WriteFile { path: path.to_path_buf(), source };
    let mut file = File::create(path).map_err(err)?;
    file.write_all(&json).map_err(err)?;
    if sync {
        file.sync_all().map_err(err)?;
    }
    Ok(())
}

/// Replaces `snapshot.json` in `dir` atomically (temporary file, fsync, rename, fsync
/// of the directory): readers see the old or the new metadata, never a mix.
pub fn replace_meta(dir: &Path, meta: &SnapshotMeta) -> Result<(), MetadataError> {
    let tmp = dir.join(".snapshot.json.tmp");
    write_meta(&tmp, meta)?;
    let path = dir.join("snapshot.json");
    let err = |source| MetadataError::WriteFile { path: path.clone(), source };
    fs::rename(&tmp, &path).map_err(err)?;
    File::open(dir).and_then(|d| d.sync_all()).map_err(err)
}

/// Reads and strictly parses `snapshot.json` at `path`.
pub fn read_meta(path: &Path) -> Result<SnapshotMeta, MetadataError> {
    let err = |source| MetadataError::ReadFile { path: path.to_path_buf(), source };
    let size = match fs::metadata(path) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(MetadataError::Missing(path.to_path_buf())),
        Err(e) => return Err(err(e)),
    };
    if size > METADATA_MAX_BYTES {
        return Err(MetadataError::TooLarge { path: path.to_path_buf(), size, max: METADATA_MAX_BYTES });
    }
    let mut bytes = Vec::new();
    File::open(path).map_err(err)?.take(METADATA_MAX_BYTES + 1).read_to_end(&mut bytes).map_err(err)?;
    let parse_err = |source| MetadataError::Parse { path: path.to_path_buf(), source };
    // Check the version first, so a future format with different fields is
    // reported as "unsupported version" rather than a confusing schema error.
    #[derive(Deserialize)]
    struct VersionOnly {
        format_version: u32,
    }
    let version: VersionOnly = serde_json::from_slice(&bytes).map_err(parse_err)?;
    if version.format_version != METADATA_FORMAT_VERSION {
        return Err(MetadataError::UnsupportedVersion {
            path: path.to_path_buf(),
            found: version.format_version,
            supported: METADATA_FORMAT_VERSION,
        });
    }
    serde_json::from_slice(&bytes).map_err(parse_err)
}

/// A small valid description, for tests of the modules that read and write them.
#[cfg(test)]
pub(crate) fn minimal_meta(tag: &str, status: SnapshotStatus) -> SnapshotMeta {
    SnapshotMeta {
        format_version: METADATA_FORMAT_VERSION,
        tag: tag.into(),
        created_at_unix_ms: 0,
        status,
        mem_size_bytes: 4096,
        vcpu_count: 1,
        irqchip: "split".into(),
        guest: GuestIdentity { kind: "testguest".into(), name: "g".into(), content_hash: None },
        parent_tag: None,
        parent_hash: None,
        branched_from: None,
        volumes: vec![],
        memory_bytes_allocated: 0,
        writer_pid: None,
        devices: None,
        template: None,
        memory_format: MemoryFormat::Image,
        content_hash: None,
        default_limits: None,
        default_network: None,
        memory_sealed_by: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> SnapshotMeta {
        SnapshotMeta {
            format_version: METADATA_FORMAT_VERSION,
            tag: "base".into(),
            created_at_unix_ms: 1_700_000_000_000,
            status: SnapshotStatus::Ready,
            mem_size_bytes: 256 << 20,
            vcpu_count: 2,
            irqchip: "kvm-in-kernel".into(),
            guest: GuestIdentity { kind: "linux".into(), name: "vmlinux".into(), content_hash: Some("abc123".into()) },
            parent_tag: Some("root".into()),
            parent_hash: None,
            branched_from: None,
            volumes: vec!["data".into()],
            memory_bytes_allocated: 12 << 20,
            writer_pid: None,
            devices: None,
            template: None,
            memory_format: MemoryFormat::Chunked,
            content_hash: Some("ab".repeat(32)),
            default_limits: Some(DefaultLimits {
                memory_limit_bytes: None,
                cpu_millis: Some(500),
                pids_max: Some(64),
                io: Some(forkvm_api::IoLimits { disk_ops_per_sec: Some(100), ..Default::default() }),
            }),
            default_network: Some(forkvm_api::NetworkPolicy {
                allow_internet: false,
                allow: vec!["pypi.org".into(), "*.pythonhosted.org".into()],
                deny: Vec::new(),
            }),
            memory_sealed_by: Some("0123456789abcdef".into()),
        }
    }

    #[test]
    fn round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("snapshot.json");
        write_meta(&path, &sample()).unwrap();
        assert_eq!(read_meta(&path).unwrap(), sample());
        let text = fs::read_to_string(&path).unwrap();
        assert!(text.contains("\"status\": \"ready\""), "{text}");
    }

    #[test]
    fn optional_fields_may_be_absent() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("snapshot.json");
        let json = r#"{"format_version":1,"tag":"t","created_at_unix_ms":1,
            "status":"writing","mem_size_bytes":4096,"vcpu_count":1,
            "irqchip":"x","guest":{"kind":"testguest","name":"g"},
            "memory_bytes_allocated":0}"#;
        fs::write(&path, json).unwrap();
        let meta = read_meta(&path).unwrap();
        assert_eq!(meta.status, SnapshotStatus::Writing);
        assert_eq!(meta.parent_tag, None);
        assert!(meta.volumes.is_empty());
        assert_eq!(meta.guest.content_hash, None);
    }

    #[test]
    fn unknown_field_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("snapshot.json");
        let mut value = serde_json::to_value(sample()).unwrap();
        value["surprise"] = serde_json::json!(1);
        fs::write(&path, value.to_string()).unwrap();
        let err = read_meta(&path).unwrap_err();
        assert!(matches!(err, MetadataError::Parse { .. }));
        assert!(err.to_string().contains("surprise"), "{err}");
    }

    #[test]
    fn unknown_version_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("snapshot.json");
        fs::write(&path, r#"{"format_version": 2, "new_field": true}"#).unwrap();
        let err = read_meta(&path).unwrap_err();
        assert!(matches!(err, MetadataError::UnsupportedVersion { found: 2, supported: 1, .. }));
    }

    #[test]
    fn garbage_is_a_parse_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("snapshot.json");
        fs::write(&path, "not json").unwrap();
        assert!(matches!(read_meta(&path).unwrap_err(), MetadataError::Parse { .. }));
    }

    #[test]
    fn missing_and_oversized_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("snapshot.json");
        assert!(matches!(
            read_meta(&path).unwrap_err(),
            MetadataError::Missing(p) if p == path
        ));
        File::create(&path).unwrap().set_len(METADATA_MAX_BYTES + 1).unwrap();
        assert!(matches!(read_meta(&path).unwrap_err(), MetadataError::TooLarge { .. }));
    }
}
