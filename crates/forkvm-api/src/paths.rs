//! Where a client finds the daemon without being told: the run root and the API socket
//! in it. Part of the API's contract (the CLI, the Rust client, the daemon and the SDKs
//! must agree), so it lives here rather than with the sandbox registry that also uses
//! the run root; clients then need nothing of the sandbox crates.

use std::path::PathBuf;

/// The daemon's API socket's file name inside the run root.
pub const SOCKET_NAME: &str = "forkvmd.sock";

/// The run root: `$FORKVM_RUN`, else `$XDG_RUNTIME_DIR/forkvm`, else `/run/forkvm` for
/// root, else `<tmp>/forkvm-<uid>`.
pub fn default_run_root() -> PathBuf {
    if let Some(v) = std::env::var_os("FORKVM_RUN").filter(|v| !v.is_empty()) {
        return PathBuf::from(v);
    }
    if let Some(v) = std::env::var_os("XDG_RUNTIME_DIR").filter(|v| !v.is_empty()) {
        return PathBuf::from(v).join("forkvm");
    }
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    if uid == 0 {
        PathBuf::from("/run/forkvm")
    } else {
        std::env::temp_dir().join(format!("forkvm-{uid}"))
    }
}

/// The daemon's default API socket: `<run root>/forkvmd.sock`.
pub fn default_socket() -> PathBuf {
    default_run_root().join(SOCKET_NAME)
}
