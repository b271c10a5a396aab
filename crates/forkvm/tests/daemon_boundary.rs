//! Linux tier, through a real `forkvm daemon`: what a guest produces cannot exhaust the
//! host. An exec that prints more than its cap returns `truncated` with the byte count,
//! and the daemon's memory stays bounded while it does.
//!
//! The guest kernel runs through KVM's emulator on PVM hosts, so a guest moves output
//! slowly (64 MiB took 650 s through `yes | head` here); the test prints 1.5 times the
//! default cap. `FORKVM_TEST_EXEC_FLOOD_BYTES=2147483648` runs the 2 GiB case.

mod common;

use common::Env;
use forkvm_client::{Client, Endpoint};

/// What the guest prints: 1.5 default caps unless `FORKVM_TEST_EXEC_FLOOD_BYTES` says
/// otherwise (a multiple of 64 KiB).
fn flood_bytes() -> u64 {
    let default = forkvm_client::api::DEFAULT_MAX_OUTPUT_BYTES * 3 / 2;
    std::env::var("FORKVM_TEST_EXEC_FLOOD_BYTES").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The peak resident memory of process `pid`, KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn an_exec_printing_past_its_cap_returns_truncated_and_the_daemon_stays_small() {
    let mut env = Env::new();
    env.start_daemon(&[]);
    env.ok(&["snapshot", "create", "--image", "tiny", "--tag", "t"]);
    env.ok(&["fork", "--tag", "t", "-n", "1"]);
    let id = env.json(&["ps", "--json"])[0]["id"].as_str().unwrap().to_string();
    let daemon = env.daemon.as_ref().unwrap().id();
    let endpoint = Endpoint::parse(&format!("unix:{}", env.dir.join("run/forkvmd.sock").display())).unwrap();
    let client = Client::new(endpoint, None).unwrap();
    let before = peak_rss_kib(daemon);

    let n = flood_bytes();
    let req = forkvm_client::api::ExecRequest {
        cmd: Some(format!("dd if=/dev/zero bs=65536 count={} 2>/dev/null; echo done >&2", n / 65536)),
        timeout_secs: 1200,
        ..Default::default()
    };
    let started = std::time::Instant::now();
    let r = client.exec(&id, &req).unwrap();
    let elapsed = started.elapsed();
    eprintln!("exec printed {n} bytes in {elapsed:.1?}; daemon peak RSS {before} -> {} KiB", peak_rss_kib(daemon));
    assert_eq!(r.exit_code, 0, "{}", r.stderr);
    assert!(r.truncated);
    assert_eq!(r.stdout_bytes, n);
    assert_eq!(r.stdout.len() as u64, forkvm_client::api::DEFAULT_MAX_OUTPUT_BYTES);
    assert!(r.stdout.bytes().all(|b| b == 0));
    assert_eq!((r.stderr.as_str(), r.stderr_bytes), ("done\n", 5));
    let grown = peak_rss_kib(daemon).saturating_sub(before);
    assert!(grown < 128 << 10, "the daemon's peak memory grew by {grown} KiB for {n} bytes of output");

    // A per-call cap, and a bad one.
    let req = forkvm_client::api::ExecRequest {
        cmd: Some("yes | head -c 100000".into()),
        max_output_bytes: Some(1000),
        ..Default::default()
    };
    let r = client.exec(&id, &req).unwrap();
    assert_eq!((r.stdout.len(), r.stdout_bytes, r.truncated), (1000, 100_000, true));
    let req =
        forkvm_client::api::ExecRequest { cmd: Some("true".into()), max_output_bytes: Some(0), ..Default::default() };
    let e = client.exec(&id, &req).unwrap_err().to_string();
    assert!(e.contains("max_output_bytes"), "{e}");
    let r = client
        .exec(&id, &forkvm_client::api::ExecRequest { cmd: Some("echo hi".into()), ..Default::default() })
        .unwrap();
    assert_eq!((r.stdout.as_str(), r.truncated, r.stdout_bytes), ("hi\n", false, 3));
}
