//! Why a remote operation failed, naming the step and the object.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// The remote URL is not one this build serves.
    #[error("remote {url:?}: {reason}")]
    BadUrl { url: String, reason: String },
    /// The object store answered with an error (after its retries).
    #[error("remote {url}: {step} {object}: {source}")]
    Store { url: String, step: &'static str, object: String, source: Box<object_store::Error> },
    /// `tag` has no manifest on the remote.
    #[error("remote {url}: no tag {tag:?} (push it first: forkvm push {tag} --to {url})")]
    NoTag { url: String, tag: String },
    /// An object did not open under the key, or its content is not what its name says.
    #[error("remote {url}: {object} refused: {reason}")]
    Refused { url: String, object: String, reason: String },
    /// A lock name that is not one (`shared-`/`exclusive-` and 16 hex digits).
    #[error("remote {url}: {name:?} is not a lock's name (shared-<16 hex> or exclusive-<16 hex>, as the remote's locks are listed)")]
    BadLockName { url: String, name: String },
    /// No lock of that name on the remote.
    #[error("remote {url}: no such lock locks/{name}")]
    NoLock { url: String, name: String },
    /// Another host's push or collection holds the remote.
    #[error("remote {url}: {object}: {reason} (try again when it ends)")]
    Locked { url: String, object: String, reason: String },
    /// The remote key file.
    #[error("remote key {path}: {reason}")]
    Key { path: PathBuf, reason: String },
    /// A host file operation.
    #[error("remote: {step} {path}: {source}")]
    Io { step: &'static str, path: PathBuf, source: std::io::Error },
    /// The store's side: walking a chain to push, or installing a pulled one.
    #[error(transparent)]
    Chain(#[from] forkvm_snapshot::chain::ChainError),
}

impl RemoteError {
    pub(crate) fn io(step: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> RemoteError {
        let path = path.into();
        move |source| RemoteError::Io { step, path, source }
    }

    /// The API's error code for this failure.
    pub fn code(&self) -> forkvm_api::ErrorCode {
        match self {
            RemoteError::BadUrl { .. } | RemoteError::Key { .. } | RemoteError::BadLockName { .. } => {
                forkvm_api::ErrorCode::BadRequest
            }
            RemoteError::NoTag { .. } | RemoteError::NoLock { .. } => forkvm_api::ErrorCode::NotFound,
            RemoteError::Refused { .. } | RemoteError::Locked { .. } => forkvm_api::ErrorCode::Conflict,
            RemoteError::Chain(e) => e.code(),
            // The object store is the daemon's upstream.
            RemoteError::Store { .. } => forkvm_api::ErrorCode::BadGateway,
            RemoteError::Io { .. } => forkvm_api::ErrorCode::Internal,
        }
    }
}
