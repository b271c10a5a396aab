//! A real HTTP/1.1 server for the client's tests, no mocking: std listeners (TCP, Unix,
//! and TLS through rustls' blocking stream) on a thread, every request recorded, canned
//! replies chosen by a handler. Chunked replies are written with pauses between chunks
//! so the client really receives them as separate body frames.

use crate::endpoint::Endpoint;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Debug, Clone)]
pub(crate) struct Recorded {
    pub method: String,
    pub target: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Recorded {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("request body is JSON")
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Reply {
    status: u16,
    content_type: &'static str,
    chunks: Vec<Vec<u8>>,
    chunked: bool,
}

impl Reply {
    pub(crate) fn json(status: u16, value: serde_json::Value) -> Reply {
        Reply::raw(status, "application/json", value.to_string().into_bytes())
    }

    pub(crate) fn raw(status: u16, content_type: &'static str, body: Vec<u8>) -> Reply {
        Reply { status, content_type, chunks: vec![body], chunked: false }
    }

    pub(crate) fn empty(status: u16) -> Reply {
        Reply { status, content_type: "text/plain", chunks: Vec::new(), chunked: false }
    }

    /// Sent with `Transfer-Encoding: chunked`, one chunk (and one flush) per element.
    pub(crate) fn chunked(status: u16, content_type: &'static str, chunks: Vec<Vec<u8>>) -> Reply {
        Reply { status, content_type, chunks, chunked: true }
    }
}

type Handler = Arc<dyn Fn(&Recorded) -> Reply + Send + Sync>;
type Log = Arc<Mutex<Vec<Recorded>>>;

pub(crate) struct TestServer {
    pub endpoint: Endpoint,
    /// For `tls`: the PEM certificate the server presents (self-signed, so its own CA).
    pub ca_file: Option<PathBuf>,
    log: Log,
    _dir: tempfile::TempDir,
}

impl TestServer {
    pub(crate) fn tcp(handler: impl Fn(&Recorded) -> Reply + Send + Sync + 'static) -> TestServer {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (log, handler) = (Log::default(), Arc::new(handler) as Handler);
        let l = log.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let _ = serve(conn.unwrap(), &handler, &l);
            }
        });
        TestServer {
            endpoint: Endpoint::Http { host: "127.0.0.1".into(), port },
            ca_file: None,
            log,
            _dir: tempfile::tempdir().unwrap(),
        }
    }

    pub(crate) fn unix(handler: impl Fn(&Recorded) -> Reply + Send + Sync + 'static) -> TestServer {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("forkvmd.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let (log, handler) = (Log::default(), Arc::new(handler) as Handler);
        let l = log.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let _ = serve(conn.unwrap(), &handler, &l);
            }
        });
        TestServer { endpoint: Endpoint::Unix(path), ca_file: None, log, _dir: dir }
    }

    /// HTTPS on 127.0.0.1 with a fresh self-signed certificate for `127.0.0.1`; with
    /// `ca`, one marked `CA:TRUE` as `openssl req -x509` makes them.
    pub(crate) fn tls(ca: bool, handler: impl Fn(&Recorded) -> Reply + Send + Sync + 'static) -> TestServer {
        let dir = tempfile::tempdir().unwrap();
        let key_pair = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
        if ca {
            params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        }
        let certificate = params.self_signed(&key_pair).unwrap();
        let ca_file = dir.path().join("ca.pem");
        std::fs::write(&ca_file, certificate.pem()).unwrap();
        let cert = certificate.der().clone();
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(key_pair.serialize_der().into());
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = Arc::new(
            rustls::ServerConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(vec![cert], key)
                .unwrap(),
        );
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (log, handler) = (Log::default(), Arc::new(handler) as Handler);
        let l = log.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(tls) = rustls::ServerConnection::new(config.clone()) else { continue };
                let mut stream = rustls::StreamOwned::new(tls, conn.unwrap());
                if serve(&mut stream, &handler, &l).is_ok() {
                    stream.conn.send_close_notify();
                    let _ = stream.flush();
                }
            }
        });
        TestServer {
            endpoint: Endpoint::Https { host: "127.0.0.1".into(), port },
            ca_file: Some(ca_file),
            log,
            _dir: dir,
        }
    }

    pub(crate) fn requests(&self) -> Vec<Recorded> {
        self.log.lock().unwrap().clone()
    }

    pub(crate) fn last(&self) -> Recorded {
        self.requests().pop().expect("the server saw a request")
    }
}

/// Reads one request, records it, writes the handler's reply, closes.
fn serve(mut stream: impl Read + Write, handler: &Handler, log: &Log) -> std::io::Result<()> {
    let request = read_request(&mut stream)?;
    let reply = handler(&request);
    log.lock().unwrap().push(request);
    let reason = match reply.status {
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        409 => "Conflict",
        _ => "Whatever",
    };
    let mut head =
        format!("HTTP/1.1 {} {reason}\r\nConnection: close\r\nContent-Type: {}\r\n", reply.status, reply.content_type);
    if reply.chunked {
        head.push_str("Transfer-Encoding: chunked\r\n\r\n");
        stream.write_all(head.as_bytes())?;
        stream.flush()?;
        for chunk in &reply.chunks {
            std::thread::sleep(Duration::from_millis(20));
            stream.write_all(format!("{:x}\r\n", chunk.len()).as_bytes())?;
            stream.write_all(chunk)?;
            stream.write_all(b"\r\n")?;
            stream.flush()?;
        }
        stream.write_all(b"0\r\n\r\n")?;
    } else {
        let body = reply.chunks.concat();
        if reply.status != 204 {
            head.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes())?;
        stream.write_all(&body)?;
    }
    stream.flush()
}

fn read_request(stream: &mut impl Read) -> std::io::Result<Recorded> {
    let mut r = BufReader::new(stream);
    let mut line = String::new();
    r.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_string();
    let target = parts.next().unwrap_or_default().to_string();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        r.read_line(&mut h)?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':').expect("header has a colon");
        headers.push((k.trim().to_string(), v.trim().to_string()));
    }
    let mut req = Recorded { method, target, headers, body: Vec::new() };
    if let Some(len) = req.header("content-length") {
        let mut body = vec![0; len.parse().unwrap()];
        r.read_exact(&mut body)?;
        req.body = body;
    } else if req.header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        loop {
            let mut size = String::new();
            r.read_line(&mut size)?;
            let size = usize::from_str_radix(size.trim().split(';').next().unwrap(), 16).unwrap();
            if size == 0 {
                let mut end = String::new();
                while r.read_line(&mut end)? > 2 {
                    end.clear();
                }
                break;
            }
            let mut chunk = vec![0; size + 2];
            r.read_exact(&mut chunk)?;
            req.body.extend_from_slice(&chunk[..size]);
        }
    }
    Ok(req)
}
