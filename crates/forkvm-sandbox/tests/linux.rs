//! Linux tier: a real guest kernel with the agent. The `tiny` template is booted once
//! (or found in the cache) into a template snapshot; every test restores its own
//! sandbox from it (~0.3 s) instead of booting (~30–90 s here).

use forkvm_proto::{ExecRequest, MkdirRequest, WriteFileRequest};
use forkvm_sandbox::network::dns::upstream;
use forkvm_sandbox::network::fake_internet::{self, FakeInternet};
use forkvm_sandbox::network::uplink;
use forkvm_sandbox::{ensure_template_snapshot, Artifacts, Sandbox, TemplateSnapshot};
use std::sync::OnceLock;

/// The one uplink of this process's sandboxes (root only): a fake internet, so that no
/// sandbox under test reaches any other address, answering DNS for a few names.
struct Internet {
    net: FakeInternet,
    _dns: fake_internet::FakeDns,
}

/// The address of every name under the fake internet's `*.cdn.example.test`.
const CDN_HOST: std::net::Ipv4Addr = fake_internet::OTHER_HOST_IP;

fn internet() -> Option<&'static FakeInternet> {
    static I: OnceLock<Option<Internet>> = OnceLock::new();
    I.get_or_init(|| {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return None;
        }
        let net = FakeInternet::create().expect("a fake internet");
        let dns = net.serve_dns(&[("www.example.test", fake_internet::HOST_IP), ("*.cdn.example.test", CDN_HOST)]);
        uplink::configure(net.uplink().unwrap()).expect("the uplink is chosen before any sandbox");
        upstream::configure(vec![(fake_internet::HOST_IP, 53).into()])
            .expect("the resolvers are chosen before any sandbox");
        Some(Internet { _dns: dns.expect("the fake internet's DNS"), net })
    })
    .as_ref()
    .map(|i| &i.net)
}

fn template() -> &'static TemplateSnapshot {
    static T: OnceLock<TemplateSnapshot> = OnceLock::new();
    T.get_or_init(|| {
        internet();
        let artifacts =
            Artifacts::ensure("tiny", &mut |_| {}).expect("kernel and tiny image (see scripts/prepare-guest)");
        ensure_template_snapshot(artifacts).expect("template snapshot")
    })
}

fn sandbox() -> Sandbox {
    Sandbox::start(template()).expect("sandbox")
}

#[test]
fn exec_with_env_cwd_stdin_and_exit_code() {
    let sb = sandbox();
    let mut req = ExecRequest::shell("cd .. && echo \"$GREETING from $(pwd)\"; cat; exit 3");
    req.env = vec![("GREETING".into(), "hello".into())];
    req.cwd = Some("/etc".into());
    let out = sb.client.exec_collect(&req, b"piped stdin\n").unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello from /\npiped stdin\n");
    assert_eq!(out.status.code, Some(3));
    assert!(!out.status.timed_out);
}

#[test]
fn a_timeout_kills_the_command_and_says_so() {
    let sb = sandbox();
    let mut req = ExecRequest::argv(["sleep", "30"]);
    req.timeout_ms = Some(1500);
    let t = std::time::Instant::now();
    let out = sb.client.exec_collect(&req, b"").unwrap();
    assert!(out.status.timed_out, "{:?}", out.status);
    assert!(t.elapsed().as_secs() < 20, "killed long before sleep would end");
}

#[test]
fn files_of_0_1_and_8_mib_round_trip_byte_identical() {
    // 8 MiB is 32 of the protocol's data chunks each way; every page of it is guest
    // kernel work, emulated here (a 50 MiB round trip took minutes).
    let sb = sandbox();
    sb.client.mkdir(&MkdirRequest { path: "/tmp/data".into(), parents: true, mode: None, owner: None }).unwrap();
    let big: Vec<u8> = (0..8u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    for (name, data) in [("empty", Vec::new()), ("one", vec![0x5a]), ("big", big)] {
        let path = format!("/tmp/data/{name}");
        let req = WriteFileRequest { path: path.clone(), mode: Some(0o640), create_parents: false, owner: None };
        sb.client.write_file(&req, &mut data.as_slice()).unwrap();
        let back = sb.client.read_file_to_vec(&path).unwrap();
        assert!(back == data, "{name}: {} bytes back, {} written", back.len(), data.len());
        assert_eq!(sb.client.stat(&path).unwrap().size, data.len() as u64);
    }
    let names: Vec<String> = sb.client.list("/tmp/data").unwrap().into_iter().map(|e| e.name).collect();
    assert_eq!(names.len(), 3, "{names:?}");
    assert!(sb.client.read_file_to_vec("/tmp/data/missing").is_err());
}

#[test]
fn three_clones_read_three_different_random_streams() {
    let probe = ExecRequest::shell("head -c 16 /dev/urandom | od -An -tx1");
    let streams: Vec<String> = (0..3)
        .map(|_| {
            let sb = sandbox();
            String::from_utf8_lossy(&sb.client.exec_collect(&probe, b"").unwrap().stdout).into_owned()
        })
        .collect();
    assert!(streams.iter().all(|s| s.trim().len() > 30), "{streams:?}");
    assert!(streams[0] != streams[1] && streams[1] != streams[2] && streams[0] != streams[2], "{streams:?}");
}

#[test]
fn sandboxes_get_their_own_identity_and_entropy() {
    let (a, b) = (sandbox(), sandbox());
    assert_ne!(a.id, b.id);
    let probe = ExecRequest::shell("hostname; head -c 16 /dev/urandom | od -An -tx1");
    let (ra, rb) = (a.client.exec_collect(&probe, b"").unwrap(), b.client.exec_collect(&probe, b"").unwrap());
    let (sa, sb) = (String::from_utf8_lossy(&ra.stdout).into_owned(), String::from_utf8_lossy(&rb.stdout).into_owned());
    assert!(sa.starts_with(&format!("sb-{}", a.id)), "{sa}");
    assert!(sb.starts_with(&format!("sb-{}", b.id)), "{sb}");
    let (ua, ub) = (sa.lines().nth(1).unwrap_or(""), sb.lines().nth(1).unwrap_or(""));
    assert!(!ua.trim().is_empty() && ua != ub, "urandom must differ between clones: {ua} vs {ub}");
    assert_eq!(a.client.ping().unwrap().sandbox_id.as_deref(), Some(a.id.as_str()));
}

#[test]
fn writes_stay_in_their_sandbox() {
    let (a, b) = (sandbox(), sandbox());
    a.client.exec_collect(&ExecRequest::shell("echo mine > /etc/motd"), b"").unwrap();
    let read = ExecRequest::shell("cat /etc/motd 2>/dev/null || echo none");
    assert_eq!(String::from_utf8_lossy(&a.client.exec_collect(&read, b"").unwrap().stdout), "mine\n");
    assert_eq!(String::from_utf8_lossy(&b.client.exec_collect(&read, b"").unwrap().stdout), "none\n");
}

/// On PVM hosts a guest kernel booted with `noxsave` (the legacy `pvm-compat` CPU
/// template; `pvm-xsave` saves AVX and AVX-512) saves no AVX state while guest user code
/// still sees AVX-512 (forkvm-agent's `xstate.rs`): glibc's AVX-512 memcpy then loses the
/// first 64 bytes of large copies whenever another task runs in the middle of one. That
/// cut holes into exec output and killed the agent, PID 1, with SIGSEGV. The agent must
/// keep glibc to SSE there, and exec output must come back byte-exact, also in the
/// sequence the agent died in (an exec with stdin, then one killed at its timeout).
#[test]
fn exec_output_stays_byte_exact_where_the_kernel_saves_no_avx_state() {
    let sb = sandbox();
    // What guest user code is offered (CPUID, XCR0) against what the guest kernel saves,
    // seen from a guest process: on AMD PVM hosts user code sees the host's AVX-512 while
    // the kernel saves only FXSAVE state; Intel hosts with CPUID faulting hide AVX from it.
    let probe = sb.client.exec_collect(&ExecRequest::argv(["/sbin/forkvm-agent", "--vector-state"]), b"").unwrap();
    let probe = String::from_utf8_lossy(&probe.stdout).to_string();
    // Only vector state glibc uses counts (AVX, AVX-512): PKRU and AMX, which the host's
    // XCR0 enables on PVM hosts and no guest kernel saves there, are not glibc's.
    let unsaved =
        probe.split_whitespace().find_map(|w| w.strip_prefix("glibc_unsaved=0x")).expect("the agent's vector state");
    let unsaved = u64::from_str_radix(unsaved, 16).unwrap();
    if unsaved != 0 {
        let environ = sb.client.read_file_to_vec("/proc/1/environ").unwrap();
        let tunables = environ.split(|b| *b == 0).find_map(|v| v.strip_prefix(b"GLIBC_TUNABLES=".as_slice()));
        let tunables = String::from_utf8_lossy(tunables.unwrap_or_default());
        assert!(
            tunables.contains("glibc.cpu.hwcaps=-AVX,") && tunables.contains("-AVX_Fast_Unaligned_Load"),
            "PID 1 runs with glibc's AVX code on a kernel that does not save AVX state: GLIBC_TUNABLES={tunables:?}"
        );
    }
    // Every chunk of output is copied by the agent into a fresh 64 KiB buffer.
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let input: Vec<u8> = (0..1 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let out = sb.client.exec_collect(&ExecRequest::argv(["cat"]), &input).unwrap();
    assert_eq!(out.stdout.len(), input.len());
    let bad: Vec<usize> = (0..input.len()).filter(|&i| out.stdout[i] != input[i]).collect();
    assert!(bad.is_empty(), "{} bytes differ, first at {:#x}", bad.len(), bad[0]);
    for round in 0..3 {
        let mut req = ExecRequest::shell("echo $GREETING; pwd; cat");
        req.env = vec![("GREETING".into(), "hello".into())];
        req.cwd = Some("/tmp".into());
        let out = sb.client.exec_collect(&req, b"from stdin").unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "hello\n/tmp\nfrom stdin", "round {round}");
        let mut req = ExecRequest::shell("sleep 5");
        req.timeout_ms = Some(1000);
        let out = sb.client.exec_collect(&req, b"").unwrap();
        assert!(out.status.timed_out, "round {round}: {:?}", out.status);
    }
    assert!(sb.client.ping().is_ok());
}

fn python_template() -> &'static TemplateSnapshot {
    static T: OnceLock<TemplateSnapshot> = OnceLock::new();
    T.get_or_init(|| {
        let artifacts = Artifacts::ensure("python", &mut |_| {}).expect("kernel and python image");
        ensure_template_snapshot(artifacts).expect("python template snapshot")
    })
}

#[test]
fn eval_in_the_warm_interpreter_returns_reprs_and_tracebacks() {
    use forkvm_proto::EvalOutcome;
    let sb = Sandbox::start(python_template()).expect("python sandbox");
    // numpy was imported by the template's warm-up, before the snapshot.
    let r = sb.client.eval("import numpy as np\nnp.arange(4).reshape(2, 2).sum()").unwrap();
    match r.outcome {
        EvalOutcome::Value { value_repr: Some(v) } => assert!(v == "np.int64(6)" || v == "6", "{v}"),
        other => panic!("expected a value, got {other:?}"),
    }
    sb.client.eval("x = 41").unwrap();
    let r = sb.client.eval("x + 1").unwrap();
    assert_eq!(r.outcome, EvalOutcome::Value { value_repr: Some("42".into()) });
    let r = sb.client.eval("1 / 0").unwrap();
    match r.outcome {
        EvalOutcome::Exception { exception, traceback } => {
            assert!(exception.contains("ZeroDivisionError"), "{exception}");
            assert!(traceback.contains("Traceback"), "{traceback}");
        }
        other => panic!("expected an exception, got {other:?}"),
    }
}

/// Serves one HTTP request on `listener` (non-blocking; bounded by a deadline) with
/// `body`; the peer's address.
#[test]
fn two_clones_fetch_from_the_internet_at_once_and_never_reach_their_uplink() {
    let Some(internet) = internet() else {
        eprintln!("skipped: sandbox networks need root");
        return;
    };
    let (a, b) = (sandbox(), sandbox());
    let listener = internet.run_inside(|| std::net::TcpListener::bind((fake_internet::HOST_IP, 80))).unwrap().unwrap();
    let router = internet.run_in_router(|| std::net::TcpListener::bind(("0.0.0.0", 8081))).unwrap().unwrap();
    let server = serve_n(listener, 2, "hello from the internet");
    // Busybox's wget crashes when given -T here: `timeout` bounds it.
    let fetch = format!("timeout 60 wget -q -O - http://{}/", fake_internet::HOST_IP);

    let (out_a, out_b) = std::thread::scope(|s| {
        let fetch_a = s.spawn(|| a.client.exec_collect(&ExecRequest::shell(&fetch), b"").unwrap());
        let fetch_b = s.spawn(|| b.client.exec_collect(&ExecRequest::shell(&fetch), b"").unwrap());
        (fetch_a.join().unwrap(), fetch_b.join().unwrap())
    });
    for out in [&out_a, &out_b] {
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "hello from the internet",
            "stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let peers = server.join().unwrap();
    assert!(peers.iter().all(|p| p.ip() == std::net::IpAddr::V4(fake_internet::ROUTER_IP)), "{peers:?}");
    // The uplink's own services (the host's, in production) are closed to sandboxes.
    let gateway = a.network().and_then(|n| n.link()).expect("linked to the uplink").outer_ip();
    let probe = ExecRequest::shell(format!("timeout 5 wget -q -O - http://{gateway}:8081/ && echo reached"));
    let out = a.client.exec_collect(&probe, b"").unwrap();
    assert!(!String::from_utf8_lossy(&out.stdout).contains("reached"), "a sandbox reached its uplink");
    router.set_nonblocking(true).unwrap();
    assert!(router.accept().is_err(), "the uplink saw a connection from a sandbox");
}

#[test]
fn a_sandbox_resolves_names_through_its_gateway_and_no_other_resolver() {
    if internet().is_none() {
        eprintln!("skipped: sandbox networks need root");
        return;
    }
    let sb = sandbox();
    // Its resolv.conf names the gateway; a query to any other resolver is answered there
    // too (busybox's nslookup speaks DNS itself, with no NSS in between).
    let probe = ExecRequest::shell(
        "cat /etc/resolv.conf; nslookup www.example.test; nslookup img.cdn.example.test 9.9.9.9; \
         nslookup missing.example.test; echo rc=$?",
    );
    let out = sb.client.exec_collect(&probe, b"").unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.starts_with("nameserver 172.16.0.1\n"), "{stdout}");
    assert!(stdout.contains(&format!("Address: {}", fake_internet::HOST_IP)), "{stdout}");
    assert!(stdout.contains(&format!("Address: {CDN_HOST}")), "{stdout}");
    assert!(stdout.trim_end().ends_with("rc=1"), "a missing name is an error: {stdout}");
}

#[test]
fn an_egress_policy_holds_for_names_addresses_and_other_resolvers_and_changes_live() {
    let Some(internet) = internet() else {
        eprintln!("skipped: sandbox networks need root");
        return;
    };
    // Both of the fake host's addresses answer on this port, for as long as the test.
    let server = internet.serve_http(8088, "reached").unwrap();
    let sb = sandbox();
    let www = fake_internet::HOST_IP;
    // One exec per policy: each probe prints its name and `ok` or `no`.
    let probe = |probes: &[(&str, String)]| {
        let script: Vec<String> = probes
            .iter()
            .map(|(name, cmd)| format!("if {cmd} >/dev/null 2>&1; then echo {name}=ok; else echo {name}=no; fi"))
            .collect();
        let out = sb.client.exec_collect(&ExecRequest::shell(script.join("\n")), b"").unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let get = |target: &str| format!("timeout 20 wget -q -O - http://{target}:8088/");
    let policy = |allow_internet: bool, allow: &[&str], deny: &[&str]| forkvm_api::NetworkPolicy {
        allow_internet,
        allow: allow.iter().map(|s| s.to_string()).collect(),
        deny: deny.iter().map(|s| s.to_string()).collect(),
    };

    // Closed but for one domain: its names resolve and connect; another name does not
    // resolve (not through another resolver either), and its address is refused.
    sb.set_network_policy(&policy(false, &["*.cdn.example.test"], &[])).unwrap();
    let out = probe(&[
        ("cdn", get("img.cdn.example.test")),
        ("www_name", "nslookup www.example.test".into()),
        ("www_other_resolver", "nslookup www.example.test 9.9.9.9".into()),
        ("www_addr", get(&www.to_string())),
    ]);
    assert_eq!(out, "cdn=ok\nwww_name=no\nwww_other_resolver=no\nwww_addr=no\n");

    // Changed while it runs: open but for one name, whose address is blocked too
    // although the guest never resolved it.
    sb.set_network_policy(&policy(true, &[], &["www.example.test"])).unwrap();
    let out = probe(&[
        ("cdn", get("img.cdn.example.test")),
        ("cdn_addr", get(&CDN_HOST.to_string())),
        ("www_name", "nslookup www.example.test".into()),
        ("www_addr", get(&www.to_string())),
    ]);
    assert_eq!(out, "cdn=ok\ncdn_addr=ok\nwww_name=no\nwww_addr=no\n");

    // Networks: a denied one wins over the internet, an allowed one over a denied one.
    sb.set_network_policy(&policy(true, &[&format!("{www}")], &["203.0.113.0/24"])).unwrap();
    let out = probe(&[("www_addr", get(&www.to_string())), ("cdn_addr", get(&CDN_HOST.to_string()))]);
    assert_eq!(out, "www_addr=ok\ncdn_addr=no\n");

    // Bad input changes nothing.
    let e = sb.set_network_policy(&policy(true, &[], &["10.0.0.1/8"])).unwrap_err();
    assert!(e.to_string().contains("network.deny: \"10.0.0.1/8\""), "{e}");
    let out = probe(&[("www_addr", get(&www.to_string())), ("cdn_addr", get(&CDN_HOST.to_string()))]);
    assert_eq!(out, "www_addr=ok\ncdn_addr=no\n");

    assert_eq!(server.served(), 5, "the server saw every allowed fetch, and nothing else");
}

/// Serves `n` HTTP requests on `listener` with `body`; returns the peers.
fn serve_n(
    listener: std::net::TcpListener,
    n: usize,
    body: &'static str,
) -> std::thread::JoinHandle<Vec<std::net::SocketAddr>> {
    std::thread::spawn(move || {
        let mut peers = Vec::new();
        for _ in 0..n {
            let one = listener.try_clone().unwrap();
            peers.push(serve_once(one, body.to_string()).join().unwrap());
        }
        peers
    })
}

fn serve_once(listener: std::net::TcpListener, body: String) -> std::thread::JoinHandle<std::net::SocketAddr> {
    use std::io::{Read, Write};
    std::thread::spawn(move || {
        listener.set_nonblocking(true).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        let (mut conn, peer) = loop {
            match listener.accept() {
                Ok(c) => break c,
                Err(_) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(5))
                }
                Err(e) => panic!("the guest never connected: {e}"),
            }
        };
        conn.set_nonblocking(false).unwrap();
        conn.set_read_timeout(Some(std::time::Duration::from_secs(60))).unwrap();
        let mut request = Vec::new();
        let mut buf = [0u8; 1024];
        while !request.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = conn.read(&mut buf).expect("the request");
            assert!(n > 0, "the guest hung up mid-request");
            request.extend_from_slice(&buf[..n]);
        }
        let head = format!("HTTP/1.0 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
        conn.write_all(head.as_bytes()).unwrap();
        conn.write_all(body.as_bytes()).unwrap();
        peer
    })
}

#[test]
fn clones_with_one_address_each_reach_their_own_namespace_over_tcp() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: sandbox networks need root");
        return;
    }
    let (a, b) = (sandbox(), sandbox());
    for (i, sb) in [&a, &b].into_iter().enumerate() {
        let net = sb.network().expect("root gets a template with a network, and its sandboxes one each");
        let listener = net.run_inside(|| std::net::TcpListener::bind(("172.16.0.1", 8080))).unwrap().unwrap();
        let server = serve_once(listener, format!("hello sandbox {i}"));
        let probe = ExecRequest::shell("cat /sys/class/net/eth0/address; wget -q -O - http://172.16.0.1:8080/");
        let out = sb.client.exec_collect(&probe, b"").unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            stdout,
            format!("06:00:ac:10:00:02\nhello sandbox {i}"),
            "stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let peer = server.join().unwrap();
        assert_eq!(peer.ip().to_string(), "172.16.0.2", "every clone has the same address");
    }
}
