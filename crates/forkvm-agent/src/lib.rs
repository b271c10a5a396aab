//! The forkvm guest agent as a library; `main.rs` only parses flags and calls in.
//!
//! The agent runs inside the guest (as PID 1, or started by it) and serves the
//! `forkvm-proto` protocol over AF_VSOCK (or a Unix socket for host tests): `ping`,
//! streamed `exec`, files, `eval` in one warm Python interpreter, `identity` after a
//! restore, and `shutdown`. Startup order (see `main.rs`):
//!
//! 0. [`xstate::avoid_unsaved_vector_state`] — re-exec with glibc kept off vector
//!    registers the kernel does not save, where that is the case (PVM hosts).
//! 1. [`reaper::Reaper::start`] — block SIGCHLD and start reaping, before any thread.
//! 2. When PID 1: [`init::mount_early`] and the boot hostname.
//! 3. Start the warm interpreter, if configured ([`interp::Interp::start`]).
//! 4. Bind the listener and [`server::Agent::serve`] forever.

pub mod exec;
pub mod exec_defaults;
pub mod files;
pub mod guest_user;
pub mod identity;
pub mod init;
pub mod interp;
pub mod procs;
pub mod reaper;
pub mod server;
pub mod spawn;
pub mod tar_out;
pub mod untar;
pub mod vector_check;
pub mod volumes;
pub mod vsock;
pub mod watch;
pub mod workers;
pub mod xstate;
