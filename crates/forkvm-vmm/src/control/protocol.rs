//! Control-socket messages. Requests reject unknown fields; responses carry either a
//! result or an error string that names what failed.

use crate::vmm::fault::FaultPoint;
use crate::vmm::{BranchRequest, ForkChild, VmmLabels};
use forkvm_api::ErrorCode;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Longest request line the server reads.
pub const MAX_REQUEST_BYTES: usize = 1 << 20;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    // Empty struct variants, not unit ones: serde ignores unknown fields next to the tag
    // of a unit variant, and requests must reject them.
    Status {},
    Pause {},
    Resume {},
    /// Snapshot into `dir`, which must not exist; its last component is the tag.
    Snapshot {
        dir: PathBuf,
    },
    /// Bytes for COM1's input, hex-encoded.
    SendInput {
        hex: String,
    },
    Shutdown {},
    /// Snapshot the running VM under a new tag (full or live).
    Branch(BranchRequest),
    /// Fork the running VM into one child VMM per entry. `taps` descriptors come with the
    /// request (`SCM_RIGHTS`, see `fd_passing`): the first `taps` children's taps, in order.
    Fork {
        children: Vec<ForkChild>,
        #[serde(default, skip_serializing_if = "is_zero")]
        taps: usize,
    },
    /// Set the labels (sandbox id, template) recorded in this VM's snapshots.
    Label(VmmLabels),
    /// Seal every layered disk's top (a consistent cut of the disks, without pausing the
    /// vCPUs); answers with each layered disk's sealed layers.
    SealDisks {},
    /// The lazily restored disks' counters; `finish_recording` ends their recordings
    /// and merges them into their playbooks.
    LazyDisks {
        #[serde(default)]
        finish_recording: bool,
    },
    /// The guest memory pages this VM has touched since its restore
    /// (`vstate::memory_playbook::TouchedMemory`), for the caller to merge into a
    /// memory playbook.
    TouchedMemory {},
    /// Merge each listed disk's own sealed layers up to the given (vault-covered) layer
    /// into one, when there are at least `min_layers` (`vmm::compact`).
    CompactDisks {
        covered: Vec<crate::vmm::compact::CoveredLayer>,
        min_layers: usize,
    },
    /// Arm a fault for the next branch (only with `FORKVM_FAULT_INJECTION=1`).
    InjectFault {
        point: FaultPoint,
    },
}

/// Version of this protocol, sent in every response. A VMM outlives the daemon and the
/// CLI that started it, so an upgraded forkvm may talk to a VMM of an older build: it
/// reads answers of any version up to its own (version 1 VMMs sent none), and refuses
/// a newer one by name rather than misreading it.
///
/// - 1: `code` is free text.
/// - 2: `v` is sent; `code` is a [`forkvm_api::ErrorCode`].
pub const CONTROL_PROTOCOL_VERSION: u32 = 2;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Response {
    /// The answering VMM's [`CONTROL_PROTOCOL_VERSION`] (absent: 1).
    #[serde(default = "version_1")]
    pub v: u32,
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What kind of failure (absent: internal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<ErrorCode>,
}

fn version_1() -> u32 {
    1
}

impl Response {
    pub fn ok(result: serde_json::Value) -> Response {
        Response { v: CONTROL_PROTOCOL_VERSION, ok: true, result: Some(result), error: None, code: None }
    }
    /// A successful answer of a typed result.
    pub fn ok_as<T: Serialize>(result: &T) -> Response {
        match serde_json::to_value(result) {
            Ok(v) => Response::ok(v),
            Err(e) => Response::err(format!("encoding the answer: {e}"), ErrorCode::Internal),
        }
    }
    pub fn err(error: impl Into<String>, code: ErrorCode) -> Response {
        Response { v: CONTROL_PROTOCOL_VERSION, ok: false, result: None, error: Some(error.into()), code: Some(code) }
    }
}

/// Hex input that is not hex.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HexError {
    #[error("hex input has odd length {0}")]
    OddLength(usize),
    #[error("hex input is not hex at offset {0}")]
    NotHex(usize),
}

pub fn hex_encode(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn hex_decode(s: &str) -> Result<Vec<u8>, HexError> {
    if !s.len().is_multiple_of(2) {
        return Err(HexError::OddLength(s.len()));
    }
    (0..s.len())
        .step_by(2)
        .map(|i| {
            // `from_str_radix` alone would also take a sign ("+f").
            s.get(i..i + 2)
                .filter(|pair| pair.bytes().all(|b| b.is_ascii_hexdigit()))
                .and_then(|pair| u8::from_str_radix(pair, 16).ok())
                .ok_or(HexError::NotHex(i))
        })
        .collect()
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_and_reject_unknown_fields() {
        let r: Request = serde_json::from_str(r#"{"op":"snapshot","dir":"/x/t"}"#).unwrap();
        assert_eq!(r, Request::Snapshot { dir: "/x/t".into() });
        assert!(serde_json::from_str::<Request>(r#"{"op":"pause","x":1}"#).is_err());
        assert!(serde_json::from_str::<Request>(r#"{"op":"snapshot","dir":"/a","x":1}"#).is_err());
        assert_eq!(serde_json::from_str::<Request>(r#"{"op":"pause"}"#).unwrap(), Request::Pause {});
        assert_eq!(serde_json::to_string(&Request::Status {}).unwrap(), r#"{"op":"status"}"#);
        assert!(serde_json::from_str::<Request>(r#"{"op":"reboot"}"#).is_err());
    }

    #[test]
    fn answers_of_version_1_vmms_still_read() {
        let old: Response = serde_json::from_str(r#"{"ok":false,"error":"x","code":"conflict"}"#).unwrap();
        assert_eq!((old.v, old.code), (1, Some(ErrorCode::Conflict)));
        let old: Response = serde_json::from_str(r#"{"ok":false,"error":"x","code":"forbidden"}"#).unwrap();
        assert_eq!(old.code, Some(ErrorCode::Forbidden));
        let now = serde_json::to_string(&Response::ok_as(&7)).unwrap();
        assert_eq!(now, format!(r#"{{"v":{CONTROL_PROTOCOL_VERSION},"ok":true,"result":7}}"#));
    }

    #[test]
    fn hex_round_trips_and_rejects_garbage() {
        let bytes = vec![0, 1, 0xab, 0xff];
        assert_eq!(hex_decode(&hex_encode(&bytes)).unwrap(), bytes);
        assert_eq!(hex_decode("abc").unwrap_err(), HexError::OddLength(3));
        assert_eq!(hex_decode("zz").unwrap_err(), HexError::NotHex(0));
        assert_eq!(hex_decode("+f").unwrap_err(), HexError::NotHex(0), "a sign is not a hex digit");
    }
}
