//! `ClientError`: one variant per step that can fail (find the daemon, connect, TLS,
//! send, receive, decode) plus the daemon's own refusals (`Api`), so a caller can tell
//! "the daemon is not running" from "the daemon said no" without parsing text.

use crate::endpoint::EndpointError;
pub use forkvm_api::ErrorCode;
use std::path::PathBuf;

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    #[error("starting the client's I/O runtime")]
    Runtime(#[source] std::io::Error),
    #[error("loading CA certificates from {}", path.display())]
    CaCert {
        path: PathBuf,
        #[source]
        source: BoxError,
    },
    #[error("connecting to the daemon at {endpoint}")]
    Connect {
        endpoint: String,
        #[source]
        source: std::io::Error,
    },
    #[error("TLS with the daemon at {endpoint}")]
    Tls {
        endpoint: String,
        #[source]
        source: BoxError,
    },
    /// An argument that cannot name anything (an empty id, say), refused before sending.
    #[error("{what} {value:?}: {reason}")]
    InvalidArgument { what: &'static str, value: String, reason: &'static str },
    #[error("sending {request} to the daemon")]
    Send {
        request: String,
        #[source]
        source: BoxError,
    },
    #[error("reading the daemon's reply to {request}")]
    Receive {
        request: String,
        #[source]
        source: BoxError,
    },
    #[error("the daemon's reply to {request} exceeds {limit} bytes")]
    TooLarge { request: String, limit: usize },
    /// The reply was not the JSON the API promises; `body` is its start, for a human.
    #[error("decoding the daemon's {what} (reply starts {body:?})")]
    Decode {
        what: &'static str,
        #[source]
        source: serde_json::Error,
        body: String,
    },
    /// The daemon answered with an error status; `message` is its `error` text.
    #[error("{message}")]
    Api { status: u16, code: ErrorCode, message: String, state: Option<String> },
    /// An `exec/stream` reply ended with an `error` line instead of `exit`.
    #[error("{message}")]
    Stream { message: String },
    #[error("the daemon's exec stream ended without an exit line")]
    Truncated,
    #[error("writing the downloaded bytes")]
    Sink(#[source] std::io::Error),
    #[error("reading the bytes to upload")]
    Source(#[source] std::io::Error),
    /// A local file given to upload could not be opened.
    #[error("opening {} to upload it", path.display())]
    OpenFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl ClientError {
    /// The HTTP status, for an error the daemon answered with.
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Api { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The daemon's machine-readable code (`not_found`, `conflict`, ...).
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Api { code, .. } => Some(*code),
            _ => None,
        }
    }

    pub fn is_not_found(&self) -> bool {
        self.status() == Some(404)
    }

    /// True when no daemon could be reached at all (nothing listening, refused, timeout).
    pub fn is_unreachable(&self) -> bool {
        matches!(self, ClientError::Connect { .. })
    }
}

/// At most this many characters of a bad reply go into an error.
const EXCERPT_CHARS: usize = 200;

pub(crate) fn excerpt(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let mut out: String = text.chars().take(EXCERPT_CHARS).collect();
    if text.chars().nth(EXCERPT_CHARS).is_some() {
        out.push('…');
    }
    out
}

/// The error for a non-2xx reply: the daemon's `{"error","code","state"}` body, or for
/// anything else (a proxy's HTML page, an empty body) the status and a body excerpt.
pub(crate) fn api_error(status: u16, reason: &str, body: &[u8]) -> ClientError {
    match serde_json::from_slice::<forkvm_api::ErrorBody>(body) {
        Ok(b) => ClientError::Api {
            status,
            // forkd sends no code; a newer daemon may send one this build does not know.
            code: if b.code == ErrorCode::Unknown { ErrorCode::from_http_status(status) } else { b.code },
            message: b.error,
            state: b.state,
        },
        Err(_) => {
            let text = excerpt(body);
            let text = text.trim();
            let message = if text.is_empty() {
                format!("the daemon answered HTTP {status} {reason}")
            } else {
                format!("the daemon answered HTTP {status} {reason}: {text}")
            };
            ClientError::Api { status, code: ErrorCode::from_http_status(status), message, state: None }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_the_daemon_error_body() {
        let e = api_error(409, "Conflict", br#"{"error":"snapshot t is writing","code":"conflict","state":"writing"}"#);
        let ClientError::Api { status, code, message, state } = &e else { panic!("{e:?}") };
        assert_eq!(
            (*status, *code, message.as_str(), state.as_deref()),
            (409, ErrorCode::Conflict, "snapshot t is writing", Some("writing"))
        );
        assert_eq!(e.to_string(), "snapshot t is writing");
        assert_eq!(e.code(), Some(ErrorCode::Conflict));
    }

    #[test]
    fn a_forkd_body_without_code_gets_one_from_the_status() {
        let e = api_error(404, "Not Found", br#"{"error":"no sandbox x"}"#);
        assert!(e.is_not_found());
        assert_eq!(e.code(), Some(ErrorCode::NotFound));
        assert_eq!(e.to_string(), "no sandbox x");
    }

    #[test]
    fn a_non_json_body_keeps_status_and_excerpt() {
        let e = api_error(502, "Bad Gateway", b"<html>upstream down</html>");
        assert_eq!(e.to_string(), "the daemon answered HTTP 502 Bad Gateway: <html>upstream down</html>");
        assert_eq!(e.code(), Some(ErrorCode::Internal));
        let e = api_error(500, "Internal Server Error", b"");
        assert_eq!(e.to_string(), "the daemon answered HTTP 500 Internal Server Error");
    }

    #[test]
    fn excerpts_are_capped() {
        let long = "é".repeat(500);
        let x = excerpt(long.as_bytes());
        assert_eq!(x.chars().count(), EXCERPT_CHARS + 1);
        assert!(x.ends_with('…'));
    }
}
