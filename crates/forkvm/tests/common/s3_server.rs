//! moto's S3 server (`moto[server]` from PyPI) on a loopback port of its own, with one
//! bucket, for the object-storage tests; killed and reaped when dropped. Requests of the
//! tests' own (listing, tampering with objects) are plain HTTP/1.1.
#![allow(dead_code)] // each test binary uses its own part of it

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const BUCKET: &str = "forkvm-test";

/// An Authorization header moto accepts (it does not check signatures, but treats a
/// request without one as anonymous, which may not read private objects).
const AUTH: &str = "Authorization: AWS4-HMAC-SHA256 Credential=test/20261201/us-east-1/s3/aws4_request, \
                    SignedHeaders=host, Signature=0\r\n";

/// moto's S3 server on a loopback port; killed (and reaped) when dropped.
pub struct S3Server {
    child: Child,
    pub port: u16,
}

impl S3Server {
    pub fn start() -> S3Server {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new("python3")
            .args(["-m", "moto.server", "-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("moto's server (pip install 'moto[server]')");
        let mut server = S3Server { child, port };
        // Listening is not yet serving: while moto starts, a connection may be accepted
        // and reset. Creating the bucket is retried until it answers.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match server.try_http("PUT", &format!("/{BUCKET}"), &[]) {
                Ok((200, _)) => break,
                Ok((status, _)) => panic!("creating the bucket: HTTP {status}"),
                Err(e) => assert!(Instant::now() < deadline, "moto's server did not serve within 60 s: {e}"),
            }
            if let Some(status) = server.child.try_wait().unwrap() {
                panic!("moto's server exited before serving ({status}): is port {port} taken?");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        server
    }

    /// One plain HTTP/1.1 request (moto does not check signatures): (status, body).
    pub fn http(&self, method: &str, path: &str, body: &[u8]) -> (u16, Vec<u8>) {
        self.try_http(method, path, body).unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    fn try_http(&self, method: &str, path: &str, body: &[u8]) -> std::io::Result<(u16, Vec<u8>)> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port))?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: {}\r\nConnection: close\r\n{AUTH}\r\n",
            self.port,
            body.len()
        );
        s.write_all(head.as_bytes())?;
        s.write_all(body)?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw)?;
        let Some(split) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
            return Err(std::io::Error::other("no HTTP answer"));
        };
        let status = String::from_utf8_lossy(&raw[9..12]).parse().unwrap();
        let headers = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
        let mut body = raw[split + 4..].to_vec();
        if headers.contains("transfer-encoding: chunked") {
            body = dechunk(&body);
        }
        Ok((status, body))
    }

    /// The object names under `prefix` (one listing page is enough here: < 1000 asked for).
    pub fn keys(&self, prefix: &str) -> Vec<String> {
        let (status, body) = self.http("GET", &format!("/{BUCKET}?list-type=2&prefix={prefix}"), &[]);
        assert_eq!(status, 200);
        let xml = String::from_utf8(body).unwrap();
        xml.split("<Key>").skip(1).map(|k| k.split("</Key>").next().unwrap().to_string()).collect()
    }

    pub fn get(&self, key: &str) -> Vec<u8> {
        let (status, body) = self.http("GET", &format!("/{BUCKET}/{key}"), &[]);
        assert_eq!(status, 200, "GET {key}");
        body
    }

    pub fn put(&self, key: &str, body: &[u8]) {
        assert_eq!(self.http("PUT", &format!("/{BUCKET}/{key}"), body).0, 200, "PUT {key}");
    }

    /// Points an S3 client (`object_store`'s environment) at this server.
    pub fn client_env(&self, c: &mut Command) {
        c.env("AWS_ENDPOINT", format!("http://127.0.0.1:{}", self.port))
            .env("AWS_ALLOW_HTTP", "true")
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .env("AWS_DEFAULT_REGION", "us-east-1")
            .env_remove("HTTP_PROXY")
            .env_remove("HTTPS_PROXY")
            .env_remove("http_proxy")
            .env_remove("https_proxy");
    }

    pub fn signal(&self, sig: &str) {
        assert!(Command::new("kill").args([sig, &self.child.id().to_string()]).status().unwrap().success());
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.signal("-CONT");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn dechunk(mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let line_end = body.windows(2).position(|w| w == b"\r\n").unwrap();
        let len = usize::from_str_radix(std::str::from_utf8(&body[..line_end]).unwrap().trim(), 16).unwrap();
        if len == 0 {
            return out;
        }
        out.extend_from_slice(&body[line_end + 2..line_end + 2 + len]);
        body = &body[line_end + 4 + len..];
    }
}
