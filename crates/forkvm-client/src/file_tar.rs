//! Whole trees and checked transfers: a guest directory as a tar stream out
//! (`GET .../files/tar`) and in (`PUT .../files/tar`), and a guest file's SHA-256
//! (`GET .../files/sha256`) to check a download against. Streams both ways.

use crate::client::{decode, Client};
use crate::encode::Target;
use crate::error::ClientError;
use forkvm_api::{FileChecksum, FileWritten};
use hyper::Method;
use std::io::{Read, Write};

/// Largest reply to an upload (a small JSON object).
const REPLY_LIMIT: usize = 1 << 20;

fn target(id: &str, suffix: &'static str, path: &str) -> Result<Target, ClientError> {
    if path.is_empty() {
        return Err(ClientError::InvalidArgument { what: "path", value: String::new(), reason: "must not be empty" });
    }
    Ok(Target::new("/v1/sandboxes").segment("sandbox id", id)?.push(suffix).query("path", path))
}

impl Client {
    /// `GET /v1/sandboxes/{id}/files/sha256?path=`: the file's size and SHA-256, computed
    /// in the guest.
    pub fn file_checksum(&self, id: &str, path: &str) -> Result<FileChecksum, ClientError> {
        self.call_json(Method::GET, &target(id, "/files/sha256", path)?.build(), None::<&()>, "file checksum")
    }

    /// `GET /v1/sandboxes/{id}/files/tar?path=`: a tar archive of the guest directory
    /// into `sink`; returns its size.
    pub fn read_tar(&self, id: &str, dir: &str, sink: &mut dyn Write) -> Result<u64, ClientError> {
        self.download(&target(id, "/files/tar", dir)?.build(), sink)
    }

    /// `PUT /v1/sandboxes/{id}/files/tar?path=`: the tar archive `src` unpacked into the
    /// guest directory (refused at its end if its SHA-256 is not `sha256`, when given).
    pub fn write_tar(
        &self,
        id: &str,
        dir: &str,
        src: &mut dyn Read,
        sha256: Option<&str>,
    ) -> Result<FileWritten, ClientError> {
        let mut t = target(id, "/files/tar", dir)?;
        if let Some(h) = sha256 {
            t = t.query("sha256", h);
        }
        let reply = self.upload(Method::PUT, &t.build(), "application/x-tar", src, REPLY_LIMIT)?;
        decode(&reply, "tar upload reply")
    }
}
