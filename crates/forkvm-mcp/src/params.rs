//! The arguments of each tool. Their doc comments become the JSON Schema descriptions
//! an agent reads, so they say what a value does and what the default is.

use schemars::JsonSchema;
use serde::Deserialize;
use std::collections::BTreeMap;

/// Which snapshot.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TagArgs {
    /// The snapshot's tag.
    pub tag: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSnapshotArgs {
    /// Tag of the new snapshot: letters, digits, `.`, `_`, `-`.
    pub tag: String,
    /// Template to boot, e.g. `python` (Python 3 with numpy, warmed) or `tiny`.
    pub template: String,
    /// vCPUs of the sandboxes spawned from it (1 to 16); default: the template's.
    #[serde(default)]
    pub vcpus: Option<u8>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeleteSnapshotArgs {
    /// The snapshot's tag.
    pub tag: String,
    /// Also delete the snapshots built on it (branches and diffs over it).
    #[serde(default)]
    pub cascade: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SpawnArgs {
    /// Tag of the snapshot to start from (see `list_snapshots`).
    pub snapshot_tag: String,
    /// How many sandboxes, 1 to 100; each is a copy-on-write clone of the snapshot.
    #[serde(default = "one")]
    pub n: u32,
    /// Memory limit of each sandbox's VMM in MiB; default: the snapshot's.
    #[serde(default)]
    pub memory_limit_mib: Option<u64>,
    /// Archive each sandbox this many seconds after it starts (0: never); default: the daemon's.
    #[serde(default)]
    pub ttl_seconds: Option<u64>,
    /// Volumes (named disks that outlive sandboxes) to mount in each: `mode` `rw` (one
    /// writer, only with n = 1), `ro`, or `cow` (a private writable copy).
    #[serde(default)]
    pub volumes: Vec<forkvm_api::VolumeMount>,
}

/// Which sandbox.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SandboxArgs {
    /// The sandbox's id (from `spawn`, `fork` or `list_sandboxes`).
    pub sandbox_id: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecArgs {
    /// The sandbox's id.
    pub sandbox_id: String,
    /// A shell command line, run by `/bin/sh -c` (pipes, redirects, `&&` work). Give
    /// this or `args`.
    #[serde(default)]
    pub command: Option<String>,
    /// A program and its arguments, run without a shell. Give this or `command`.
    #[serde(default)]
    pub args: Option<Vec<String>>,
    /// Working directory; default: `/`.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Extra environment variables.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Text given to the command's standard input.
    #[serde(default)]
    pub stdin: Option<String>,
    /// Seconds before the command is killed (exit code 124); default 60.
    #[serde(default = "sixty")]
    pub timeout_secs: u64,
    /// Most bytes of stdout and of stderr shown (head and tail); default 16384. The
    /// whole output is saved in the sandbox when it is longer, and the reply says where.
    #[serde(default = "default_shown")]
    pub max_output_bytes: usize,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EvalArgs {
    /// The sandbox's id (a sandbox of a Python template).
    pub sandbox_id: String,
    /// Python source run in the sandbox's warm interpreter (numpy is imported as `np` in
    /// the `python` template); the value of a final expression comes back as `result`.
    pub code: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadFileArgs {
    /// The sandbox's id.
    pub sandbox_id: String,
    /// Absolute path of the file in the sandbox.
    pub path: String,
    /// Byte to start at; default 0. Use it to page through a long file.
    #[serde(default)]
    pub offset: u64,
    /// Most bytes returned, 1 to 1048576; default 65536.
    #[serde(default = "default_read")]
    pub max_bytes: usize,
}

/// How `write_file`'s `content` is encoded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// The content is the file's text.
    #[default]
    Utf8,
    /// The content is the file's bytes in standard base64.
    Base64,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteFileArgs {
    /// The sandbox's id.
    pub sandbox_id: String,
    /// Absolute path of the file; an existing file is replaced.
    pub path: String,
    /// The file's content.
    pub content: String,
    /// `utf8` (default) or `base64`.
    #[serde(default)]
    pub encoding: Encoding,
    /// Permission bits as an octal string such as `"755"`; default `644`.
    #[serde(default)]
    pub mode: Option<String>,
    /// Create missing parent directories; default true.
    #[serde(default = "yes")]
    pub create_parents: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListFilesArgs {
    /// The sandbox's id.
    pub sandbox_id: String,
    /// Absolute path of the directory; default `/`.
    #[serde(default = "root")]
    pub path: String,
}

/// How a branch copies the sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum BranchMode {
    /// Pause, write all of memory, resume.
    Full,
    /// Pause only for the copy-on-write mark (milliseconds), write memory while it runs.
    Live,
    /// Store only the pages that differ from the snapshot it was spawned from.
    Diff,
}

impl BranchMode {
    pub fn as_str(self) -> &'static str {
        match self {
            BranchMode::Full => "full",
            BranchMode::Live => "live",
            BranchMode::Diff => "diff",
        }
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BranchArgs {
    /// The running sandbox to snapshot; it keeps running.
    pub sandbox_id: String,
    /// Tag of the new snapshot; default: one the daemon picks.
    #[serde(default)]
    pub tag: Option<String>,
    /// `live` (default: shortest pause), `full` or `diff`.
    #[serde(default)]
    pub mode: Option<BranchMode>,
    /// Also measure how much memory differs from the snapshot it was spawned from
    /// (`diff_physical_bytes`).
    #[serde(default)]
    pub measure_diff: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkArgs {
    /// The running sandbox to copy; it keeps running.
    pub sandbox_id: String,
    /// How many copies, 1 to 100; each has the source's memory, processes and files.
    #[serde(default = "one")]
    pub n: u32,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StartProcessArgs {
    /// The sandbox's id.
    pub sandbox_id: String,
    /// A shell command line, run by `/bin/sh -c` in the background.
    pub command: String,
    /// Working directory; default: the image's, else `/`.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Extra environment variables.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// A name listed with the process.
    #[serde(default)]
    pub tag: Option<String>,
    /// Output bytes kept for reading (1 to 16777216); default 1048576.
    #[serde(default)]
    pub ring_bytes: Option<u64>,
    /// Kill it after this many seconds (1 to 86400); default: it runs until it ends.
    #[serde(default)]
    pub timeout_secs: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcessOutputArgs {
    /// The sandbox's id.
    pub sandbox_id: String,
    /// The process's pid (from `start_process` or `list_processes`).
    pub pid: u32,
    /// Byte of its output to start at (`next_offset` of the last read); default: the
    /// oldest byte kept.
    #[serde(default)]
    pub offset: Option<u64>,
    /// Most bytes returned, 1 to 1048576; default 65536.
    #[serde(default = "default_read")]
    pub max_bytes: usize,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SendInputArgs {
    /// The sandbox's id.
    pub sandbox_id: String,
    /// The process's pid.
    pub pid: u32,
    /// Text for its standard input (add `\n` to end a line).
    pub text: String,
    /// End its input after the text.
    #[serde(default)]
    pub close: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StopProcessArgs {
    /// The sandbox's id.
    pub sandbox_id: String,
    /// The process's pid.
    pub pid: u32,
    /// The signal number; default 15 (TERM).
    #[serde(default)]
    pub signal: Option<i32>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListProcessesArgs {
    /// The sandbox's id.
    pub sandbox_id: String,
}

/// Most sandboxes one `spawn` or `fork` tool call makes (the API allows more; an agent
/// asking for thousands is more likely a mistake).
pub const MAX_PER_CALL: u32 = 100;
/// Upper bound of `max_output_bytes` and `max_bytes`.
pub const MAX_SHOWN: usize = 1 << 20;

fn one() -> u32 {
    1
}
fn sixty() -> u64 {
    60
}
fn yes() -> bool {
    true
}
fn root() -> String {
    "/".into()
}
fn default_shown() -> usize {
    16 << 10
}
fn default_read() -> usize {
    64 << 10
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckpointArgs {
    /// The running sandbox to checkpoint (memory and disks); it keeps running.
    pub sandbox_id: String,
    /// What the checkpoint is for, e.g. "before deleting the build directory".
    #[serde(default)]
    pub note: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RewindArgs {
    /// The running sandbox to put back.
    pub sandbox_id: String,
    /// The checkpoint's number (from `list_checkpoints`).
    #[serde(default)]
    pub seq: Option<u64>,
    /// Or: the newest checkpoint taken at least this many seconds ago.
    #[serde(default)]
    pub ago_seconds: Option<f64>,
}
