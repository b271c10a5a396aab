//! `forkvm-client`: a typed, blocking client for forkvmd's REST v1 API.
//!
//! It exists so the `forkvm` CLI (and any Rust program) can drive the daemon without
//! writing HTTP by hand, using the very request and reply types the daemon serves
//! (`forkvm-api`), so the two cannot drift apart. It speaks HTTP/1.1 over the daemon's
//! Unix socket, plain TCP, or TLS (system roots or a given CA file), one connection per
//! request, on a small single-threaded runtime the [`Client`] owns.
//!
//! ```no_run
//! use forkvm_client::{Client, Endpoint};
//! let client = Client::new(Endpoint::default_socket(), None)?;
//! for sb in client.list_sandboxes()? {
//!     println!("{} from {:?}", sb.id, sb.snapshot_tag);
//! }
//! # Ok::<(), forkvm_client::ClientError>(())
//! ```
//!
//! Files: `endpoint` (where the daemon is), `client` (the `Client` and its request
//! plumbing), `transport` (sockets, request bodies), `tls` (what an https daemon is
//! trusted by), `encode` (safe URL building),
//! `ndjson` (streamed lines), `error`, and one file per resource: `system`, `snapshots`,
//! `sandboxes`, `files`, `ports` (exposed ports, port forwarding), `processes` and
//! `process_socket` (background processes; one on a WebSocket).

mod client;
mod encode;
mod endpoint;
mod error;
mod file_tar;
mod files;
mod ndjson;
mod ports;
mod process_socket;
mod processes;
mod sandboxes;
mod snapshots;
mod system;
mod templates;
mod tls;
mod transport;
mod volumes;
mod workspaces;

#[cfg(test)]
mod client_tests;
#[cfg(test)]
mod test_server;

pub use client::{token_from_env, Client, ClientOptions};
pub use endpoint::{Endpoint, EndpointError, DAEMON_ENV, SOCKET_NAME};
pub use error::{ClientError, ErrorCode};
pub use files::WriteFileOptions;
pub use forkvm_api as api;
pub use ports::ForwardErrors;
pub use process_socket::{ProcessSocket, SocketEvent, SocketInput};
pub use sandboxes::ExecExit;
