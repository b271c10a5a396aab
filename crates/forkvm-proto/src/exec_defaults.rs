//! The image's exec defaults: a file the image builder writes and the agent reads, so a
//! template made from an OCI image runs its execs with the image's Env, WorkingDir and
//! User whichever front end (REST, CLI, E2B, MCP) sent them. A request's own env, cwd
//! and user win over these.

use serde::{Deserialize, Serialize};

/// Where the file is in the guest.
pub const EXEC_DEFAULTS_PATH: &str = "/etc/forkvm/exec.json";
/// The most of it the agent reads.
pub const MAX_EXEC_DEFAULTS_BYTES: u64 = 1 << 20;

/// The file's content.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecDefaultsFile {
    /// Variables set before the request's own, in this order.
    #[serde(default)]
    pub env: Vec<(String, String)>,
    #[serde(default)]
    pub cwd: Option<String>,
    /// A user name of the image's `/etc/passwd`.
    #[serde(default)]
    pub user: Option<String>,
}
