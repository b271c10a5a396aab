//! The web console, `/ui/`: a page that shows a daemon's sandboxes and snapshots, draws
//! their lineage, and opens a terminal, a console log, files and sparklines per
//! sandbox (docs/console.md). Its assets are built from `ui/` (TypeScript, xterm.js,
//! pinned by `ui/package-lock.json`) into `ui/dist/`, which is committed and embedded
//! here, so users need no build step and the page loads nothing from elsewhere: the
//! Content-Security-Policy allows only this origin.
//!
//! The assets are public (they hold no data); everything the page shows comes from the
//! API with the daemon's bearer token, which the user gives in the address's fragment
//! (`/ui/#token=...`, never sent to a server) and the page keeps for the tab. A
//! listener serves it only with [`crate::gate::Gate::with_console`], which also admits
//! the page's same-origin requests (see `gate`).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;

/// Where the console is served.
pub const PREFIX: &str = "/ui";

/// One embedded file: its name under `/ui/`, content type and bytes.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    bytes: &'static [u8],
}

const ASSETS: &[Asset] = &[
    Asset { name: "", content_type: "text/html; charset=utf-8", bytes: include_bytes!("../ui/dist/index.html") },
    Asset {
        name: "app.js",
        content_type: "text/javascript; charset=utf-8",
        bytes: include_bytes!("../ui/dist/app.js"),
    },
    Asset { name: "app.css", content_type: "text/css; charset=utf-8", bytes: include_bytes!("../ui/dist/app.css") },
];

/// Only this origin, no inline script, no frames of it elsewhere.
const CSP: &str = "default-src 'self'; script-src 'self'; connect-src 'self'; img-src 'self' data:; \
                   style-src 'self' 'unsafe-inline'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

/// Whether `path` is the console's (public when the console is on).
pub fn is_console_path(path: &str) -> bool {
    path == PREFIX || path.strip_prefix(PREFIX).is_some_and(|rest| rest.starts_with('/'))
}

/// The console's routes (stateless: merged into a listener's app).
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    let mut r = Router::new().route(PREFIX, get(|| async { Redirect::permanent("/ui/") }));
    for a in ASSETS {
        r = r.route(&format!("{PREFIX}/{}", a.name), get(move || async move { serve(a) }));
    }
    r
}

fn serve(a: &'static Asset) -> Response {
    let mut resp = (StatusCode::OK, a.bytes).into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(a.content_type));
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt;

    #[test]
    fn console_paths() {
        for p in ["/ui", "/ui/", "/ui/app.js"] {
            assert!(is_console_path(p), "{p}");
        }
        for p in ["/uix", "/v1/ui", "/", "/ui.js"] {
            assert!(!is_console_path(p), "{p}");
        }
    }

    #[tokio::test]
    async fn assets_are_served_with_their_type_and_policy() {
        let app: Router = router();
        let get = |uri: &str| axum::http::Request::get(uri).body(axum::body::Body::empty()).unwrap();
        let r = app.clone().oneshot(get("/ui/")).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers()[header::CONTENT_TYPE], "text/html; charset=utf-8");
        assert!(r.headers()[header::CONTENT_SECURITY_POLICY].to_str().unwrap().starts_with("default-src 'self'"));
        let r = app.clone().oneshot(get("/ui/app.js")).await.unwrap();
        assert_eq!(r.headers()[header::CONTENT_TYPE], "text/javascript; charset=utf-8");
        let r = app.clone().oneshot(get("/ui")).await.unwrap();
        assert_eq!(
            (r.status(), &r.headers()[header::LOCATION]),
            (StatusCode::PERMANENT_REDIRECT, &HeaderValue::from_static("/ui/"))
        );
        let r = app.oneshot(get("/ui/nothing.js")).await.unwrap();
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
    }
}
