//! Linux tier, through a real `forkvm daemon` whose uplink is a fake internet this test
//! makes (no sandbox reaches any other address): a spawn's egress policy holds in its
//! sandboxes and in their forks, a policy changes on a running sandbox, and after a
//! `kill -9` and restart of the daemon the sandboxes resolve names again, under the
//! policy their namespaces kept; a tag's default policy holds in the sandboxes spawned
//! from it, and a branch keeps its sandbox's.

mod common;

use forkvm_client::api::{BranchSandboxRequest, CreateSandboxRequest, ExecRequest, ForkSandboxRequest, NetworkPolicy};
use forkvm_client::Client;
use forkvm_sandbox::network::fake_internet::{self, FakeInternet};
use std::time::{Duration, Instant};

fn policy(allow_internet: bool, allow: &[&str], deny: &[&str]) -> NetworkPolicy {
    NetworkPolicy {
        allow_internet,
        allow: allow.iter().map(|s| s.to_string()).collect(),
        deny: deny.iter().map(|s| s.to_string()).collect(),
    }
}

/// Runs each probe in sandbox `id` (one exec); `name=ok` or `name=no` per line.
fn probe(client: &Client, id: &str, probes: &[(&str, String)]) -> String {
    let script: Vec<String> = probes
        .iter()
        .map(|(name, cmd)| format!("if {cmd} >/dev/null 2>&1; then echo {name}=ok; else echo {name}=no; fi"))
        .collect();
    let req = ExecRequest {
        args: vec!["sh".into(), "-c".into(), script.join("\n")],
        timeout_secs: 300,
        ..ExecRequest::default()
    };
    client.exec(id, &req).unwrap().stdout
}

fn get(target: &str) -> String {
    format!("timeout 20 wget -q -O - http://{target}:8088/")
}

#[test]
fn policies_hold_through_spawn_fork_change_and_a_daemon_restart() {
    if !common::networks_allowed() {
        return;
    }
    let internet = FakeInternet::create().expect("a fake internet");
    let _dns = internet
        .serve_dns(&[
            ("www.example.test", fake_internet::HOST_IP),
            ("*.cdn.example.test", fake_internet::OTHER_HOST_IP),
        ])
        .unwrap();
    let server = internet.serve_http(8088, "hi").unwrap();

    let mut env = common::Env::new();
    let uplink = internet.router_path();
    let dns = fake_internet::HOST_IP.to_string();
    let daemon_env = [("FORKVM_UPLINK", uplink.as_str()), ("FORKVM_DNS", dns.as_str())];
    env.start_daemon_with(&[], &daemon_env);
    env.ok(&["snapshot", "create", "--image", "tiny", "--tag", "t"]);
    let client = env.client();
    let www = fake_internet::HOST_IP.to_string();

    // Spawned closed but for the CDN.
    let mut req = CreateSandboxRequest::new("t", 1);
    req.network = Some(policy(false, &["*.cdn.example.test"], &[]));
    req.per_child_netns = true;
    let a = client.spawn(&req).unwrap().remove(0);
    assert_eq!(a.network, req.network, "the sandbox shows its policy");
    let closed = [
        ("cdn", get("img.cdn.example.test")),
        ("www_name", "nslookup www.example.test".into()),
        ("www_addr", get(&www)),
    ];
    // An allowed name's address is reachable once the name resolved, not before.
    let cdn_addr = ("cdn_addr", get(&fake_internet::OTHER_HOST_IP.to_string()));
    assert_eq!(probe(&client, &a.id, std::slice::from_ref(&cdn_addr)), "cdn_addr=no\n");
    assert_eq!(probe(&client, &a.id, &closed), "cdn=ok\nwww_name=no\nwww_addr=no\n");

    // Its fork keeps the policy, and what its source resolved (its guest remembers it).
    let b = client.fork(&a.id, &ForkSandboxRequest::new(1)).unwrap().remove(0);
    assert_eq!(b.network, req.network);
    assert_eq!(probe(&client, &b.id, &[cdn_addr]), "cdn_addr=ok\n");
    assert_eq!(probe(&client, &b.id, &closed), "cdn=ok\nwww_name=no\nwww_addr=no\n");

    // Opened on the running parent, not on its child.
    let opened = client.set_network(&a.id, &policy(true, &[], &[])).unwrap();
    assert_eq!(opened.network, None, "the default policy is not shown");
    assert_eq!(probe(&client, &a.id, &[("www_addr", get(&www))]), "www_addr=ok\n");
    assert_eq!(probe(&client, &b.id, &[("www_addr", get(&www))]), "www_addr=no\n");
    let bad = client.set_network(&b.id, &policy(true, &["10.0.0.1/8"], &[])).unwrap_err();
    assert!(bad.to_string().contains("network.allow"), "{bad}");

    // kill -9 of the daemon: the sandboxes run on; the new daemon serves their DNS
    // again, and the child's namespace still holds its policy.
    let mut daemon = env.daemon.take().unwrap();
    daemon.kill().unwrap();
    daemon.wait().unwrap();
    env.start_daemon_with(&[], &daemon_env);
    let client = env.client();
    assert_eq!(probe(&client, &b.id, &closed), "cdn=ok\nwww_name=no\nwww_addr=no\n");
    assert_eq!(
        probe(&client, &a.id, &[("cdn", get("img.cdn.example.test")), ("www", get("www.example.test"))]),
        "cdn=ok\nwww=ok\n"
    );
    assert_eq!(client.get_sandbox(&b.id).unwrap().network, req.network, "the registry kept the policy");

    // The CLI: a policy on start and on a running sandbox, through the daemon; refused
    // without one.
    let started = env.json(&["fork", "--tag", "t", "--deny", "*.example.test", "--json"]);
    let c = started["sandboxes"][0]["id"].as_str().expect("a sandbox id").to_string();
    assert_eq!(started["sandboxes"][0]["network"]["deny"], serde_json::json!(["*.example.test"]));
    let set = env.json(&["network", &a.id, "--no-internet", "--allow", "*.cdn.example.test", "--json"]);
    assert_eq!(set["network"]["allow_internet"], serde_json::json!(false));
    assert_eq!(probe(&client, &a.id, &[("www", get("www.example.test"))]), "www=no\n");
    let local = env.command(&["fork", "--tag", "t", "--no-internet"]).output().unwrap();
    assert!(!local.status.success());
    assert!(String::from_utf8_lossy(&local.stderr).contains("network policies need the daemon"));

    // A tag's default policy: a spawn asking none takes it (and it holds), one asking
    // another gets that one.
    let cdn_only = policy(false, &["*.cdn.example.test"], &[]);
    let create = ["snapshot", "create", "--image", "tiny", "--tag", "closed", "--no-internet"];
    let tagged = env.json(&[&create[..], &["--allow", "*.cdn.example.test", "--json"]].concat());
    assert_eq!(tagged["default_network"], serde_json::to_value(&cdn_only).unwrap(), "{tagged}");
    let d = client.spawn(&CreateSandboxRequest::new("closed", 1)).unwrap().remove(0);
    assert_eq!(d.network.as_ref(), Some(&cdn_only), "a spawn asking no policy takes its tag's");
    let www_addr = ("www_addr", get(&www));
    assert_eq!(probe(&client, &d.id, &[closed[0].clone(), www_addr]), "cdn=ok\nwww_addr=no\n");
    let mut asking = CreateSandboxRequest::new("closed", 1);
    asking.network = Some(policy(true, &[], &["*.cdn.example.test"]));
    let e = client.spawn(&asking).unwrap().remove(0);
    assert_eq!(e.network, asking.network, "a spawn's own policy wins over its tag's");
    // A branch keeps its sandbox's policy as it is when taken (a's was set twice since
    // its spawn), and so does a spawn from the branch.
    let a_now = policy(false, &["*.cdn.example.test"], &[]);
    let br = BranchSandboxRequest { tag: Some("a-now".into()), ..BranchSandboxRequest::default() };
    let branch = client.branch(&a.id, &br).unwrap();
    assert_eq!(branch.default_network.as_ref(), Some(&a_now));
    let listed = client.list_snapshots().unwrap();
    assert_eq!(listed.iter().find(|s| s.tag == "closed").and_then(|s| s.default_network.clone()), Some(cdn_only));
    let f = client.spawn(&CreateSandboxRequest::new("a-now", 1)).unwrap().remove(0);
    assert_eq!(f.network, Some(a_now));
    // Without the daemon nothing would enforce it: refused.
    let local = env.command(&["fork", "--tag", "closed"]).output().unwrap();
    assert!(!local.status.success());
    assert!(String::from_utf8_lossy(&local.stderr).contains("tag closed carries a default network policy"));

    for id in [&a.id, &b.id, &c, &d.id, &e.id, &f.id] {
        client.kill_sandbox(id).unwrap();
    }
    assert_eq!(server.served(), 8, "the server saw every allowed fetch, and nothing else");
}

/// The sandbox links (`fvm*`) on the fake internet's router: one per live sandbox.
fn links_on(internet: &FakeInternet) -> usize {
    let out = internet
        .run_in_router(|| std::process::Command::new("ip").args(["-o", "link", "show"]).output())
        .unwrap()
        .expect("ip (iproute2)");
    String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.contains(": fvm")).count()
}

/// Waits up to 10 s for `links_on` to be `n` (a namespace is taken apart by a kernel
/// worker, a moment after its last reference goes).
fn wait_for_links(internet: &FakeInternet, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while links_on(internet) != n {
        assert!(Instant::now() < deadline, "{} sandbox links on the uplink, expected {n}", links_on(internet));
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn nothing_of_a_sandbox_network_outlives_it() {
    if !common::networks_allowed() {
        return;
    }
    let internet = FakeInternet::create().expect("a fake internet");
    let mut env = common::Env::new();
    let uplink = internet.router_path();
    // No slots made ahead: every link on the uplink is a live sandbox's.
    let daemon_env = [("FORKVM_UPLINK", uplink.as_str()), ("FORKVM_DNS", "203.0.113.2"), ("FORKVM_NET_POOL", "0")];
    env.start_daemon_with(&[], &daemon_env);
    env.ok(&["snapshot", "create", "--image", "tiny", "--tag", "t"]);
    let client = env.client();
    assert_eq!(links_on(&internet), 0);

    // 20 spawn and kill cycles, with a policy (rules, learned sets) on half of them.
    for i in 0..20 {
        let mut req = CreateSandboxRequest::new("t", 1);
        if i % 2 == 0 {
            req.network = Some(policy(false, &["*.cdn.example.test"], &["198.51.100.0/24"]));
        }
        let sb = client.spawn(&req).unwrap().remove(0);
        assert_eq!(links_on(&internet), 1, "cycle {i}");
        client.kill_sandbox(&sb.id).unwrap();
        wait_for_links(&internet, 0);
    }

    // A fork's children, and `kill -9` of one VMM.
    let a = client.spawn(&CreateSandboxRequest::new("t", 1)).unwrap().remove(0);
    let fork = ForkSandboxRequest {
        n: 2,
        memory_limit_mib: None,
        cpu_limit_millis: None,
        pids_limit: None,
        io_limits: None,
        ttl_seconds: None,
        network: Some(policy(true, &[], &["203.0.113.0/24"])),
    };
    let children = client.fork(&a.id, &fork).unwrap();
    wait_for_links(&internet, 3);
    // SAFETY: kill with a pid and a signal number.
    assert_eq!(unsafe { libc::kill(children[0].pid.unwrap(), libc::SIGKILL) }, 0);
    wait_for_links(&internet, 2);

    // A daemon restart in between: the sandboxes it finds are killed as before.
    let mut daemon = env.daemon.take().unwrap();
    daemon.kill().unwrap();
    daemon.wait().unwrap();
    env.start_daemon_with(&[], &daemon_env);
    let client = env.client();
    assert_eq!(links_on(&internet), 2);
    for id in [&a.id, &children[1].id] {
        client.kill_sandbox(id).unwrap();
    }
    wait_for_links(&internet, 0);
}

/// Bytes each capped transfer moves: six seconds' worth at the least cap, past the one
/// second a bucket holds.
const CAPPED_BYTES: usize = 48 << 10;
const CAP: u64 = 8 << 10;

#[test]
fn network_caps_hold_each_way() {
    if !common::networks_allowed() {
        return;
    }
    let internet = FakeInternet::create().expect("a fake internet");
    let body: &'static str = Box::leak("x".repeat(CAPPED_BYTES).into_boxed_str());
    let _http = internet.serve_http(8090, body).unwrap();
    // A sink that times what reaches it: from the first byte to the last expected one.
    let sink = internet.run_inside(|| std::net::TcpListener::bind((fake_internet::HOST_IP, 8089))).unwrap().unwrap();
    let timed = std::thread::spawn(move || {
        use std::io::Read;
        sink.set_nonblocking(true).unwrap();
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut conn = loop {
            match sink.accept() {
                Ok((conn, _)) => break conn,
                Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
                Err(e) => return (0, None, Some(e.to_string())),
            }
        };
        conn.set_nonblocking(false).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        let mut buf = [0u8; 4096];
        let (mut got, mut first) = (0, None);
        while got < CAPPED_BYTES {
            match conn.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    first.get_or_insert_with(Instant::now);
                    got += n;
                }
            }
        }
        (got, first.map(|t| t.elapsed()), None)
    });

    let mut env = common::Env::new();
    let uplink = internet.router_path();
    env.start_daemon_with(&[], &[("FORKVM_UPLINK", uplink.as_str()), ("FORKVM_DNS", "203.0.113.2")]);
    env.ok(&["snapshot", "create", "--image", "tiny", "--tag", "t"]);
    let client = env.client();
    let mut req = CreateSandboxRequest::new("t", 1);
    req.io_limits = Some(forkvm_client::api::IoLimits {
        net_tx_bytes_per_sec: Some(CAP),
        net_rx_bytes_per_sec: Some(CAP),
        ..Default::default()
    });
    let sb = client.spawn(&req).unwrap().remove(0);
    assert_eq!(sb.io_limits, req.io_limits, "the sandbox shows its caps");
    let exec = |script: String| {
        let req = ExecRequest { args: vec!["sh".into(), "-c".into(), script], timeout_secs: 120, ..Default::default() };
        client.exec(&sb.id, &req).unwrap()
    };

    // Out: the guest sends; the sink sees it no faster than the cap (a bucket's worth at
    // once, the rest at the rate).
    let host = fake_internet::HOST_IP;
    exec(format!("head -c {CAPPED_BYTES} /dev/zero | timeout 60 nc {host} 8089"));
    let (got, took, never) = timed.join().unwrap();
    assert_eq!(never, None, "the guest never connected to the sink");
    let took = took.expect("bytes arrived").as_secs_f64();
    assert_eq!(got, CAPPED_BYTES);
    let least = (CAPPED_BYTES as f64 - CAP as f64) / CAP as f64 * 0.9;
    assert!(took >= least, "{got} bytes out in {took:.2} s, under a cap of {CAP} B/s (at least {least:.1} s)");

    // In: the guest fetches; the whole exec takes no less than the cap allows.
    let started = Instant::now();
    let out = exec(format!("timeout 60 wget -q -O - http://{host}:8090/ | wc -c"));
    let took = started.elapsed().as_secs_f64();
    assert_eq!(out.stdout.trim(), CAPPED_BYTES.to_string(), "{}", out.stderr);
    assert!(took >= least, "{CAPPED_BYTES} bytes in in {took:.2} s, under a cap of {CAP} B/s");
    client.kill_sandbox(&sb.id).unwrap();
}
