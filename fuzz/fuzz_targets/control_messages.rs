//! The VMM control socket's JSON lines, both directions.
//!
//! Server side (the VMM): the input is what a client wrote on the socket, read exactly as
//! `control::server::serve_connection` reads it — line by line through a `BufReader`
//! limited to `MAX_REQUEST_BYTES + 1` per line, an over-long line answered and the
//! connection dropped, each line parsed as a `Request` (unknown fields refused) and
//! answered with a `Response` line. For the requests whose arguments the server checks
//! before touching the VM: `send_input`'s hex (`hex_decode`) and a branch's tag
//! (`validate_tag`). Handling the request itself needs a running VM and is not reached.
//!
//! Client side (`ControlClient::call_raw`): every line is also parsed as a `Response`.
//!
//! Checked: requests and responses round-trip through their JSON, and accepted hex
//! re-encodes to itself (`hex_encode`, lower case) or differs only in case.

#![no_main]

use forkvm_snapshot::validate_tag;
use forkvm_vmm::control::protocol::{hex_decode, hex_encode, MAX_REQUEST_BYTES};
use forkvm_api::ErrorCode;
use forkvm_vmm::control::{Request, Response};
use libfuzzer_sys::fuzz_target;
use std::io::{BufRead, BufReader, Read};

fn answer(req: &Request) -> Response {
    match req {
        Request::SendInput { hex } => match hex_decode(hex) {
            Ok(bytes) => {
                assert_eq!(hex_encode(&bytes), hex.to_ascii_lowercase(), "hex round trip");
                Response::ok(serde_json::Value::Null)
            }
            Err(e) => Response::err(e.to_string(), ErrorCode::BadRequest),
        },
        Request::Branch(b) => match b.tag.as_deref().map(validate_tag) {
            Some(Err(e)) => Response::err(e.to_string(), ErrorCode::BadRequest),
            _ => Response::ok(serde_json::json!({ "tag": b.tag })),
        },
        _ => Response::ok(serde_json::Value::Null),
    }
}

fn client_side(line: &str) {
    let Ok(resp) = serde_json::from_str::<Response>(line) else { return };
    let text = serde_json::to_string(&resp).expect("a response serialises");
    let back: Response = serde_json::from_str(&text).expect("a serialised response parses");
    // `result` is opaque JSON whose floats serde_json does not promise to round-trip.
    assert_eq!((back.ok, back.error, back.code), (resp.ok, resp.error, resp.code), "response round trip");
}

fuzz_target!(|data: &[u8]| {
    let mut reader = BufReader::new(data.take(u64::MAX));
    let mut replies = Vec::new();
    loop {
        let mut line = String::new();
        reader.get_mut().set_limit(MAX_REQUEST_BYTES as u64 + 1);
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        client_side(&line);
        if line.len() > MAX_REQUEST_BYTES {
            replies.push(Response::err(format!("bad request: longer than {MAX_REQUEST_BYTES} bytes"), ErrorCode::BadRequest));
            break;
        }
        let mut shutdown = false;
        let response = match serde_json::from_str::<Request>(line.trim_end()) {
            Ok(req) => {
                shutdown = matches!(req, Request::Shutdown {});
                let text = serde_json::to_string(&req).expect("a request serialises");
                let back: Request = serde_json::from_str(&text).expect("a serialised request parses");
                assert_eq!(back, req, "request round trip");
                answer(&req)
            }
            Err(e) => Response::err(format!("bad request: {e}"), ErrorCode::BadRequest),
        };
        replies.push(response);
        if shutdown {
            break;
        }
    }
    for r in &replies {
        let text = serde_json::to_string(r).expect("a response serialises");
        assert!(!text.contains('\n'), "a response line holds a newline");
    }
});
