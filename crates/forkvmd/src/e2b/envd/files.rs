//! envd's `/files`: `GET` streams a guest file out, `POST` streams multipart parts in
//! (each part's file name is its target path, or the `path` parameter for one file).
//! Bytes move through a bounded channel between the HTTP body and the agent's
//! connection, so neither end holds a whole file. Written files, and the parents a write
//! makes, belong to the call's user.

use super::{checked_user, home_of, open, resolve};
use crate::e2b::connect::RpcError;
use crate::e2b::records::E2bSandbox;
use crate::e2b::E2b;
use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Multipart, Request};
use axum::http::{header, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use forkvm_proto::{ErrorKind, FileType, WriteFileRequest};
use std::io::Read;

/// Chunks in flight between an HTTP body and the agent.
const CHANNEL_DEPTH: usize = 16;

use crate::e2b::front::plain_error as http_error;

fn rpc_to_http(e: RpcError) -> Response {
    http_error(e.status(), e.message)
}

#[derive(Debug, Default, serde::Deserialize)]
struct FilesQuery {
    path: Option<String>,
    username: Option<String>,
}

/// A blocking reader over chunks sent from async code.
struct ChannelReader {
    rx: tokio::sync::mpsc::Receiver<Bytes>,
    current: Bytes,
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            match self.rx.blocking_recv() {
                Some(b) => self.current = b,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current[..n]);
        self.current = self.current.slice(n..);
        Ok(n)
    }
}

pub async fn serve(e2b: E2b, rec: E2bSandbox, user: String, req: Request) -> Response {
    let q: FilesQuery = match serde_urlencoded::from_str(req.uri().query().unwrap_or("")) {
        Ok(q) => q,
        Err(e) => return http_error(StatusCode::BAD_REQUEST, format!("invalid query: {e}")),
    };
    let user = match q.username.as_deref().filter(|u| !u.is_empty()).map(checked_user).transpose() {
        Ok(u) => u.unwrap_or(user),
        Err(e) => return rpc_to_http(e),
    };
    let home = home_of(&user);
    let path = match q.path.as_deref().map(|p| resolve(p, &home)).transpose() {
        Ok(p) => p,
        Err(e) => return rpc_to_http(e),
    };
    match *req.method() {
        Method::GET => match path {
            Some(path) => download(e2b, rec, user, path).await,
            None => http_error(StatusCode::BAD_REQUEST, "GET /files needs ?path="),
        },
        Method::POST => upload(e2b, rec, user, path, req).await,
        ref m => http_error(StatusCode::METHOD_NOT_ALLOWED, format!("{m} /files: GET or POST")),
    }
}

async fn download(e2b: E2b, rec: E2bSandbox, user: String, path: String) -> Response {
    let call = match open(&e2b, &rec, user).await {
        Ok(c) => c,
        Err(e) => return rpc_to_http(e),
    };
    let p = path.clone();
    let call = match tokio::task::spawn_blocking(move || call.agent.stat(&p).map(|info| (call, info))).await {
        Ok(Ok((call, info))) if info.file_type == FileType::Dir => {
            drop(call);
            return http_error(StatusCode::BAD_REQUEST, format!("path '{path}' is a directory"));
        }
        Ok(Ok((call, _))) => call,
        Ok(Err(forkvm_proto::ClientError::Agent(e))) if e.kind == ErrorKind::NotFound => {
            return http_error(StatusCode::NOT_FOUND, format!("path '{path}' does not exist"));
        }
        Ok(Err(e)) => return rpc_to_http(e.into()),
        Err(e) => return http_error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(CHANNEL_DEPTH);
    tokio::task::spawn_blocking(move || {
        struct Sink(tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>);
        impl std::io::Write for Sink {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0
                    .blocking_send(Ok(Bytes::copy_from_slice(buf)))
                    .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the client went away"))?;
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut sink = Sink(tx.clone());
        if let Err(e) = call.agent.read_file(&path, &mut sink) {
            // The status went out already: the body ends in an error, never short.
            let _ = tx.blocking_send(Err(std::io::Error::other(e.to_string())));
        }
    });
    let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    ([(header::CONTENT_TYPE, "application/octet-stream")], body).into_response()
}

async fn upload(e2b: E2b, rec: E2bSandbox, user: String, path: Option<String>, req: Request) -> Response {
    let is_multipart = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.to_ascii_lowercase().starts_with("multipart/form-data"));
    if !is_multipart {
        return http_error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "POST /files takes multipart/form-data (forkvm reports envd 0.5.2: no octet-stream uploads)",
        );
    }
    let mut parts = match Multipart::from_request(req, &()).await {
        Ok(m) => m,
        Err(e) => return http_error(StatusCode::BAD_REQUEST, format!("reading the multipart body: {e}")),
    };
    let call = match open(&e2b, &rec, user).await {
        Ok(c) => c,
        Err(e) => return rpc_to_http(e),
    };
    let call = std::sync::Arc::new(call);
    let home = call.home();
    let mut written = Vec::new();
    loop {
        let mut field = match parts.next_field().await {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) => return http_error(StatusCode::BAD_REQUEST, format!("reading the multipart body: {e}")),
        };
        if field.name() != Some("file") {
            continue;
        }
        // One file: the `path` parameter; several: each part's file name.
        let target = match (&path, field.file_name()) {
            (Some(p), _) => Ok(p.clone()),
            (None, Some(name)) => resolve(name, &home),
            (None, None) => Err(RpcError::invalid("a file part has no file name and the request no ?path=")),
        };
        let target = match target {
            Ok(t) => t,
            Err(e) => return rpc_to_http(e),
        };
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(CHANNEL_DEPTH);
        let (c, t) = (call.clone(), target.clone());
        let writer = tokio::task::spawn_blocking(move || {
            let req = WriteFileRequest { path: t, mode: None, create_parents: true, owner: Some(c.user.clone()) };
            c.agent.write_file(&req, &mut ChannelReader { rx, current: Bytes::new() })
        });
        let mut failed = None;
        loop {
            match field.chunk().await {
                Ok(Some(chunk)) => {
                    if tx.send(chunk).await.is_err() {
                        break; // the writer stopped: its error says why
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    failed = Some(format!("reading the upload of {target}: {e}"));
                    break;
                }
            }
        }
        drop(tx);
        let outcome = writer.await;
        if let Some(why) = failed {
            return http_error(StatusCode::BAD_REQUEST, why);
        }
        match outcome {
            Ok(Ok(_bytes)) => {}
            Ok(Err(forkvm_proto::ClientError::Agent(e))) if e.kind == ErrorKind::PermissionDenied => {
                return http_error(StatusCode::FORBIDDEN, e.message)
            }
            Ok(Err(e)) => return rpc_to_http(e.into()),
            Err(e) => return http_error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        }
        let name = target.rsplit('/').next().unwrap_or(&target).to_string();
        written.push(serde_json::json!({ "name": name, "type": "file", "path": target }));
    }
    if written.is_empty() {
        return http_error(StatusCode::BAD_REQUEST, "the multipart body holds no part named \"file\"");
    }
    axum::Json(written).into_response()
}
