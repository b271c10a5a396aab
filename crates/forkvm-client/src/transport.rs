//! The bytes-on-the-wire layer: open a Unix, TCP or TLS connection, run hyper's
//! HTTP/1.1 handshake on it, and give back a request sender; plus the request body
//! types (empty, whole, streamed from a channel). Nothing here knows the API's routes;
//! what TLS trusts is in `tls`.

use crate::endpoint::Endpoint;
use crate::error::{BoxError, ClientError};
use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Body, Frame};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpStream, UnixStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsConnector;

/// Every request body: boxed so one connection type serves them all.
pub(crate) type ReqBody = BoxBody<Bytes, std::io::Error>;

pub(crate) fn empty() -> ReqBody {
    Empty::new().map_err(|never| match never {}).boxed()
}

pub(crate) fn full(bytes: impl Into<Bytes>) -> ReqBody {
    Full::new(bytes.into()).map_err(|never| match never {}).boxed()
}

/// A body fed chunk by chunk through a bounded channel (sent chunked), so an upload
/// streams from a reader without holding the file in memory.
struct ChannelBody {
    rx: mpsc::Receiver<std::io::Result<Bytes>>,
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        self.rx.poll_recv(cx).map(|chunk| chunk.map(|r| r.map(Frame::data)))
    }
}

pub(crate) fn channel(capacity: usize) -> (mpsc::Sender<std::io::Result<Bytes>>, ReqBody) {
    let (tx, rx) = mpsc::channel(capacity);
    (tx, ChannelBody { rx }.boxed())
}

/// A fresh connection to `endpoint`, HTTP/1.1 handshake done, its driver spawned on
/// the current runtime. `request` names the call for errors.
pub(crate) async fn connect(
    endpoint: &Endpoint,
    tls: Option<&TlsConnector>,
    timeout: Duration,
    request: &str,
) -> Result<SendRequest<ReqBody>, ClientError> {
    let connect_err = |source| ClientError::Connect { endpoint: endpoint.to_string(), source };
    match endpoint {
        Endpoint::Unix(path) => {
            let stream = within(timeout, UnixStream::connect(path)).await.map_err(connect_err)?;
            handshake(stream, request).await
        }
        Endpoint::Http { host, port } => {
            let stream = within(timeout, TcpStream::connect((host.as_str(), *port))).await.map_err(connect_err)?;
            // Small request/response pairs: do not wait for Nagle.
            let _ = stream.set_nodelay(true);
            handshake(stream, request).await
        }
        Endpoint::Https { host, port } => {
            let tls_err = |source: BoxError| ClientError::Tls { endpoint: endpoint.to_string(), source };
            let connector = tls.ok_or_else(|| tls_err("no TLS configuration".into()))?;
            let name = ServerName::try_from(host.clone()).map_err(|e| tls_err(e.into()))?;
            let tcp = within(timeout, TcpStream::connect((host.as_str(), *port))).await.map_err(connect_err)?;
            let _ = tcp.set_nodelay(true);
            let stream = within(timeout, connector.connect(name, tcp)).await.map_err(|e| tls_err(e.into()))?;
            handshake(stream, request).await
        }
    }
}

/// `f`, or a `TimedOut` error once `timeout` has passed.
async fn within<T>(timeout: Duration, f: impl Future<Output = std::io::Result<T>>) -> std::io::Result<T> {
    match tokio::time::timeout(timeout, f).await {
        Ok(r) => r,
        Err(_) => Err(std::io::Error::new(std::io::ErrorKind::TimedOut, format!("no answer within {timeout:?}"))),
    }
}

async fn handshake<S>(stream: S, request: &str) -> Result<SendRequest<ReqBody>, ClientError>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (sender, conn) = http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| ClientError::Send { request: request.to_string(), source: e.into() })?;
    // The connection's failures also fail the request or its body, where they are reported.
    // Upgrades allowed: a raw stream to a guest's port rides on one (`ports`).
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    Ok(sender)
}
