//! `GET /v1/sandboxes/{id}/processes/{pid}/attach`: a background process on a WebSocket,
//! output out and input in on one connection, as a terminal in a browser or an SDK
//! needs it (docs/processes.md). Output goes out as binary messages whose first byte is
//! the stream ([`ATTACH_STDOUT`], [`ATTACH_STDERR`]), the rest of what the agent says
//! (`from`, `keepalive`, `end`, `error`) as [`ProcessOutputEvent`] text; binary messages
//! in are stdin, text messages in are [`ProcessControl`]. The process ending closes the
//! socket (1000) after its `end`; the client closing it detaches, and the process runs
//! on. A control the daemon cannot take (not JSON, a size or signal out of range) is
//! answered with an `error` and a close (1008).
//!
//! The agent's attachment is made before the upgrade: an unknown sandbox or pid, or an
//! offset past the end, is an HTTP error, not a socket that closes at once.

use super::processes::{pid_of, proc_error};
use super::run::client;
use crate::error::{agent_error, ApiError};
use crate::extract::QueryArgs;
use crate::lifecycle::InUse;
use crate::state::AppState;
use axum::extract::ws::{close_code, CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::response::Response;
use forkvm_api::{ProcessAttachQuery, ProcessControl, ProcessOutputEvent, ATTACH_STDERR, ATTACH_STDOUT};
use forkvm_proto::{ProcAttachRequest, ProcAttachment, ProcEvent, ProcInput, PtySize};
use forkvm_sandbox::process_view;
use futures_util::{SinkExt, StreamExt};
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// The largest message a client may send (stdin arrives in pieces of any size below).
const MAX_MESSAGE: usize = 1 << 20;
/// Messages from the client waiting for the agent.
const INBOUND_QUEUE: usize = 64;
/// How long a closed socket waits for the client's close in answer.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// The upgrade, once the agent attached.
pub async fn attach(
    State(s): State<AppState>,
    Path((id, pid)): Path<(String, String)>,
    QueryArgs(q): QueryArgs<ProcessAttachQuery>,
    ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let pid = pid_of(&pid)?;
    let sandbox = id.clone();
    s.blocking(move |s| s.known_sandbox(&sandbox).map(drop)).await?;
    let ws = ws.map_err(|e| {
        ApiError::bad_request(format!(
            "attaching to a process needs a WebSocket (GET with Connection: upgrade, Upgrade: websocket): {e}"
        ))
    })?;
    let sandbox = id.clone();
    let (attachment, in_use) = s
        .blocking(move |s| {
            let (c, in_use) = client(&s, &sandbox)?;
            let req = ProcAttachRequest { pid, offset: q.offset, follow: true };
            let attachment = c.proc_attach(&req).map_err(|e| proc_error(&sandbox, e))?;
            Ok((attachment, in_use))
        })
        .await?;
    let handles = attachment.input().and_then(|a| Ok((a, attachment.input()?)));
    let (input, detach) = handles.map_err(|e| ApiError::internal(format!("a handle on the attachment: {e}")))?;
    let session = Session { s, id, pid, in_use };
    // A browser (the web console) offers `forkvm` beside its token and needs it chosen.
    Ok(ws
        .max_message_size(MAX_MESSAGE)
        .protocols(["forkvm"])
        .on_upgrade(move |socket| session.run(socket, attachment, input, detach)))
}

/// One attached client.
struct Session {
    s: AppState,
    id: String,
    pid: u32,
    /// An attached client keeps the sandbox from idle pause, as a follower does.
    in_use: InUse,
}

/// What the client sent that goes to the agent, in order.
enum Inbound {
    Stdin(bytes::Bytes),
    Control(ProcessControl),
}

impl Session {
    async fn run(self, socket: WebSocket, attachment: ProcAttachment<UnixStream>, input: ProcInput, detach: ProcInput) {
        let Session { s, id, pid, in_use } = self;
        let (mut sink, mut stream) = socket.split();
        let (out_tx, mut out_rx) = tokio::sync::mpsc::channel::<Message>(64);
        let reader_tx = out_tx.clone();
        let reader_id = id.clone();
        tokio::task::spawn_blocking(move || {
            let mut send = |m: Message| reader_tx.blocking_send(m).is_ok();
            read_output(attachment, &reader_id, &mut send);
        });
        // Bounded both ways: a client that types faster than the process reads stops
        // being read (TCP holds it back) while its output still flows.
        let (in_tx, in_rx) = tokio::sync::mpsc::channel::<Inbound>(INBOUND_QUEUE);
        let writer_id = id.clone();
        tokio::task::spawn_blocking(move || write_input(&s, &writer_id, pid, input, in_rx, out_tx));
        loop {
            tokio::select! {
                out = out_rx.recv() => {
                    let Some(msg) = out else { break };
                    let last = matches!(msg, Message::Close(_));
                    if sink.send(msg).await.is_err() || last {
                        break;
                    }
                }
                inbound = stream.next(), if in_tx.capacity() > 0 => {
                    let sent = match inbound {
                        Some(Ok(Message::Binary(b))) => in_tx.try_send(Inbound::Stdin(b)).is_ok(),
                        Some(Ok(Message::Text(t))) => match control(t.as_str()) {
                            Ok(c) => in_tx.try_send(Inbound::Control(c)).is_ok(),
                            Err(why) => {
                                let _ = sink.send(error_text(why.clone())).await;
                                let _ = sink.send(close(close_code::POLICY, &why)).await;
                                false
                            }
                        },
                        Some(Ok(Message::Ping(_) | Message::Pong(_))) => true,
                        Some(Ok(Message::Close(_)) | Err(_)) | None => false,
                    };
                    if !sent {
                        break;
                    }
                }
            }
        }
        // The process runs on; the agent's reader and our writer end with the attachment.
        detach.detach();
        drop(in_tx);
        let _ = tokio::time::timeout(CLOSE_WAIT, async { while let Some(Ok(_)) = stream.next().await {} }).await;
        drop(in_use);
        tracing::debug!(sandbox_id = %id, pid, "a process's socket closed");
    }
}

/// A client's text message, checked.
fn control(text: &str) -> Result<ProcessControl, String> {
    let c: ProcessControl =
        serde_json::from_str(text).map_err(|e| format!("a text message is a control ({{\"type\": ...}}): {e}"))?;
    match c {
        ProcessControl::Resize { rows, cols } if !PtySize { rows, cols }.is_valid() => {
            Err(format!("a terminal of {rows}x{cols}: rows and cols must be between 1 and 1000"))
        }
        ProcessControl::Signal { signal } if !(1..=64).contains(&signal) => {
            Err(format!("signal {signal} is not a signal number (1..=64)"))
        }
        ok => Ok(ok),
    }
}

/// On a blocking thread: the agent's events as messages, until the process ended (then
/// its `end` and a close) or the attachment failed or was detached.
fn read_output(mut attachment: ProcAttachment<UnixStream>, id: &str, send: &mut dyn FnMut(Message) -> bool) {
    loop {
        let sent = match attachment.recv() {
            Ok(Some(ProcEvent::Stdout(b))) => send(output(ATTACH_STDOUT, &b)),
            Ok(Some(ProcEvent::Stderr(b))) => send(output(ATTACH_STDERR, &b)),
            Ok(Some(ProcEvent::From { offset, skipped })) => send(text(&ProcessOutputEvent::From { offset, skipped })),
            Ok(Some(ProcEvent::Keepalive)) => send(text(&ProcessOutputEvent::Keepalive)),
            Ok(Some(ProcEvent::End(p))) => {
                let _ = send(text(&ProcessOutputEvent::End { process: process_view::info(p) }))
                    && send(close(close_code::NORMAL, "the process ended"));
                return;
            }
            Ok(None) => return,
            Err(e) => {
                let _ = send(error_text(agent_error(id, e).message)) && send(close(close_code::ERROR, "agent error"));
                return;
            }
        };
        if !sent {
            return;
        }
    }
}

/// On a blocking thread: the client's input and controls to the agent, in order; a
/// failure is told to the client, and closes the socket.
fn write_input(
    s: &AppState,
    id: &str,
    pid: u32,
    mut input: ProcInput,
    mut inbound: tokio::sync::mpsc::Receiver<Inbound>,
    out: tokio::sync::mpsc::Sender<Message>,
) {
    while let Some(next) = inbound.blocking_recv() {
        let done = match next {
            Inbound::Stdin(b) => input.send(&b).map_err(|e| agent_error(id, e)),
            Inbound::Control(ProcessControl::Resize { rows, cols }) => {
                input.resize(PtySize { rows, cols }).map_err(|e| agent_error(id, e))
            }
            Inbound::Control(ProcessControl::CloseStdin) => input.close_stdin().map_err(|e| agent_error(id, e)),
            Inbound::Control(ProcessControl::Signal { signal }) => {
                client(s, id).and_then(|(c, _in_use)| c.signal(pid, signal).map_err(|e| proc_error(id, e)))
            }
        };
        if let Err(e) = done {
            let _ = out.blocking_send(error_text(e.message));
            let _ = out.blocking_send(close(close_code::ERROR, "input failed"));
            return;
        }
    }
}

fn output(stream: u8, bytes: &[u8]) -> Message {
    let mut framed = Vec::with_capacity(bytes.len() + 1);
    framed.push(stream);
    framed.extend_from_slice(bytes);
    Message::Binary(framed.into())
}

fn text(event: &ProcessOutputEvent) -> Message {
    let line = serde_json::to_string(event).unwrap_or_else(|e| format!(r#"{{"type":"error","error":"{e}"}}"#));
    Message::Text(line.into())
}

fn error_text(error: String) -> Message {
    text(&ProcessOutputEvent::Error { error })
}

fn close(code: u16, reason: &str) -> Message {
    Message::Close(Some(CloseFrame { code, reason: reason.into() }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_are_checked_before_the_agent_sees_them() {
        assert_eq!(
            control(r#"{"type":"resize","rows":50,"cols":132}"#),
            Ok(ProcessControl::Resize { rows: 50, cols: 132 })
        );
        assert_eq!(control(r#"{"type":"close_stdin"}"#), Ok(ProcessControl::CloseStdin));
        assert_eq!(control(r#"{"type":"signal","signal":2}"#), Ok(ProcessControl::Signal { signal: 2 }));
        assert!(control(r#"{"type":"resize","rows":0,"cols":80}"#).unwrap_err().contains("0x80"));
        assert!(control(r#"{"type":"signal","signal":65}"#).unwrap_err().contains("65"));
        assert!(control(r#"{"type":"resize","rows":5,"cols":5,"x":1}"#).unwrap_err().contains("unknown field"));
        assert!(control("ls\n").unwrap_err().contains("a text message is a control"));
    }

    #[test]
    fn output_messages_lead_with_their_stream() {
        let Message::Binary(b) = output(ATTACH_STDERR, b"oops") else { panic!("a binary message") };
        assert_eq!(&b[..], b"\x02oops");
    }
}
