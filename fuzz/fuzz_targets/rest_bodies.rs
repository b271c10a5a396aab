//! REST request bodies: every request type of `forkvm-api` (all refuse unknown fields),
//! as forkvmd's `JsonBody` extractor reads them, plus the name validators the daemon
//! applies to what the bodies carry.
//!
//! The input is the body. It is prepared as `forkvmd::extract::JsonBody` does (an
//! all-whitespace body reads as `{}`; anything else must start with `{`; at most 4 MiB),
//! then parsed as each request type in turn. (The extractor itself is not linked: it
//! would pull the whole daemon — axum, tokio, rustls, SQLite — into the fuzz build for
//! those three checks; the parsing is `serde_json::from_slice`, as here.)
//!
//! Checked: an accepted body round-trips through its type; every tag a request carries
//! that `validate_tag` (tags) or `is_template_name` (templates) accepts is a safe single
//! path component; and on every string the input holds, `validate_tag`,
//! `vault::validate_name`, `is_template_name` and `is_layer_name` accept only names that
//! are safe file names (the property each documents).

#![no_main]

use forkvm_api::{
    BranchSandboxRequest, CompactSnapshotRequest, CreateSandboxRequest, CreateSnapshotRequest, DiskForkRequest,
    DiskSnapshotRequest, EvalRequest, ExecRequest, ForkSandboxRequest, RestoreRequest, SetTtlRequest,
};
use forkvm_image::rootfs::catalog::is_template_name;
use forkvm_snapshot::vault::validate_name;
use forkvm_snapshot::{is_layer_name, validate_tag};
use libfuzzer_sys::fuzz_target;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fmt::Debug;

/// `forkvmd::extract::MAX_JSON_BODY`.
const MAX_JSON_BODY: usize = 4 << 20;

/// Whether `name` can only ever name one entry inside a directory.
fn safe_component(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\0']) && name.len() <= 255
}

fn check_names(s: &str) {
    if validate_tag(s).is_ok() {
        assert!(safe_component(s) && !s.contains("..") && !s.ends_with(".partial"), "validate_tag accepted {s:?}");
    }
    if validate_name("fuzz", s).is_ok() {
        assert!(safe_component(s) && !s.starts_with('.') && s.len() <= 64, "validate_name accepted {s:?}");
    }
    if is_template_name(s) {
        assert!(safe_component(s) && !s.starts_with('.'), "is_template_name accepted {s:?}");
    }
    if is_layer_name(s) {
        assert!(s.len() == 32 && s.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()), "{s:?}");
    }
}

/// Parses `body` as `T`; an accepted body must round-trip. Returns it.
fn parse<T: DeserializeOwned + Serialize + PartialEq + Debug>(body: &[u8]) -> Option<T> {
    let v: T = serde_json::from_slice(body).ok()?;
    let json = serde_json::to_vec(&v).expect("an accepted request serialises");
    let back: T = serde_json::from_slice(&json).expect("a serialised request parses");
    assert_eq!(back, v, "request round trip");
    Some(v)
}

fn tag(t: &str) {
    if validate_tag(t).is_ok() {
        assert!(safe_component(t), "validate_tag accepted the unsafe tag {t:?}");
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() > MAX_JSON_BODY {
        return;
    }
    let body: &[u8] = if data.iter().all(u8::is_ascii_whitespace) { b"{}" } else { data };
    if body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{') {
        if let Some(r) = parse::<CreateSnapshotRequest>(body) {
            tag(&r.tag);
            if is_template_name(&r.template) {
                assert!(safe_component(&r.template), "is_template_name accepted {:?}", r.template);
            }
        }
        if let Some(r) = parse::<CompactSnapshotRequest>(body) {
            tag(&r.to);
        }
        if let Some(r) = parse::<CreateSandboxRequest>(body) {
            tag(&r.snapshot_tag);
        }
        parse::<ForkSandboxRequest>(body);
        if let Some(r) = parse::<BranchSandboxRequest>(body) {
            r.tag.iter().chain(r.parent_tag.iter()).for_each(|t| tag(t));
        }
        parse::<ExecRequest>(body);
        parse::<EvalRequest>(body);
        parse::<DiskSnapshotRequest>(body);
        parse::<RestoreRequest>(body);
        parse::<DiskForkRequest>(body);
        parse::<SetTtlRequest>(body);
    }
    // The validators on every string the body holds (or on the whole input as text).
    match serde_json::from_slice::<serde_json::Value>(data) {
        Ok(v) => visit(&v),
        Err(_) => {
            if let Ok(s) = std::str::from_utf8(data) {
                check_names(s);
            }
        }
    }
});

fn visit(v: &serde_json::Value) {
    match v {
        serde_json::Value::String(s) => check_names(s),
        serde_json::Value::Array(a) => a.iter().for_each(visit),
        serde_json::Value::Object(o) => o.iter().for_each(|(k, v)| {
            check_names(k);
            visit(v);
        }),
        _ => {}
    }
}
