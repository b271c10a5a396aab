//! A blocking client for a VMM's control socket: one typed method per request, each
//! returning the type the VMM answers with, and refusals with their [`ErrorCode`].

use super::fd_passing::send_with_fds;
use super::protocol::{hex_encode, Request, Response, CONTROL_PROTOCOL_VERSION};
use crate::devices::attach::TapSource;
use crate::vmm::compact::{CoveredLayer, DiskCompaction};
use crate::vmm::disks::{DiskSeal, LazyDisk};
use crate::vmm::fault::FaultPoint;
use crate::vmm::{BranchReport, BranchRequest, ForkChild, ForkReport, SnapshotReport, VmmLabels, VmmStatus};
use crate::vstate::memory_playbook::TouchedMemory;
use forkvm_api::ErrorCode;
use serde::de::DeserializeOwned;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Most bytes of one answer from a VMM (the largest, a guest's touched memory pages, is
/// a few MiB at most).
pub const MAX_RESPONSE_BYTES: u64 = 16 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ControlClientError {
    #[error("connecting to the VMM control socket {path}: {source}")]
    Connect { path: PathBuf, source: std::io::Error },
    #[error("talking to the VMM control socket: {0}")]
    Io(std::io::Error),
    #[error("the VMM sent a response that is not valid: {0}")]
    BadResponse(String),
    #[error("the VMM speaks control protocol version {found}; this forkvm knows up to {CONTROL_PROTOCOL_VERSION} (stop that sandbox with this forkvm's `kill`, or use the newer forkvm)")]
    Version { found: u32 },
    #[error("not sent: {0}")]
    BadRequest(String),
    #[error("the VMM refused: {error}")]
    Refused { error: String, code: ErrorCode },
}

#[derive(Debug)]
pub struct ControlClient {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl ControlClient {
    pub fn connect(path: &Path) -> Result<ControlClient, ControlClientError> {
        // As a forkvm client: a jailed VMM serves no one else (`host::peer_guard`).
        let stream = forkvm_proto::trusted_peer::connect(path)
            .map_err(|source| ControlClientError::Connect { path: path.into(), source })?;
        ControlClient::over(stream)
    }

    /// A client on a connected stream.
    pub fn over(stream: UnixStream) -> Result<ControlClient, ControlClientError> {
        stream.set_read_timeout(Some(Duration::from_secs(120))).map_err(ControlClientError::Io)?;
        let writer = stream.try_clone().map_err(ControlClientError::Io)?;
        Ok(ControlClient { reader: BufReader::new(stream), writer })
    }

    /// Sends one request; returns its result as JSON (for printing it: code uses the
    /// typed methods), or the VMM's error as `Refused`.
    pub fn call(&mut self, req: &Request) -> Result<serde_json::Value, ControlClientError> {
        let mut line = serde_json::to_string(req).map_err(|e| ControlClientError::BadResponse(e.to_string()))?;
        line.push('\n');
        self.call_raw(&line)
    }

    /// [`ControlClient::call`], with the answer read as `T`.
    fn call_as<T: DeserializeOwned>(&mut self, req: &Request) -> Result<T, ControlClientError> {
        let value = self.call(req)?;
        serde_json::from_value(value).map_err(|e| ControlClientError::BadResponse(format!("answer to {req:?}: {e}")))
    }

    /// Sends a raw request line (tests use this to send malformed input). The answer is
    /// read up to [`MAX_RESPONSE_BYTES`]: a VMM is untrusted, and one its guest took over
    /// must not make its caller (the daemon) buffer without end.
    pub fn call_raw(&mut self, line: &str) -> Result<serde_json::Value, ControlClientError> {
        self.writer.write_all(line.as_bytes()).map_err(ControlClientError::Io)?;
        self.read_answer()
    }

    /// Reads one answer line (see [`ControlClient::call_raw`]).
    fn read_answer(&mut self) -> Result<serde_json::Value, ControlClientError> {
        let mut resp = String::new();
        let n = (&mut self.reader).take(MAX_RESPONSE_BYTES + 1).read_line(&mut resp).map_err(ControlClientError::Io)?;
        if n == 0 {
            return Err(ControlClientError::BadResponse("connection closed before a response".into()));
        }
        if !resp.ends_with('\n') && n as u64 > MAX_RESPONSE_BYTES {
            return Err(ControlClientError::BadResponse(format!(
                "the answer exceeds {MAX_RESPONSE_BYTES} bytes; the rest is not read"
            )));
        }
        let resp: Response =
            serde_json::from_str(&resp).map_err(|e| ControlClientError::BadResponse(format!("{e}: {resp:?}")))?;
        if resp.v > CONTROL_PROTOCOL_VERSION {
            return Err(ControlClientError::Version { found: resp.v });
        }
        match (resp.ok, resp.result, resp.error) {
            (true, result, _) => Ok(result.unwrap_or(serde_json::Value::Null)),
            (false, _, error) => Err(ControlClientError::Refused {
                error: error.unwrap_or_default(),
                code: resp.code.unwrap_or(ErrorCode::Internal),
            }),
        }
    }

    /// The error code of a refusal (`conflict`, `disk_full`, ...), if any.
    pub fn code(err: &ControlClientError) -> Option<ErrorCode> {
        match err {
            ControlClientError::Refused { code, .. } => Some(*code),
            _ => None,
        }
    }

    pub fn status(&mut self) -> Result<VmmStatus, ControlClientError> {
        self.call_as(&Request::Status {})
    }

    /// Pauses the vCPUs (idempotent). The VMM answers its status after, which this
    /// does not read: call [`ControlClient::status`] for it.
    pub fn pause(&mut self) -> Result<(), ControlClientError> {
        self.call(&Request::Pause {}).map(|_| ())
    }

    /// Resumes the vCPUs (idempotent); as [`ControlClient::pause`].
    pub fn resume(&mut self) -> Result<(), ControlClientError> {
        self.call(&Request::Resume {}).map(|_| ())
    }

    /// Snapshots the VM into `dir`, which must not exist.
    pub fn snapshot(&mut self, dir: &Path) -> Result<SnapshotReport, ControlClientError> {
        self.call_as(&Request::Snapshot { dir: dir.to_path_buf() })
    }

    pub fn branch(&mut self, req: BranchRequest) -> Result<BranchReport, ControlClientError> {
        self.call_as(&Request::Branch(req))
    }

    /// Forks the running VM; each child's tap (a descriptor) goes with the request.
    pub fn fork(&mut self, children: Vec<ForkChild>) -> Result<ForkReport, ControlClientError> {
        let mut taps = Vec::new();
        for c in &children {
            match &c.tap {
                Some(TapSource::Fd(fd)) => taps.push(fd.clone()),
                Some(TapSource::Named(_)) => {
                    return Err(ControlClientError::BadRequest("a fork child's tap must be a descriptor".into()))
                }
                None => {}
            }
        }
        if !taps.is_empty() && taps.len() != children.len() {
            return Err(ControlClientError::BadRequest("either every fork child has a tap, or none".into()));
        }
        let req = Request::Fork { children, taps: taps.len() };
        let mut line = serde_json::to_string(&req).map_err(|e| ControlClientError::BadResponse(e.to_string()))?;
        line.push('\n');
        let fds: Vec<_> = taps.iter().map(|fd| fd.as_fd()).collect();
        send_with_fds(&self.writer, line.as_bytes(), &fds).map_err(ControlClientError::Io)?;
        let value = self.read_answer()?;
        serde_json::from_value(value).map_err(|e| ControlClientError::BadResponse(format!("answer to a fork: {e}")))
    }

    /// Sets the labels recorded in the VM's snapshots; answers the status after.
    pub fn label(&mut self, labels: VmmLabels) -> Result<VmmStatus, ControlClientError> {
        self.call_as(&Request::Label(labels))
    }

    pub fn seal_disks(&mut self) -> Result<Vec<DiskSeal>, ControlClientError> {
        self.call_as(&Request::SealDisks {})
    }

    pub fn lazy_disks(&mut self, finish_recording: bool) -> Result<Vec<LazyDisk>, ControlClientError> {
        self.call_as(&Request::LazyDisks { finish_recording })
    }

    pub fn touched_memory(&mut self) -> Result<TouchedMemory, ControlClientError> {
        self.call_as(&Request::TouchedMemory {})
    }

    pub fn compact_disks(
        &mut self,
        covered: Vec<CoveredLayer>,
        min_layers: usize,
    ) -> Result<Vec<DiskCompaction>, ControlClientError> {
        self.call_as(&Request::CompactDisks { covered, min_layers })
    }

    pub fn inject_fault(&mut self, point: FaultPoint) -> Result<(), ControlClientError> {
        self.call(&Request::InjectFault { point }).map(|_| ())
    }

    /// Asks the VMM to stop; it answers before it exits.
    pub fn shutdown(&mut self) -> Result<(), ControlClientError> {
        self.call(&Request::Shutdown {}).map(|_| ())
    }

    pub fn send_input(&mut self, bytes: &[u8]) -> Result<(), ControlClientError> {
        self.call(&Request::SendInput { hex: hex_encode(bytes) }).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer that reads one request line and answers `answer` (then hangs up).
    fn peer(answer: Vec<u8>) -> ControlClient {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(theirs.try_clone().unwrap()).read_line(&mut line);
            let _ = theirs.write_all(&answer);
        });
        ControlClient::over(ours).unwrap()
    }

    #[test]
    fn an_answer_is_read_up_to_its_cap_and_no_further() {
        let ok = format!("{{\"v\":{CONTROL_PROTOCOL_VERSION},\"ok\":true,\"result\":7}}\n");
        assert_eq!(peer(ok.into_bytes()).call(&Request::Status {}).unwrap(), serde_json::json!(7));
        // A VMM that never ends its line: refused once the cap is reached.
        let endless = vec![b' '; (MAX_RESPONSE_BYTES + 4096) as usize];
        let err = peer(endless).call(&Request::Status {}).unwrap_err();
        assert!(err.to_string().contains("exceeds"), "{err}");
    }
}
