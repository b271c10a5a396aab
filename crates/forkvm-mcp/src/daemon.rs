//! The forkvmd connection the tools share. `forkvm_client::Client` is blocking (it
//! drives its own small runtime), so each call runs on tokio's blocking pool and an MCP
//! session stays responsive while a long exec or snapshot build is under way.

use forkvm_client::{Client, ClientError};
use std::sync::Arc;

/// A failed daemon call, worded for the agent that made it: the daemon's own message
/// (with its HTTP status), or why the daemon could not be reached.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("{0}")]
    Daemon(#[from] ClientError),
    #[error("the daemon call stopped before it answered: {0}")]
    Aborted(String),
    #[error("{0}")]
    Invalid(String),
}

/// The daemon the MCP server drives (cheap to clone).
#[derive(Debug, Clone)]
pub struct Daemon {
    client: Arc<Client>,
}

impl Daemon {
    pub fn new(client: Client) -> Daemon {
        Daemon { client: Arc::new(client) }
    }

    /// Runs one blocking client call off the async runtime.
    pub async fn call<T, F>(&self, f: F) -> Result<T, CallError>
    where
        T: Send + 'static,
        F: FnOnce(&Client) -> Result<T, ClientError> + Send + 'static,
    {
        let client = Arc::clone(&self.client);
        match tokio::task::spawn_blocking(move || f(&client)).await {
            Ok(result) => result.map_err(CallError::from),
            Err(e) => Err(CallError::Aborted(e.to_string())),
        }
    }
}
