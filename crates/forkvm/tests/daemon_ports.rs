//! Linux tier, through a real `forkvm daemon` with no uplink (nothing leaves the host:
//! exposed ports need none): a guest's HTTP server reached by URL under its port's
//! token and no other (401 without one, 403 with another sandbox's — a fork's parent's
//! included — 404 once unexposed), a browser's token traded for a cookie, an upgrade
//! carried through both ways, and `forkvm port-forward` as raw TCP.

mod common;

use forkvm_client::api::{CreateSandboxRequest, ExecRequest, ForkSandboxRequest};
use forkvm_client::Client;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// A guest script answering an upgrade to `echo`, then echoing what it is sent.
const UPGRADE_ECHO: &str = r#"#!/bin/sh
while read -r line; do
  line=$(printf %s "$line" | tr -d '\r')
  [ -z "$line" ] && break
done
printf 'HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: echo\r\n\r\n'
exec cat
"#;

fn sh(client: &Client, id: &str, script: &str) -> String {
    let req = ExecRequest {
        args: vec!["sh".into(), "-c".into(), script.into()],
        timeout_secs: 120,
        ..ExecRequest::default()
    };
    let out = client.exec(id, &req).unwrap();
    assert_eq!(out.exit_code, 0, "{script}: {}{}", out.stdout, out.stderr);
    out.stdout
}

/// An answer: status, headers (lower-case names) and body.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

/// Reads an answer's status line and headers from `r`.
fn read_head(r: &mut impl BufRead) -> (u16, Vec<(String, String)>) {
    let mut status = String::new();
    r.read_line(&mut status).unwrap();
    let code = status.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or_else(|| panic!("{status:?}"));
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        let line = line.trim_end();
        if line.is_empty() {
            return (code, headers);
        }
        let (k, v) = line.split_once(':').unwrap();
        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
    }
}

/// `GET path` through the daemon's socket with `extra` header lines; the connection
/// closes after the answer, so the body is what follows the head.
fn get(socket: &Path, path: &str, extra: &[String]) -> Answer {
    get_at(socket, "forkvmd", path, extra)
}

/// [`get`] with `Host: host`.
fn get_at(socket: &Path, host: &str, path: &str, extra: &[String]) -> Answer {
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let mut head = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    for h in extra {
        head.push_str(h);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    let mut r = BufReader::new(s);
    let (status, headers) = read_head(&mut r);
    let mut body = String::new();
    r.read_to_string(&mut body).unwrap();
    if headers.iter().any(|(k, v)| k == "transfer-encoding" && v == "chunked") {
        body = unchunk(&body);
    }
    Answer { status, headers, body }
}

fn unchunk(raw: &str) -> String {
    let (mut out, mut rest) = (String::new(), raw);
    while let Some((size, after)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap();
        if n == 0 {
            break;
        }
        out.push_str(&after[..n]);
        rest = &after[n + 2..];
    }
    out
}

/// A P-256 key: its signing key and public JWK (JSON).
fn p256_key() -> (jsonwebtoken::EncodingKey, String) {
    use base64::Engine;
    let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let point = pair.public_key_raw();
    let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
    let jwk = serde_json::json!({"kty": "EC", "crv": "P-256", "x": b64(&point[1..33]), "y": b64(&point[33..])});
    (jsonwebtoken::EncodingKey::from_ec_der(&pair.serialize_der()), jwk.to_string())
}

/// A DPoP proof (RFC 9449) for `GET htu` with access token `token`.
fn dpop_proof(key: &jsonwebtoken::EncodingKey, jwk: &str, htu: &str, token: &str) -> String {
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
    header.typ = Some("dpop+jwt".into());
    header.jwk = Some(serde_json::from_str(jwk).unwrap());
    let claims = serde_json::json!({
        "jti": format!("{:?}", std::time::SystemTime::now()), "htm": "GET", "htu": htu,
        "iat": jsonwebtoken::get_current_timestamp(), "ath": forkvmd::dpop::token_hash(token),
    });
    jsonwebtoken::encode(&header, &claims, key).unwrap()
}

fn token(t: &str) -> String {
    format!("X-Forkvm-Port-Token: {t}")
}

#[test]
fn exposed_ports_route_by_their_own_tokens_and_port_forward_carries_tcp() {
    if !common::networks_allowed() {
        return;
    }
    let mut env = common::Env::new();
    env.start_daemon_with(&[], &[("FORKVM_UPLINK", "none")]);
    env.ok(&["snapshot", "create", "--image", "tiny", "--tag", "t"]);
    let (socket, client) = (env.socket(), env.client());

    let a = client.spawn(&CreateSandboxRequest::new("t", 1)).unwrap().remove(0).id;
    let serve = format!(
        "mkdir -p /srv && echo parent > /srv/who && cat > /srv/upgrade <<'EOF'\n{UPGRADE_ECHO}EOF\n\
         chmod +x /srv/upgrade && busybox httpd -p 8000 -h /srv && \
         (setsid busybox nc -ll -p 9000 -e /srv/upgrade </dev/null >/dev/null 2>&1 &) && \
         (setsid busybox nc -ll -p 9001 -e /bin/cat </dev/null >/dev/null 2>&1 &)"
    );
    sh(&client, &a, &serve);

    // Exposed from the CLI; the token is the port's own.
    let exposed = env.json(&["expose", &a, "8000", "--json"]);
    let token_a = exposed["token"].as_str().unwrap().to_string();
    let path_a = exposed["path"].as_str().unwrap().to_string();
    assert_eq!(path_a, format!("/v1/sandboxes/{a}/ports/8000/"));
    assert_eq!(client.expose(&a, 8000, None).unwrap().token, token_a, "exposing again keeps the token");
    let who = |path: &str, t: &str| get(&socket, &format!("{path}who"), &[token(t)]);
    let answer = who(&path_a, &token_a);
    assert_eq!((answer.status, answer.body.as_str()), (200, "parent\n"), "{answer:?}");

    // No token, another token, a port not exposed.
    assert_eq!(get(&socket, &format!("{path_a}who"), &[]).status, 401);
    assert_eq!(who(&path_a, "fvp_0123").status, 403);
    assert_eq!(who(&format!("/v1/sandboxes/{a}/ports/8001/"), &token_a).status, 404);

    // A browser: the token in the address becomes a cookie of this port's path.
    let visit = get(&socket, &format!("{path_a}who?x=1&forkvm_token={token_a}"), &[]);
    assert_eq!(visit.status, 303, "{visit:?}");
    assert_eq!(visit.header("location"), Some(format!("{path_a}who?x=1").as_str()));
    let cookie = visit.header("set-cookie").unwrap().split(';').next().unwrap().to_string();
    let again = get(&socket, &format!("{path_a}who?x=1"), &[format!("Cookie: {cookie}")]);
    assert_eq!((again.status, again.body.as_str()), (200, "parent\n"));

    // A fork's child serves the same port under a token of its own; neither token
    // routes to the other sandbox.
    let fork = ForkSandboxRequest::new(1);
    let b = client.fork(&a, &fork).unwrap().remove(0).id;
    let child_ports = client.exposed_ports(&b).unwrap();
    assert_eq!(child_ports.iter().map(|p| p.port).collect::<Vec<_>>(), [8000]);
    let (token_b, path_b) = (child_ports[0].token.clone(), child_ports[0].path.clone());
    assert_ne!(token_b, token_a);
    sh(&client, &b, "echo child > /srv/who");
    assert_eq!(who(&path_b, &token_b).body, "child\n");
    assert_eq!(who(&path_b, &token_a).status, 403, "the parent's token does not route to the child");
    assert_eq!(who(&path_a, &token_b).status, 403);
    assert_eq!(who(&path_a, &token_a).body, "parent\n");

    // Each port has an origin of its own too: every path there is the guest's (the
    // API's paths included), under the same token rules, and a visit's cookie is that
    // origin's alone.
    let at = |host: &str, path: &str, extra: &[String]| get_at(&socket, host, path, extra);
    let host_a = exposed["host"].as_str().unwrap().to_string();
    assert_eq!(host_a, format!("8000-{a}.localhost"));
    let own = at(&format!("{host_a}:8889"), "/who", &[token(&token_a)]);
    assert_eq!((own.status, own.body.as_str()), (200, "parent\n"), "{own:?}");
    let api_path = at(&host_a, "/v1/sandboxes", &[token(&token_a)]);
    assert_eq!(api_path.status, 404, "{api_path:?}");
    assert_eq!(api_path.header("x-forkvm-error"), None, "the guest's 404, not the daemon's: {api_path:?}");
    assert_eq!(at(&host_a, "/who", &[]).status, 401);
    let host_b = child_ports[0].host.clone().unwrap();
    assert_eq!(
        at(&host_b, "/who", &[token(&token_a)]).status,
        403,
        "the parent's token is refused at the child's origin"
    );
    assert_eq!(at(&host_b, "/who", &[token(&token_b)]).body, "child\n");
    let visit = at(&host_b, &format!("/who?forkvm_token={token_b}"), &[]);
    assert_eq!((visit.status, visit.header("location")), (303, Some("/who")), "{visit:?}");
    let cookie = visit.header("set-cookie").unwrap();
    assert!(cookie.contains("; Path=/;") && !cookie.contains("Domain"), "{cookie}");
    let cookie = cookie.split(';').next().unwrap();
    assert_eq!(at(&host_b, "/who", &[format!("Cookie: {cookie}")]).body, "child\n");
    assert_eq!(at(&format!("9-{b}.localhost"), "/who", &[token(&token_b)]).status, 404, "port 9 is not exposed");

    // An upgrade is carried through, both ways.
    let upgrade_token = client.expose(&a, 9000, None).unwrap().token;
    let mut s = UnixStream::connect(&socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let head = format!(
        "GET /v1/sandboxes/{a}/ports/9000/live HTTP/1.1\r\nHost: forkvmd\r\nConnection: Upgrade\r\n\
         Upgrade: echo\r\n{}\r\n\r\n",
        token(&upgrade_token)
    );
    s.write_all(head.as_bytes()).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let (status, headers) = read_head(&mut r);
    assert_eq!(status, 101, "{headers:?}");
    assert!(headers.contains(&("upgrade".into(), "echo".into())), "{headers:?}");
    for line in ["ping\n", "pong\n"] {
        s.write_all(line.as_bytes()).unwrap();
        let mut back = String::new();
        r.read_line(&mut back).unwrap();
        assert_eq!(back, line);
    }
    drop((s, r));

    // port-forward: raw TCP on a local port, a stream per connection.
    let mut forward = env
        .command(&["--daemon", &format!("unix:{}", socket.display()), "port-forward", &a, "0", "9001"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(forward.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let local = line.split_whitespace().nth(1).unwrap_or_else(|| panic!("{line:?}")).to_string();
    let mut conns: Vec<std::net::TcpStream> = (0..2).map(|_| std::net::TcpStream::connect(&local).unwrap()).collect();
    for (i, c) in conns.iter_mut().enumerate() {
        c.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        c.write_all(format!("hello {i}\n").as_bytes()).unwrap();
    }
    for (i, c) in conns.iter_mut().enumerate() {
        let mut back = String::new();
        BufReader::new(c).read_line(&mut back).unwrap();
        assert_eq!(back, format!("hello {i}\n"));
    }
    let _ = forward.kill();
    let _ = forward.wait();
    let closed = env.cli(&["port-forward", &a, "0", "9002"]);
    assert!(!closed.status.success());
    assert!(String::from_utf8_lossy(&closed.stderr).contains("nothing listens on port 9002"), "{closed:?}");

    // A port bound to a key (DPoP): its token alone is refused; with a proof of the key
    // it passes, once per proof, and the guest sees neither.
    let (key, jwk) = p256_key();
    let jkt = forkvmd::dpop::thumbprint(&jwk).unwrap();
    let bound = env.json(&["expose", &b, "8001", "--dpop-jkt", &jkt, "--json"]);
    assert_eq!(bound["dpop_jkt"].as_str(), Some(jkt.as_str()));
    sh(&client, &b, "busybox httpd -p 8001 -h /srv");
    let bound_token = bound["token"].as_str().unwrap().to_string();
    let bound_path = format!("/v1/sandboxes/{b}/ports/8001/who");
    assert_eq!(get(&socket, &bound_path, &[token(&bound_token)]).status, 401);
    let proof = dpop_proof(&key, &jwk, &format!("http://forkvmd{bound_path}"), &bound_token);
    let with_proof = [format!("Authorization: DPoP {bound_token}"), format!("DPoP: {proof}")];
    let answer = get(&socket, &bound_path, &with_proof);
    assert_eq!((answer.status, answer.body.as_str()), (200, "child\n"), "{answer:?}");
    assert_eq!(get(&socket, &bound_path, &with_proof).status, 401, "a proof is good once");

    // Unexposed: the token stops working; a killed sandbox's ports go with it.
    env.ok(&["unexpose", &a, "8000"]);
    assert_eq!(who(&path_a, &token_a).status, 404);
    assert_eq!(who(&path_b, &token_b).body, "child\n");
    client.kill_sandbox(&b).unwrap();
    assert_eq!(who(&path_b, &token_b).status, 404);
    assert!(client.exposed_ports(&b).unwrap_err().is_not_found());
    let local = env.command(&["ports", &a]).output().unwrap();
    assert!(String::from_utf8_lossy(&local.stderr).contains("needs the daemon"), "{local:?}");
    client.kill_sandbox(&a).unwrap();
}
