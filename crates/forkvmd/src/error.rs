//! One error type for every handler: an HTTP status, a machine-readable code, the
//! message a user reads, and for conflicts the object's current state. Library errors
//! map onto it by their own `code()`, so the REST status of a failure is decided where
//! the failure is understood, not re-guessed here.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use forkvm_api::{ErrorBody, ErrorCode};

#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
    pub state: Option<String>,
}

impl ApiError {
    /// An error of class `code` (its HTTP status is the code's). A conflict without a
    /// state reports `conflict`.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ApiError {
        let state = (code == ErrorCode::Conflict).then(|| "conflict".to_string());
        ApiError { code, message: message.into(), state }
    }
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorCode::BadRequest, message)
    }
    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorCode::NotFound, message)
    }
    pub fn conflict(message: impl Into<String>, state: impl Into<String>) -> ApiError {
        ApiError { state: Some(state.into()), ..ApiError::new(ErrorCode::Conflict, message) }
    }
    pub fn unauthorized(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorCode::Unauthorized, message)
    }
    pub fn busy(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorCode::Busy, message)
    }
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorCode::Internal, message)
    }

    /// The HTTP status it is answered with.
    pub fn status(&self) -> StatusCode {
        StatusCode::from_u16(self.code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    pub fn body(&self) -> ErrorBody {
        // A code from a newer peer (through a VMM or the spawner) is answered as internal.
        let code = if self.code == ErrorCode::Unknown { ErrorCode::Internal } else { self.code };
        ErrorBody { error: self.message.clone(), code, state: self.state.clone() }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status(), Json(self.body())).into_response()
    }
}

impl From<forkvm_sandbox::network::NetworkError> for ApiError {
    fn from(e: forkvm_sandbox::network::NetworkError) -> ApiError {
        use forkvm_sandbox::network::NetworkError;
        match e {
            NetworkError::Policy(_) => ApiError::bad_request(e.to_string()),
            NetworkError::NoNetwork => ApiError::conflict(e.to_string(), "no_network"),
            _ => ApiError::internal(e.to_string()),
        }
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
        let mut out = ApiError::new(e.code(), e.to_string());
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
            // The request asked for what no restore gives.
            e @ forkvm_sandbox::SourceError::Vcpus { .. } => ApiError::bad_request(e.to_string()),
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
                ApiError::new(ErrorCode::DiskFull, format!("no space left: {source}"))
            }
            ChainError::Pack(p @ PackError::Io { .. }) => ApiError::internal(p.to_string()),
            other => {
                let message = other.to_string();
                // A snapshot whose chain or files are broken is in the wrong state to be
                // used, whatever failed to read it: a 409 that says so.
                match other.state() {
                    Some(state) => ApiError::conflict(message, state),
                    None => ApiError::new(other.code(), message),
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
            other => ApiError::new(other.code(), other.to_string()),
        }
    }
}

impl From<forkvm_sandbox::RegistryError> for ApiError {
    fn from(e: forkvm_sandbox::RegistryError) -> ApiError {
        ApiError::new(e.code(), e.to_string())
    }
}

impl From<forkvm_sandbox::SpawnError> for ApiError {
    fn from(e: forkvm_sandbox::SpawnError) -> ApiError {
        ApiError::new(e.code(), e.to_string())
    }
}

impl From<forkvm_sandbox::LifecycleError> for ApiError {
    fn from(e: forkvm_sandbox::LifecycleError) -> ApiError {
        let mut out = ApiError::new(e.code(), e.to_string());
        if out.code == ErrorCode::Conflict {
            out.state = Some(e.conflict_state().to_string());
        }
        out
    }
}

impl From<forkvm_sandbox::disk_snapshots::DiskSnapshotError> for ApiError {
    fn from(e: forkvm_sandbox::disk_snapshots::DiskSnapshotError) -> ApiError {
        use forkvm_sandbox::disk_snapshots::DiskSnapshotError;
        match e {
            DiskSnapshotError::Lifecycle(l) => l.into(),
            other => ApiError::new(other.code(), other.to_string()),
        }
    }
}

impl From<forkvm_snapshot::TagError> for ApiError {
    fn from(e: forkvm_snapshot::TagError) -> ApiError {
        ApiError::bad_request(e.to_string())
    }
}

/// A transport failure of an agent call to sandbox `id` (its connection refused or cut):
/// a 404 when the sandbox is gone or its VMM has exited (it was killed or stopped while
/// the call ran, which is the caller's news, not a server fault), else [`agent_error`]'s
/// 500. The VMM's exit is looked for a few times over 100 ms: a connection is cut as the
/// exiting VMM closes its descriptors, a moment before the kernel marks it exited.
pub fn agent_error_in(registry: &forkvm_sandbox::Registry, id: &str, e: forkvm_proto::ClientError) -> ApiError {
    if matches!(e, forkvm_proto::ClientError::Agent(_)) {
        return agent_error(id, e);
    }
    for _ in 0..5 {
        match registry.lookup(id) {
            Err(forkvm_sandbox::RegistryError::NotFound(_)) => {
                return ApiError::not_found(format!("sandbox {id} was removed while the call ran"))
            }
            Ok((_, false)) => return ApiError::not_found(format!("sandbox {id} stopped while the call ran ({e})")),
            _ => std::thread::sleep(std::time::Duration::from_millis(20)),
        }
    }
    agent_error(id, e)
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

#[cfg(test)]
mod agent_error_tests {
    use super::*;

    #[test]
    fn a_cut_connection_to_a_sandbox_that_is_gone_is_a_404() {
        let dir = tempfile::tempdir().unwrap();
        let registry = forkvm_sandbox::Registry::open(dir.path());
        let cut = || forkvm_proto::ClientError::Connect(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        let e = agent_error_in(&registry, "gone1", cut());
        assert_eq!(e.status(), axum::http::StatusCode::NOT_FOUND);
        assert!(e.message.contains("gone1 was removed while the call ran"), "{}", e.message);
        // The guest's own refusal keeps its meaning, whatever the registry says.
        let refused = forkvm_proto::ClientError::Agent(forkvm_proto::AgentError::new(
            forkvm_proto::ErrorKind::InvalidInput,
            "bad path",
        ));
        assert_eq!(agent_error_in(&registry, "gone1", refused).status(), axum::http::StatusCode::BAD_REQUEST);
    }
}
