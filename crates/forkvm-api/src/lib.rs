//! The REST v1 wire types: forkd's JSON shapes (field names, defaults, status codes) plus
//! forkvm's additions, each marked. Requests refuse unknown fields, so a typo is a 400
//! naming the field rather than a silently ignored option. Shared by the daemon, the
//! Rust client; `docs/openapi.json` documents them for other clients.

use serde::{Deserialize, Serialize};

pub mod checkpoints;
pub mod disks;
pub mod error_code;
pub mod lineage;
pub mod paths;
pub mod ports;
pub mod processes;
pub mod remote;
pub mod routes;
pub mod templates;
pub mod volumes;
pub mod workspaces;

pub use checkpoints::{
    CheckpointInfo, CheckpointList, CheckpointPolicy, CreateCheckpointRequest, RewindReport, RewindRequest,
};
pub use disks::{
    ArchiveReport, DiskForkRequest, DiskRestoreMode, DiskSnapshotDisk, DiskSnapshotInfo, DiskSnapshotReport,
    DiskSnapshotRequest, LastDiskSnapshot, RestoreRequest,
};
pub use error_code::ErrorCode;
pub use lineage::{Lineage, LineageEdge, LineageNode, SandboxUsage};
pub use ports::{ExposeRequest, ExposedPort};
pub use processes::{
    ProcessAttachQuery, ProcessControl, ProcessExit, ProcessInfo, ProcessInputQuery, ProcessInputWritten,
    ProcessOutputEvent, ProcessOutputQuery, SignalProcessRequest, StartProcessRequest, TerminalSize, ATTACH_STDERR,
    ATTACH_STDOUT,
};
pub use remote::{
    CollectRequest, GcReport, LockInfo, LockKind, PullReport, PullRequest, PushReport, PushRequest, RemoteInfo,
};
pub use templates::{
    BuildTemplateQuery, ImportOciQuery, PruneBuildsReport, PruneBuildsRequest, TemplateBuildEvent, TemplateBuildReport,
    TemplateBuildStep, TemplateImportEvent,
};
pub use volumes::{CreateVolumeRequest, SnapshotVolumeRequest, VolumeInfo, VolumeMode, VolumeMount};
pub use workspaces::{CreateWorkspaceRequest, SuspendWorkspaceRequest, WorkspaceInfo};

/// Version of this API, reported by `GET /version`.
pub const API_VERSION: &str = "v1";
/// Most sandboxes one `POST /v1/sandboxes` or fork may create.
pub const MAX_SANDBOXES_PER_CALL: u32 = 1000;

/// What `GET /v1/sandboxes/{id}/console` returns of the log's end unless `bytes` says.
pub const DEFAULT_CONSOLE_BYTES: u64 = 64 << 10;
/// The largest `bytes` a console read accepts.
pub const MAX_CONSOLE_BYTES: u64 = 1 << 20;

/// Every error body: `{"error": "..."}` as forkd, plus a machine-readable `code`
/// ([`ErrorCode`]; a body without one, as forkd sends, reads as `Unknown`) and, for
/// conflicts, the object's current `state`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ErrorBody {
    pub error: String,
    #[serde(default = "unknown_code")]
    pub code: ErrorCode,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
}

fn unknown_code() -> ErrorCode {
    ErrorCode::Unknown
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Health {
    pub ok: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct VersionInfo {
    pub version: String,
    pub api: String,
}

/// `POST /v1/snapshots`. forkd boots a kernel and rootfs given by path; forkvm builds
/// from a named template (`tiny`, `python`), booted once and cached by content hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSnapshotRequest {
    pub tag: String,
    pub template: String,
    /// forkvm: the limits a sandbox spawned from this tag gets unless its spawn asks for
    /// others (bounds as in [`CreateSandboxRequest`]); absent: forkvm's defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_limits: Option<DefaultLimits>,
    /// forkvm: where a sandbox spawned from this tag may connect to unless its spawn asks
    /// for another policy; absent: anywhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_network: Option<NetworkPolicy>,
    /// forkvm: vCPUs of the tag's sandboxes, 1 to 16 (the template booted on that many,
    /// once, then cached); absent: the template's `vcpus`, else 1. A sandbox keeps its
    /// snapshot's count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vcpus: Option<u8>,
}

/// forkvm: caps on what a sandbox's virtio devices do for its guest per second, each a
/// token bucket holding one second's worth (a request larger than that passes once the
/// bucket is full and is paid off before the next). Requests over a cap wait in their
/// queue while the guest runs on. An absent field: no cap.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IoLimits {
    /// Bytes read and written per second, per disk; 65536 or more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_bytes_per_sec: Option<u64>,
    /// Disk requests per second, per disk; 10 or more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_ops_per_sec: Option<u64>,
    /// Random bytes the entropy device (virtio-rng) hands out per second; 64 or more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rng_bytes_per_sec: Option<u64>,
    /// Bytes per second the guest sends through its network device (frames, headers
    /// included); 8192 or more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net_tx_bytes_per_sec: Option<u64>,
    /// Bytes per second the guest receives through its network device; 8192 or more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net_rx_bytes_per_sec: Option<u64>,
}

impl IoLimits {
    /// These caps, unless they cap nothing (how requests, rows and listings carry them).
    pub fn asked(self) -> Option<IoLimits> {
        (self != IoLimits::default()).then_some(self)
    }
}

/// forkvm: where a sandbox's guest may connect to (`docs/networking.md`). Entries of
/// `allow` and `deny` are IPv4 addresses (`203.0.113.7`), CIDRs (`10.0.0.0/8`), domain
/// names (`pypi.org`) or wildcards (`*.pythonhosted.org`: every name under it, not
/// itself). An address or name that `allow` matches is reachable whatever `deny` says;
/// what neither matches is reachable when `allow_internet` is true. Names are enforced
/// at the sandbox's resolver: a denied name does not resolve (and its addresses are
/// blocked), and with `allow_internet` false only allowed names resolve, so only their
/// addresses are reachable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkPolicy {
    /// Whether what no rule names is reachable; true by default.
    #[serde(default = "yes")]
    pub allow_internet: bool,
    /// At most 256 entries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
    /// At most 256 entries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<String>,
}

impl Default for NetworkPolicy {
    /// Everything reachable (but what every sandbox is kept from: other sandboxes, the
    /// host, link-local addresses).
    fn default() -> Self {
        NetworkPolicy { allow_internet: true, allow: Vec::new(), deny: Vec::new() }
    }
}

impl NetworkPolicy {
    /// Whether it is the default (how rows and listings leave it out).
    pub fn is_default(&self) -> bool {
        *self == NetworkPolicy::default()
    }
}

/// forkvm: a tag's default limits for the sandboxes spawned from it; an absent field
/// takes forkvm's default for that resource.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DefaultLimits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_limit_mib: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_limit_millis: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids_limit: Option<u32>,
    /// forkvm: caps on each sandbox's disk and entropy I/O (token buckets in its VMM);
    /// absent: none (a fork of a running sandbox: its source's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_limits: Option<IoLimits>,
}

/// A snapshot in the store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SnapshotInfo {
    pub tag: String,
    pub dir: String,
    pub created_at_unix: u64,
    #[serde(default)]
    pub branched_from: Option<String>,
    /// Pause window of the branch that made it, in whole milliseconds rounded up: an
    /// integer, as forkd's clients read it. Set it with [`SnapshotInfo::set_pause`].
    #[serde(default, serialize_with = "whole_ms")]
    pub pause_ms: Option<f64>,
    /// forkvm: the same pause window in microseconds (the precision `pause_ms` rounds away).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_us: Option<u64>,
    /// forkd's `measure_diff`: milliseconds it took to work out what a diff over the
    /// sandbox's parent would store (outside the pause window here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diff_ms: Option<u64>,
    /// forkd's `measure_diff`: bytes of the guest pages that differ from the parent's, what
    /// a diff branch would store before compression.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diff_physical_bytes: Option<u64>,
    /// forkd's `measure_diff`: the guest memory size the diff covers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diff_logical_bytes: Option<u64>,
    /// `writing`, `ready` or `failed`.
    pub status: String,
    /// Whether a sandbox can be spawned from it now.
    pub bootable: bool,
    #[serde(default)]
    pub warning: Option<String>,
    /// forkvm: the template it descends from.
    #[serde(default)]
    pub template: Option<String>,
    /// forkvm: branch mode (`full`, `live`, `diff`), for branches.
    #[serde(default)]
    pub mode: Option<String>,
    /// forkvm: guest memory size.
    #[serde(default)]
    pub memory_logical_bytes: u64,
    /// forkvm: bytes the memory occupies on disk: a whole image's allocated blocks, or
    /// for a chunked snapshot the compressed chunks it added to the store when it was made.
    #[serde(default)]
    pub memory_physical_bytes: u64,
    /// forkvm: the limits a sandbox spawned from it gets unless its spawn asks for others.
    #[serde(default)]
    pub default_limits: Option<DefaultLimits>,
    /// forkvm: where a sandbox spawned from it may connect to unless its spawn asks for
    /// another policy (a branch: its sandbox's policy when it was taken); absent: anywhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_network: Option<NetworkPolicy>,
    /// forkvm: vCPUs of the sandboxes spawned from it (its machine's; absent from an
    /// older daemon).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vcpus: Option<u8>,
}

impl SnapshotInfo {
    /// Records a branch's pause window: `pause_ms` (whole, rounded up) and `pause_us`.
    pub fn set_pause(&mut self, ms: Option<f64>) {
        self.pause_ms = ms;
        self.pause_us = ms.map(|ms| (ms * 1e3).round().max(0.0) as u64);
    }

    /// The pause window in milliseconds as precisely as the reply has it (`pause_us`,
    /// else the whole `pause_ms` an older daemon or forkd sent).
    pub fn pause_ms_precise(&self) -> Option<f64> {
        self.pause_us.map(|us| us as f64 / 1e3).or(self.pause_ms)
    }
}

fn whole_ms<S: serde::Serializer>(ms: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    match ms {
        Some(ms) => s.serialize_u64(ms.max(0.0).ceil() as u64),
        None => s.serialize_none(),
    }
}

/// `GET /v1/snapshots/{tag}/info`: forkd's fields (sizes, lineage) plus forkvm's
/// chain detail. Fields forkvm added default when absent, so an older daemon's answer
/// still parses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SnapshotInfoDetail {
    pub tag: String,
    pub dir: String,
    pub created_at_unix: Option<u64>,
    /// Guest memory size.
    pub memory_logical_bytes: u64,
    /// Bytes the memory occupies on disk: a whole image's allocated blocks, or a chunked
    /// snapshot's `memory.map` plus the compressed chunks it references (chunks shared
    /// with other snapshots are counted in each).
    pub memory_physical_bytes: u64,
    pub vmstate_bytes: u64,
    pub parent_tag: Option<String>,
    pub parent_content_hash: Option<String>,
    /// Links above the chain's base (0 for a snapshot without a parent).
    pub chain_depth: u32,
    /// From the base to the parent, as far as they exist.
    pub ancestors: Vec<String>,
    /// Snapshots made directly on top of this one.
    pub dependents: Vec<String>,
    /// forkvm: the sandbox this snapshot was branched from, if it is a branch.
    #[serde(default)]
    pub branched_from: Option<String>,
    /// `writing`, `ready` or `failed` (ready on disk but not bootable; see `problem`).
    pub status: String,
    /// forkvm: every snapshot built on this one, at any depth, deepest first (what
    /// `DELETE ?cascade=true` removes with it).
    #[serde(default)]
    pub descendants: Vec<String>,
    /// forkvm: whether a sandbox can be spawned from it now.
    #[serde(default = "yes")]
    pub bootable: bool,
    /// forkvm: why it is not bootable (e.g. its parent was removed with `force`).
    #[serde(default)]
    pub problem: Option<String>,
    /// forkvm: `image` (a whole `memory.img`) or `chunked` (a `memory.map` over the
    /// store's chunks; a diff over its parent when it has one).
    #[serde(default)]
    pub memory_format: String,
    /// forkvm: content hash of a chunked snapshot (what a child's `parent_content_hash` names).
    #[serde(default)]
    pub content_hash: Option<String>,
    /// forkvm: bytes on disk of the whole chain, base to this snapshot (vmstate and memory
    /// of every link).
    #[serde(default)]
    pub chain_physical_bytes: u64,
    /// forkvm: chunks this snapshot's `memory.map` references (0 for a whole image).
    #[serde(default)]
    pub chunks: u64,
}

/// forkd: `POST /v1/snapshots/{tag}/compact`: the flat equivalent of `tag`'s chain,
/// written as the new snapshot `to` (no parent; `branched_from` is `compact:<tag>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CompactSnapshotRequest {
    pub to: String,
}

/// forkvm: the reply to `POST /v1/snapshots/unpack`: which links of the packed chain
/// were written into the store and which were already there with the same content.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct UnpackResponse {
    /// The chain's head (the tag that was packed).
    pub head: String,
    /// Links written into the store, base first.
    pub imported: Vec<String>,
    /// Links already in the store with the same content hash, reused.
    pub reused: Vec<String>,
    /// Chunks the store did not have, and those it had already.
    pub chunks_new: u64,
    pub chunks_present: u64,
    /// Bytes of the pack's entries before compression, and of the pack itself.
    pub logical_bytes: u64,
    pub pack_bytes: u64,
    /// Time spent checking and importing (not receiving).
    pub ms: f64,
    /// forkvm: the public key (hex) that signed the pack, if it was signed.
    #[serde(default)]
    pub signed_by: Option<String>,
}

/// `POST /v1/sandboxes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSandboxRequest {
    pub snapshot_tag: String,
    #[serde(default = "one")]
    pub n: u32,
    #[serde(default)]
    pub memory_limit_mib: Option<u64>,
    /// forkvm: CPU limit of each sandbox's VMM, in thousandths of a CPU (1000: one CPU's
    /// worth of time per 100 ms period), 10 to 1024000; absent: the default, 1000 per vCPU + 1000 (a
    /// fork of a running sandbox: its source's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_limit_millis: Option<u32>,
    /// forkvm: tasks (threads and processes) each sandbox's VMM may have, 32 to 4194304;
    /// absent: the default, 4352 (a fork of a running sandbox: its source's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids_limit: Option<u32>,
    /// forkvm: caps on each sandbox's disk and entropy I/O (token buckets in its VMM);
    /// absent: none (a fork of a running sandbox: its source's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_limits: Option<IoLimits>,
    /// forkvm: the vCPUs the caller expects; a sandbox has its snapshot's, so another
    /// count is refused (400) rather than silently ignored. Make a tag with more vCPUs
    /// through `POST /v1/snapshots` `vcpus`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vcpus: Option<u8>,
    /// forkd: a network namespace per child. Accepted: every sandbox has its own.
    #[serde(default)]
    pub per_child_netns: bool,
    /// forkvm: where each sandbox may connect to; absent: anywhere ([`NetworkPolicy`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkPolicy>,
    /// forkd: pre-fault memory. Accepted and ignored: restores are copy-on-write.
    #[serde(default)]
    pub prewarm: bool,
    /// forkd: memory a live BRANCH can be taken of. Accepted: every sandbox's is.
    #[serde(default)]
    pub live_fork: bool,
    /// forkd: hugepage-backed memory. Accepted and ignored: memory is THP-backed.
    #[serde(default)]
    pub hugepages: bool,
    /// forkvm: archive each sandbox this many seconds after it started (`0`: never);
    /// absent, the daemon's `--default-ttl`.
    #[serde(default)]
    pub ttl_seconds: Option<u64>,
    /// forkvm: volumes to attach to each sandbox (at most 4; a writable one only when
    /// `n` is 1). docs/volumes.md.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VolumeMount>,
    /// forkvm: each sandbox's checkpoint policy from the start (as `PUT
    /// .../checkpoints` would set it). docs/checkpoints.md.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoints: Option<CheckpointPolicy>,
}

fn one() -> u32 {
    1
}

impl CreateSandboxRequest {
    /// `n` sandboxes from `snapshot_tag`, every other field at its default.
    pub fn new(snapshot_tag: impl Into<String>, n: u32) -> Self {
        CreateSandboxRequest {
            snapshot_tag: snapshot_tag.into(),
            n,
            memory_limit_mib: None,
            cpu_limit_millis: None,
            pids_limit: None,
            io_limits: None,
            vcpus: None,
            per_child_netns: false,
            network: None,
            prewarm: false,
            live_fork: false,
            hugepages: false,
            ttl_seconds: None,
            volumes: Vec::new(),
            checkpoints: None,
        }
    }
}

/// forkvm: `POST /v1/sandboxes/{id}/fork`: N copies of a running sandbox, no disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkSandboxRequest {
    #[serde(default = "one")]
    pub n: u32,
    #[serde(default)]
    pub memory_limit_mib: Option<u64>,
    /// forkvm: CPU limit of each sandbox's VMM, in thousandths of a CPU (1000: one CPU's
    /// worth of time per 100 ms period), 10 to 1024000; absent: the default, 1000 per vCPU + 1000 (a
    /// fork of a running sandbox: its source's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_limit_millis: Option<u32>,
    /// forkvm: tasks (threads and processes) each sandbox's VMM may have, 32 to 4194304;
    /// absent: the default, 4352 (a fork of a running sandbox: its source's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids_limit: Option<u32>,
    /// forkvm: caps on each sandbox's disk and entropy I/O (token buckets in its VMM);
    /// absent: none (a fork of a running sandbox: its source's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_limits: Option<IoLimits>,
    /// As [`CreateSandboxRequest::ttl_seconds`].
    #[serde(default)]
    pub ttl_seconds: Option<u64>,
    /// forkvm: where each child may connect to; absent: its source's policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkPolicy>,
}

impl ForkSandboxRequest {
    /// `n` copies, every other field at its default (the source's limits and policy).
    pub fn new(n: u32) -> Self {
        ForkSandboxRequest {
            n,
            memory_limit_mib: None,
            cpu_limit_millis: None,
            pids_limit: None,
            io_limits: None,
            ttl_seconds: None,
            network: None,
        }
    }
}

/// A running sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SandboxInfo {
    pub id: String,
    /// The tag it was spawned from (for a fork of a running sandbox, its source's).
    pub snapshot_tag: Option<String>,
    pub netns: Option<String>,
    /// forkd: the agent's address. forkvm: `unix:<path>` of the vsock socket.
    pub guest_addr: String,
    pub created_at_unix: u64,
    pub pid: Option<i32>,
    pub memory_limit_mib: Option<u64>,
    /// forkvm: the CPU limit its cgroup holds, thousandths of a CPU; none without a
    /// cgroup (archived, or forkvm may not make cgroups on this host).
    #[serde(default)]
    pub cpu_limit_millis: Option<u32>,
    /// forkvm: the tasks limit its cgroup holds; none without a cgroup.
    #[serde(default)]
    pub pids_limit: Option<u32>,
    /// forkvm: the caps on its disk and entropy I/O it was started with; none: no cap.
    #[serde(default)]
    pub io_limits: Option<IoLimits>,
    pub has_branched: bool,
    pub last_branch_memory_path: Option<String>,
    pub branch_count: u32,
    /// forkvm: `running`, `paused` (the daemon paused it when idle; the next call that
    /// needs it resumes it) or `archived` (in `<store>/archives/<id>/`, no process;
    /// `POST .../restore` brings it back).
    pub state: String,
    /// forkvm.
    pub template: Option<String>,
    /// forkvm: the running sandbox it was forked from.
    pub forked_from: Option<String>,
    /// forkvm: last API call that touched it.
    pub last_active_unix: u64,
    /// forkvm: the daemon's last disk snapshot of it, if it tried one since it started.
    #[serde(default)]
    pub last_disk_snapshot: Option<LastDiskSnapshot>,
    /// forkvm: why it is in its state: `idle` (paused), `ttl` or `api` (archived).
    #[serde(default)]
    pub reason: Option<String>,
    /// forkvm: last API call that used it (exec, files, eval, ...), Unix ms.
    #[serde(default)]
    pub last_activity_unix_ms: u64,
    /// forkvm: its time to live, if it has one.
    #[serde(default)]
    pub ttl_seconds: Option<u64>,
    /// forkvm: when the daemon archives it (Unix ms), if it has a TTL.
    #[serde(default)]
    pub expires_at_unix_ms: Option<u64>,
    /// forkvm: when it was archived (Unix ms), for an archived sandbox.
    #[serde(default)]
    pub archived_at_unix_ms: Option<u64>,
    /// forkvm: how its VMM process is confined, read from the kernel when asked
    /// (`GET /v1/sandboxes/{id}` only; null in lists and for an archived sandbox).
    #[serde(default)]
    pub jail: Option<VmmJail>,
    /// forkvm: where its guest may connect to, unless anywhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkPolicy>,
    /// forkvm: its vCPUs (its snapshot's; absent from an older daemon).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vcpus: Option<u8>,
}

/// forkvm: a sandbox VMM's confinement as the kernel reports it (`/proc/<pid>`), in
/// [`SandboxInfo::jail`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct VmmJail {
    /// Effective uid and gid of the VMM process.
    pub uid: u32,
    pub gid: u32,
    /// No capability in its effective, permitted or ambient set.
    pub no_capabilities: bool,
    /// `no_new_privs` is set: no `execve` can grant it anything.
    pub no_new_privs: bool,
    /// `filter` when every thread runs under its seccomp filter, `off` when none does,
    /// `partial` otherwise.
    pub seccomp: String,
    /// Its threads, and how many run under a seccomp filter.
    pub threads: u32,
    pub seccomp_filtered_threads: u32,
    /// Namespaces it does not share with the daemon (`mnt`, `pid`, `net`, `ipc`, `uts`,
    /// `user`).
    pub own_namespaces: Vec<String>,
    /// Its root directory as the daemon sees it.
    pub root: String,
}

/// `POST /v1/sandboxes/{id}/branch`. `mode` (`full`, `live` or `diff`) wins; forkd's
/// legacy booleans `live` and `diff` select a mode when it is absent (both, or one
/// contradicting `mode`, is a 400). `parent_tag` is for diff branches: the tag the
/// sandbox must have been spawned from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BranchSandboxRequest {
    #[serde(default)]
    pub tag: Option<String>,
    #[serde(default)]
    pub mode: Option<String>,
    #[serde(default)]
    pub live: bool,
    #[serde(default)]
    pub diff: bool,
    #[serde(default)]
    pub measure_diff: bool,
    #[serde(default = "yes")]
    pub wait: bool,
    #[serde(default)]
    pub parent_tag: Option<String>,
}

fn yes() -> bool {
    true
}

impl BranchSandboxRequest {
    /// A diff branch (`mode: "diff"`) to `tag` (the daemon's default when `None`), over
    /// the tag the sandbox was spawned from, which must be `parent_tag` when given.
    pub fn diff(tag: Option<String>, parent_tag: Option<String>) -> Self {
        BranchSandboxRequest { tag, mode: Some("diff".into()), parent_tag, ..BranchSandboxRequest::default() }
    }
}

/// The same defaults as an empty JSON body (`wait: true`).
impl Default for BranchSandboxRequest {
    fn default() -> Self {
        BranchSandboxRequest {
            tag: None,
            mode: None,
            live: false,
            diff: false,
            measure_diff: false,
            wait: true,
            parent_tag: None,
        }
    }
}

/// `POST /v1/sandboxes/{id}/exec` and `/exec/stream`. forkd takes `args`; forkvm also
/// takes `cmd` (run by `/bin/sh -c`), `env`, `cwd` and `stdin`. Exactly one of `args`
/// and `cmd`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub cmd: Option<String>,
    #[serde(default = "thirty")]
    pub timeout_secs: u64,
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    pub cwd: Option<String>,
    /// Bytes (UTF-8) given to the process's standard input.
    #[serde(default)]
    pub stdin: Option<String>,
    /// Most bytes of each of stdout and stderr returned ([`DEFAULT_MAX_OUTPUT_BYTES`]
    /// when absent, at most [`MAX_OUTPUT_BYTES`]); the rest is counted, not kept, and
    /// the response says `truncated`.
    #[serde(default)]
    pub max_output_bytes: Option<u64>,
}

/// What an exec returns of each stream unless the request says otherwise.
pub const DEFAULT_MAX_OUTPUT_BYTES: u64 = 4 << 20;
/// The largest `max_output_bytes` accepted.
pub const MAX_OUTPUT_BYTES: u64 = 16 << 20;

fn thirty() -> u64 {
    30
}

/// The same defaults as a JSON body with only the command (`timeout_secs: 30`).
impl Default for ExecRequest {
    fn default() -> Self {
        ExecRequest {
            args: Vec::new(),
            cmd: None,
            timeout_secs: 30,
            env: Default::default(),
            cwd: None,
            stdin: None,
            max_output_bytes: None,
        }
    }
}

/// `exit_code` is the process's code, else 128 + signal, else 124 on timeout (as
/// `timeout(1)`); forkvm adds `signal`, `timed_out` and `duration_ms` so a timeout is
/// never mistaken for a failure of the program.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ExecResponse {
    pub stdout: String,
    pub stderr: String,
    pub exit_code: i32,
    #[serde(default)]
    pub signal: Option<i32>,
    #[serde(default)]
    pub timed_out: bool,
    #[serde(default)]
    pub duration_ms: u64,
    /// forkvm: stdout or stderr was longer than `max_output_bytes` and is cut there.
    #[serde(default)]
    pub truncated: bool,
    /// forkvm: how many bytes the process wrote to stdout (all of them, kept or not).
    #[serde(default)]
    pub stdout_bytes: u64,
    /// forkvm: how many bytes the process wrote to stderr.
    #[serde(default)]
    pub stderr_bytes: u64,
}

/// One line of `POST /v1/sandboxes/{id}/exec/stream` (NDJSON): output chunks as they
/// come, then one `exit` (or one `error`) line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ExecEvent {
    Stdout { data: String },
    Stderr { data: String },
    Exit { exit_code: i32, signal: Option<i32>, timed_out: bool, duration_ms: u64 },
    Error { error: String },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EvalRequest {
    pub code: String,
}

/// forkd's shape (`result`, `error`, `exit_code`: 0 or 1) plus what the code printed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct EvalResponse {
    /// `repr()` of the last expression, if the code ended in one.
    pub result: Option<String>,
    /// The exception and traceback, if the code raised.
    pub error: Option<String>,
    pub exit_code: i32,
    #[serde(default)]
    pub stdout: String,
    #[serde(default)]
    pub stderr: String,
}

/// forkvm: one entry of `GET /v1/sandboxes/{id}/files/list?path=`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct FileEntry {
    pub name: String,
    /// `file`, `dir`, `symlink` or `other`.
    #[serde(rename = "type")]
    pub file_type: String,
    pub size: u64,
    pub mode: u32,
    pub mtime_unix_ns: i64,
}

/// forkvm: the reply to a file upload (`PUT .../files`) or a tar upload (`PUT
/// .../files/tar`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct FileWritten {
    pub path: String,
    pub bytes: u64,
    /// The SHA-256 of the body as the daemon received it (lowercase hex).
    pub sha256: String,
}

/// forkvm: `GET /v1/sandboxes/{id}/files/sha256?path=`: a file's size and SHA-256,
/// computed in the guest (to check a download against).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct FileChecksum {
    pub path: String,
    pub size: u64,
    /// Lowercase hex.
    pub sha256: String,
}

/// forkvm: one line of `GET /v1/sandboxes/{id}/files/watch?path=` (NDJSON): `armed`
/// first, then changes as the guest sees them, a `keepalive` after 5 s without one, and
/// an `end` or `error` line last when the watch ends on the sandbox's side.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WatchEvent {
    /// The watch is in place: every change from now on is reported.
    Armed { directories: u32 },
    /// One change. `kind`: `create`, `write`, `remove`, `rename` or `chmod`; `path` is
    /// relative to the watched directory.
    Change { kind: String, path: String },
    /// Nothing changed for a while; the watch is alive.
    Keepalive,
    /// The guest kernel's event queue overflowed: changes were lost; the watch goes on.
    Overflow,
    /// The watched directory went away; the last line.
    End { reason: String },
    /// The watch failed; the last line.
    Error { error: String },
}

/// forkvm: `POST /v1/sandboxes/{id}/ttl`: archive the sandbox `ttl_seconds` from now
/// (`0`: never).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SetTtlRequest {
    pub ttl_seconds: u64,
}
