//! Files inside a sandbox: `/v1/sandboxes/{id}/files` (download, upload, remove) and
//! `/files/list`. Downloads stream into a writer and uploads stream from a reader, so
//! a large file never sits in memory whole.

use crate::client::{check, collect, decode, next_data, Client};
use crate::encode::Target;
use crate::error::ClientError;
use crate::transport;
use bytes::Bytes;
use forkvm_api::{FileEntry, FileWritten};
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

/// Size of one upload chunk read from a reader.
const CHUNK: usize = 64 << 10;
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
        let target = files(id, path, "/files")?.build();
        let name = format!("GET {target}");
        self.block_on(async {
            let resp = self.send(Method::GET, &target, transport::empty(), None).await?;
            let mut body = resp.into_body();
            let mut total = 0u64;
            while let Some(data) = next_data(&mut body, &name).await? {
                sink.write_all(&data).map_err(ClientError::Sink)?;
                total += data.len() as u64;
            }
            sink.flush().map_err(ClientError::Sink)?;
            Ok(total)
        })
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
        let name = format!("PUT {target}");
        self.block_on(async {
            let mut sender = self.open(&name).await?;
            let (tx, body) = transport::channel(4);
            let req = self.build(Method::PUT, &target, body, Some("application/octet-stream"))?;
            let send = sender.send_request(req);
            let produce = async move {
                let mut buf = vec![0u8; CHUNK];
                loop {
                    let n = match src.read(&mut buf) {
                        Ok(0) => return Ok(()),
                        Ok(n) => n,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        Err(e) => {
                            // Abort the body so the daemon does not keep a truncated file.
                            let _ = tx.send(Err(std::io::Error::new(e.kind(), "upload source failed"))).await;
                            return Err(e);
                        }
                    };
                    if tx.send(Ok(Bytes::copy_from_slice(&buf[..n]))).await.is_err() {
                        return Ok(()); // The connection stopped taking the body; its reply tells why.
                    }
                }
            };
            tokio::pin!(send, produce);
            let (early, read) = tokio::select! {
                r = &mut send => (Some(r), Ok(())),
                read = &mut produce => (None, read),
            };
            read.map_err(ClientError::Source)?;
            let resp = match early {
                Some(r) => r,
                None => send.await,
            }
            .map_err(|e| ClientError::Send { request: name.clone(), source: e.into() })?;
            let resp = check(resp, &name).await?;
            decode(&collect(resp.into_body(), REPLY_LIMIT, &name).await?, "file upload reply")
        })
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
}
