//! An HTTPS server for a test's fake internet (`forkvm_sandbox::network::fake_internet`):
//! a certificate authority of the test's own, a server certificate it signs for the
//! names the test serves, and files answered by path over TLS (rustls); a path ending
//! in `/` is an HTML page. Sandboxes trust
//! the CA only once the test installs it in their guest, so a test can show both that
//! TLS is checked and that it then works.
//!
//! Bounded: at most [`MAX_CONNECTIONS`] connections, each read for at most 30 s, a
//! request head of at most 64 KiB; the server stops when dropped.
#![allow(dead_code)] // each test binary uses its own part of it

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Connections one server takes at most.
pub const MAX_CONNECTIONS: usize = 200;

/// A certificate authority and a server configuration whose certificate it signed.
pub struct TestTls {
    /// The CA's certificate (PEM): what a guest must trust.
    pub ca_pem: String,
    pub server: Arc<rustls::ServerConfig>,
}

/// Makes a CA and a server certificate for `names`, signed by it.
pub fn test_tls(names: &[&str]) -> TestTls {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose};
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, "forkvm test CA");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();

    let mut leaf = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
    leaf.distinguished_name.push(DnType::CommonName, names[0]);
    leaf.use_authority_key_identifier_extension = true;
    let leaf_key = KeyPair::generate().unwrap();
    let cert = leaf.signed_by(&leaf_key, &ca).unwrap();

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into());
    let server = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone(), ca.der().clone()], key)
        .unwrap();
    TestTls { ca_pem: ca.pem(), server: Arc::new(server) }
}

/// A running HTTPS server; stops when dropped.
pub struct FakeHttps {
    stop: Arc<AtomicBool>,
    requested: Arc<Mutex<Vec<String>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeHttps {
    /// The paths asked for so far, in order (`GET` only; anything else is refused).
    pub fn requested(&self) -> Vec<String> {
        self.requested.lock().unwrap().clone()
    }
}

impl Drop for FakeHttps {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Serves `files` (path → body) on `listener`, bound in the fake internet's host.
pub fn serve(listener: TcpListener, tls: Arc<rustls::ServerConfig>, files: BTreeMap<String, Vec<u8>>) -> FakeHttps {
    listener.set_nonblocking(true).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let requested = Arc::new(Mutex::new(Vec::new()));
    let (stopping, log) = (stop.clone(), requested.clone());
    let files = Arc::new(files);
    let thread = std::thread::Builder::new()
        .name("fake-https".into())
        .spawn(move || {
            let mut taken = 0;
            while !stopping.load(Ordering::Relaxed) && taken < MAX_CONNECTIONS {
                let Ok((conn, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                taken += 1;
                let (tls, files, log) = (tls.clone(), files.clone(), log.clone());
                std::thread::spawn(move || answer(conn, tls, &files, &log));
            }
        })
        .unwrap();
    FakeHttps { stop, requested, thread: Some(thread) }
}

/// Answers one request on `conn`, then closes it.
fn answer(
    conn: TcpStream,
    tls: Arc<rustls::ServerConfig>,
    files: &BTreeMap<String, Vec<u8>>,
    log: &Mutex<Vec<String>>,
) {
    let _ = conn.set_nonblocking(false);
    let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
    let Ok(server) = rustls::ServerConnection::new(tls) else { return };
    let mut stream = rustls::StreamOwned::new(server, conn);
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 64 * 1024 {
        match stream.read(&mut buf) {
            Ok(n) if n > 0 => head.extend_from_slice(&buf[..n]),
            _ => return, // a handshake the client refused, or a closed connection
        }
    }
    let line = String::from_utf8_lossy(&head).lines().next().unwrap_or_default().to_string();
    let mut words = line.split_whitespace();
    let (method, target) = (words.next().unwrap_or_default(), words.next().unwrap_or_default());
    let path = target.split(['?', '#']).next().unwrap_or_default().to_string();
    let found = (method == "GET").then(|| files.get(&path)).flatten();
    log.lock().unwrap().push(path.clone());
    let (status, body): (&str, &[u8]) = match found {
        Some(body) => ("200 OK", body),
        None => ("404 Not Found", b"not here\n"),
    };
    // Directories are index pages (pip reads only HTML or JSON ones); the rest is bytes.
    let kind = if path.ends_with('/') { "text/html; charset=utf-8" } else { "application/octet-stream" };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(head.as_bytes()).and_then(|_| stream.write_all(body));
    stream.conn.send_close_notify();
    let _ = stream.flush();
}
