//! Helpers the daemon's unit tests share.

use axum::http::HeaderMap;

/// A header map of `pairs`, in order (a name given twice has both values).
pub fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(*k, v.parse().unwrap());
    }
    h
}
