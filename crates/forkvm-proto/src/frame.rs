//! Frame encoding and decoding: the fixed 8-byte header, the size cap and the typed
//! errors for every way a frame can be wrong. Bytes from the peer are untrusted input:
//! the header is checked (magic, version, kind, length) before any payload is read.

use std::io::{self, Read, Write};

use serde::{de::DeserializeOwned, Serialize};

/// The two bytes every frame starts with.
pub const MAGIC: [u8; 2] = *b"FV";

/// Wire protocol version.
///
/// Compatibility rule: adding an optional message field (with `#[serde(default)]`), a
/// new request whose absence the peer can detect (`Response::Error { kind: Unsupported }`)
/// or a new frame kind sent only when such a field asks for it (`Started`) keeps the
/// version; anything else (header layout, frame kinds, renamed or required
/// fields, changed conversation order) bumps it. Host and agent must use the same version;
/// a mismatch is answered with an `Error` frame of code `version_mismatch`.
pub const PROTOCOL_VERSION: u8 = 1;

/// Header length in bytes: magic (2), version (1), kind (1), payload length (4, LE).
pub const HEADER_LEN: usize = 8;

/// Largest payload accepted in one frame (1 MiB).
pub const MAX_PAYLOAD: usize = 1 << 20;

/// Payload size used for `Stdout`/`Stderr`/`Data` chunks sent by this crate (256 KiB).
pub const DATA_CHUNK: usize = 256 << 10;

/// What a frame carries; see the table in the crate doc.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// JSON `Request`, host → agent.
    Request = 0x01,
    /// JSON `Response`, agent → host; ends the conversation.
    Response = 0x02,
    /// Raw stdin bytes, host → agent.
    Stdin = 0x03,
    /// Raw stdout bytes, agent → host.
    Stdout = 0x04,
    /// Raw stderr bytes, agent → host.
    Stderr = 0x05,
    /// Raw file bytes, either direction.
    Data = 0x06,
    /// End of a host → agent `Stdin`/`Data` stream; empty payload.
    End = 0x07,
    /// JSON `Started`, agent → host: the exec's process is running (only when the
    /// request set `report_start`).
    Started = 0x08,
    /// JSON `WatchMessage`, agent → host: a `watch` request's news.
    Watch = 0x09,
    /// JSON `ProcNews`, agent → host: an attached background process's news.
    ProcNews = 0x0a,
    /// JSON `ProcControl`, host → agent: a resize or end of input for an attached
    /// background process.
    Control = 0x0b,
    /// JSON `ProtocolError`: the agent rejected a frame.
    Error = 0x7f,
}

impl FrameKind {
    /// Decodes a kind byte, `None` for unknown kinds.
    pub fn from_u8(byte: u8) -> Option<Self> {
        Some(match byte {
            0x01 => Self::Request,
            0x02 => Self::Response,
            0x03 => Self::Stdin,
            0x04 => Self::Stdout,
            0x05 => Self::Stderr,
            0x06 => Self::Data,
            0x07 => Self::End,
            0x08 => Self::Started,
            0x09 => Self::Watch,
            0x0a => Self::ProcNews,
            0x0b => Self::Control,
            0x7f => Self::Error,
            _ => return None,
        })
    }
}

/// Everything that can go wrong reading or writing one frame.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The peer closed the stream cleanly before the first header byte.
    #[error("connection closed before a frame header")]
    Closed,
    /// Reading the header failed.
    #[error("reading frame header: {0}")]
    ReadHeader(#[source] io::Error),
    /// The stream ended inside a header or payload.
    #[error("truncated frame: {what} needs {expected} bytes, got {got}")]
    Truncated { what: &'static str, expected: usize, got: usize },
    /// The first two bytes are not [`MAGIC`].
    #[error("bad frame magic {0:02x?}, expected {MAGIC:02x?} (not a forkvm agent stream?)")]
    BadMagic([u8; 2]),
    /// The peer speaks another protocol version.
    #[error("protocol version mismatch: peer sent {got}, this side speaks {expected}")]
    VersionMismatch { got: u8, expected: u8 },
    /// The kind byte is not in the kind table.
    #[error("unknown frame kind 0x{0:02x}")]
    UnknownKind(u8),
    /// The declared payload is larger than [`MAX_PAYLOAD`].
    #[error("frame payload of {len} bytes exceeds the {max}-byte limit")]
    Oversized { len: usize, max: usize },
    /// Reading the payload failed.
    #[error("reading frame payload: {0}")]
    ReadPayload(#[source] io::Error),
    /// Writing the frame failed.
    #[error("writing {kind:?} frame: {source}")]
    Write { kind: FrameKind, source: io::Error },
    /// Serializing a message to JSON failed.
    #[error("encoding {kind:?} frame as JSON: {source}")]
    Encode { kind: FrameKind, source: serde_json::Error },
    /// The payload is not valid JSON for the expected message type.
    #[error("malformed {kind:?} frame payload: {source}")]
    Malformed { kind: FrameKind, source: serde_json::Error },
}

/// One decoded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// What the payload is.
    pub kind: FrameKind,
    /// Raw payload bytes (JSON or data, depending on `kind`).
    pub payload: Vec<u8>,
}

impl Frame {
    /// Decodes the payload as JSON of type `T`.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, FrameError> {
        serde_json::from_slice(&self.payload).map_err(|source| FrameError::Malformed { kind: self.kind, source })
    }
}

/// Encodes a header for a payload of `len` bytes.
pub fn encode_header(kind: FrameKind, len: usize) -> Result<[u8; HEADER_LEN], FrameError> {
    if len > MAX_PAYLOAD {
        return Err(FrameError::Oversized { len, max: MAX_PAYLOAD });
    }
    let mut header = [0u8; HEADER_LEN];
    header[..2].copy_from_slice(&MAGIC);
    header[2] = PROTOCOL_VERSION;
    header[3] = kind as u8;
    header[4..].copy_from_slice(&(len as u32).to_le_bytes());
    Ok(header)
}

/// Checks a header, returning the kind and payload length. Checks run in wire order:
/// magic, version, kind, length.
pub fn decode_header(header: &[u8; HEADER_LEN]) -> Result<(FrameKind, usize), FrameError> {
    let magic = [header[0], header[1]];
    if magic != MAGIC {
        return Err(FrameError::BadMagic(magic));
    }
    if header[2] != PROTOCOL_VERSION {
        return Err(FrameError::VersionMismatch { got: header[2], expected: PROTOCOL_VERSION });
    }
    let kind = FrameKind::from_u8(header[3]).ok_or(FrameError::UnknownKind(header[3]))?;
    let len = u32::from_le_bytes([header[4], header[5], header[6], header[7]]) as usize;
    if len > MAX_PAYLOAD {
        return Err(FrameError::Oversized { len, max: MAX_PAYLOAD });
    }
    Ok((kind, len))
}

/// Writes one frame (header and payload in a single `write_all`).
pub fn write_frame<W: Write + ?Sized>(w: &mut W, kind: FrameKind, payload: &[u8]) -> Result<(), FrameError> {
    let header = encode_header(kind, payload.len())?;
    let mut buf = Vec::with_capacity(HEADER_LEN + payload.len());
    buf.extend_from_slice(&header);
    buf.extend_from_slice(payload);
    w.write_all(&buf).and_then(|()| w.flush()).map_err(|source| FrameError::Write { kind, source })
}

/// Serializes `msg` as JSON and writes it as one frame of `kind`.
pub fn write_json<W: Write + ?Sized, T: Serialize>(w: &mut W, kind: FrameKind, msg: &T) -> Result<(), FrameError> {
    let payload = serde_json::to_vec(msg).map_err(|source| FrameError::Encode { kind, source })?;
    write_frame(w, kind, &payload)
}

/// Reads as many bytes as available into `buf`, returning how many (short only at EOF).
fn read_full<R: Read + ?Sized>(r: &mut R, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Reads one frame, checking the header before reading (and allocating) the payload.
pub fn read_frame<R: Read + ?Sized>(r: &mut R) -> Result<Frame, FrameError> {
    let mut header = [0u8; HEADER_LEN];
    let got = read_full(r, &mut header).map_err(FrameError::ReadHeader)?;
    if got == 0 {
        return Err(FrameError::Closed);
    }
    if got < HEADER_LEN {
        return Err(FrameError::Truncated { what: "header", expected: HEADER_LEN, got });
    }
    let (kind, len) = decode_header(&header)?;
    let mut payload = vec![0u8; len];
    let got = read_full(r, &mut payload).map_err(FrameError::ReadPayload)?;
    if got < len {
        return Err(FrameError::Truncated { what: "payload", expected: len, got });
    }
    Ok(Frame { kind, payload })
}

#[cfg(test)]
#[path = "frame_tests.rs"]
mod tests;
