//! Unit tests for framing and message encoding: round trips and every rejected-frame
//! error, kept apart from `frame.rs` so that file stays about the format.

use super::*;
use crate::msg::{
    Command, ExecRequest, IdentityRequest, ProtocolError, ProtocolErrorCode, Request, Response, WriteFileRequest,
};

fn encode(kind: FrameKind, payload: &[u8]) -> Vec<u8> {
    let mut buf = Vec::new();
    write_frame(&mut buf, kind, payload).unwrap();
    buf
}

#[test]
fn header_layout_is_magic_version_kind_le_length() {
    let buf = encode(FrameKind::Stdout, b"hello");
    assert_eq!(&buf[..8], &[b'F', b'V', PROTOCOL_VERSION, 0x04, 5, 0, 0, 0]);
    assert_eq!(&buf[8..], b"hello");
}

#[test]
fn raw_frames_round_trip_including_empty_and_max() {
    for (kind, payload) in [
        (FrameKind::End, Vec::new()),
        (FrameKind::Data, vec![0xAB; 1]),
        (FrameKind::Stdin, (0..=255u8).cycle().take(MAX_PAYLOAD).collect()),
    ] {
        let buf = encode(kind, &payload);
        let frame = read_frame(&mut buf.as_slice()).unwrap();
        assert_eq!(frame, Frame { kind, payload });
    }
}

#[test]
fn json_messages_round_trip() {
    let reqs = [
        Request::Ping,
        Request::Exec(ExecRequest {
            command: Command::Argv(vec!["ls".into(), "-l".into()]),
            env: vec![("A".into(), "b".into())],
            cwd: Some("/tmp".into()),
            stdin: true,
            timeout_ms: Some(200),
            user: Some("user".into()),
            report_start: true,
        }),
        Request::Signal(crate::SignalRequest { pid: 42, signal: 9 }),
        Request::Rename { from: "/a".into(), to: "/b".into() },
        Request::WriteFile(WriteFileRequest {
            path: "/a".into(),
            mode: Some(0o600),
            create_parents: true,
            owner: None,
        }),
        Request::Identity(IdentityRequest {
            sandbox_id: "sb-1".into(),
            hostname: "h".into(),
            wall_clock_unix_ns: 1_700_000_000_000_000_000,
            entropy: vec![0, 1, 0xfe, 0xff],
            interpreter_seed: vec![7; 32],
        }),
        Request::Remove { path: "/x".into(), recursive: true },
    ];
    for req in reqs {
        let mut buf = Vec::new();
        write_json(&mut buf, FrameKind::Request, &req).unwrap();
        let back: Request = read_frame(&mut buf.as_slice()).unwrap().json().unwrap();
        assert_eq!(back, req);
    }
    let json = serde_json::to_string(&Response::Written { bytes: 3 }).unwrap();
    assert_eq!(json, r#"{"type":"written","bytes":3}"#);
}

#[test]
fn entropy_travels_as_hex() {
    let req = IdentityRequest {
        sandbox_id: "s".into(),
        hostname: "h".into(),
        wall_clock_unix_ns: 1,
        entropy: vec![0xde, 0xad],
        interpreter_seed: Vec::new(),
    };
    let json = serde_json::to_string(&req).unwrap();
    assert!(json.contains(r#""entropy":"dead""#), "{json}");
    let bad = json.replace("dead", "zz");
    assert!(serde_json::from_str::<IdentityRequest>(&bad).is_err());
    // An older host sends no interpreter seed; the field is left out when empty.
    assert!(!json.contains("interpreter_seed"), "{json}");
    assert_eq!(serde_json::from_str::<IdentityRequest>(&json).unwrap(), req);
}

#[test]
fn optional_fields_default_and_unknown_fields_are_ignored() {
    let req: Request = serde_json::from_str(r#"{"op":"exec","command":{"shell":"true"},"future":1}"#).unwrap();
    assert_eq!(req, Request::Exec(ExecRequest::shell("true")));
}

#[test]
fn version_mismatch_is_reported_with_both_versions() {
    let mut buf = encode(FrameKind::Request, b"{}");
    buf[2] = PROTOCOL_VERSION + 1;
    let err = read_frame(&mut buf.as_slice()).unwrap_err();
    assert!(
        matches!(err, FrameError::VersionMismatch { got, expected } if got == PROTOCOL_VERSION + 1 && expected == PROTOCOL_VERSION)
    );
    assert_eq!(ProtocolError::from_frame_error(&err).code, ProtocolErrorCode::VersionMismatch);
}

#[test]
fn bad_magic_and_unknown_kind_are_named() {
    let err = read_frame(&mut &b"GET / HTTP/1.1\r\n"[..]).unwrap_err();
    assert!(matches!(err, FrameError::BadMagic([b'G', b'E'])), "{err}");
    let mut buf = encode(FrameKind::Data, b"x");
    buf[3] = 0x42;
    let err = read_frame(&mut buf.as_slice()).unwrap_err();
    assert!(matches!(err, FrameError::UnknownKind(0x42)), "{err}");
    assert!(err.to_string().contains("0x42"));
}

#[test]
fn oversized_frames_are_rejected_before_reading_payload() {
    let mut header = encode(FrameKind::Data, b"");
    header[4..8].copy_from_slice(&((MAX_PAYLOAD as u32) + 1).to_le_bytes());
    let err = read_frame(&mut header.as_slice()).unwrap_err();
    assert!(matches!(err, FrameError::Oversized { len, .. } if len == MAX_PAYLOAD + 1), "{err}");
    let big = vec![0u8; MAX_PAYLOAD + 1];
    let err = write_frame(&mut Vec::new(), FrameKind::Data, &big).unwrap_err();
    assert!(matches!(err, FrameError::Oversized { .. }));
}

#[test]
fn truncated_header_and_payload_are_distinguished_from_clean_close() {
    assert!(matches!(read_frame(&mut &b""[..]).unwrap_err(), FrameError::Closed));
    let buf = encode(FrameKind::Data, b"hello");
    let err = read_frame(&mut &buf[..5]).unwrap_err();
    assert!(matches!(err, FrameError::Truncated { what: "header", expected: 8, got: 5 }), "{err}");
    let err = read_frame(&mut &buf[..10]).unwrap_err();
    assert!(matches!(err, FrameError::Truncated { what: "payload", expected: 5, got: 2 }), "{err}");
}

#[test]
fn malformed_json_payload_is_a_typed_error() {
    let buf = encode(FrameKind::Request, b"{\"op\":\"nope\"}");
    let frame = read_frame(&mut buf.as_slice()).unwrap();
    let err = frame.json::<Request>().unwrap_err();
    assert!(matches!(err, FrameError::Malformed { kind: FrameKind::Request, .. }), "{err}");
    assert_eq!(ProtocolError::from_frame_error(&err).code, ProtocolErrorCode::Malformed);
}

#[test]
fn io_errors_map_to_errno_kinds() {
    use crate::msg::{AgentError, ErrorKind};
    let e = AgentError::from_io("open /nope", &std::io::Error::from_raw_os_error(2));
    assert_eq!((e.kind, e.errno), (ErrorKind::NotFound, Some(2)));
    assert!(e.message.starts_with("open /nope: "));
    let e = AgentError::from_io("read /d", &std::io::Error::from_raw_os_error(21));
    assert_eq!(e.kind, ErrorKind::IsADirectory);
}
