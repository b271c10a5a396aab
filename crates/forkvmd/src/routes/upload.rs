//! Request bodies that are files (a snapshot pack, an image archive): written to a
//! staging directory of the store, bounded, removed with the directory however the
//! request ends.

use crate::error::ApiError;
use axum::body::Body;
use futures_util::StreamExt;
use std::path::{Path, PathBuf};
use tokio::io::AsyncWriteExt;

/// Removes a staging directory when dropped (a request that ends early included).
#[derive(Debug)]
pub struct Staged(pub PathBuf);

impl Drop for Staged {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A host I/O failure at `step` on `path`: 507 when the disk is full, else 500.
pub fn io_error(step: &str, path: &Path, e: std::io::Error) -> ApiError {
    let message = format!("{step} ({}): {e}", path.display());
    if e.raw_os_error() == Some(libc::ENOSPC) {
        ApiError::new(forkvm_api::ErrorCode::DiskFull, message)
    } else {
        ApiError::internal(message)
    }
}

/// Writes the request body (`what`, for errors) to `path`, refusing more than `limit`
/// bytes and an empty body; returns its length.
pub async fn receive(body: Body, path: &Path, limit: u64, what: &str) -> Result<u64, ApiError> {
    let mut f = tokio::fs::File::create(path).await.map_err(|e| io_error("creating the upload file", path, e))?;
    let mut stream = body.into_data_stream();
    let mut total = 0u64;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| ApiError::bad_request(format!("reading the uploaded {what}: {e}")))?;
        total += chunk.len() as u64;
        if total > limit {
            return Err(ApiError::bad_request(format!("{what} is larger than {limit} bytes")));
        }
        f.write_all(&chunk).await.map_err(|e| io_error("writing the upload", path, e))?;
    }
    f.flush().await.map_err(|e| io_error("writing the upload", path, e))?;
    if total == 0 {
        return Err(ApiError::bad_request(format!("the request body is empty: send {what} as the body")));
    }
    Ok(total)
}
