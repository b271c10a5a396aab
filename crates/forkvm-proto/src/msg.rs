//! Message types carried as JSON in `Request`, `Response` and `Error` frames.
//!
//! Unknown fields are ignored and new optional fields carry `#[serde(default)]`, which is
//! what lets the compatibility rule next to `PROTOCOL_VERSION` add fields without a bump.

use std::io;

use serde::{Deserialize, Serialize};

/// A request from the host; one per connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Liveness and identity check.
    Ping,
    /// Run a process; see [`ExecRequest`].
    Exec(ExecRequest),
    /// Stream a file's bytes back in `Data` frames.
    ReadFile { path: String },
    /// Write a file from the `Data` frames that follow.
    WriteFile(WriteFileRequest),
    /// List a directory.
    List { path: String },
    /// Describe one path (follows a final symlink).
    Stat { path: String },
    /// Create a directory.
    Mkdir(MkdirRequest),
    /// Remove a file, symlink or directory.
    Remove {
        path: String,
        #[serde(default)]
        recursive: bool,
    },
    /// Rename a path (`rename(2)`: within one file system, replacing a file target).
    Rename { from: String, to: String },
    /// Run code in the warm interpreter.
    Eval { code: String },
    /// Apply a fresh identity after a snapshot restore.
    Identity(IdentityRequest),
    /// Send a signal to the process group of a running exec (its pid from `Started`).
    /// Only processes the agent started can be signalled; another pid is `NotFound`.
    Signal(SignalRequest),
    /// Sync and reset the guest (or exit the agent when it is not PID 1).
    Shutdown,
    /// Watch a directory (inotify): `Watch` frames until the host sends `End` or the
    /// directory goes away; see [`WatchRequest`].
    Watch(WatchRequest),
    /// Mount a volume the host put into a volume slot; see [`MountVolumeRequest`].
    MountVolume(MountVolumeRequest),
    /// Write every dirty page of the guest to its disks (`sync(2)`): before the host
    /// stops a sandbox whose writes must outlive it (a volume's writer).
    Sync,
    /// Unpack the tar stream in the `Data` frames that follow into a directory; see
    /// [`UntarRequest`]. Answered with `Written` (the stream's byte count).
    Untar(UntarRequest),
    /// Start a background process ([`crate::procs`]); answered with `Proc`.
    ProcStart(crate::ProcStartRequest),
    /// The background processes kept (running and ended); answered with `Procs`.
    ProcList,
    /// Stream a background process's output: a `ProcNews` frame (`attached`), then
    /// `Stdout`/`Stderr` frames; the host may send `Stdin` and `Control` frames
    /// meanwhile and hangs up to detach. Ends with `Proc` once the process ended and all
    /// its output went (`follow`), or once the output so far went.
    ProcAttach(crate::ProcAttachRequest),
    /// `Stdin` frames, then `End`, for a background process's stdin; `Written`.
    ProcInput(crate::ProcInputRequest),
    /// Resize a background process's terminal; `Done`.
    ProcResize(crate::ProcResizeRequest),
    /// A file's size and SHA-256, computed in the guest; answered with `FileHash`.
    HashFile { path: String },
    /// Stream a tar archive of a directory back in `Data` frames (its entries named
    /// relative to it; links kept as links, never followed); ends with `ReadDone`.
    Tar { path: String },
}

/// An `untar` request: the entries of a tar stream made under `dir` (made if missing),
/// none of them outside it, with the modes the stream gives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UntarRequest {
    /// Absolute guest path.
    pub dir: String,
    /// Who owns every entry: a guest user name or a uid, with an optional `:group` (a
    /// gid, or the user's own group's name). Root when absent.
    #[serde(default)]
    pub owner: Option<String>,
}

/// A `mount_volume` request: the block device whose serial is `serial` (a volume slot
/// the host just filled) mounted at `path` (made if missing).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountVolumeRequest {
    pub serial: String,
    /// Absolute guest path.
    pub path: String,
    /// Mount read-only (the device refuses writes too).
    #[serde(default)]
    pub read_only: bool,
}

/// A `watch` request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchRequest {
    /// The directory to watch.
    pub path: String,
    /// Also watch every directory below it, including ones created while it is watched.
    #[serde(default)]
    pub recursive: bool,
}

/// What happened to an entry of a watched directory (the kinds E2B's envd reports).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    /// Created, or moved in.
    Create,
    /// Its contents were written.
    Write,
    /// Removed.
    Remove,
    /// Moved away (its new name, when still watched, arrives as a `Create`).
    Rename,
    /// Its permissions, owner or times changed.
    Chmod,
}

/// Payload of a `Watch` frame, agent → host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WatchMessage {
    /// The watch is in place: every change from now on is reported. Always the first.
    Armed {
        /// Directories watched (1 unless recursive).
        directories: u32,
    },
    /// One change. `path` is relative to the watched directory.
    Change { kind: ChangeKind, path: String },
    /// The kernel's event queue overflowed: changes were lost since the last message.
    Overflow,
    /// Nothing happened for a while; the watch is alive.
    Keepalive,
}

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Command {
    /// `argv[0]` is looked up in `PATH`.
    Argv(Vec<String>),
    /// Run through `sh -c`.
    Shell(String),
}

/// An `exec` request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecRequest {
    /// The program.
    pub command: Command,
    /// Extra environment, applied over the agent's own.
    #[serde(default)]
    pub env: Vec<(String, String)>,
    /// Working directory; the agent's own when absent.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Whether `Stdin` frames and an `End` frame follow the request. The client sets it.
    #[serde(default)]
    pub stdin: bool,
    /// Kill the process group after this long and report `timed_out`.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Run as this guest user (a name in the guest's `/etc/passwd`): its uid, gid and
    /// groups, with `HOME`, `USER` and `LOGNAME` set and its home as the default working
    /// directory. The agent's own user (root) when absent.
    #[serde(default)]
    pub user: Option<String>,
    /// Send a `Started` frame with the process's pid before any output, so the caller
    /// can signal it while it runs. An agent that predates it sends none; the caller
    /// then sees output or the exit first.
    #[serde(default)]
    pub report_start: bool,
}

impl ExecRequest {
    /// An argv request with no env, cwd or timeout.
    pub fn argv<I: IntoIterator<Item = S>, S: Into<String>>(argv: I) -> Self {
        Self::new(Command::Argv(argv.into_iter().map(Into::into).collect()))
    }

    /// A `sh -c` request with no env, cwd or timeout.
    pub fn shell(script: impl Into<String>) -> Self {
        Self::new(Command::Shell(script.into()))
    }

    fn new(command: Command) -> Self {
        Self { command, env: Vec::new(), cwd: None, stdin: false, timeout_ms: None, user: None, report_start: false }
    }
}

/// Payload of a `Started` frame: the process an exec started (and its process group's
/// id: every exec is the leader of a group of its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Started {
    pub pid: u32,
}

/// A `signal` request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignalRequest {
    /// The pid a `Started` frame reported.
    pub pid: u32,
    /// The signal number (1..=64; not 0).
    pub signal: i32,
}

/// How an exec ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitStatus {
    /// Exit code, when the process exited normally.
    pub code: Option<i32>,
    /// Terminating signal, when a signal killed it.
    pub signal: Option<i32>,
    /// The agent killed the process group because `timeout_ms` passed.
    pub timed_out: bool,
    /// Wall time from spawn to exit.
    pub duration_ms: u64,
}

/// A `write_file` request; the bytes follow in `Data` frames ended by `End`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteFileRequest {
    /// Destination path; replaced atomically (temp file + rename in the same directory).
    pub path: String,
    /// Permission bits; 0o644 when absent.
    #[serde(default)]
    pub mode: Option<u32>,
    /// Create missing parent directories.
    #[serde(default)]
    pub create_parents: bool,
    /// The guest user who owns the file and the parents this request creates; root
    /// (the agent's own user) when absent.
    #[serde(default)]
    pub owner: Option<String>,
}

/// A `mkdir` request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MkdirRequest {
    /// Directory to create.
    pub path: String,
    /// Create missing parents, and succeed if the directory exists.
    #[serde(default)]
    pub parents: bool,
    /// Permission bits (before umask); 0o755 when absent.
    #[serde(default)]
    pub mode: Option<u32>,
    /// The guest user who owns the directories this request creates; root when absent.
    #[serde(default)]
    pub owner: Option<String>,
}

/// The type of a directory entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileType {
    File,
    Dir,
    Symlink,
    Other,
}

/// One `list` entry, or a `stat` result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileInfo {
    /// Entry name (for `stat`, the last path component).
    pub name: String,
    /// File type (`list` does not follow symlinks; `stat` does).
    pub file_type: FileType,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    /// Modification time, nanoseconds since the Unix epoch (i64: years 1677..2262).
    pub mtime_unix_ns: i64,
    /// The owner's and group's names in the guest (their numbers when the guest's
    /// `/etc/passwd` or `/etc/group` has no line for them). Absent from older agents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Where a symlink points (`list` only, which does not follow links).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<String>,
}

/// How the warm interpreter's evaluation ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum EvalOutcome {
    /// The code ran; `value_repr` is `repr()` of the last expression, if it ended in one.
    Value { value_repr: Option<String> },
    /// The code raised.
    Exception { exception: String, traceback: String },
}

/// The reply to `eval`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvalResponse {
    /// Value or exception.
    pub outcome: EvalOutcome,
    /// What the code printed to `sys.stdout`.
    pub stdout: String,
    /// What the code printed to `sys.stderr`.
    pub stderr: String,
}

/// The `identity` request sent right after a restore.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdentityRequest {
    /// The new sandbox id, reported by `ping` from now on.
    pub sandbox_id: String,
    /// New hostname (`sethostname`).
    pub hostname: String,
    /// Wall clock to set (`clock_settime(CLOCK_REALTIME)`), ns since the Unix epoch.
    pub wall_clock_unix_ns: u64,
    /// Fresh host entropy for the kernel RNG, hex-encoded on the wire.
    #[serde(with = "crate::bytes_hex")]
    pub entropy: Vec<u8>,
    /// Fresh host bytes, apart from `entropy`, that seed the warm interpreter's random
    /// generators (`random`, numpy's global one) in user space: reseeding them from the
    /// guest kernel (`os.urandom`) costs a fork's first answer ~0.2 s where the kernel is
    /// emulated. Empty (an older host): the agent reseeds them from the kernel.
    #[serde(default, with = "crate::bytes_hex", skip_serializing_if = "Vec::is_empty")]
    pub interpreter_seed: Vec<u8>,
}

/// What happened to the identity's entropy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntropyOutcome {
    /// Added with `RNDADDENTROPY` and credited to the kernel's entropy count.
    Credited,
    /// `RNDADDENTROPY` failed; written to `/dev/urandom` (mixed, not credited).
    MixedNotCredited,
    /// No entropy was sent.
    None,
}

/// The reply to `identity`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdentityApplied {
    /// Number of identities applied since the agent started, this one included.
    pub generation: u64,
    /// What happened to the entropy.
    pub entropy: EntropyOutcome,
    /// How long the agent took, by step (absent from older agents).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timings: Option<IdentityTimings>,
}

/// Where an identity's time went inside the guest, in microseconds: the part of a
/// fork's first answer that the host cannot see.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct IdentityTimings {
    /// Hostname, clock, entropy and CRNG reseed: the guest kernel's part.
    pub kernel_us: u64,
    /// Reseeding the warm interpreter's generators (a round trip to it).
    pub interpreter_us: u64,
}

/// The reply to `ping`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pong {
    /// The agent's crate version.
    pub agent_version: String,
    /// The wire protocol version the agent speaks.
    pub protocol_version: u8,
    /// Milliseconds since the agent started (monotonic; includes time before a snapshot).
    pub uptime_ms: u64,
    /// The sandbox id from the last `identity`, if any.
    pub sandbox_id: Option<String>,
    /// Number of identities applied; see the crate doc.
    pub generation: u64,
    /// Whether a warm interpreter is configured.
    pub eval_available: bool,
}

/// A terminal reply; see the conversation table in the crate doc.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Response {
    Pong(Pong),
    Exit(ExitStatus),
    ReadDone {
        bytes: u64,
    },
    Written {
        bytes: u64,
    },
    Entries {
        entries: Vec<FileInfo>,
    },
    Stat(FileInfo),
    Done,
    Eval(EvalResponse),
    Identity(IdentityApplied),
    ShuttingDown,
    Proc(crate::ProcInfo),
    Procs {
        procs: Vec<crate::ProcInfo>,
    },
    /// A file's size and SHA-256 (lowercase hex).
    FileHash {
        size: u64,
        sha256: String,
    },
    Error(AgentError),
}

/// errno-like classification of an operation failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    NotFound,
    PermissionDenied,
    IsADirectory,
    NotADirectory,
    AlreadyExists,
    DirectoryNotEmpty,
    InvalidInput,
    /// The agent cannot do this (e.g. `eval` with no interpreter configured).
    Unsupported,
    /// The warm interpreter died or broke its channel.
    Interpreter,
    /// Any other failure; see `errno` and `message`.
    Io,
}

/// A failed operation: the agent kept serving, only this request failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{kind:?}: {message}")]
pub struct AgentError {
    /// Classification.
    pub kind: ErrorKind,
    /// Human-readable message naming the failed step and path.
    pub message: String,
    /// The raw errno, when the failure came from a syscall.
    #[serde(default)]
    pub errno: Option<i32>,
}

impl AgentError {
    /// An error with no errno.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self { kind, message: message.into(), errno: None }
    }

    /// Classifies an I/O error; `context` names the step, e.g. `"open /etc/x"`.
    pub fn from_io(context: &str, err: &io::Error) -> Self {
        let errno = err.raw_os_error();
        let kind = match errno {
            Some(libc_errno::ENOENT) => ErrorKind::NotFound,
            Some(libc_errno::EACCES | libc_errno::EPERM) => ErrorKind::PermissionDenied,
            Some(libc_errno::EISDIR) => ErrorKind::IsADirectory,
            Some(libc_errno::ENOTDIR) => ErrorKind::NotADirectory,
            Some(libc_errno::EEXIST) => ErrorKind::AlreadyExists,
            Some(libc_errno::ENOTEMPTY) => ErrorKind::DirectoryNotEmpty,
            Some(libc_errno::EINVAL) => ErrorKind::InvalidInput,
            _ => match err.kind() {
                io::ErrorKind::NotFound => ErrorKind::NotFound,
                io::ErrorKind::PermissionDenied => ErrorKind::PermissionDenied,
                io::ErrorKind::AlreadyExists => ErrorKind::AlreadyExists,
                io::ErrorKind::InvalidInput => ErrorKind::InvalidInput,
                _ => ErrorKind::Io,
            },
        };
        Self { kind, message: format!("{context}: {err}"), errno }
    }
}

/// Linux errno values (stable ABI), kept here so the protocol crate needs no libc.
mod libc_errno {
    pub const EPERM: i32 = 1;
    pub const ENOENT: i32 = 2;
    pub const EACCES: i32 = 13;
    pub const EEXIST: i32 = 17;
    pub const ENOTDIR: i32 = 20;
    pub const EISDIR: i32 = 21;
    pub const EINVAL: i32 = 22;
    pub const ENOTEMPTY: i32 = 39;
}

/// Why the agent rejected a frame (payload of an `Error` frame).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProtocolErrorCode {
    BadMagic,
    VersionMismatch,
    UnknownKind,
    Oversized,
    Truncated,
    Malformed,
    /// A well-formed frame of a kind not valid at this point of the conversation.
    UnexpectedFrame,
}

/// Payload of an `Error` frame.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("agent rejected frame ({code:?}): {message}")]
pub struct ProtocolError {
    /// Machine-readable reason.
    pub code: ProtocolErrorCode,
    /// The decoder's message, naming the bad value.
    pub message: String,
    /// The protocol version the agent speaks.
    pub agent_protocol_version: u8,
}

impl ProtocolError {
    /// Maps a frame decoding error to the code the agent reports.
    pub fn from_frame_error(err: &crate::FrameError) -> Self {
        use crate::FrameError as E;
        let code = match err {
            E::BadMagic(_) => ProtocolErrorCode::BadMagic,
            E::VersionMismatch { .. } => ProtocolErrorCode::VersionMismatch,
            E::UnknownKind(_) => ProtocolErrorCode::UnknownKind,
            E::Oversized { .. } => ProtocolErrorCode::Oversized,
            E::Truncated { .. } | E::Closed => ProtocolErrorCode::Truncated,
            _ => ProtocolErrorCode::Malformed,
        };
        Self { code, message: err.to_string(), agent_protocol_version: crate::PROTOCOL_VERSION }
    }
}
