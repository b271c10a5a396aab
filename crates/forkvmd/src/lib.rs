//! forkvmd: the controller daemon. It answers forkd's REST v1 (same paths and JSON
//! shapes, so forkd's clients work unchanged) and adds files, streamed exec, forking a
//! running sandbox, a Unix-socket listener, and re-attaching to running sandboxes after
//! a restart.
//!
//! Sandboxes are separate VMM processes that outlive the daemon; the daemon drives them
//! through their control sockets and agents, keeps its own records in SQLite (see
//! [`db`]), and on start reconciles those records with what runs ([`reconcile`]).
//! Spawning forks, which a multi-threaded process must not do, so a single-threaded
//! helper forked before the runtime starts does it ([`spawner`]).

pub mod audit;
pub mod auth;
pub mod checkpoints;
pub mod daemon;
pub mod db;
pub mod disk;
pub mod dpop;
pub mod e2b;
pub mod error;
pub mod extract;
pub mod gate;
pub mod lifecycle;
pub mod metrics;
mod own_cgroup;
pub mod port_auth;
pub mod port_proxy;
pub mod reconcile;
pub mod replicate_branch;
pub mod routes;
pub mod serve;
pub mod spawner;
pub mod state;
pub mod sweeper;
#[cfg(test)]
mod test_util;
pub mod ui;
pub mod views;
pub mod workspaces;

pub use daemon::{run, DaemonConfig, DaemonError};
pub use state::AppState;

/// The API's router over `state`, without authentication or audit (those wrap it per
/// listener, see [`serve::wrap`]); in-process tests call it directly.
pub fn app(state: AppState) -> axum::Router {
    // Ahead of the routes: a port's own origin is the guest's, every path of it.
    routes::router(state.clone()).layer(axum::middleware::from_fn_with_state(state, port_proxy::own_origin))
}
