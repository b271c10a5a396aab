//! Request extractors whose failures are the API's 400s with a message naming what was
//! wrong (axum's own extractors answer in plain text, or 415/422).

use crate::error::ApiError;
use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

/// Largest JSON body accepted.
pub const MAX_JSON_BODY: usize = 4 << 20;

/// A JSON body; an empty body is read as `{}` (every field defaulted), so calls with
/// nothing to say (`ping`, `branch` with defaults) need no body. A non-empty body needs
/// `Content-Type: application/json`: a browser cannot send that cross-origin without a
/// preflight, which the gate refuses, so a web page cannot post a form here.
#[derive(Debug)]
pub struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let is_json = req.headers().get(axum::http::header::CONTENT_TYPE).is_some_and(|v| is_json_type(v.as_bytes()));
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(|e| ApiError::bad_request(format!("reading the request body: {e}")))?;
        if bytes.len() > MAX_JSON_BODY {
            return Err(ApiError::bad_request(format!("the JSON body is larger than {MAX_JSON_BODY} bytes")));
        }
        let text: &[u8] = if bytes.iter().all(|b| b.is_ascii_whitespace()) { b"{}" } else { &bytes };
        if !is_json && text != b"{}" {
            return Err(ApiError::new(
                forkvm_api::ErrorCode::UnsupportedMediaType,
                "a JSON body needs the header Content-Type: application/json",
            ));
        }
        if text.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
            return Err(ApiError::bad_request("invalid JSON body: it must be a JSON object"));
        }
        serde_json::from_slice(text).map(JsonBody).map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))
    }
}

/// Whether a Content-Type value is `application/json` (any case, parameters allowed).
fn is_json_type(v: &[u8]) -> bool {
    let essence = v.split(|b| *b == b';').next().unwrap_or_default();
    essence.trim_ascii().eq_ignore_ascii_case(b"application/json")
}

/// Query parameters; unknown ones are refused when `T` denies unknown fields.
#[derive(Debug)]
pub struct QueryArgs<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for QueryArgs<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let q = parts.uri.query().unwrap_or("");
        serde_urlencoded::from_str(q).map(QueryArgs).map_err(|e| ApiError::bad_request(format!("invalid query: {e}")))
    }
}

/// The one path parameter of a route (`{id}` or `{tag}`), percent-decoded; or the
/// [`ParamValue`] the router gave a request whose parameter a static path shadowed.
#[derive(Debug)]
pub struct Param(pub String);

/// The path parameter of a request routed by a static path (see `routes::shadowed`).
#[derive(Debug, Clone)]
pub struct ParamValue(pub String);

impl<S: Send + Sync> FromRequestParts<S> for Param {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        if let Some(ParamValue(v)) = parts.extensions.get::<ParamValue>() {
            return Ok(Param(v.clone()));
        }
        let axum::extract::Path(v) = axum::extract::Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::bad_request(format!("invalid path parameter: {e}")))?;
        Ok(Param(v))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn json_content_types() {
        for ok in ["application/json", "Application/JSON", "application/json; charset=utf-8", " application/json "] {
            assert!(super::is_json_type(ok.as_bytes()), "{ok}");
        }
        for bad in ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data", "application/jsonx", ""] {
            assert!(!super::is_json_type(bad.as_bytes()), "{bad}");
        }
    }
}
