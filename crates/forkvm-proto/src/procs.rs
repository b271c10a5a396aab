//! Messages of background processes: commands the agent starts and keeps, each with its
//! output in a bounded ring, that any number of later connections attach to (from an
//! offset), feed input to, resize and signal, while the process outlives every one of
//! them. A terminal (`pty`) is one such process whose output is a single stream.
//!
//! Offsets count every byte the process wrote, on all of its streams together, since it
//! started; the ring keeps the last [`ProcStartRequest::ring_bytes`] of them. An attach
//! from an offset the ring no longer holds starts at the oldest byte it holds and says
//! how many were skipped.

use serde::{Deserialize, Serialize};

use crate::{Command, ExitStatus};

/// Bytes of output a process's ring keeps when the request names none.
pub const DEFAULT_RING_BYTES: u64 = 1 << 20;
/// The most a request may ask a ring to keep.
pub const MAX_RING_BYTES: u64 = 16 << 20;
/// Processes the agent keeps at once, running or ended (the oldest ended ones go first).
pub const MAX_PROCS: usize = 64;
/// Bytes of a tag.
pub const MAX_TAG: usize = 128;

/// A terminal's size in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtySize {
    pub rows: u16,
    pub cols: u16,
}

impl PtySize {
    /// Whether both sides are in 1..=1000 (what a terminal could have).
    pub fn is_valid(&self) -> bool {
        (1..=1000).contains(&self.rows) && (1..=1000).contains(&self.cols)
    }
}

/// A `proc_start` request: run `command` in the background.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcStartRequest {
    pub command: Command,
    /// Extra environment, applied over the agent's own and the image's defaults.
    #[serde(default)]
    pub env: Vec<(String, String)>,
    #[serde(default)]
    pub cwd: Option<String>,
    /// A guest user to run as (as `exec`'s).
    #[serde(default)]
    pub user: Option<String>,
    /// Run on a new terminal of this size: stdin, stdout and stderr are the terminal,
    /// the process leads a session whose controlling terminal it is, and its output is
    /// one stream. Without it: pipes, stdin open until closed.
    #[serde(default)]
    pub pty: Option<PtySize>,
    /// A name of the caller's, listed with the process.
    #[serde(default)]
    pub tag: Option<String>,
    /// Output bytes to keep; [`DEFAULT_RING_BYTES`] when absent, at most
    /// [`MAX_RING_BYTES`].
    #[serde(default)]
    pub ring_bytes: Option<u64>,
    /// Kill the process group after this long.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

impl ProcStartRequest {
    /// `command` with nothing else asked: no terminal, the default ring, no timeout.
    pub fn new(command: Command) -> ProcStartRequest {
        ProcStartRequest {
            command,
            env: Vec::new(),
            cwd: None,
            user: None,
            pty: None,
            tag: None,
            ring_bytes: None,
            timeout_ms: None,
        }
    }

    /// A `sh -c` script with nothing else asked.
    pub fn shell(script: impl Into<String>) -> ProcStartRequest {
        ProcStartRequest::new(Command::Shell(script.into()))
    }
}

/// What the agent knows of one background process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcInfo {
    /// Its pid in the guest, also its process group's (and session's, on a terminal).
    pub pid: u32,
    /// The command as started (argv, or `sh -c SCRIPT`).
    pub argv: Vec<String>,
    #[serde(default)]
    pub tag: Option<String>,
    /// The terminal's size, when it runs on one.
    #[serde(default)]
    pub pty: Option<PtySize>,
    /// Milliseconds since the Unix epoch, by the guest's clock.
    pub started_at_unix_ms: u64,
    /// Offset after the last byte of output so far.
    pub output_end: u64,
    /// Offset of the oldest byte the ring still holds.
    pub output_start: u64,
    /// Whether its stdin still takes input.
    pub stdin_open: bool,
    /// How it ended; absent while it runs.
    #[serde(default)]
    pub exit: Option<ExitStatus>,
}

/// A `proc_attach` request: stream a process's output from `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcAttachRequest {
    pub pid: u32,
    /// Where to start; the oldest byte kept when absent.
    #[serde(default)]
    pub offset: Option<u64>,
    /// Keep streaming until the process ends (else: until the output so far is sent).
    #[serde(default)]
    pub follow: bool,
}

/// A `proc_input` request: the `Stdin` frames that follow (to `End`) go to the process's
/// stdin (its terminal, on one); `close` closes its stdin after them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcInputRequest {
    pub pid: u32,
    #[serde(default)]
    pub close: bool,
}

/// A `proc_resize` request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcResizeRequest {
    pub pid: u32,
    pub size: PtySize,
}

/// Payload of a `ProcNews` frame, agent → host, on an attached connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ProcNews {
    /// Always first: the output frames that follow start at `offset`; `skipped` bytes
    /// asked for had already left the ring.
    Attached { offset: u64, skipped: u64 },
    /// Nothing new for a while; the attachment is alive.
    Keepalive,
}

/// Payload of a `Control` frame, host → agent, on an attached connection (beside
/// `Stdin` frames, which go to the process).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ProcControl {
    /// The terminal's new size.
    Resize { size: PtySize },
    /// Close the process's stdin (end of input; on a terminal, its EOF character).
    CloseStdin,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn news_and_controls_are_tagged_by_type() {
        let news = serde_json::to_string(&ProcNews::Attached { offset: 3, skipped: 1 }).unwrap();
        assert_eq!(news, r#"{"type":"attached","offset":3,"skipped":1}"#);
        let c: ProcControl = serde_json::from_str(r#"{"type":"resize","size":{"rows":24,"cols":80}}"#).unwrap();
        assert_eq!(c, ProcControl::Resize { size: PtySize { rows: 24, cols: 80 } });
    }

    #[test]
    fn terminal_sizes_are_bounded() {
        assert!(PtySize { rows: 24, cols: 80 }.is_valid());
        assert!(!PtySize { rows: 0, cols: 80 }.is_valid());
        assert!(!PtySize { rows: 24, cols: 5000 }.is_valid());
    }
}
