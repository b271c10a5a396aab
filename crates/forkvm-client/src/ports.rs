//! Exposed ports (`/v1/sandboxes/{id}/ports`) and port forwarding: a local TCP listener
//! whose every connection becomes a raw stream to a guest's port, each over its own
//! connection to the daemon (`GET /v1/sandboxes/{id}/tcp/{port}`, upgraded to `tcp`).

use crate::client::{check, Client};
use crate::encode::Target;
use crate::error::ClientError;
use crate::transport;
use forkvm_api::{ExposeRequest, ExposedPort};
use hyper::header::{HeaderMap, HeaderName, HeaderValue, AUTHORIZATION, CONNECTION, HOST, UPGRADE, USER_AGENT};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio_rustls::TlsConnector;

fn ports(id: &str) -> Result<Target, ClientError> {
    Ok(Target::new("/v1/sandboxes").segment("sandbox id", id)?.push("/ports"))
}

/// What a forwarded connection reports when it ends badly (the listener goes on).
pub type ForwardErrors = Arc<dyn Fn(&str) + Send + Sync>;

/// What opening an upgraded stream needs, owned, so each connection's task (or a
/// socket's own thread) can open its own.
#[derive(Clone)]
pub(crate) struct StreamOpener {
    endpoint: crate::Endpoint,
    authorization: Option<HeaderValue>,
    tls: Option<TlsConnector>,
    connect_timeout: Duration,
    pub(crate) target: String,
}

impl StreamOpener {
    /// A raw stream to the guest's port, through its own connection to the daemon.
    async fn open(&self) -> Result<TokioIo<hyper::upgrade::Upgraded>, ClientError> {
        Ok(self.upgrade("tcp", &[]).await?.1)
    }

    /// The target upgraded to `protocol` (with `headers` besides the usual ones), on a
    /// connection of its own: the answer's headers and the stream.
    pub(crate) async fn upgrade(
        &self,
        protocol: &'static str,
        headers: &[(HeaderName, HeaderValue)],
    ) -> Result<(HeaderMap, TokioIo<hyper::upgrade::Upgraded>), ClientError> {
        let name = format!("GET {}", self.target);
        let mut sender = transport::connect(&self.endpoint, self.tls.as_ref(), self.connect_timeout, &name).await?;
        let mut req = Request::builder()
            .method(Method::GET)
            .uri(&self.target)
            .header(HOST, self.endpoint.authority())
            .header(USER_AGENT, concat!("forkvm-client/", env!("CARGO_PKG_VERSION")))
            .header(CONNECTION, "upgrade")
            .header(UPGRADE, protocol);
        if let Some(auth) = &self.authorization {
            req = req.header(AUTHORIZATION, auth.clone());
        }
        for (k, v) in headers {
            req = req.header(k, v);
        }
        let req =
            req.body(transport::empty()).map_err(|e| ClientError::Send { request: name.clone(), source: e.into() })?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| ClientError::Send { request: name.clone(), source: e.into() })?;
        if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
            let resp = check(resp, &name).await?;
            return Err(ClientError::Receive {
                request: name,
                source: format!("expected 101 Switching Protocols, got {}", resp.status()).into(),
            });
        }
        let answered = resp.headers().clone();
        let upgraded =
            hyper::upgrade::on(resp).await.map_err(|e| ClientError::Receive { request: name, source: e.into() })?;
        Ok((answered, TokioIo::new(upgraded)))
    }
}

impl Client {
    /// `GET /v1/sandboxes/{id}/ports`.
    pub fn exposed_ports(&self, id: &str) -> Result<Vec<ExposedPort>, ClientError> {
        self.call_json(Method::GET, &ports(id)?.build(), None::<&()>, "exposed ports")
    }

    /// `POST /v1/sandboxes/{id}/ports`: `port`'s path and token (the ones it has if it
    /// was exposed already), bound to the key whose thumbprint is `dpop_jkt` if given.
    pub fn expose(&self, id: &str, port: u16, dpop_jkt: Option<&str>) -> Result<ExposedPort, ClientError> {
        let req = ExposeRequest { port, dpop_jkt: dpop_jkt.map(str::to_string) };
        self.call_json(Method::POST, &ports(id)?.build(), Some(&req), "exposed port")
    }

    /// `DELETE /v1/sandboxes/{id}/ports/{port}`: its token stops working.
    pub fn unexpose(&self, id: &str, port: u16) -> Result<(), ClientError> {
        self.call_empty(Method::DELETE, &ports(id)?.segment("port", &port.to_string())?.build())
    }

    /// Forwards `listen` (`host:port`; port 0 picks one) to `port` of sandbox `id` until
    /// the listener fails: each accepted connection gets a stream to the guest's port
    /// of its own. `ready` is told the address listened on once the sandbox's port was
    /// reached once (so a wrong id or a closed port fails here, before listening);
    /// `errors` hears of connections that ended badly.
    pub fn port_forward(
        &self,
        id: &str,
        listen: &str,
        port: u16,
        ready: impl FnOnce(SocketAddr),
        errors: ForwardErrors,
    ) -> Result<(), ClientError> {
        let opener = self.stream_opener(
            Target::new("/v1/sandboxes").segment("sandbox id", id)?.push("/tcp").segment("port", &port.to_string())?,
        );
        self.block_on(async move {
            drop(opener.open().await?);
            let listener = tokio::net::TcpListener::bind(listen)
                .await
                .map_err(|source| ClientError::Connect { endpoint: format!("listening on {listen}"), source })?;
            let local = listener
                .local_addr()
                .map_err(|source| ClientError::Connect { endpoint: format!("listening on {listen}"), source })?;
            ready(local);
            loop {
                let (mut conn, peer) = listener
                    .accept()
                    .await
                    .map_err(|source| ClientError::Connect { endpoint: format!("accepting on {local}"), source })?;
                let _ = conn.set_nodelay(true);
                let (opener, errors) = (opener.clone(), errors.clone());
                tokio::spawn(async move {
                    let ended = match opener.open().await {
                        Ok(mut guest) => tokio::io::copy_bidirectional(&mut conn, &mut guest)
                            .await
                            .map(drop)
                            .map_err(|e| e.to_string()),
                        Err(e) => Err(e.to_string()),
                    };
                    if let Err(why) = ended {
                        errors(&format!("{peer} -> sandbox port {port}: {why}"));
                    }
                });
            }
        })
    }

    pub(crate) fn stream_opener(&self, target: Target) -> StreamOpener {
        StreamOpener {
            endpoint: self.endpoint().clone(),
            authorization: self.authorization().cloned(),
            tls: self.tls().cloned(),
            connect_timeout: self.connect_timeout(),
            target: target.build(),
        }
    }
}
