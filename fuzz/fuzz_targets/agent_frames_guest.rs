//! The guest side of the agent protocol: what `forkvm-agent` reads from the host on one
//! connection. The input is the host's byte stream.
//!
//! This follows the agent's `server::Agent::serve_one` read path step for step: one frame
//! (`read_frame`), which must be a `Request`, decoded as JSON; for an `exec` with stdin
//! the `Stdin` frames up to `End` (`exec::drain_input`), for `write_file` the `Data` frames
//! up to `End` (`files::write_file`); and a rejected frame answered with the `Error`
//! frame's `ProtocolError` (`ServeError::protocol_error`). The agent's own functions take
//! a `UnixStream` and then act on the request (run commands, write files, reset the
//! guest), so they are not called here; the protocol crate's decoding, which is all the
//! agent does with the bytes before acting, is.
//!
//! Checked: a decoded request serialises and decodes back equal (what the host's client
//! sends is what the agent reads).

#![no_main]

use forkvm_proto::{
    read_frame, write_json, FrameError, FrameKind, ProtocolError, ProtocolErrorCode, Request, PROTOCOL_VERSION,
};
use libfuzzer_sys::fuzz_target;

/// The agent's answer to a rejected frame, or `None` when it just closes the connection.
fn answer(e: &FrameError) -> Option<ProtocolError> {
    match e {
        FrameError::Closed | FrameError::ReadHeader(_) | FrameError::ReadPayload(_) => None,
        e => Some(ProtocolError::from_frame_error(e)),
    }
}

fn unexpected(step: &str, kind: FrameKind) -> ProtocolError {
    ProtocolError {
        code: ProtocolErrorCode::UnexpectedFrame,
        message: format!("unexpected {kind:?} frame during {step}"),
        agent_protocol_version: PROTOCOL_VERSION,
    }
}

/// Reads input frames of `kind` up to `End`.
fn drain(conn: &mut &[u8], kind: FrameKind, step: &str) -> Result<u64, Option<ProtocolError>> {
    let mut total = 0u64;
    loop {
        let frame = read_frame(conn).map_err(|e| answer(&e))?;
        match frame.kind {
            k if k == kind => total += frame.payload.len() as u64,
            FrameKind::End => return Ok(total),
            k => return Err(Some(unexpected(step, k))),
        }
    }
}

fn serve_one(conn: &mut &[u8]) -> Result<(), Option<ProtocolError>> {
    let frame = read_frame(conn).map_err(|e| answer(&e))?;
    if frame.kind != FrameKind::Request {
        return Err(Some(unexpected("request", frame.kind)));
    }
    let req: Request = frame.json().map_err(|e| answer(&e))?;
    let json = serde_json::to_vec(&req).expect("a decoded request serialises");
    let back: Request = serde_json::from_slice(&json).expect("a serialised request decodes");
    assert_eq!(back, req, "request round trip");
    match req {
        Request::Exec(r) if r.stdin => drain(conn, FrameKind::Stdin, "exec stdin").map(|_| ()),
        Request::WriteFile(_) => drain(conn, FrameKind::Data, "write_file data").map(|_| ()),
        Request::ProcInput(_) => drain(conn, FrameKind::Stdin, "proc_input stdin").map(|_| ()),
        _ => Ok(()),
    }
}

fuzz_target!(|data: &[u8]| {
    let mut conn = data;
    if let Err(Some(pe)) = serve_one(&mut conn) {
        let mut out = Vec::new();
        write_json(&mut out, FrameKind::Error, &pe).expect("the agent's Error frame encodes");
        let mut r = &out[..];
        let frame = read_frame(&mut r).expect("the agent's Error frame decodes");
        assert_eq!(frame.json::<ProtocolError>().expect("Error payload"), pe, "Error frame round trip");
    }
});
