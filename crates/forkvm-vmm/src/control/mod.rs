//! The per-VM control channel: a Unix socket speaking JSON lines.
//!
//! Every VMM process listens on its own socket; the daemon (and the CLI, and tests)
//! drive the VM through it: status, pause, resume, snapshot to a directory, serial input,
//! shutdown. One request per line, one response per line:
//!
//! ```text
//! → {"op":"snapshot","dir":"/var/lib/forkvm/snapshots/t1"}
//! ← {"ok":true,"result":{"dir":"...","mem_size_bytes":536870912,...}}
//! → {"op":"pause","extra":1}
//! ← {"ok":false,"error":"bad request: unknown field `extra`, expected `op`"}
//! ```

pub mod client;
pub mod fd_passing;
pub mod protocol;
pub mod server;

pub use client::{ControlClient, ControlClientError};
pub use protocol::{Request, Response};
pub use server::{serve_until_exit, ServeError};
