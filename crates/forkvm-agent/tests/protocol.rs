//! Protocol robustness and control requests through the real agent binary: rejected
//! frames get an `Error` frame and the agent keeps serving; ping, identity, shutdown.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use common::TestAgent;
use forkvm_proto::{
    read_frame, write_frame, EntropyOutcome, FrameKind, IdentityRequest, ProtocolError, ProtocolErrorCode,
    PROTOCOL_VERSION,
};

/// Sends raw bytes on a fresh connection and returns the agent's `Error` frame.
fn rejected(agent: &TestAgent, bytes: &[u8]) -> ProtocolError {
    let mut s = UnixStream::connect(&agent.socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(bytes).unwrap();
    let frame = read_frame(&mut s).unwrap();
    assert_eq!(frame.kind, FrameKind::Error);
    let err: ProtocolError = frame.json().unwrap();
    assert_eq!(err.agent_protocol_version, PROTOCOL_VERSION);
    // Still alive for the next connection.
    assert_eq!(agent.client().ping().unwrap().protocol_version, PROTOCOL_VERSION);
    err
}

fn frame(kind: FrameKind, payload: &[u8]) -> Vec<u8> {
    let mut buf = Vec::new();
    write_frame(&mut buf, kind, payload).unwrap();
    buf
}

#[test]
fn rejected_frames_get_named_error_frames() {
    let agent = TestAgent::start_with(&[]);
    let err = rejected(&agent, b"GET / HTTP/1.1\r\n\r\n");
    assert_eq!(err.code, ProtocolErrorCode::BadMagic);

    let mut wrong_version = frame(FrameKind::Request, br#"{"op":"ping"}"#);
    wrong_version[2] = PROTOCOL_VERSION + 1;
    let err = rejected(&agent, &wrong_version);
    assert_eq!(err.code, ProtocolErrorCode::VersionMismatch);
    assert!(err.message.contains(&format!("peer sent {}", PROTOCOL_VERSION + 1)), "{}", err.message);

    let mut unknown = frame(FrameKind::Request, b"{}");
    unknown[3] = 0x33;
    assert_eq!(rejected(&agent, &unknown).code, ProtocolErrorCode::UnknownKind);

    let mut oversized = frame(FrameKind::Request, b"");
    oversized[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(rejected(&agent, &oversized).code, ProtocolErrorCode::Oversized);

    assert_eq!(rejected(&agent, &frame(FrameKind::Request, b"{not json")).code, ProtocolErrorCode::Malformed);
    assert_eq!(rejected(&agent, &frame(FrameKind::Request, br#"{"op":"fly"}"#)).code, ProtocolErrorCode::Malformed);
    assert_eq!(rejected(&agent, &frame(FrameKind::Stdin, b"x")).code, ProtocolErrorCode::UnexpectedFrame);

    // A write_file whose data stream carries the wrong frame kind.
    let mut bad_stream = frame(FrameKind::Request, br#"{"op":"write_file","path":"/tmp/x-never"}"#);
    bad_stream.extend(frame(FrameKind::Stdout, b"x"));
    assert_eq!(rejected(&agent, &bad_stream).code, ProtocolErrorCode::UnexpectedFrame);
}

#[test]
fn truncated_request_then_close_is_survived() {
    let agent = TestAgent::start_with(&[]);
    let full = frame(FrameKind::Request, br#"{"op":"ping"}"#);
    let mut s = UnixStream::connect(&agent.socket).unwrap();
    s.write_all(&full[..full.len() - 3]).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let reply = read_frame(&mut s).unwrap();
    assert_eq!(reply.json::<ProtocolError>().unwrap().code, ProtocolErrorCode::Truncated);
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    assert!(agent.client().ping().is_ok());
}

#[test]
fn ping_reports_versions_and_uptime() {
    let agent = TestAgent::start();
    let pong = agent.client().ping().unwrap();
    assert_eq!(pong.agent_version, env!("CARGO_PKG_VERSION"));
    assert_eq!((pong.sandbox_id, pong.generation, pong.eval_available), (None, 0, true));
    std::thread::sleep(Duration::from_millis(20));
    assert!(agent.client().ping().unwrap().uptime_ms >= pong.uptime_ms + 20);
}

fn identity(id: &str) -> IdentityRequest {
    IdentityRequest {
        sandbox_id: id.into(),
        hostname: format!("host-{id}"),
        wall_clock_unix_ns: 1_800_000_000_123_456_789,
        entropy: vec![0xa5; 64],
        interpreter_seed: vec![0x5a; 32],
    }
}

#[test]
fn identity_sets_sandbox_id_generation_and_makes_the_calls() {
    let agent = TestAgent::start_with(&[]);
    let applied = agent.client().identity(&identity("sb-1")).unwrap();
    assert_eq!((applied.generation, applied.entropy), (1, EntropyOutcome::Credited));
    let pong = agent.client().ping().unwrap();
    assert_eq!((pong.sandbox_id.as_deref(), pong.generation), (Some("sb-1"), 1));
    assert_eq!(agent.client().identity(&identity("sb-2")).unwrap().generation, 2);
    assert_eq!(agent.client().ping().unwrap().sandbox_id.as_deref(), Some("sb-2"));

    let calls = std::fs::read_to_string(agent.dir.path().join("identity-calls")).unwrap();
    let calls: Vec<serde_json::Value> = calls.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let first: Vec<_> = calls[..3].iter().map(|c| (c["call"].as_str().unwrap(), c["arg"].clone())).collect();
    assert_eq!(
        first,
        [
            ("set_hostname", serde_json::json!("host-sb-1")),
            ("set_wall_clock", serde_json::json!(1_800_000_000_123_456_789u64)),
            ("add_entropy", serde_json::json!(64)),
        ]
    );
    assert_eq!(calls.len(), 6);
}

#[test]
fn identity_falls_back_to_mixing_entropy() {
    let agent = TestAgent::start_with(&["--identity-record-fail-credit"]);
    let applied = agent.client().identity(&identity("sb-x")).unwrap();
    assert_eq!(applied.entropy, EntropyOutcome::MixedNotCredited);
}

#[test]
fn shutdown_replies_then_the_agent_exits() {
    let mut agent = TestAgent::start_with(&[]);
    agent.client().shutdown().unwrap();
    for _ in 0..500 {
        if let Some(status) = agent.child.try_wait().unwrap() {
            assert!(status.success(), "{status}");
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("agent did not exit after shutdown");
}
