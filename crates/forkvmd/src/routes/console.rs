//! `GET /v1/sandboxes/{id}/console`: the end of a sandbox's serial console log, for
//! seeing why a guest stopped or what its kernel printed (the MCP server's console
//! resource reads it). The log is written by the guest, so it is untrusted bytes:
//! bounded here and sent as UTF-8 with invalid sequences replaced.

use crate::error::ApiError;
use crate::extract::{Param, QueryArgs};
use crate::lifecycle::archived_conflict;
use crate::state::AppState;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use forkvm_api::{DEFAULT_CONSOLE_BYTES, MAX_CONSOLE_BYTES};
use forkvm_sandbox::RegistryError;

/// The query of a console read.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsoleArgs {
    /// How many of the log's last bytes; [`DEFAULT_CONSOLE_BYTES`] when absent.
    #[serde(default)]
    pub bytes: Option<u64>,
}

/// The console's last `bytes` of a running or stopped (not yet swept) sandbox.
pub async fn read(
    State(s): State<AppState>,
    Param(id): Param,
    QueryArgs(args): QueryArgs<ConsoleArgs>,
) -> Result<Response, ApiError> {
    let want = args.bytes.unwrap_or(DEFAULT_CONSOLE_BYTES);
    if want == 0 || want > MAX_CONSOLE_BYTES {
        return Err(ApiError::bad_request(format!("bytes must be between 1 and {MAX_CONSOLE_BYTES}, got {want}")));
    }
    let text = s
        .blocking(move |s| {
            let record = match s.registry.lookup(&id) {
                Ok((record, _alive)) => record,
                Err(RegistryError::NotFound(_)) => {
                    return Err(archived_conflict(&s, &id)
                        .unwrap_or_else(|| ApiError::not_found(format!("sandbox {id:?} not found"))))
                }
                Err(e) => return Err(e.into()),
            };
            let tail = forkvm_vmm::devices::console_log::read_tail(&record.console(), want);
            Ok(String::from_utf8_lossy(&tail).into_owned())
        })
        .await?;
    Ok(([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response())
}
