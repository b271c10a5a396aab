//! The Connect protocol as E2B's SDKs speak it to envd: JSON codec over HTTP/1.1, no
//! compression (e2b-api.md §3.1). Unary calls are a JSON body each way; server streams
//! are envelopes `[flags u8][length u32 BE][JSON]`, flag `0x02` marking the mandatory
//! end-of-stream message (which carries an error, if any).
//!
//! Hand-written rather than a Connect crate: the SDKs need the JSON codec only, over
//! HTTP/1.1, for a dozen small messages, while `connectrpc` (the one crate that serves
//! client streaming) brings its own message types and a `protoc` build step. The
//! messages are serde types in [`super::envd`], lenient as proto3 JSON is (camelCase or
//! snake_case names, enums by name or number).

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Largest request message accepted.
pub const MAX_MESSAGE: usize = 4 << 20;
/// The end-of-stream flag.
pub const END_STREAM: u8 = 0x02;
/// A compressed message, which these clients never send and we never accept.
const COMPRESSED: u8 = 0x01;
/// The content type of a stream: exactly this (the Python client compares it verbatim).
pub const STREAM_TYPE: &str = "application/connect+json";

/// A Connect error: a code from the protocol's list and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RpcError {
    pub code: &'static str,
    pub message: String,
}

impl RpcError {
    pub fn new(code: &'static str, message: impl Into<String>) -> RpcError {
        RpcError { code, message: message.into() }
    }
    pub fn invalid(message: impl Into<String>) -> RpcError {
        RpcError::new("invalid_argument", message)
    }
    pub fn not_found(message: impl Into<String>) -> RpcError {
        RpcError::new("not_found", message)
    }
    pub fn internal(message: impl Into<String>) -> RpcError {
        RpcError::new("internal", message)
    }
    pub fn unimplemented(message: impl Into<String>) -> RpcError {
        RpcError::new("unimplemented", message)
    }

    /// The HTTP status of a unary error (the Connect protocol's table).
    pub fn status(&self) -> StatusCode {
        match self.code {
            "canceled" => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
            "invalid_argument" | "failed_precondition" | "out_of_range" => StatusCode::BAD_REQUEST,
            "deadline_exceeded" => StatusCode::GATEWAY_TIMEOUT,
            "not_found" => StatusCode::NOT_FOUND,
            "already_exists" | "aborted" => StatusCode::CONFLICT,
            "permission_denied" => StatusCode::FORBIDDEN,
            "resource_exhausted" => StatusCode::TOO_MANY_REQUESTS,
            "unimplemented" => StatusCode::NOT_IMPLEMENTED,
            "unavailable" => StatusCode::SERVICE_UNAVAILABLE,
            "unauthenticated" => StatusCode::UNAUTHORIZED,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({ "code": self.code, "message": self.message })
    }
}

impl From<forkvm_proto::AgentError> for RpcError {
    fn from(e: forkvm_proto::AgentError) -> RpcError {
        use forkvm_proto::ErrorKind as K;
        let code = match e.kind {
            K::NotFound => "not_found",
            K::PermissionDenied => "permission_denied",
            K::AlreadyExists => "already_exists",
            K::InvalidInput | K::IsADirectory | K::NotADirectory | K::DirectoryNotEmpty => "invalid_argument",
            K::Unsupported => "unimplemented",
            _ => "internal",
        };
        RpcError::new(code, e.message)
    }
}

impl From<forkvm_proto::ClientError> for RpcError {
    fn from(e: forkvm_proto::ClientError) -> RpcError {
        match e {
            forkvm_proto::ClientError::Agent(a) => a.into(),
            other => RpcError::new("unavailable", other.to_string()),
        }
    }
}

/// A unary error answer.
impl IntoResponse for RpcError {
    fn into_response(self) -> Response {
        (self.status(), [(header::CONTENT_TYPE, "application/json")], self.json().to_string()).into_response()
    }
}

/// A unary success answer.
pub fn unary<T: Serialize>(msg: &T) -> Response {
    match serde_json::to_vec(msg) {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => RpcError::internal(format!("encoding the reply: {e}")).into_response(),
    }
}

/// A unary request's message: a JSON body (empty means `{}`).
pub fn unary_request<T: DeserializeOwned>(body: &[u8]) -> Result<T, RpcError> {
    if body.len() > MAX_MESSAGE {
        return Err(RpcError::new("resource_exhausted", format!("the message is larger than {MAX_MESSAGE} bytes")));
    }
    let text: &[u8] = if body.iter().all(u8::is_ascii_whitespace) { b"{}" } else { body };
    serde_json::from_slice(text).map_err(|e| RpcError::invalid(format!("invalid message: {e}")))
}

/// The one message of a server-streaming request: one envelope.
pub fn stream_request<T: DeserializeOwned>(body: &[u8]) -> Result<T, RpcError> {
    let mut rest = body;
    let (flags, msg) = next_envelope(&mut rest)?.ok_or_else(|| RpcError::invalid("the request holds no message"))?;
    if flags & COMPRESSED != 0 {
        return Err(RpcError::unimplemented("compressed messages are not accepted"));
    }
    serde_json::from_slice(msg).map_err(|e| RpcError::invalid(format!("invalid message: {e}")))
}

/// The next envelope of `buf` (flags, message), advancing it; `None` at the end.
pub fn next_envelope<'a>(buf: &mut &'a [u8]) -> Result<Option<(u8, &'a [u8])>, RpcError> {
    if buf.is_empty() {
        return Ok(None);
    }
    if buf.len() < 5 {
        return Err(RpcError::invalid("a truncated envelope header"));
    }
    let flags = buf[0];
    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
    if len > MAX_MESSAGE {
        return Err(RpcError::new("resource_exhausted", format!("a message of {len} bytes (at most {MAX_MESSAGE})")));
    }
    if buf.len() < 5 + len {
        return Err(RpcError::invalid(format!("an envelope of {len} bytes holds {}", buf.len() - 5)));
    }
    let msg = &buf[5..5 + len];
    *buf = &buf[5 + len..];
    Ok(Some((flags, msg)))
}

fn envelope(flags: u8, json: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(5 + json.len());
    out.push(flags);
    out.extend_from_slice(&(json.len() as u32).to_be_bytes());
    out.extend_from_slice(json);
    Bytes::from(out)
}

/// A message envelope of a stream.
pub fn message<T: Serialize>(msg: &T) -> Bytes {
    envelope(0, &serde_json::to_vec(msg).unwrap_or_else(|_| b"{}".to_vec()))
}

/// The end-of-stream envelope: `{}`, or `{"error": ...}`.
pub fn end_stream(error: Option<&RpcError>) -> Bytes {
    let body = match error {
        Some(e) => serde_json::json!({ "error": e.json() }),
        None => serde_json::json!({}),
    };
    envelope(END_STREAM, body.to_string().as_bytes())
}

/// A streaming answer whose envelopes come from `rx` (each flushed as it comes; the
/// sender ends with [`end_stream`]).
pub fn stream_response(rx: tokio::sync::mpsc::Receiver<Bytes>) -> Response {
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    let body = Body::from_stream(futures_util::StreamExt::map(stream, Ok::<_, std::io::Error>));
    let mut resp = Response::new(body);
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(STREAM_TYPE));
    resp
}

/// The answer of a client-streaming call: its one message and the end of the stream,
/// enveloped as a stream's are.
pub fn stream_reply<T: Serialize>(msg: &T) -> Response {
    let mut body = message(msg).to_vec();
    body.extend_from_slice(&end_stream(None));
    let mut resp = Response::new(Body::from(body));
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(STREAM_TYPE));
    resp
}

/// A stream that fails before its first message: one end-of-stream envelope with the
/// error (status 200, as the protocol has it).
pub fn stream_error(e: RpcError) -> Response {
    let mut resp = Response::new(Body::from(end_stream(Some(&e))));
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(STREAM_TYPE));
    resp
}

/// The `Connect-Timeout-Ms` of a request, if any.
pub fn timeout_ms(headers: &HeaderMap) -> Option<u64> {
    headers.get("connect-timeout-ms")?.to_str().ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_round_trip_and_bad_ones_are_refused() {
        let m = message(&serde_json::json!({"a": 1}));
        let end = end_stream(Some(&RpcError::not_found("x")));
        let mut all: Vec<u8> = m.to_vec();
        all.extend_from_slice(&end);
        let mut rest = all.as_slice();
        assert_eq!(next_envelope(&mut rest).unwrap(), Some((0, &b"{\"a\":1}"[..])));
        let (flags, body) = next_envelope(&mut rest).unwrap().unwrap();
        assert_eq!(flags, END_STREAM);
        assert_eq!(body, br#"{"error":{"code":"not_found","message":"x"}}"#);
        assert_eq!(next_envelope(&mut rest).unwrap(), None);
        assert!(next_envelope(&mut &[0u8, 0, 0][..]).is_err());
        assert!(next_envelope(&mut &[0u8, 0, 0, 0, 9, b'{'][..]).is_err());
        assert!(next_envelope(&mut &[0u8, 0xff, 0xff, 0xff, 0xff][..]).unwrap_err().message.contains("at most"));
        let v: serde_json::Value = stream_request(&m).unwrap();
        assert_eq!(v["a"], 1);
        assert!(stream_request::<serde_json::Value>(&envelope(COMPRESSED, b"{}")).is_err());
    }

    #[test]
    fn arbitrary_bytes_never_panic_nor_read_past_the_buffer() {
        // A fixed xorshift stream of inputs, many of them near-valid headers.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..20_000 {
            let len = (next() % 48) as usize;
            let mut buf: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            if len >= 5 && next() % 2 == 0 {
                let claimed = (next() % 64) as u32;
                buf[1..5].copy_from_slice(&claimed.to_be_bytes());
            }
            let mut rest = buf.as_slice();
            let mut seen = 0;
            while let Ok(Some((_, msg))) = next_envelope(&mut rest) {
                seen += 5 + msg.len();
                assert!(seen <= buf.len());
            }
            let _ = stream_request::<serde_json::Value>(&buf);
            let _ = unary_request::<serde_json::Value>(&buf);
        }
    }

    #[test]
    fn error_codes_map_to_statuses() {
        assert_eq!(RpcError::not_found("x").status(), StatusCode::NOT_FOUND);
        assert_eq!(RpcError::new("already_exists", "x").status(), StatusCode::CONFLICT);
        assert_eq!(RpcError::new("unauthenticated", "x").status(), StatusCode::UNAUTHORIZED);
        assert_eq!(RpcError::new("whatever", "x").status(), StatusCode::INTERNAL_SERVER_ERROR);
    }
}
