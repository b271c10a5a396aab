//! The sandbox-wide `envs` of E2B's `Sandbox.create` for the code interpreter's cells.
//!
//! Why this exists: E2B's code-interpreter server reads a sandbox's env vars from envd
//! inside the guest when it starts a context, so `Sandbox.create(envs=...)` reaches
//! `run_code`. forkvm's envd lives in this daemon, and the server in the guest starts its
//! contexts before the snapshot is taken, long before any sandbox has envs. So the front
//! adds them to each `POST /execute` on the server's port instead, under the cell's own
//! `env_vars`: a cell sees the sandbox's envs, and a per-run env of the same name wins,
//! as at E2B. The server undoes a cell's `env_vars` after it, so nothing leaks between
//! sandboxes forked from one snapshot.

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::Response;
use http_body_util::BodyExt;
use std::collections::BTreeMap;

/// The code interpreter's port in the guest.
pub const CODE_INTERPRETER_PORT: u16 = 49999;
/// Largest `/execute` body read to add the envs (a cell's code and its env vars).
pub const MAX_EXECUTE_BODY: usize = 16 << 20;

/// Whether a request to `port` is a cell the sandbox's envs go into.
pub fn applies(port: u16, method: &Method, path: &str) -> bool {
    port == CODE_INTERPRETER_PORT && method == Method::POST && path == "/execute"
}

/// `req` with `envs` added to its body's `env_vars` (see the module doc); a body that is
/// not a JSON object, or whose `env_vars` is neither null nor an object, goes as it came
/// (the server answers it). A body over [`MAX_EXECUTE_BODY`] is refused with 413.
pub async fn with_sandbox_envs(req: Request, envs: &BTreeMap<String, String>) -> Result<Request, Response> {
    let (mut parts, body) = req.into_parts();
    let limited = http_body_util::Limited::new(body, MAX_EXECUTE_BODY);
    let bytes: Bytes = match limited.collect().await {
        Ok(c) => c.to_bytes(),
        Err(e) => {
            let (status, what) = match e.downcast_ref::<http_body_util::LengthLimitError>() {
                Some(_) => (StatusCode::PAYLOAD_TOO_LARGE, format!("a cell over {MAX_EXECUTE_BODY} bytes")),
                None => (StatusCode::BAD_REQUEST, format!("reading the cell: {e}")),
            };
            return Err(super::front::plain_error(status, what));
        }
    };
    let body = match merged(&bytes, envs) {
        Some(new) => {
            parts.headers.insert(header::CONTENT_LENGTH, HeaderValue::from(new.len()));
            Bytes::from(new)
        }
        None => bytes,
    };
    Ok(Request::from_parts(parts, Body::from(body)))
}

/// `body` with `envs` under its `env_vars` (the body's own of the same name kept), or
/// `None` when it is left as it is.
fn merged(body: &[u8], envs: &BTreeMap<String, String>) -> Option<Vec<u8>> {
    if envs.is_empty() {
        return None;
    }
    let mut cell: serde_json::Value = serde_json::from_slice(body).ok()?;
    let obj = cell.as_object_mut()?;
    let mut all: serde_json::Map<String, serde_json::Value> =
        envs.iter().map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone()))).collect();
    match obj.get("env_vars") {
        None | Some(serde_json::Value::Null) => {}
        Some(serde_json::Value::Object(own)) => all.extend(own.iter().map(|(k, v)| (k.clone(), v.clone()))),
        Some(_) => return None,
    }
    obj.insert("env_vars".into(), serde_json::Value::Object(all));
    serde_json::to_vec(&cell).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn envs() -> BTreeMap<String, String> {
        [("SANDBOX_WIDE".to_string(), "yes".to_string()), ("BOTH".to_string(), "sandbox".to_string())].into()
    }

    fn merge(body: serde_json::Value) -> Option<serde_json::Value> {
        merged(&serde_json::to_vec(&body).unwrap(), &envs()).map(|b| serde_json::from_slice(&b).unwrap())
    }

    #[test]
    fn the_sandboxs_envs_go_under_the_cells_own() {
        let got = merge(json!({"code": "x", "env_vars": {"BOTH": "cell", "OWN": "1"}})).unwrap();
        assert_eq!(got, json!({"code": "x", "env_vars": {"BOTH": "cell", "OWN": "1", "SANDBOX_WIDE": "yes"}}));
        for none in [json!({"code": "x"}), json!({"code": "x", "env_vars": null})] {
            let got = merge(none).unwrap();
            assert_eq!(got["env_vars"], json!({"BOTH": "sandbox", "SANDBOX_WIDE": "yes"}));
            assert_eq!(got["code"], "x");
        }
    }

    #[test]
    fn what_is_not_a_cell_goes_as_it_came() {
        assert_eq!(merge(json!({"code": "x", "env_vars": ["A"]})), None, "the server answers a bad one");
        assert_eq!(merge(json!(["x"])), None);
        assert_eq!(merged(b"not json", &envs()), None);
        assert_eq!(merged(br#"{"code":"x"}"#, &BTreeMap::new()), None, "no envs: nothing to add");
        assert!(applies(49999, &Method::POST, "/execute"));
        assert!(!applies(49999, &Method::GET, "/execute") && !applies(8888, &Method::POST, "/execute"));
        assert!(!applies(49999, &Method::POST, "/contexts"));
    }

    #[tokio::test]
    async fn a_request_gets_the_new_body_and_its_length() {
        let req = axum::http::Request::post("/execute")
            .header(header::CONTENT_LENGTH, "13")
            .body(Body::from(r#"{"code":"1+1"}"#))
            .unwrap();
        let out = with_sandbox_envs(req, &envs()).await.unwrap();
        let len: usize = out.headers()[header::CONTENT_LENGTH].to_str().unwrap().parse().unwrap();
        let body = out.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(len, body.len());
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["env_vars"]["SANDBOX_WIDE"], "yes");
        let huge = axum::http::Request::post("/execute").body(Body::from(vec![b' '; MAX_EXECUTE_BODY + 1])).unwrap();
        let refused = with_sandbox_envs(huge, &envs()).await.unwrap_err();
        assert_eq!(refused.status(), StatusCode::PAYLOAD_TOO_LARGE);
    }
}
