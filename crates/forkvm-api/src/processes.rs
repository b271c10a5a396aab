//! Background processes (`/v1/sandboxes/{id}/processes*`): commands that run on after
//! the request that started them, each with its output kept in a bounded ring that any
//! later request reads from an offset, with input, signals and, on a terminal, resizes.
//! docs/processes.md.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A terminal's size in character cells (1..=1000 each).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TerminalSize {
    pub rows: u16,
    pub cols: u16,
}

/// forkvm: `POST /v1/sandboxes/{id}/processes`: start `args` (or `cmd` through `sh -c`)
/// in the background; answered 201 with its [`ProcessInfo`] once it runs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StartProcessRequest {
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub cmd: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub cwd: Option<String>,
    /// A guest user to run as (a name or uid in the guest); the image's default, else
    /// root, when absent.
    #[serde(default)]
    pub user: Option<String>,
    /// Run on a new terminal of this size (its output is one stream, `stdout`).
    #[serde(default)]
    pub pty: Option<TerminalSize>,
    /// A name of the caller's, listed with the process (at most 128 bytes).
    #[serde(default)]
    pub tag: Option<String>,
    /// Output bytes to keep (1 MiB when absent, at most 16 MiB).
    #[serde(default)]
    pub ring_bytes: Option<u64>,
    /// Kill its process group after this long (1 s to a day); it runs until it ends
    /// when absent.
    #[serde(default)]
    pub timeout_secs: Option<u64>,
}

/// How a background process ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ProcessExit {
    /// Its code, else 128 + the signal that ended it, else 124 after its timeout.
    pub exit_code: i32,
    #[serde(default)]
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub duration_ms: u64,
}

/// One background process of a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ProcessInfo {
    /// Its pid in the guest (also its process group's).
    pub pid: u32,
    /// What runs (`cmd` as `/bin/sh -c CMD`).
    pub argv: Vec<String>,
    #[serde(default)]
    pub tag: Option<String>,
    /// Its terminal's size, when it runs on one.
    #[serde(default)]
    pub pty: Option<TerminalSize>,
    pub started_at_unix_ms: u64,
    /// The offset after the last byte of output so far (stdout and stderr together).
    pub output_end: u64,
    /// The offset of the oldest byte still kept.
    pub output_start: u64,
    pub stdin_open: bool,
    pub running: bool,
    /// How it ended; absent while it runs.
    #[serde(default)]
    pub exit: Option<ProcessExit>,
}

/// forkvm: the query of `GET /v1/sandboxes/{id}/processes/{pid}/output`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcessOutputQuery {
    /// Where to start (the oldest byte kept when absent).
    #[serde(default)]
    pub offset: Option<u64>,
    /// Keep streaming until the process ends.
    #[serde(default)]
    pub follow: bool,
}

/// forkvm: one line of `GET /v1/sandboxes/{id}/processes/{pid}/output` (NDJSON): `from`
/// first (and again when a follower fell behind the ring), output as it comes, a
/// `keepalive` after 5 s without any, and `end` (or `error`) last.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ProcessOutputEvent {
    /// The output that follows starts at `offset`; `skipped` bytes asked for had left
    /// the ring.
    From {
        offset: u64,
        skipped: u64,
    },
    /// Bytes the process wrote: `stream` is `stdout` or `stderr`, `offset` that of the
    /// first byte, `data` the bytes in base64.
    Output {
        stream: String,
        offset: u64,
        data: String,
    },
    Keepalive,
    /// The process ended and all its output came (following), or all output so far
    /// came.
    End {
        process: ProcessInfo,
    },
    Error {
        error: String,
    },
}

/// forkvm: the query of `POST /v1/sandboxes/{id}/processes/{pid}/input` (the body is
/// the bytes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcessInputQuery {
    /// Close its stdin after the bytes (on a terminal: send end-of-file).
    #[serde(default)]
    pub close: bool,
}

/// forkvm: the reply to `POST /v1/sandboxes/{id}/processes/{pid}/input`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ProcessInputWritten {
    pub bytes: u64,
}

/// forkvm: `POST /v1/sandboxes/{id}/processes/{pid}/signal`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SignalProcessRequest {
    /// 1..=64.
    pub signal: i32,
}

/// forkvm: the query of `GET /v1/sandboxes/{id}/processes/{pid}/attach`, a WebSocket
/// that carries a process's output out and its input in (docs/processes.md): binary
/// messages out are output, their first byte the stream (1 stdout, 2 stderr); text
/// messages out are [`ProcessOutputEvent`] lines other than `output`. Binary messages
/// in are stdin; text messages in are [`ProcessControl`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcessAttachQuery {
    /// Where the output starts (the oldest byte kept when absent).
    #[serde(default)]
    pub offset: Option<u64>,
}

/// forkvm: a text message a client sends on `.../processes/{pid}/attach`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ProcessControl {
    /// The terminal's new size (1..=1000 each).
    Resize { rows: u16, cols: u16 },
    /// Ends the process's input (on a terminal: end-of-file).
    CloseStdin,
    /// A signal (1..=64) to the process's group.
    Signal { signal: i32 },
}

/// The first byte of a binary output message on `.../attach`: the stream it came from.
pub const ATTACH_STDOUT: u8 = 1;
/// See [`ATTACH_STDOUT`].
pub const ATTACH_STDERR: u8 = 2;
