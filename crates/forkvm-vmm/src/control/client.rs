//! A blocking client for a VMM's control socket.

use super::protocol::{hex_encode, Request, Response};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum ControlClientError {
    #[error("connecting to the VMM control socket {path}: {source}")]
    Connect { path: PathBuf, source: std::io::Error },
    #[error("talking to the VMM control socket: {0}")]
    Io(std::io::Error),
    #[error("the VMM sent a response that is not valid: {0}")]
    BadResponse(String),
    #[error("the VMM refused: {error}")]
    Refused { error: String, code: Option<String> },
}

#[derive(Debug)]
pub struct ControlClient {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl ControlClient {
    pub fn connect(path: &Path) -> Result<ControlClient, ControlClientError> {
        let stream =
            UnixStream::connect(path).map_err(|source| ControlClientError::Connect { path: path.into(), source })?;
        stream.set_read_timeout(Some(Duration::from_secs(120))).map_err(ControlClientError::Io)?;
        let writer = stream.try_clone().map_err(ControlClientError::Io)?;
        Ok(ControlClient { reader: BufReader::new(stream), writer })
    }

    /// Sends one request; returns its result, or the VMM's error as `Refused`.
    pub fn call(&mut self, req: &Request) -> Result<serde_json::Value, ControlClientError> {
        let mut line = serde_json::to_string(req).map_err(|e| ControlClientError::BadResponse(e.to_string()))?;
        line.push('\n');
        self.call_raw(&line)
    }

    /// Sends a raw request line (tests use this to send malformed input).
    pub fn call_raw(&mut self, line: &str) -> Result<serde_json::Value, ControlClientError> {
        self.writer.write_all(line.as_bytes()).map_err(ControlClientError::Io)?;
        let mut resp = String::new();
        let n = self.reader.read_line(&mut resp).map_err(ControlClientError::Io)?;
        if n == 0 {
            return Err(ControlClientError::BadResponse("connection closed before a response".into()));
        }
        let resp: Response =
            serde_json::from_str(&resp).map_err(|e| ControlClientError::BadResponse(format!("{e}: {resp:?}")))?;
        match (resp.ok, resp.result, resp.error) {
            (true, result, _) => Ok(result.unwrap_or(serde_json::Value::Null)),
            (false, _, error) => Err(ControlClientError::Refused { error: error.unwrap_or_default(), code: resp.code }),
        }
    }

    /// The error code of a refusal (`conflict`, `disk_full`, ...), if any.
    pub fn code(err: &ControlClientError) -> Option<&str> {
        match err {
            ControlClientError::Refused { code, .. } => code.as_deref(),
            _ => None,
        }
    }

    pub fn send_input(&mut self, bytes: &[u8]) -> Result<(), ControlClientError> {
        self.call(&Request::SendInput { hex: hex_encode(bytes) }).map(|_| ())
    }
}
