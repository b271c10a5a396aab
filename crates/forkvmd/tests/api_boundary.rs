//! The daemon's boundary against callers that are not its user: web pages in the user's
//! browser (CSRF, DNS rebinding), other local users on the Unix socket, clients that
//! hold connections open (slowloris) or open too many. Each test drives the real gate
//! and, where connections matter, the real listener over loopback or a Unix socket.

mod common_api;

use axum::http::StatusCode;
use common_api::*;
use forkvmd::gate::Gate;
use forkvmd::serve::{ConnLimits, TcpServe, UnixPeers, UnixServe};
use std::io::{Read, Write};
use std::time::{Duration, Instant};

const AUTH: (&str, &str) = ("authorization", "Bearer test-token-0123456789abcdef");
const HOST: (&str, &str) = ("host", "127.0.0.1:8889");
const JSON: (&str, &str) = ("content-type", "application/json");

#[tokio::test]
async fn a_cross_origin_post_is_refused_and_changes_nothing() {
    let e = env();
    let body = r#"{"tag":"t1","template":"tiny"}"#;
    let evil = ("origin", "https://evil.example");
    let (status, text) = call_with(&e.app, "POST", "/v1/snapshots", &[AUTH, HOST, JSON, evil], body).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{text}");
    assert!(error_of(&text).error.contains("--allow-origin https://evil.example"), "{text}");
    // A browser's no-cors form post: no Origin sent by some browsers, but Sec-Fetch-Site.
    let site = ("sec-fetch-site", "cross-site");
    let (status, _) = call_with(&e.app, "POST", "/v1/snapshots", &[HOST, site], body).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(!e.state.store.root().join("t1").exists(), "a refused request created a snapshot");
    // An allowed origin passes the gate (and then meets the token check).
    let gate = Gate::tcp(forkvmd::auth::Token::new(TOKEN).unwrap(), &["https://ok.example".to_string()], &[], None);
    let app = forkvmd::serve::wrap(forkvmd::app(e.state.clone()), gate, None);
    let ok = ("origin", "https://ok.example");
    let (status, _) = call_with(&app, "GET", "/v1/sandboxes", &[HOST, ok], "").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = call_with(&app, "GET", "/v1/sandboxes", &[HOST, ok, AUTH], "").await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn a_json_body_needs_the_json_content_type() {
    let e = env();
    let form = ("content-type", "application/x-www-form-urlencoded");
    let (status, text) = call_with(&e.app, "POST", "/v1/snapshots", &[AUTH, HOST, form], r#"{"tag":"t1"}"#).await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{text}");
    assert!(error_of(&text).error.contains("Content-Type: application/json"), "{text}");
    let (status, _) = call_with(&e.app, "POST", "/v1/sandboxes/x/exec", &[AUTH, HOST], r#"{"args":["true"]}"#).await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    // An empty body needs no type (ping, branch with defaults).
    let (status, _) = call_with(&e.app, "POST", "/v1/sandboxes/x/ping", &[AUTH, HOST], "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_rebound_host_name_is_refused() {
    let e = env();
    let rebound = ("host", "attacker.example:8889");
    let (status, text) = call_with(&e.app, "GET", "/v1/sandboxes", &[AUTH, rebound], "").await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{text}");
    assert!(error_of(&text).error.contains("--allow-host"), "{text}");
    for host in ["localhost:8889", "127.0.0.1", "[::1]:8889"] {
        let (status, _) = call_with(&e.app, "GET", "/v1/sandboxes", &[AUTH, ("host", host)], "").await;
        assert_eq!(status, StatusCode::OK, "{host}");
    }
}

/// Serves the test app on loopback TCP with `limits`; returns the address.
async fn serve_tcp(e: &Env, limits: ConnLimits) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let tcp = TcpServe { listener, app: e.app.clone(), tls: None };
    tokio::spawn(forkvmd::serve::run(None, Some(tcp), limits, None, std::future::pending()));
    addr
}

/// Reads from `s` until EOF or error; returns how long that took.
fn time_to_close(s: &mut std::net::TcpStream, limit: Duration) -> Duration {
    let t = Instant::now();
    s.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return t.elapsed(),
            Ok(_) => continue,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slowloris_client_is_cut_after_the_header_timeout() {
    let e = env();
    let limits = ConnLimits { header_timeout: Duration::from_secs(1), ..ConnLimits::default() };
    let addr = serve_tcp(&e, limits).await;
    let elapsed = tokio::task::spawn_blocking(move || slowloris(addr)).await.unwrap();
    assert!(elapsed < Duration::from_secs(4), "the connection stayed open {elapsed:?} (header timeout 1 s)");
}

/// Holds a request header open (a header that never ends: a line every 200 ms, well
/// inside any read timeout) for up to 5 s; returns how long the server kept the connection.
fn slowloris(addr: std::net::SocketAddr) -> Duration {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n").unwrap();
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(5) {
        if s.write_all(b"X-Slow: 1\r\n").is_err() {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    t.elapsed() + time_to_close(&mut s, Duration::from_secs(5))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_e2b_listeners_cut_a_slowloris_client_too() {
    let e = env();
    let limits = ConnLimits { header_timeout: Duration::from_secs(1), ..ConnLimits::default() };
    let keys = vec!["e2b_test_key_0123456789".to_string()];
    let loopback = Some("127.0.0.1:0".parse().unwrap());
    let config = forkvmd::e2b::E2bConfig { api: loopback, sandbox: loopback, api_keys: keys, ..Default::default() };
    let addrs = forkvmd::e2b::start(e.state.clone(), config, limits).await.unwrap();
    assert_eq!(addrs.len(), 2, "the API and the sandbox front");
    let held = tokio::task::spawn_blocking(move || {
        let each: Vec<_> = addrs.into_iter().map(|a| std::thread::spawn(move || slowloris(a))).collect();
        each.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
    })
    .await
    .unwrap();
    for (what, elapsed) in ["E2B API", "E2B sandbox front"].iter().zip(held) {
        assert!(elapsed < Duration::from_secs(4), "{what} kept the connection {elapsed:?} (header timeout 1 s)");
    }
}

/// One HTTP/1.1 request over TLS to `addr`, trusting `ca` and naming `host` (SNI and
/// Host); the whole answer.
fn https_get(
    addr: std::net::SocketAddr,
    ca: &rustls::pki_types::CertificateDer<'static>,
    host: &str,
    path: &str,
) -> String {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone()).unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from(host.to_string()).unwrap();
    let conn = rustls::ClientConnection::new(std::sync::Arc::new(config), name).unwrap();
    let tcp = std::net::TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    write!(tls, "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").unwrap();
    let mut out = Vec::new();
    let _ = tls.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_e2b_listeners_speak_tls_and_route_by_host_under_it() {
    let e = env();
    let dir = tempfile::tempdir().unwrap();
    let cert = rcgen::generate_simple_self_signed(vec!["*.sb.test".to_string(), "api.sb.test".to_string()]).unwrap();
    let (cert_pem, key_pem) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert_pem, cert.cert.pem()).unwrap();
    std::fs::write(&key_pem, cert.signing_key.serialize_pem()).unwrap();
    let loopback = Some("127.0.0.1:0".parse().unwrap());
    let config = forkvmd::e2b::E2bConfig {
        api: loopback,
        sandbox: loopback,
        api_keys: vec!["e2b_test_key_0123456789".to_string()],
        domain: Some("sb.test".into()),
        tls: Some((cert_pem.clone(), key_pem.clone())),
        ..Default::default()
    };
    let addrs = forkvmd::e2b::start(e.state.clone(), config.clone(), ConnLimits::default()).await.unwrap();
    let ca = cert.cert.der().clone();
    let (api, front) = (addrs[0], addrs[1]);
    tokio::task::spawn_blocking(move || {
        let answer = https_get(api, &ca, "api.sb.test", "/v2/sandboxes");
        assert!(answer.starts_with("HTTP/1.1 401"), "the control plane over TLS, no key: {answer}");
        // Routed by Host under the domain: a sandbox that does not exist is E2B's 502.
        let answer = https_get(front, &ca, "49983-0123456789abcdef.sb.test", "/health");
        assert!(answer.starts_with("HTTP/1.1 502") && answer.contains("The sandbox was not found"), "{answer}");
        // The front answers api.<domain> as the control plane: one address for the SDKs.
        let answer = https_get(front, &ca, "api.sb.test", "/v2/sandboxes");
        assert!(answer.starts_with("HTTP/1.1 401"), "api.<domain> at the front: {answer}");
        // Plain HTTP on a TLS listener gets no HTTP answer.
        let mut plain = std::net::TcpStream::connect(front).unwrap();
        plain.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        plain.write_all(b"GET /health HTTP/1.1\r\nHost: 49983-0123456789abcdef.sb.test\r\n\r\n").unwrap();
        let mut out = Vec::new();
        let _ = plain.read_to_end(&mut out);
        assert!(!String::from_utf8_lossy(&out).contains("HTTP/1.1"), "{}", String::from_utf8_lossy(&out));
    })
    .await
    .unwrap();
    // A key that is not a key is a start-up error, before anything listens.
    std::fs::write(&key_pem, "not a key").unwrap();
    let err = forkvmd::e2b::start(e.state.clone(), config, ConnLimits::default()).await.unwrap_err();
    assert!(err.to_string().contains("key.pem"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_cap_are_closed_at_accept() {
    let e = env();
    let limits = ConnLimits { max_connections: 2, ..ConnLimits::default() };
    let addr = serve_tcp(&e, limits).await;
    tokio::task::spawn_blocking(move || {
        let held: Vec<_> = (0..2).map(|_| std::net::TcpStream::connect(addr).unwrap()).collect();
        std::thread::sleep(Duration::from_millis(300));
        let mut third = std::net::TcpStream::connect(addr).unwrap();
        let _ = third.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
        let mut out = Vec::new();
        third.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let _ = third.read_to_end(&mut out);
        assert!(out.is_empty(), "the third connection was served: {}", String::from_utf8_lossy(&out));
        drop(held);
        // Closing the held connections frees their slots.
        let t = Instant::now();
        loop {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            s.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").unwrap();
            let mut out = Vec::new();
            let _ = s.read_to_end(&mut out);
            if out.starts_with(b"HTTP/1.1 200") {
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(5), "no slot came free");
            std::thread::sleep(Duration::from_millis(50));
        }
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_unix_socket_refuses_other_users() {
    // SAFETY: geteuid cannot fail.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test runs as root (it connects as another uid)");
    let e = env();
    let dir = e.dir.path().join("sock");
    std::fs::create_dir(&dir).unwrap();
    let path = dir.join("forkvmd.sock");
    let listener = forkvmd::serve::bind_unix(&path, None).unwrap();
    let unix = UnixServe { listener, app: e.app.clone(), peers: UnixPeers::this_user(None) };
    tokio::spawn(forkvmd::serve::run(Some(unix), None, ConnLimits::default(), None, std::future::pending()));
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    // Open the file mode up, so only the peer check stands between uid 65534 and the API.
    for p in [e.dir.path(), dir.as_path(), path.as_path()] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    let probe = move |uid: u32| {
        let script = "import socket,sys\n\
            s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])\n\
            s.sendall(b'GET /healthz HTTP/1.1\\r\\nHost: localhost\\r\\nConnection: close\\r\\n\\r\\n')\n\
            s.settimeout(5); out=b''\n\
            while True:\n  d=s.recv(4096)\n  if not d: break\n  out+=d\n\
            print(out[:12].decode() or 'closed')";
        use std::os::unix::process::CommandExt;
        let out = std::process::Command::new("python3").args(["-c", script]).arg(&path).uid(uid).gid(uid).output();
        let out = out.unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string() + &String::from_utf8_lossy(&out.stderr)
    };
    let (root, nobody) = tokio::task::spawn_blocking(move || (probe(0), probe(65534))).await.unwrap();
    assert_eq!(root, "HTTP/1.1 200");
    // It connected (the file mode let it), and the daemon closed the connection unserved.
    let closed = ["closed", "ConnectionResetError", "BrokenPipeError"].iter().any(|w| nobody.contains(w));
    assert!(closed && !nobody.contains("HTTP/") && !nobody.contains("PermissionError"), "uid 65534 got: {nobody}");
}

#[tokio::test]
async fn a_host_path_template_is_refused_naming_the_templates_and_nothing_is_written() {
    let e = env();
    let host_file = e.dir.path().join("evil.toml");
    let evil = "name = \"evil\"\nbase = \"busybox\"\n[files]\n\"/etc/pwned\" = \"x\"\n";
    std::fs::write(&host_file, evil).unwrap();
    let before = tree_listing(e.dir.path());
    for template in [host_file.to_str().unwrap(), "../evil", "evil", "/etc/passwd"] {
        let body = serde_json::json!({ "tag": "t1", "template": template }).to_string();
        let (status, text) = call(&e.app, "POST", "/v1/snapshots", Some(TOKEN), &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{template}: {text}");
        let err = error_of(&text).error;
        assert!(err.contains("code-interpreter, python, tiny"), "{template}: the message names no templates: {err}");
    }
    // Nothing was written: no snapshot, no image build, no cache (only the audit lines).
    let after: Vec<String> = tree_listing(e.dir.path()).into_iter().filter(|p| !p.ends_with("audit.log")).collect();
    let before: Vec<String> = before.into_iter().filter(|p| !p.ends_with("audit.log")).collect();
    assert_eq!(after, before);
}

/// Every path under `dir`, sorted.
fn tree_listing(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let p = entry.path();
            if p.is_dir() {
                stack.push(p.clone());
            }
            out.push(p.display().to_string());
        }
    }
    out.sort();
    out
}
