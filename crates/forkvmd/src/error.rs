//! One error type for every handler: an HTTP status, a machine-readable code, the
//! message a user reads, and for conflicts the object's current state. Library errors
//! map onto it by their own `code()`, so the REST status of a failure is decided where
//! the failure is understood, not re-guessed here.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use forkvm_api::ErrorBody;

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub state: Option<String>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, code, message: message.into(), state: None }
    }
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }
    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
    }
    pub fn conflict(message: impl Into<String>, state: impl Into<String>) -> ApiError {
        ApiError { state: Some(state.into()), ..ApiError::new(StatusCode::CONFLICT, "conflict", message) }
    }
    pub fn unauthorized(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }
    pub fn busy(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "busy", message)
    }
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }

    /// From a library error's code (`not_found`, `conflict`, `bad_request`, `disk_full`,
    /// anything else is internal) and message.
    pub fn from_code(code: &str, message: impl Into<String>) -> ApiError {
        let message = message.into();
        match code {
            "not_found" => ApiError::not_found(message),
            "bad_request" => ApiError::bad_request(message),
            "conflict" => ApiError::conflict(message, "conflict"),
            "disk_full" => ApiError::new(StatusCode::INSUFFICIENT_STORAGE, "disk_full", message),
            _ => ApiError::internal(message),
        }
    }

    pub fn body(&self) -> ErrorBody {
        ErrorBody { error: self.message.clone(), code: self.code.to_string(), state: self.state.clone() }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body())).into_response()
    }
}

impl From<forkvm_snapshot::StoreError> for ApiError {
    fn from(e: forkvm_snapshot::StoreError) -> ApiError {
        use forkvm_snapshot::StoreError;
        let state = match &e {
            StoreError::Writing { .. } => Some("writing"),
            StoreError::Abandoned { .. } => Some("abandoned"),
            StoreError::Exists { .. } => Some("exists"),
            // It exists but cannot be used: incomplete or unreadable files.
            StoreError::Invalid { .. } => return ApiError::conflict(e.to_string(), "not_bootable"),
            _ => None,
        };
        let mut out = ApiError::from_code(e.code(), e.to_string());
        if let Some(s) = state {
            out.state = Some(s.to_string());
        }
        out
    }
}

impl From<forkvm_sandbox::SourceError> for ApiError {
    fn from(e: forkvm_sandbox::SourceError) -> ApiError {
        match e {
            forkvm_sandbox::SourceError::Store(s) => s.into(),
            // A missing head is a 404 and a broken link a 409, as the chain decides.
            forkvm_sandbox::SourceError::Chain(c) => c.into(),
            // A snapshot that exists but cannot be spawned from is in the wrong state.
            other => ApiError::conflict(other.to_string(), "not_bootable"),
        }
    }
}

impl From<forkvm_snapshot::chain::ChainError> for ApiError {
    fn from(e: forkvm_snapshot::chain::ChainError) -> ApiError {
        use forkvm_snapshot::chain::ChainError;
        use forkvm_snapshot::PackError;
        match e {
            ChainError::Store(s) => s.into(),
            // The host failed to read or write a pack file: not the pack's fault.
            ChainError::Pack(PackError::Io { source, .. }) if source.raw_os_error() == Some(libc::ENOSPC) => {
                ApiError::new(StatusCode::INSUFFICIENT_STORAGE, "disk_full", format!("no space left: {source}"))
            }
            ChainError::Pack(p @ PackError::Io { .. }) => ApiError::internal(p.to_string()),
            other => {
                let message = other.to_string();
                // A snapshot whose chain or files are broken is in the wrong state to be
                // used, whatever failed to read it: a 409 that says so.
                match other.state() {
                    Some(state) => ApiError::conflict(message, state),
                    None => ApiError::from_code(other.code(), message),
                }
            }
        }
    }
}

impl From<forkvm_sandbox::ChainOpError> for ApiError {
    fn from(e: forkvm_sandbox::ChainOpError) -> ApiError {
        use forkvm_sandbox::ChainOpError;
        match e {
            ChainOpError::Chain(c) => c.into(),
            ChainOpError::Source(s) => s.into(),
            ChainOpError::Spawn(s) => s.into(),
            ChainOpError::Lifecycle(l) => l.into(),
            other => ApiError::from_code(other.code(), other.to_string()),
        }
    }
}

impl From<forkvm_sandbox::RegistryError> for ApiError {
    fn from(e: forkvm_sandbox::RegistryError) -> ApiError {
        ApiError::from_code(e.code(), e.to_string())
    }
}

impl From<forkvm_sandbox::SpawnError> for ApiError {
    fn from(e: forkvm_sandbox::SpawnError) -> ApiError {
        ApiError::from_code(e.code(), e.to_string())
    }
}

impl From<forkvm_sandbox::LifecycleError> for ApiError {
    fn from(e: forkvm_sandbox::LifecycleError) -> ApiError {
        let mut out = ApiError::from_code(e.code(), e.to_string());
        if out.code == "conflict" {
            out.state = Some(if e.to_string().contains("writing") { "writing" } else { "exists" }.to_string());
        }
        out
    }
}

impl From<forkvm_sandbox::disk_snapshots::DiskSnapshotError> for ApiError {
    fn from(e: forkvm_sandbox::disk_snapshots::DiskSnapshotError) -> ApiError {
        use forkvm_sandbox::disk_snapshots::DiskSnapshotError;
        match e {
            DiskSnapshotError::Lifecycle(l) => l.into(),
            other => ApiError::from_code(other.code(), other.to_string()),
        }
    }
}

impl From<forkvm_snapshot::TagError> for ApiError {
    fn from(e: forkvm_snapshot::TagError) -> ApiError {
        ApiError::bad_request(e.to_string())
    }
}

/// An agent call failed: the guest's own refusal keeps its meaning (a missing file is a
/// 404, a bad path a 400); a transport failure is a 500 naming the sandbox.
pub fn agent_error(id: &str, e: forkvm_proto::ClientError) -> ApiError {
    use forkvm_proto::{ClientError, ErrorKind};
    match &e {
        ClientError::Agent(a) => match a.kind {
            ErrorKind::NotFound => ApiError::not_found(format!("sandbox {id}: {}", a.message)),
            ErrorKind::AlreadyExists => ApiError::conflict(format!("sandbox {id}: {}", a.message), "exists"),
            ErrorKind::PermissionDenied
            | ErrorKind::IsADirectory
            | ErrorKind::NotADirectory
            | ErrorKind::DirectoryNotEmpty
            | ErrorKind::InvalidInput => ApiError::bad_request(format!("sandbox {id}: {}", a.message)),
            ErrorKind::Unsupported => ApiError::bad_request(format!("sandbox {id}: {}", a.message)),
            _ => ApiError::internal(format!("sandbox {id}: {}", a.message)),
        },
        _ => ApiError::internal(format!("sandbox {id}: agent: {e}")),
    }
}
