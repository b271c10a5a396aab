//! A background process on a WebSocket (`GET /v1/sandboxes/{id}/processes/{pid}/attach`):
//! its output comes as [`SocketEvent`]s while [`SocketInput`] (from any thread) types,
//! resizes, signals and ends its input, all on one connection, as a terminal needs.
//!
//! The socket lives on a thread of its own with its own small runtime: the client's
//! runtime only runs while a call blocks on it, and a terminal reads and writes at once.
//! The upgrade is made there too (a stream belongs to the runtime that opened it), and
//! [`Client::attach_process`] returns once it is made or failed.

use crate::client::Client;
use crate::error::ClientError;
use crate::ports::StreamOpener;
use forkvm_api::{ProcessControl, ProcessInfo, ProcessOutputEvent, TerminalSize, ATTACH_STDERR, ATTACH_STDOUT};
use futures_util::{SinkExt, StreamExt};
use hyper::header::{HeaderName, HeaderValue};
use std::sync::mpsc;
use std::time::Duration;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

/// What an attached socket brings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SocketEvent {
    /// The output that follows starts at `offset`; `skipped` bytes asked for had left
    /// the ring (first, and again whenever the reader fell behind).
    From {
        offset: u64,
        skipped: u64,
    },
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    /// Five seconds without output.
    Keepalive,
    /// The process ended (its output all came); the socket is closed.
    End(ProcessInfo),
}

/// An attachment to a background process over a WebSocket. Dropping it detaches: the
/// process runs on.
#[derive(Debug)]
pub struct ProcessSocket {
    events: mpsc::Receiver<Result<SocketEvent, ClientError>>,
    input: SocketInput,
    over: bool,
}

/// Input and controls for a [`ProcessSocket`], from any thread.
#[derive(Debug, Clone)]
pub struct SocketInput {
    out: tokio::sync::mpsc::UnboundedSender<Message>,
}

impl Client {
    /// `GET /v1/sandboxes/{id}/processes/{pid}/attach?offset=`, a WebSocket: the
    /// process's output from `offset` (the oldest byte kept when `None`) as it comes,
    /// and its input the other way.
    pub fn attach_process(&self, id: &str, pid: u32, offset: Option<u64>) -> Result<ProcessSocket, ClientError> {
        let mut target = crate::processes::process(id, pid, "/attach")?;
        if let Some(o) = offset {
            target = target.query("offset", &o.to_string());
        }
        ProcessSocket::open(self.stream_opener(target))
    }
}

impl ProcessSocket {
    fn open(opener: StreamOpener) -> Result<ProcessSocket, ClientError> {
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), ClientError>>();
        let (events_tx, events) = mpsc::channel();
        let (out, out_rx) = tokio::sync::mpsc::unbounded_channel();
        let request = format!("GET {}", opener.target);
        std::thread::Builder::new()
            .name("process-socket".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(ClientError::Runtime(e)));
                        return;
                    }
                };
                rt.block_on(async move {
                    match handshake(&opener).await {
                        Ok(ws) => {
                            let _ = ready_tx.send(Ok(()));
                            relay(ws, out_rx, events_tx, &opener.target).await;
                        }
                        Err(e) => drop(ready_tx.send(Err(e))),
                    }
                });
            })
            .map_err(ClientError::Runtime)?;
        let gone = || ClientError::Receive { request: request.clone(), source: "the socket's thread ended".into() };
        ready_rx.recv().map_err(|_| gone())??;
        Ok(ProcessSocket { events, input: SocketInput { out }, over: false })
    }

    /// The next event, waiting for it; `None` once the process ended ([`SocketEvent::End`]
    /// came) or the socket was detached. The daemon's `error` is [`ClientError::Stream`].
    pub fn recv(&mut self) -> Result<Option<SocketEvent>, ClientError> {
        self.take(self.events.recv().ok())
    }

    /// [`ProcessSocket::recv`], waiting at most `limit` (`Ok(None)` with the socket still
    /// open when nothing came: see [`ProcessSocket::is_over`]).
    pub fn recv_timeout(&mut self, limit: Duration) -> Result<Option<SocketEvent>, ClientError> {
        match self.events.recv_timeout(limit) {
            Ok(e) => self.take(Some(e)),
            Err(mpsc::RecvTimeoutError::Timeout) => Ok(None),
            Err(mpsc::RecvTimeoutError::Disconnected) => self.take(None),
        }
    }

    /// Whether the socket ended (the process ended, or it was detached or failed).
    pub fn is_over(&self) -> bool {
        self.over
    }

    fn take(&mut self, got: Option<Result<SocketEvent, ClientError>>) -> Result<Option<SocketEvent>, ClientError> {
        match got {
            None => {
                self.over = true;
                Ok(None)
            }
            Some(Err(e)) => {
                self.over = true;
                Err(e)
            }
            Some(Ok(e)) => {
                self.over |= matches!(e, SocketEvent::End(_));
                Ok(Some(e))
            }
        }
    }

    /// A handle that types and sends controls, from any thread.
    pub fn input(&self) -> SocketInput {
        self.input.clone()
    }
}

impl Drop for ProcessSocket {
    fn drop(&mut self) {
        self.input.detach();
    }
}

impl SocketInput {
    /// Bytes for the process's stdin (its terminal's keys).
    pub fn send(&self, bytes: &[u8]) -> Result<(), ClientError> {
        self.push(Message::Binary(bytes.to_vec().into()))
    }

    /// The terminal's new size.
    pub fn resize(&self, size: TerminalSize) -> Result<(), ClientError> {
        self.control(ProcessControl::Resize { rows: size.rows, cols: size.cols })
    }

    /// Ends the process's input.
    pub fn close_stdin(&self) -> Result<(), ClientError> {
        self.control(ProcessControl::CloseStdin)
    }

    /// A signal to the process's group.
    pub fn signal(&self, signal: i32) -> Result<(), ClientError> {
        self.control(ProcessControl::Signal { signal })
    }

    /// Closes the socket: the process runs on.
    pub fn detach(&self) {
        let _ = self.out.send(Message::Close(None));
    }

    fn control(&self, c: ProcessControl) -> Result<(), ClientError> {
        let text = serde_json::to_string(&c)
            .map_err(|e| ClientError::Send { request: "a process socket's control".into(), source: e.into() })?;
        self.push(Message::Text(text.into()))
    }

    fn push(&self, m: Message) -> Result<(), ClientError> {
        self.out.send(m).map_err(|_| ClientError::Send {
            request: "input on a process socket".into(),
            source: "the socket is closed".into(),
        })
    }
}

/// The upgrade, with the accept key checked.
async fn handshake(
    opener: &StreamOpener,
) -> Result<WebSocketStream<hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>>, ClientError> {
    let key = tokio_tungstenite::tungstenite::handshake::client::generate_key();
    let headers = [
        (HeaderName::from_static("sec-websocket-version"), HeaderValue::from_static("13")),
        (
            HeaderName::from_static("sec-websocket-key"),
            HeaderValue::from_str(&key)
                .map_err(|e| ClientError::Send { request: format!("GET {}", opener.target), source: e.into() })?,
        ),
    ];
    let (answered, io) = opener.upgrade("websocket", &headers).await?;
    let accept = answered.get("sec-websocket-accept").and_then(|v| v.to_str().ok());
    if accept != Some(derive_accept_key(key.as_bytes()).as_str()) {
        return Err(ClientError::Receive {
            request: format!("GET {}", opener.target),
            source: "the daemon's WebSocket answer has a wrong Sec-WebSocket-Accept".into(),
        });
    }
    Ok(WebSocketStream::from_raw_socket(io, Role::Client, None).await)
}

/// The socket's loop: what the caller sends goes out, what comes in becomes events,
/// until either side closes.
async fn relay<S>(
    ws: WebSocketStream<S>,
    mut out: tokio::sync::mpsc::UnboundedReceiver<Message>,
    events: mpsc::Sender<Result<SocketEvent, ClientError>>,
    target: &str,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let failed = |source: String| ClientError::Receive { request: format!("GET {target}"), source: source.into() };
    let (mut sink, mut stream) = ws.split();
    loop {
        tokio::select! {
            m = out.recv() => {
                let Some(m) = m else { break };
                let last = matches!(m, Message::Close(_));
                if sink.send(m).await.is_err() || last {
                    break;
                }
            }
            m = stream.next() => {
                let event = match m {
                    Some(Ok(Message::Binary(b))) => match b.split_first() {
                        Some((&ATTACH_STDOUT, rest)) => Ok(SocketEvent::Stdout(rest.to_vec())),
                        Some((&ATTACH_STDERR, rest)) => Ok(SocketEvent::Stderr(rest.to_vec())),
                        _ => Err(failed(format!("an output message of stream {:?}", b.first()))),
                    },
                    Some(Ok(Message::Text(t))) => match serde_json::from_str::<ProcessOutputEvent>(t.as_str()) {
                        Ok(ProcessOutputEvent::From { offset, skipped }) => Ok(SocketEvent::From { offset, skipped }),
                        Ok(ProcessOutputEvent::Keepalive) => Ok(SocketEvent::Keepalive),
                        Ok(ProcessOutputEvent::End { process }) => Ok(SocketEvent::End(process)),
                        Ok(ProcessOutputEvent::Error { error }) => Err(ClientError::Stream { message: error }),
                        Ok(ProcessOutputEvent::Output { .. }) => Err(failed("base64 output on a socket".into())),
                        Err(e) => Err(failed(format!("a text message that is no event: {e}"))),
                    },
                    Some(Ok(_)) => continue,
                    Some(Err(e)) => Err(failed(e.to_string())),
                    None => break,
                };
                let last = !matches!(event, Ok(SocketEvent::From { .. } | SocketEvent::Stdout(_) | SocketEvent::Stderr(_) | SocketEvent::Keepalive));
                if events.send(event).is_err() || last {
                    break;
                }
            }
        }
    }
    let _ = sink.close().await;
}
