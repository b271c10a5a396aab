//! The client's side of background processes ([`crate::procs`]): start, list, input,
//! resize, and attachments that read a process's output while another thread feeds it.

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use crate::client::{
    decode_final, final_response, frame_failed, idle_limit, send_stream, unexpected, AgentClient, ClientError,
    IdleLimit,
};
use crate::{
    read_frame, write_frame, write_json, FrameKind, ProcAttachRequest, ProcControl, ProcInfo, ProcInputRequest,
    ProcNews, ProcResizeRequest, ProcStartRequest, PtySize, Request, Response,
};

/// What an attachment brings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProcEvent {
    /// The output that follows starts at `offset`; `skipped` bytes before it had left
    /// the ring (first, and again whenever the reader fell behind it).
    From {
        offset: u64,
        skipped: u64,
    },
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    /// Nothing new for a while (every 5 s while the process is quiet): a reader that
    /// relays the output can find out here whether its own reader is still there.
    Keepalive,
    /// The attachment is over: the process ended and all its output came (following),
    /// or the output so far came.
    End(ProcInfo),
}

impl<S: Read + Write + IdleLimit> AgentClient<S> {
    /// Starts a background process.
    pub fn proc_start(&self, req: &ProcStartRequest) -> Result<ProcInfo, ClientError> {
        match self.call("proc_start", &Request::ProcStart(req.clone()), idle_limit::CALL)? {
            Response::Proc(info) => Ok(info),
            other => Err(unexpected("proc_start", &other)),
        }
    }

    /// The background processes the agent keeps.
    pub fn proc_list(&self) -> Result<Vec<ProcInfo>, ClientError> {
        match self.call("proc_list", &Request::ProcList, idle_limit::CALL)? {
            Response::Procs { procs } => Ok(procs),
            other => Err(unexpected("proc_list", &other)),
        }
    }

    /// Sends `src` to a background process's stdin (closing it after, with `close`);
    /// returns the bytes it took.
    pub fn proc_input(&self, pid: u32, src: &mut dyn Read, close: bool) -> Result<u64, ClientError> {
        let step = "proc_input";
        let req = Request::ProcInput(ProcInputRequest { pid, close });
        let (mut stream, limit) = self.start(step, &req, idle_limit::CALL)?;
        send_stream(&mut stream, src, FrameKind::Stdin, step, limit)?;
        match final_response(&mut stream, step, limit)? {
            Response::Written { bytes } => Ok(bytes),
            other => Err(unexpected(step, &other)),
        }
    }

    /// Resizes a background process's terminal.
    pub fn proc_resize(&self, pid: u32, size: PtySize) -> Result<(), ClientError> {
        self.expect_done("proc_resize", &Request::ProcResize(ProcResizeRequest { pid, size }))
    }

    /// Attaches to a background process: its output from `req.offset`. Returns once the
    /// agent accepted, with the offset the output starts at.
    pub fn proc_attach(&self, req: &ProcAttachRequest) -> Result<ProcAttachment<S>, ClientError> {
        let step = "proc_attach";
        let (mut stream, limit) = self.start(step, &Request::ProcAttach(*req), idle_limit::ATTACH)?;
        let frame = read_frame(&mut stream).map_err(frame_failed(step, limit, false))?;
        if frame.kind != FrameKind::ProcNews {
            let other = decode_final(&frame, step)?;
            return Err(unexpected(step, &other));
        }
        let first = frame.json::<ProcNews>().map_err(|source| ClientError::Receive { step, source })?;
        let ProcNews::Attached { offset, skipped } = first else {
            return Err(ClientError::Unexpected { step, got: format!("{first:?} before the attachment") });
        };
        Ok(ProcAttachment { stream, limit, pending: Some(ProcEvent::From { offset, skipped }), ended: false })
    }
}

/// An attachment to a background process ([`AgentClient::proc_attach`]). Dropping it
/// detaches; the process runs on.
#[derive(Debug)]
pub struct ProcAttachment<S: Read + Write> {
    stream: S,
    limit: Duration,
    pending: Option<ProcEvent>,
    ended: bool,
}

impl<S: Read + Write> ProcAttachment<S> {
    /// The next event, waiting for it; `None` after [`ProcEvent::End`].
    pub fn recv(&mut self) -> Result<Option<ProcEvent>, ClientError> {
        let step = "proc_attach";
        if let Some(e) = self.pending.take() {
            return Ok(Some(e));
        }
        if self.ended {
            return Ok(None);
        }
        let frame = read_frame(&mut self.stream).map_err(frame_failed(step, self.limit, false))?;
        let event = match frame.kind {
            FrameKind::Stdout => ProcEvent::Stdout(frame.payload),
            FrameKind::Stderr => ProcEvent::Stderr(frame.payload),
            FrameKind::ProcNews => match frame.json::<ProcNews>() {
                Ok(ProcNews::Attached { offset, skipped }) => ProcEvent::From { offset, skipped },
                Ok(ProcNews::Keepalive) => ProcEvent::Keepalive,
                Err(source) => return Err(ClientError::Receive { step, source }),
            },
            _ => {
                self.ended = true;
                match decode_final(&frame, step)? {
                    Response::Proc(info) => ProcEvent::End(info),
                    other => return Err(unexpected(step, &other)),
                }
            }
        };
        Ok(Some(event))
    }
}

impl ProcAttachment<UnixStream> {
    /// A handle that sends input and controls on this attachment from another thread.
    pub fn input(&self) -> io::Result<ProcInput> {
        Ok(ProcInput { stream: self.stream.try_clone()? })
    }
}

/// Input and controls for an attached process ([`ProcAttachment::input`]).
#[derive(Debug)]
pub struct ProcInput {
    stream: UnixStream,
}

impl ProcInput {
    /// Bytes for the process's stdin (its terminal).
    pub fn send(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        for chunk in bytes.chunks(crate::DATA_CHUNK) {
            write_frame(&mut self.stream, FrameKind::Stdin, chunk)
                .map_err(|source| ClientError::Send { step: "proc_attach input", source })?;
        }
        Ok(())
    }

    /// Resizes the process's terminal.
    pub fn resize(&mut self, size: PtySize) -> Result<(), ClientError> {
        self.control(&ProcControl::Resize { size })
    }

    /// Ends the process's input.
    pub fn close_stdin(&mut self) -> Result<(), ClientError> {
        self.control(&ProcControl::CloseStdin)
    }

    fn control(&mut self, c: &ProcControl) -> Result<(), ClientError> {
        write_json(&mut self.stream, FrameKind::Control, c)
            .map_err(|source| ClientError::Send { step: "proc_attach control", source })
    }

    /// Detaches: the attachment's reader gets an error or the end soon after; the
    /// process runs on.
    pub fn detach(&self) {
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}
