//! The JSON shapes of E2B's control plane, as its shipped SDKs send and read them
//! (`e2b` 2.63 on PyPI, 2.51 on npm; `../shared/reference/e2b-api.md` §2): camelCase
//! fields, RFC 3339 times, and `{"code","message"}` errors, which the Python SDK
//! requires on every error status (it crashes on any other body).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The envd version forkvm reports. It gates what the SDKs use (e2b-api.md §2.2):
/// ≥ 0.4.0 means the server picks the default user (no `Authorization` header from the
/// SDK); from 0.5.2 the SDKs send `close_stdin` (`process.Process/CloseStdin`, served);
/// below 0.5.7 they upload as multipart only, below 0.6.2 they send no file metadata.
/// Every feature gated at or below this version is served.
pub const ENVD_VERSION: &str = "0.5.2";
/// `clientID` is required by the SDKs and means nothing to them.
pub const CLIENT_ID: &str = "forkvm";
/// A sandbox's lifetime when create names none (E2B's default).
pub const DEFAULT_TIMEOUT_SECS: u64 = 300;
/// The longest lifetime one call may ask (E2B Pro's 24 hours).
pub const MAX_TIMEOUT_SECS: u64 = 86_400;

/// `POST /v2/sandboxes` and v1 `POST /sandboxes`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NewSandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    pub timeout: Option<u64>,
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub env_vars: Option<BTreeMap<String, String>>,
    /// Pause instead of kill at the end of the lifetime.
    #[serde(default)]
    pub auto_pause: Option<bool>,
    // Accepted and not acted on (docs/e2b.md says which): secure (always), network,
    // allow_internet_access, mcp, volumeMounts, autoResume.
}

/// `POST /v2/sandboxes/{id}/connect`, v1 `.../connect` and the old `.../resume`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ConnectSandbox {
    pub timeout: Option<u64>,
}

/// `POST /sandboxes/{id}/timeout`.
#[derive(Debug, Clone, Deserialize)]
pub struct SetTimeout {
    pub timeout: u64,
}

/// The reply to create and connect.
#[derive(Debug, Clone, Serialize)]
pub struct Sandbox {
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "clientID")]
    pub client_id: &'static str,
    #[serde(rename = "envdVersion")]
    pub envd_version: &'static str,
    #[serde(rename = "envdAccessToken")]
    pub envd_access_token: String,
    #[serde(rename = "trafficAccessToken")]
    pub traffic_access_token: Option<String>,
    pub domain: Option<String>,
}

/// `GET /sandboxes/{id}` (with `envdAccessToken` and `domain`) and the items of the lists
/// (without them).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxDetail {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "clientID")]
    pub client_id: &'static str,
    pub envd_version: &'static str,
    pub started_at: String,
    pub end_at: String,
    pub cpu_count: u32,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u64,
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: u64,
    /// `running` or `paused`: the Python SDK refuses any other value.
    pub state: &'static str,
    pub metadata: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub envd_access_token: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<Lifecycle>,
}

/// What happens at the end of a sandbox's lifetime.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Lifecycle {
    /// `kill` or `pause`.
    pub on_timeout: &'static str,
    pub auto_resume: bool,
}

/// One sample of `GET /sandboxes/{id}/metrics` (every field required by the SDKs).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxMetric {
    pub timestamp: String,
    pub timestamp_unix: u64,
    pub cpu_count: u32,
    pub cpu_used_pct: f64,
    pub mem_used: u64,
    pub mem_total: u64,
    pub mem_cache: u64,
    pub disk_used: u64,
    pub disk_total: u64,
}

/// An error as E2B's control plane answers it: `{"code": <status>, "message": ...}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct E2bError {
    pub status: StatusCode,
    pub message: String,
}

impl E2bError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> E2bError {
        E2bError { status, message: message.into() }
    }
    pub fn bad_request(message: impl Into<String>) -> E2bError {
        E2bError::new(StatusCode::BAD_REQUEST, message)
    }
    pub fn not_found(message: impl Into<String>) -> E2bError {
        E2bError::new(StatusCode::NOT_FOUND, message)
    }
    pub fn conflict(message: impl Into<String>) -> E2bError {
        E2bError::new(StatusCode::CONFLICT, message)
    }
    pub fn internal(message: impl Into<String>) -> E2bError {
        E2bError::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }
}

impl From<crate::error::ApiError> for E2bError {
    fn from(e: crate::error::ApiError) -> E2bError {
        E2bError::new(e.status(), e.message)
    }
}

impl IntoResponse for E2bError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "code": self.status.as_u16(), "message": self.message });
        (self.status, axum::Json(body)).into_response()
    }
}

pub use crate::audit::rfc3339_ms as rfc3339;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_in_utc() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(rfc3339(1_796_427_296_000), "2026-12-04T23:34:56.000Z");
    }

    #[test]
    fn errors_carry_code_and_message() {
        let r = E2bError::not_found("sandbox \"x\" not found").into_response();
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
    }
}
