//! Liveness, version and metrics.

use crate::state::AppState;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::Json;
use forkvm_api::{Health, VersionInfo, API_VERSION};

pub async fn health() -> Json<Health> {
    Json(Health { ok: true })
}

pub async fn version() -> Json<VersionInfo> {
    Json(VersionInfo { version: env!("CARGO_PKG_VERSION").to_string(), api: API_VERSION.to_string() })
}

pub async fn metrics(State(s): State<AppState>) -> impl IntoResponse {
    let text = s
        .blocking(|s| Ok(s.metrics.render(s.gauges())))
        .await
        .unwrap_or_else(|e| format!("# metrics unavailable: {}\n", e.message));
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text)
}
