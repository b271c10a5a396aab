//! `forkvm bench e2b --tag T`: the cost of E2B compatibility, in one run. Each round
//! creates a sandbox and runs its first and a second command through E2B's own Python
//! SDK (`e2b`, against the daemon's E2B face) and then through forkvm's Python SDK (REST
//! on the Unix socket), both forking tag T, both from one Python process
//! (`e2b_driver.py`), alternating so host noise falls on both alike.
//!
//! * `create_ms`, `first_run_ms`, `warm_run_ms`: medians over rounds; the E2B/forkvm
//!   ratios are the compatibility's cost. Wall times hold the guest's side (an emulated
//!   guest kernel on PVM hosts), which is the same for both paths.
//! * `daemon_cpu_*_ms`: the daemon's own CPU time (user + system, from `/proc`) around
//!   each step, the host side of the difference, apart from the guest.
//!
//! With `--code-tag C` (a tag of the `code-interpreter` template) each round also
//! creates a sandbox of C through each SDK and times the first and a second `run_code`
//! (E2B's, through the template's server on port 49999) against forkvm's `eval` (the
//! agent's warm interpreter): the same arithmetic, two ways into the same guest.

use crate::util::{machine, median, r2};
use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::json;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

#[derive(Args, Debug)]
pub struct BenchE2bArgs {
    /// Tag to fork (`forkvm snapshot create --image python --tag T`): E2B's `base`.
    #[arg(long)]
    pub tag: String,
    /// Tag of the `code-interpreter` template (E2B's `code-interpreter-v1`): also time
    /// `run_code` against forkvm's `eval`.
    #[arg(long)]
    pub code_tag: Option<String>,
    /// Rounds (one E2B and one forkvm sandbox each).
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// Print JSON only.
    #[arg(long)]
    pub json: bool,
}

const DRIVER: &str = include_str!("e2b_driver.py");
const KEY: &str = "e2b_bench_key_0123456789abcdef";

/// The medians of `field` over `rounds`.
fn med(rounds: &[serde_json::Value], field: &str) -> f64 {
    let mut v: Vec<f64> = rounds.iter().filter_map(|r| r[field].as_f64()).collect();
    r2(median(&mut v))
}

pub fn run(a: BenchE2bArgs) -> Result<i32> {
    if a.rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    let dir = tempfile::tempdir()?;
    let keys = dir.path().join("keys");
    std::fs::write(&keys, format!("{KEY}\n"))?;
    let socket = dir.path().join("forkvmd.sock");
    let mut daemon = Command::new(std::env::current_exe()?)
        .args(["daemon", "--e2b-api", "127.0.0.1:0", "--e2b-sandbox", "127.0.0.1:0", "--e2b-template"])
        .arg(format!("base={}", a.tag))
        .args(a.code_tag.iter().flat_map(|c| ["--e2b-template".to_string(), format!("code-interpreter-v1={c}")]))
        .arg("--e2b-api-keys")
        .arg(&keys)
        .arg("--socket")
        .arg(&socket)
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .env("FORKVM_RUN", dir.path().join("run"))
        .env_remove("FORKVM_DAEMON")
        .stdout(Stdio::piped())
        .spawn()
        .context("starting forkvm daemon")?;
    let result = (|| -> Result<serde_json::Value> {
        let mut out = BufReader::new(daemon.stdout.take().context("daemon stdout")?);
        let (mut api, mut front) = (None, None);
        while api.is_none() || front.is_none() {
            let mut line = String::new();
            if out.read_line(&mut line)? == 0 {
                bail!("the daemon exited before its E2B listeners were up");
            }
            let addr = || line.trim().rsplit(' ').next().map(str::to_string);
            if line.contains("E2B API listening") {
                api = addr();
            } else if line.contains("E2B sandbox front listening") {
                front = addr();
            }
        }
        std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
        let sdk = concat!(env!("CARGO_MANIFEST_DIR"), "/../../sdk/python");
        let driven = Command::new("python3")
            .arg("-c")
            .arg(DRIVER)
            .arg(a.rounds.to_string())
            .arg(&a.tag)
            .arg(&socket)
            .arg(daemon.id().to_string())
            .args(a.code_tag.as_deref())
            .env("PYTHONPATH", sdk)
            .env("E2B_API_KEY", KEY)
            .env("E2B_API_URL", api.unwrap_or_default())
            .env("E2B_SANDBOX_URL", front.unwrap_or_default())
            .env_remove("E2B_DEBUG")
            .env_remove("E2B_DOMAIN")
            .stderr(Stdio::inherit())
            .output()
            .context("running the Python driver (python3 with e2b==2.63.0 installed)")?;
        if !driven.status.success() {
            bail!("the Python driver failed ({})", driven.status);
        }
        serde_json::from_slice(&driven.stdout).context("the driver's JSON")
    })();
    let _ = daemon.kill();
    let _ = daemon.wait();
    // Sandboxes a failed round left behind go with the bench's run root.
    let _ = Command::new(std::env::current_exe()?)
        .args(["kill", "--all"])
        .env("FORKVM_RUN", dir.path().join("run"))
        .stdout(Stdio::null())
        .status();
    let rounds = result?;
    let side = |which: &str| -> Option<serde_json::Value> {
        let r = rounds[which].as_array().cloned().filter(|r| !r.is_empty())?;
        Some(json!({
            "create_ms": med(&r, "create_ms"),
            "first_run_ms": med(&r, "first_run_ms"),
            "warm_run_ms": med(&r, "warm_run_ms"),
            "daemon_cpu_create_ms": med(&r, "daemon_cpu_create_ms"),
            "daemon_cpu_first_run_ms": med(&r, "daemon_cpu_first_run_ms"),
        }))
    };
    let ratios = |e: &Option<serde_json::Value>, f: &Option<serde_json::Value>| {
        let (Some(e), Some(f)) = (e, f) else { return serde_json::Value::Null };
        let ratio = |k: &str| {
            let d = f[k].as_f64().unwrap_or(0.0);
            if d > 0.0 {
                json!(r2(e[k].as_f64().unwrap_or(0.0) / d))
            } else {
                serde_json::Value::Null
            }
        };
        json!({"create": ratio("create_ms"), "first_run": ratio("first_run_ms"), "warm_run": ratio("warm_run_ms")})
    };
    let (e, f) = (side("e2b"), side("forkvm"));
    let (ec, fc) = (side("e2b_code"), side("forkvm_code"));
    let report = json!({
        "bench": "e2b",
        "machine": machine(),
        "tag": a.tag,
        "rounds": a.rounds,
        "code_tag": a.code_tag,
        "e2b_over_forkvm": ratios(&e, &f),
        "e2b_sdk": e,
        "forkvm_sdk": f,
        "run_code_over_eval": ratios(&ec, &fc),
        "e2b_run_code": ec,
        "forkvm_eval": fc,
        "raw": rounds,
    });
    if a.json {
        println!("{report}");
    } else {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    Ok(0)
}
