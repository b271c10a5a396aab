//! The daemon itself: `GET /healthz`, `/version`, `/metrics`.

use crate::client::Client;
use crate::error::ClientError;
use forkvm_api::{Health, VersionInfo};
use hyper::Method;

impl Client {
    /// `GET /healthz` (needs no token).
    pub fn health(&self) -> Result<Health, ClientError> {
        self.call_json(Method::GET, "/healthz", None::<&()>, "health reply")
    }

    /// `GET /version`.
    pub fn version(&self) -> Result<VersionInfo, ClientError> {
        self.call_json(Method::GET, "/version", None::<&()>, "version reply")
    }

    /// `GET /metrics`: Prometheus text.
    pub fn metrics(&self) -> Result<String, ClientError> {
        self.call_text("/metrics")
    }
}
