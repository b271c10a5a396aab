//! Linux tier, python template, through a real `forkvm daemon` whose uplink is a fake
//! internet this test makes (no sandbox reaches any other address): a sandbox closed to
//! all but two names fetches by name over HTTP and HTTPS, refuses a certificate it does
//! not trust until the test's CA is installed in its guest, and `pip install`s a wheel
//! from a package index served over HTTPS there, which its warm interpreter then
//! imports; a name outside its policy stays out of reach over HTTPS too.

mod common;
#[path = "common/fake_https.rs"]
mod fake_https;
#[path = "common/wheel.rs"]
mod wheel;

use forkvm_client::api::{CreateSandboxRequest, ExecRequest, ExecResponse, NetworkPolicy};
use forkvm_client::Client;
use forkvm_sandbox::network::fake_internet::{self, FakeInternet};
use std::collections::BTreeMap;
use std::time::Instant;

const INDEX: &str = "pypi.example.test";
const WWW: &str = "www.example.test";
/// Resolves in the fake internet, but the sandbox's policy does not allow it.
const OUTSIDE: &str = "outside.example.test";

fn exec(client: &Client, id: &str, script: &str) -> (ExecResponse, f64) {
    let req = ExecRequest {
        args: vec!["sh".into(), "-c".into(), script.into()],
        timeout_secs: 300,
        ..ExecRequest::default()
    };
    let t = Instant::now();
    let out = client.exec(id, &req).unwrap_or_else(|e| panic!("exec {script:?}: {e}"));
    (out, t.elapsed().as_secs_f64())
}

/// Defines `probe(urls)` in the sandbox's warm interpreter: fetches each URL and prints
/// one line each, `ok <body>` or `error <reason>` (the system's trust store decides TLS,
/// read anew for each fetch). The warm interpreter, not a new process: starting Python
/// takes tens of seconds in an emulated guest.
const PROBE: &str = r#"import urllib.request
def probe(*urls):
    for url in urls:
        try:
            print("ok", urllib.request.urlopen(url, timeout=15).read().decode().strip())
        except Exception as e:
            print("error", getattr(e, "reason", e))
"#;

/// Runs `probe` over `urls` in sandbox `id`'s warm interpreter; its lines, in order.
fn probe(client: &Client, id: &str, urls: &[String]) -> (Vec<String>, f64) {
    let t = Instant::now();
    let out = client.eval(id, &format!("probe(*{urls:?})")).unwrap();
    assert_eq!(out.error, None, "{out:?}");
    (out.stdout.lines().map(String::from).collect(), t.elapsed().as_secs_f64())
}

#[test]
#[cfg_attr(not(feature = "long-tests"), ignore = "long tier: scripts/test-long")]
fn a_python_sandbox_fetches_by_name_over_https_and_pip_installs_from_an_index() {
    if !common::networks_allowed() {
        return;
    }
    let internet = FakeInternet::create().expect("a fake internet");
    let _dns = internet
        .serve_dns(&[
            (INDEX, fake_internet::HOST_IP),
            (WWW, fake_internet::HOST_IP),
            (OUTSIDE, fake_internet::OTHER_HOST_IP),
        ])
        .unwrap();
    let http = internet.serve_http(80, "plain http by name\n").unwrap();
    let tls = fake_https::test_tls(&[INDEX, WWW, OUTSIDE]);
    let hello = wheel::wheel("fvm-hello", "1.0", "GREETING = 'hello from the fake index'\n");
    let wheel_path = format!("/packages/{}", hello.file_name);
    let files = BTreeMap::from([
        ("/".to_string(), b"hello over https\n".to_vec()),
        ("/simple/fvm-hello/".to_string(), wheel::index_page("fvm-hello", &hello, &wheel_path).into_bytes()),
        (wheel_path.clone(), hello.bytes.clone()),
    ]);
    let listener = internet.run_inside(|| std::net::TcpListener::bind(("0.0.0.0", 443))).unwrap().unwrap();
    let https = fake_https::serve(listener, tls.server.clone(), files);

    let mut env = common::Env::new();
    let uplink = internet.router_path();
    let dns = fake_internet::HOST_IP.to_string();
    env.start_daemon_with(&[], &[("FORKVM_UPLINK", uplink.as_str()), ("FORKVM_DNS", dns.as_str())]);
    env.ok(&["snapshot", "create", "--image", "python", "--tag", "py"]);
    let client = env.client();
    let mut req = CreateSandboxRequest::new("py", 1);
    req.network = Some(NetworkPolicy { allow_internet: false, allow: vec![INDEX.into(), WWW.into()], deny: vec![] });
    let id = client.spawn(&req).unwrap().remove(0).id;

    let defined = client.eval(&id, PROBE).unwrap();
    assert_eq!(defined.error, None, "{defined:?}");
    // By name over HTTP; over HTTPS TLS is checked (the test's CA is not trusted yet);
    // a name outside the policy does not resolve, and its address is not reachable.
    let outside = [format!("https://{OUTSIDE}/"), format!("https://{}/", fake_internet::OTHER_HOST_IP)];
    let urls = [format!("http://{WWW}/"), format!("https://{WWW}/"), outside[0].clone(), outside[1].clone()];
    let (before, before_s) = probe(&client, &id, &urls);
    assert_eq!(before.len(), 4, "{before:?}");
    assert_eq!(before[0], "ok plain http by name");
    assert!(before[1].starts_with("error") && before[1].contains("CERTIFICATE_VERIFY_FAILED"), "{before:?}");
    assert!(before[2].starts_with("error") && before[3].starts_with("error"), "outside reached: {before:?}");

    // Added to the guest's trust store, the bundle Python's OpenSSL and Debian's pip
    // read (`update-ca-certificates` would make the same file, one process per
    // certificate: minutes in an emulated guest).
    let (installed, install_s) =
        exec(&client, &id, &format!("cat >> /etc/ssl/certs/ca-certificates.crt <<'EOF'\n{}EOF", tls.ca_pem));
    assert_eq!(installed.exit_code, 0, "{installed:?}");
    let (pip, pip_s) = exec(
        &client,
        &id,
        &format!(
            "python3 -m pip install --disable-pip-version-check --no-cache-dir --index-url https://{INDEX}/simple/ \
             fvm-hello"
        ),
    );
    assert_eq!(pip.exit_code, 0, "pip install: {}\n{}", pip.stdout, pip.stderr);
    assert!(pip.stdout.contains("Successfully installed fvm-hello-1.0"), "{}", pip.stdout);
    // The warm interpreter imports what pip installed (its site directory was there
    // when it started), and now trusts the HTTPS host; outside stays out of reach.
    let t = Instant::now();
    let imported = client
        .eval(&id, "import importlib; importlib.invalidate_caches(); import fvm_hello\nfvm_hello.GREETING")
        .unwrap();
    assert_eq!(imported.result.as_deref(), Some("'hello from the fake index'"), "{imported:?}");
    let (after, _) = probe(&client, &id, &[format!("https://{WWW}/"), outside[0].clone(), outside[1].clone()]);
    let after_s = t.elapsed().as_secs_f64();
    assert_eq!(after[0], "ok hello over https", "the CA is trusted now: {after:?}");
    assert!(after[1].starts_with("error") && after[2].starts_with("error"), "outside reached: {after:?}");
    // The server saw the index, the wheel and the one trusted fetch, nothing else (the
    // untrusted fetch ended in its handshake; nothing outside the policy came).
    let mut asked = https.requested();
    asked.sort();
    let mut expected = vec!["/".to_string(), "/simple/fvm-hello/".to_string(), wheel_path.clone()];
    expected.sort();
    assert_eq!(asked, expected);
    assert_eq!(http.served(), 1, "the HTTP server saw the one fetch");
    eprintln!(
        "python sandbox (guest-side, emulated here): four fetches {before_s:.1} s, CA install {install_s:.1} s, \
         pip install {pip_s:.1} s, import + three fetches {after_s:.1} s"
    );
    client.kill_sandbox(&id).unwrap();
}
