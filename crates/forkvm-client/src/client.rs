//! The [`Client`]: endpoint, token and TLS settings plus the runtime its calls block
//! on, and the plumbing every route shares (build a request, send it, turn an error
//! status into [`ClientError::Api`], read and decode a JSON reply). The routes
//! themselves are in `system`, `snapshots`, `sandboxes` and `files`.

use crate::endpoint::Endpoint;
use crate::error::{api_error, excerpt, ClientError};
use crate::transport::{self, ReqBody};
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE, HOST, USER_AGENT};
use hyper::{Method, Request, Response};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fmt;
use std::future::Future;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::Duration;
use tokio_rustls::TlsConnector;

/// The environment variable holding the bearer token for TCP endpoints.
pub const TOKEN_ENV: &str = "FORKVM_TOKEN";
/// The environment variable naming a PEM CA file to trust for `https://` endpoints.
pub const CA_CERT_ENV: &str = "FORKVM_CA_CERT";

/// Largest JSON reply read into memory.
const JSON_LIMIT: usize = 64 << 20;
/// Largest error body read.
const ERROR_LIMIT: usize = 1 << 20;
/// Size of one upload chunk read from a reader.
const UPLOAD_CHUNK: usize = 64 << 10;

/// `FORKVM_TOKEN`, trimmed; `None` when unset or empty.
pub fn token_from_env() -> Option<String> {
    std::env::var(TOKEN_ENV).ok().map(|t| t.trim().to_string()).filter(|t| !t.is_empty())
}

/// How to talk to the daemon besides where.
#[derive(Clone)]
pub struct ClientOptions {
    /// Sent as `Authorization: Bearer <token>` (the daemon needs it over TCP).
    pub token: Option<String>,
    /// PEM file of the CA (or self-signed certificate) to trust instead of the system's roots.
    pub ca_cert: Option<PathBuf>,
    /// Limit on connecting (and the TLS handshake); requests themselves have none, as
    /// a snapshot build or a long exec may take minutes.
    pub connect_timeout: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions { token: None, ca_cert: None, connect_timeout: Duration::from_secs(10) }
    }
}

impl ClientOptions {
    /// Token from `FORKVM_TOKEN`, CA file from `FORKVM_CA_CERT`.
    pub fn from_env() -> ClientOptions {
        ClientOptions {
            token: token_from_env(),
            ca_cert: std::env::var_os(CA_CERT_ENV).filter(|v| !v.is_empty()).map(PathBuf::from),
            ..ClientOptions::default()
        }
    }
}

impl fmt::Debug for ClientOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientOptions")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("ca_cert", &self.ca_cert)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

/// A blocking forkvmd client. Each call opens one connection, so a `Client` holds no
/// socket between calls and survives daemon restarts. Calls block the calling thread;
/// do not call them from inside another tokio runtime.
pub struct Client {
    endpoint: Endpoint,
    authorization: Option<HeaderValue>,
    tls: Option<TlsConnector>,
    connect_timeout: Duration,
    rt: tokio::runtime::Runtime,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("endpoint", &self.endpoint)
            .field("token", &self.authorization.as_ref().map(|_| "<redacted>"))
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl Client {
    /// A client for `endpoint`, trusting the system's roots for `https://`.
    pub fn new(endpoint: Endpoint, token: Option<String>) -> Result<Client, ClientError> {
        Client::with_options(endpoint, ClientOptions { token, ..ClientOptions::default() })
    }

    pub fn with_options(endpoint: Endpoint, options: ClientOptions) -> Result<Client, ClientError> {
        let authorization = match options.token {
            Some(token) => {
                let mut value =
                    HeaderValue::try_from(format!("Bearer {token}")).map_err(|_| ClientError::InvalidArgument {
                        what: "token",
                        value: "<redacted>".into(),
                        reason: "has characters an HTTP header cannot carry",
                    })?;
                value.set_sensitive(true);
                Some(value)
            }
            None => None,
        };
        let tls = if endpoint.is_tls() { Some(crate::tls::connector(options.ca_cert.as_deref())?) } else { None };
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(ClientError::Runtime)?;
        Ok(Client { endpoint, authorization, tls, connect_timeout: options.connect_timeout, rt })
    }

    /// The endpoint from `FORKVM_DAEMON` (the default socket when unset, empty, or
    /// `auto` with nothing listening), with [`ClientOptions::from_env`].
    pub fn from_env() -> Result<Client, ClientError> {
        let endpoint = Endpoint::from_env()?.unwrap_or_else(Endpoint::default_socket);
        Client::with_options(endpoint, ClientOptions::from_env())
    }

    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    pub(crate) fn authorization(&self) -> Option<&HeaderValue> {
        self.authorization.as_ref()
    }

    pub(crate) fn tls(&self) -> Option<&TlsConnector> {
        self.tls.as_ref()
    }

    pub(crate) fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// Runs `f` to completion on the client's runtime.
    pub(crate) fn block_on<T>(&self, f: impl Future<Output = T>) -> T {
        self.rt.block_on(f)
    }

    /// A new connection ready for one request.
    pub(crate) async fn open(&self, request: &str) -> Result<SendRequest<ReqBody>, ClientError> {
        transport::connect(&self.endpoint, self.tls.as_ref(), self.connect_timeout, request).await
    }

    /// The request with the headers every call carries.
    pub(crate) fn build(
        &self,
        method: Method,
        target: &str,
        body: ReqBody,
        content_type: Option<&'static str>,
    ) -> Result<Request<ReqBody>, ClientError> {
        let mut req = Request::builder()
            .method(method)
            .uri(target)
            .header(HOST, self.endpoint.authority())
            .header(USER_AGENT, concat!("forkvm-client/", env!("CARGO_PKG_VERSION")));
        if let Some(ct) = content_type {
            req = req.header(CONTENT_TYPE, ct);
        }
        if let Some(auth) = &self.authorization {
            req = req.header(AUTHORIZATION, auth.clone());
        }
        req.body(body).map_err(|e| ClientError::Send { request: target.to_string(), source: e.into() })
    }

    /// Sends one request and returns the reply if its status is 2xx.
    pub(crate) async fn send(
        &self,
        method: Method,
        target: &str,
        body: ReqBody,
        content_type: Option<&'static str>,
    ) -> Result<Response<Incoming>, ClientError> {
        let name = format!("{method} {target}");
        let mut sender = self.open(&name).await?;
        let req = self.build(method, target, body, content_type)?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| ClientError::Send { request: name.clone(), source: e.into() })?;
        check(resp, &name).await
    }

    /// A call whose reply is JSON of type `T`; `body` is serialized as JSON.
    pub(crate) fn call_json<T: DeserializeOwned>(
        &self,
        method: Method,
        target: &str,
        body: Option<&impl Serialize>,
        what: &'static str,
    ) -> Result<T, ClientError> {
        let (body, content_type) = match body {
            Some(b) => (transport::full(encode_json(b)?), Some("application/json")),
            None => (transport::empty(), None),
        };
        self.block_on(async {
            let resp = self.send(method.clone(), target, body, content_type).await?;
            let bytes = collect(resp.into_body(), JSON_LIMIT, &format!("{method} {target}")).await?;
            decode(&bytes, what)
        })
    }

    /// A call with no request body whose reply body (if any) is ignored.
    pub(crate) fn call_empty(&self, method: Method, target: &str) -> Result<(), ClientError> {
        self.block_on(async {
            let resp = self.send(method.clone(), target, transport::empty(), None).await?;
            collect(resp.into_body(), JSON_LIMIT, &format!("{method} {target}")).await.map(drop)
        })
    }

    /// A GET whose reply body is copied into `sink` as it arrives (a file, a pack);
    /// returns how many bytes.
    pub(crate) fn download(&self, target: &str, sink: &mut dyn Write) -> Result<u64, ClientError> {
        let name = format!("GET {target}");
        self.block_on(async {
            let resp = self.send(Method::GET, target, transport::empty(), None).await?;
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

    /// A request whose body is streamed from `src` (sent chunked, never whole in memory);
    /// returns the reply body, at most `reply_limit` bytes. Stops reading `src` as soon
    /// as the daemon answers (say, with an error).
    pub(crate) fn upload(
        &self,
        method: Method,
        target: &str,
        content_type: &'static str,
        src: &mut dyn Read,
        reply_limit: usize,
    ) -> Result<Vec<u8>, ClientError> {
        let name = format!("{method} {target}");
        self.block_on(async {
            let resp = self.send_upload(method, target, content_type, src, &name).await?;
            collect(resp.into_body(), reply_limit, &name).await
        })
    }

    /// [`Client::upload`] whose reply is NDJSON: `each` gets every line as it arrives.
    pub(crate) fn upload_lines(
        &self,
        method: Method,
        target: &str,
        content_type: &'static str,
        src: &mut dyn Read,
        each: &mut dyn FnMut(&[u8]) -> Result<(), ClientError>,
    ) -> Result<(), ClientError> {
        let name = format!("{method} {target}");
        self.block_on(async {
            let resp = self.send_upload(method, target, content_type, src, &name).await?;
            let mut body = resp.into_body();
            let mut lines = crate::ndjson::Lines::default();
            while let Some(data) = next_data(&mut body, &name).await? {
                let too_long = || ClientError::TooLarge { request: name.clone(), limit: crate::ndjson::MAX_LINE };
                lines.feed(&data, too_long, &mut *each)?;
            }
            lines.finish(each)
        })
    }

    /// Sends `src` as the body; the reply once its status is a success.
    async fn send_upload(
        &self,
        method: Method,
        target: &str,
        content_type: &'static str,
        src: &mut dyn Read,
        name: &str,
    ) -> Result<Response<Incoming>, ClientError> {
        let mut sender = self.open(name).await?;
        let (tx, body) = transport::channel(4);
        let req = self.build(method, target, body, Some(content_type))?;
        let send = sender.send_request(req);
        let produce = async move {
            let mut buf = vec![0u8; UPLOAD_CHUNK];
            loop {
                let n = match src.read(&mut buf) {
                    Ok(0) => return Ok(()),
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        // Abort the body so the daemon does not keep a truncated upload.
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
        .map_err(|e| ClientError::Send { request: name.to_string(), source: e.into() })?;
        check(resp, name).await
    }

    /// A call whose reply is text (the Prometheus metrics).
    pub(crate) fn call_text(&self, target: &str) -> Result<String, ClientError> {
        self.block_on(async {
            let resp = self.send(Method::GET, target, transport::empty(), None).await?;
            let bytes = collect(resp.into_body(), JSON_LIMIT, &format!("GET {target}")).await?;
            Ok(String::from_utf8_lossy(&bytes).into_owned())
        })
    }
}

/// `resp` if 2xx, else its error body as [`ClientError::Api`].
pub(crate) async fn check(resp: Response<Incoming>, request: &str) -> Result<Response<Incoming>, ClientError> {
    let status = resp.status();
    if status.is_success() {
        return Ok(resp);
    }
    // A cut or oversized error body still leaves the status to report.
    let body = collect(resp.into_body(), ERROR_LIMIT, request).await.unwrap_or_default();
    Err(api_error(status.as_u16(), status.canonical_reason().unwrap_or(""), &body))
}

/// The whole body, refusing more than `limit` bytes.
pub(crate) async fn collect(mut body: Incoming, limit: usize, request: &str) -> Result<Vec<u8>, ClientError> {
    let mut out = Vec::new();
    while let Some(data) = next_data(&mut body, request).await? {
        if out.len() + data.len() > limit {
            return Err(ClientError::TooLarge { request: request.to_string(), limit });
        }
        out.extend_from_slice(&data);
    }
    Ok(out)
}

/// The next data frame of `body` (trailers skipped), `None` at its end.
pub(crate) async fn next_data(body: &mut Incoming, request: &str) -> Result<Option<Bytes>, ClientError> {
    loop {
        match body.frame().await {
            None => return Ok(None),
            Some(Err(e)) => return Err(ClientError::Receive { request: request.to_string(), source: e.into() }),
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    return Ok(Some(data));
                }
            }
        }
    }
}

pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8], what: &'static str) -> Result<T, ClientError> {
    serde_json::from_slice(bytes).map_err(|source| ClientError::Decode { what, source, body: excerpt(bytes) })
}

pub(crate) fn encode_json(body: &impl Serialize) -> Result<Vec<u8>, ClientError> {
    // The API's request types are plain structs with string keys: this cannot fail.
    serde_json::to_vec(body).map_err(|source| ClientError::Decode { what: "request body", source, body: String::new() })
}
