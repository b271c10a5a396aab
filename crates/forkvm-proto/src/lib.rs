//! The host↔guest agent protocol, shared by `forkvm-agent` (guest) and the host.
//!
//! It exists so both sides agree on one framed, versioned wire format and one set of
//! message types, and so the host has a ready client ([`AgentClient`]).
//!
//! # Frames
//!
//! Every frame is an 8-byte header followed by a payload:
//!
//! | offset | size | field            | value                                   |
//! |--------|------|------------------|-----------------------------------------|
//! | 0      | 2    | magic            | `b"FV"`                                 |
//! | 2      | 1    | protocol version | [`PROTOCOL_VERSION`] (1)                |
//! | 3      | 1    | frame kind       | see the kind table                      |
//! | 4      | 4    | payload length   | u32 little endian, ≤ [`MAX_PAYLOAD`]    |
//!
//! | kind | name       | direction     | payload                                         |
//! |------|------------|---------------|-------------------------------------------------|
//! | 0x01 | `Request`  | host → agent  | JSON [`Request`]                                |
//! | 0x02 | `Response` | agent → host  | JSON [`Response`] (always the last frame)       |
//! | 0x03 | `Stdin`    | host → agent  | raw bytes for the exec's stdin                  |
//! | 0x04 | `Stdout`   | agent → host  | raw bytes the process wrote to stdout           |
//! | 0x05 | `Stderr`   | agent → host  | raw bytes the process wrote to stderr           |
//! | 0x06 | `Data`     | both          | raw file bytes (`read_file` / `write_file`)     |
//! | 0x07 | `End`      | host → agent  | empty: end of a `Stdin` or `Data` stream        |
//! | 0x08 | `Started`  | agent → host  | JSON [`Started`]: the exec's pid (when asked)   |
//! | 0x09 | `Watch`    | agent → host  | JSON [`WatchMessage`]: a watch's news           |
//! | 0x0a | `ProcNews` | agent → host  | JSON [`ProcNews`]: an attachment's news         |
//! | 0x0b | `Control`  | host → agent  | JSON [`ProcControl`]: resize, end of input      |
//! | 0x7f | `Error`    | agent → host  | JSON [`ProtocolError`]: the frame was rejected  |
//!
//! # Conversations
//!
//! One request per connection: the host opens a new stream (a vsock connection is cheap)
//! for every request, so concurrent requests are concurrent connections. Each connection
//! carries exactly one of these exchanges and is then closed by the agent:
//!
//! | request                  | host then sends      | agent sends                                   |
//! |--------------------------|----------------------|-----------------------------------------------|
//! | `ping`                   | —                    | `Response::Pong`                              |
//! | `exec` (`stdin: false`)  | —                    | `Stdout`/`Stderr`*, `Response::Exit`          |
//! | `exec` (`stdin: true`)   | `Stdin`*, `End`      | `Stdout`/`Stderr`*, `Response::Exit`          |
//! | `exec` (`report_start`)  | as above             | `Started`, then as above                      |
//! | `signal`                 | —                    | `Response::Done`                              |
//! | `read_file`              | —                    | `Data`*, `Response::ReadDone`                 |
//! | `write_file`             | `Data`*, `End`       | `Response::Written`                           |
//! | `untar`                  | `Data`*, `End`       | `Response::Written`                           |
//! | `tar`                    | —                    | `Data`* (a tar archive), `Response::ReadDone` |
//! | `hash_file`              | —                    | `Response::FileHash`                          |
//! | `list` / `stat`          | —                    | `Response::Entries` / `Response::Stat`        |
//! | `mkdir` / `remove` / `rename` | —               | `Response::Done`                              |
//! | `eval`                   | —                    | `Response::Eval`                              |
//! | `identity`               | —                    | `Response::Identity`                          |
//! | `shutdown`               | —                    | `Response::ShuttingDown`, then the guest resets |
//! | `watch`                  | `End` (to stop)      | `Watch`* (`armed` first), `Response::Done`    |
//! | `proc_start`             | —                    | `Response::Proc`                              |
//! | `proc_list`              | —                    | `Response::Procs`                             |
//! | `proc_attach`            | `Stdin`*/`Control`*, hang-up to detach | `ProcNews` (`attached`), `Stdout`/`Stderr`*, `Response::Proc` |
//! | `proc_input`             | `Stdin`*, `End`      | `Response::Written`                           |
//! | `proc_resize`            | —                    | `Response::Done`                              |
//!
//! Any operation may end with `Response::Error` ([`AgentError`]: errno-like kind +
//! message) instead. A frame the agent cannot accept (bad magic, other version, unknown
//! kind, oversized, malformed JSON, a frame of the wrong kind) is answered with an
//! `Error` frame naming the problem; the agent then closes that connection and keeps
//! serving others. The host sends all of its `Stdin`/`Data` before reading; the agent
//! queues output meanwhile, so this cannot deadlock.
//!
//! # Identity after restore
//!
//! Every clone restored from one snapshot starts with the same hostname, clock and RNG
//! state. The host drives the fix-up: right after a restore it sends `identity` before
//! any other request. The agent does not gate other requests on it; instead it counts
//! applied identities in `generation` (reported by `ping` and in the identity reply), so
//! the host can check that the identity it sent is the one in force.

mod bytes_hex;
mod client;
mod client_procs;
pub mod exec_defaults;
mod frame;
mod msg;
pub mod procs;
pub mod trusted_peer;
pub mod vector_check;
mod vsock;

pub use client::{idle_limit, AgentClient, ClientError, ExecOutput, IdleLimit, WatchStream};
pub use client_procs::{ProcAttachment, ProcEvent, ProcInput};
pub use frame::{
    read_frame, write_frame, write_json, Frame, FrameError, FrameKind, DATA_CHUNK, HEADER_LEN, MAGIC, MAX_PAYLOAD,
    PROTOCOL_VERSION,
};
pub use msg::{
    AgentError, ChangeKind, Command, EntropyOutcome, ErrorKind, EvalOutcome, EvalResponse, ExecRequest, ExitStatus,
    FileInfo, FileType, IdentityApplied, IdentityRequest, IdentityTimings, MkdirRequest, MountVolumeRequest, Pong,
    ProtocolError, ProtocolErrorCode, Request, Response, SignalRequest, Started, UntarRequest, WatchMessage,
    WatchRequest, WriteFileRequest,
};
pub use procs::{
    ProcAttachRequest, ProcControl, ProcInfo, ProcInputRequest, ProcNews, ProcResizeRequest, ProcStartRequest, PtySize,
};
pub use vsock::{connect_vsock_uds, connect_vsock_uds_within, VsockConnectError};
