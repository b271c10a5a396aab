//! Files inside a sandbox: `/v1/sandboxes/{id}/files` (download, upload, remove) and
//! `/files/list` and `/files/watch`. Downloads stream into a writer and uploads stream
//! from a reader, so a large file never sits in memory whole.

use crate::client::{collect, decode, Client};
use crate::encode::Target;
use crate::error::ClientError;
use crate::transport;
use bytes::Bytes;
use forkvm_api::{FileEntry, FileWritten, WatchEvent};
use hyper::Method;
use std::io::{Read, Write};

/// Options of an upload.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteFileOptions {
    /// Permission bits of the new file (e.g. `0o644`); the daemon's default when `None`.
    pub mode: Option<u32>,
    /// Create missing parent directories.
    pub create_parents: bool,
}

/// Largest reply to an upload (a small JSON object).
const REPLY_LIMIT: usize = 1 << 20;

fn files(id: &str, path: &str, suffix: &'static str) -> Result<Target, ClientError> {
    if path.is_empty() {
        return Err(ClientError::InvalidArgument {
            what: "file path",
            value: String::new(),
            reason: "must not be empty",
        });
    }
    Ok(Target::new("/v1/sandboxes").segment("sandbox id", id)?.push(suffix).query("path", path))
}

fn upload_target(id: &str, path: &str, opts: &WriteFileOptions) -> Result<String, ClientError> {
    let mut target = files(id, path, "/files")?;
    if let Some(mode) = opts.mode {
        target = target.query("mode", &mode.to_string());
    }
    if opts.create_parents {
        target = target.query("create_parents", "true");
    }
    Ok(target.build())
}

impl Client {
    /// `GET /v1/sandboxes/{id}/files?path=`: the file's bytes into `sink`; returns how many.
    pub fn read_file(&self, id: &str, path: &str, sink: &mut dyn Write) -> Result<u64, ClientError> {
        self.download(&files(id, path, "/files")?.build(), sink)
    }

    /// `PUT /v1/sandboxes/{id}/files?path=` with `data` as the file's content.
    pub fn write_file(
        &self,
        id: &str,
        path: &str,
        data: &[u8],
        opts: &WriteFileOptions,
    ) -> Result<FileWritten, ClientError> {
        let target = upload_target(id, path, opts)?;
        let body = transport::full(Bytes::copy_from_slice(data));
        self.block_on(async {
            let resp = self.send(Method::PUT, &target, body, Some("application/octet-stream")).await?;
            decode(&collect(resp.into_body(), REPLY_LIMIT, &format!("PUT {target}")).await?, "file upload reply")
        })
    }

    /// `PUT /v1/sandboxes/{id}/files?path=` with the content streamed from `src` (sent
    /// chunked). Stops reading `src` as soon as the daemon answers (say, with an error).
    pub fn write_file_from(
        &self,
        id: &str,
        path: &str,
        src: &mut dyn Read,
        opts: &WriteFileOptions,
    ) -> Result<FileWritten, ClientError> {
        let target = upload_target(id, path, opts)?;
        let reply = self.upload(Method::PUT, &target, "application/octet-stream", src, REPLY_LIMIT)?;
        decode(&reply, "file upload reply")
    }

    /// `DELETE /v1/sandboxes/{id}/files?path=`; `recursive` for a directory and its content.
    pub fn remove_file(&self, id: &str, path: &str, recursive: bool) -> Result<(), ClientError> {
        let mut target = files(id, path, "/files")?;
        if recursive {
            target = target.query("recursive", "true");
        }
        self.call_empty(Method::DELETE, &target.build())
    }

    /// `GET /v1/sandboxes/{id}/files/list?path=`.
    pub fn list_files(&self, id: &str, path: &str) -> Result<Vec<FileEntry>, ClientError> {
        self.call_json(Method::GET, &files(id, path, "/files/list")?.build(), None::<&()>, "file list")
    }

    /// `GET /v1/sandboxes/{id}/files/watch?path=`: calls `on_event` with each line, the
    /// first being `armed`, until it returns `false` (the connection is then closed,
    /// which ends the watch) or the sandbox ends the watch: its `end` line's reason is
    /// returned, an `error` line is [`ClientError::Stream`], a body that stops without
    /// either is [`ClientError::Truncated`].
    pub fn watch_files(
        &self,
        id: &str,
        path: &str,
        recursive: bool,
        mut on_event: impl FnMut(WatchEvent) -> bool,
    ) -> Result<Option<String>, ClientError> {
        let mut target = files(id, path, "/files/watch")?;
        if recursive {
            target = target.query("recursive", "true");
        }
        let target = target.build();
        self.read_lines(Method::GET, &target, transport::empty(), None, "watch line", |event| match event {
            WatchEvent::End { reason } => Ok(Some(Some(reason))),
            WatchEvent::Error { error } => Err(ClientError::Stream { message: error }),
            // Stopped by the caller: dropping the connection ends the watch.
            event => Ok((!on_event(event)).then_some(None)),
        })
    }
}
