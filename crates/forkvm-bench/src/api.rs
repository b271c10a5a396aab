//! `forkvm bench api -n 100 --tag T`: what the REST API costs on top of the library, in
//! one run. Each round spawns N sandboxes from the tag through the library (the same call
//! `forkvm fork` makes) and then through a `forkvm daemon` started for the bench, each
//! until every sandbox is ready (re-identified), then times exec and eval round trips on
//! one sandbox, directly through its agent and through REST.
//!
//! * `spawn_ratio`: REST spawn / library spawn (median over rounds).
//! * `exec_ms`, `eval_ms`: p50 / p99 of `--round-trips` calls each (exec runs `true`,
//!   eval `1+1`); `*_overhead_p50_ms` is REST minus direct. The guest side (emulated guest
//!   kernel on PVM hosts) dominates both; the difference is the daemon's, within noise.
//! * `get_sandbox_ms`: `GET /v1/sandboxes/{id}`, ten times as many calls: the daemon's own
//!   cost per request (HTTP, registry, database), with no guest involved.
//!
//! The library spawn forks this process, so it must be single-threaded then: the bench
//! checks that, and runs the library phase first in each round.

use crate::util::{machine, median, p50_p99, r2};
use anyhow::{bail, Context, Result};
use clap::Args;
use forkvm_client::api::{CreateSandboxRequest, ExecRequest};
use forkvm_client::{Client, Endpoint};
use forkvm_sandbox::{spawn, Registry, SpawnOptions, SpawnSource};
use forkvm_snapshot::Store;
use serde_json::json;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Instant;

#[derive(Args, Debug)]
pub struct BenchApiArgs {
    /// Sandboxes per spawn.
    #[arg(short = 'n', long, default_value_t = 100)]
    pub count: u32,
    /// Tag to spawn from (`forkvm snapshot create --image python --tag T`).
    #[arg(long)]
    pub tag: String,
    /// Rounds (library spawn, then REST spawn, each).
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    /// Exec and eval calls timed per path.
    #[arg(long, default_value_t = 100)]
    pub round_trips: usize,
    /// Print JSON only.
    #[arg(long)]
    pub json: bool,
}

/// The q-quantile (nearest rank) of `v`.
fn quantile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// Times `k` calls of `f`, in ms.
pub(crate) fn time_calls(k: usize, mut f: impl FnMut() -> Result<()>) -> Result<Vec<f64>> {
    let mut out = Vec::with_capacity(k);
    for _ in 0..k {
        let t = Instant::now();
        f()?;
        out.push(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok(out)
}

fn threads_of_this_process() -> usize {
    std::fs::read_dir("/proc/self/task").map(|d| d.count()).unwrap_or(0)
}

/// Starts `forkvm daemon` on a socket under `run_root`; returns it once it listens.
pub(crate) fn start_daemon(run_root: &Path) -> Result<(Child, std::path::PathBuf)> {
    let socket = run_root.join("forkvmd.sock");
    let mut child = Command::new(std::env::current_exe()?)
        .arg("daemon")
        .arg("--socket")
        .arg(&socket)
        .arg("--state-dir")
        .arg(run_root.join("state"))
        .env("FORKVM_RUN", run_root)
        .env_remove("FORKVM_DAEMON")
        .stdout(Stdio::piped())
        .spawn()
        .context("starting forkvm daemon")?;
    let mut out = BufReader::new(child.stdout.take().context("daemon stdout")?);
    loop {
        let mut line = String::new();
        if out.read_line(&mut line)? == 0 {
            bail!("the daemon exited before listening");
        }
        if line.starts_with("forkvmd listening on unix:") {
            break;
        }
    }
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    Ok((child, socket))
}

/// Runs `measure` against a `forkvm daemon` started for it on a socket in a temporary run
/// root, then stops the daemon and kills what a failed measurement left running there.
pub(crate) fn with_bench_daemon<T>(measure: impl FnOnce(&Path) -> Result<T>) -> Result<T> {
    with_bench_daemon_pid(|socket, _pid| measure(socket))
}

/// [`with_bench_daemon`], telling `measure` the daemon's pid too (to watch its memory).
pub(crate) fn with_bench_daemon_pid<T>(measure: impl FnOnce(&Path, u32) -> Result<T>) -> Result<T> {
    let dir = tempfile::tempdir()?;
    let (mut daemon, socket) = start_daemon(dir.path())?;
    let result = measure(&socket, daemon.id());
    let _ = daemon.kill();
    let _ = daemon.wait();
    let _ = Command::new(std::env::current_exe()?)
        .args(["kill", "--all"])
        .env("FORKVM_RUN", dir.path())
        .stdout(Stdio::null())
        .status();
    result
}

struct Round {
    lib_spawn_ms: f64,
    rest_spawn_ms: f64,
    exec_direct: Vec<f64>,
    exec_rest: Vec<f64>,
    eval_direct: Vec<f64>,
    eval_rest: Vec<f64>,
    /// `GET /v1/sandboxes/{id}`: the daemon alone, no guest involved.
    get_rest: Vec<f64>,
}

fn round(a: &BenchApiArgs, source: &SpawnSource, run_root: &Path) -> Result<Round> {
    if threads_of_this_process() != 1 {
        bail!("the library spawn forks: this process must be single-threaded, it has {}", threads_of_this_process());
    }
    let registry = Registry::open(run_root);
    let t = Instant::now();
    let (sandboxes, _) = spawn(&registry, source, a.count as usize, &SpawnOptions::default())?;
    let lib_spawn_ms = t.elapsed().as_secs_f64() * 1e3;
    let direct = &sandboxes[0].client;
    let exec = forkvm_proto::ExecRequest::argv(["true"]);
    let exec_direct = time_calls(a.round_trips, || {
        direct.exec_collect(&exec, b"")?;
        Ok(())
    })?;
    let eval_direct = time_calls(a.round_trips, || {
        direct.eval("1+1")?;
        Ok(())
    })?;
    for sb in &sandboxes {
        let _ = forkvm_sandbox::kill_record(&registry, &sb.record);
    }

    let (mut daemon, socket) = start_daemon(run_root)?;
    let result = (|| -> Result<Round> {
        let client = Client::new(Endpoint::Unix(socket.clone()), None)?;
        let t = Instant::now();
        let infos = client.spawn(&CreateSandboxRequest::new(a.tag.clone(), a.count))?;
        let rest_spawn_ms = t.elapsed().as_secs_f64() * 1e3;
        let id = &infos[0].id;
        let req = ExecRequest { args: vec!["true".into()], ..ExecRequest::default() };
        let exec_rest = time_calls(a.round_trips, || {
            client.exec(id, &req)?;
            Ok(())
        })?;
        let eval_rest = time_calls(a.round_trips, || {
            client.eval(id, "1+1")?;
            Ok(())
        })?;
        let get_rest = time_calls(a.round_trips * 10, || {
            client.get_sandbox(id)?;
            Ok(())
        })?;
        for s in &infos {
            let _ = client.kill_sandbox(&s.id);
        }
        Ok(Round { lib_spawn_ms, rest_spawn_ms, exec_direct, exec_rest, eval_direct, eval_rest, get_rest })
    })();
    // SAFETY: signals the daemon we started.
    unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) };
    let _ = daemon.wait();
    result
}

pub fn run(a: BenchApiArgs) -> Result<i32> {
    let store = Store::open_default();
    let source = SpawnSource::from_tag(&store, &a.tag)?;
    let run_root = std::env::temp_dir().join(format!("forkvm-bench-api-{}", std::process::id()));
    std::fs::create_dir_all(&run_root)?;
    let mut rounds = Vec::new();
    for _ in 0..a.rounds.max(1) {
        rounds.push(round(&a, &source, &run_root)?);
    }
    let _ = std::fs::remove_dir_all(&run_root);
    let mut lib: Vec<f64> = rounds.iter().map(|r| r.lib_spawn_ms).collect();
    let mut rest: Vec<f64> = rounds.iter().map(|r| r.rest_spawn_ms).collect();
    let mut ratios: Vec<f64> = rounds.iter().map(|r| r.rest_spawn_ms / r.lib_spawn_ms).collect();
    let all = |f: fn(&Round) -> &Vec<f64>| rounds.iter().flat_map(|r| f(r).iter().copied()).collect::<Vec<f64>>();
    let (exec_direct, exec_rest) = (all(|r| &r.exec_direct), all(|r| &r.exec_rest));
    let (eval_direct, eval_rest) = (all(|r| &r.eval_direct), all(|r| &r.eval_rest));
    let overhead =
        |rest: &[f64], direct: &[f64]| r2(quantile(&mut rest.to_vec(), 0.5) - quantile(&mut direct.to_vec(), 0.5));
    let out = json!({
        "bench": "api",
        "n": a.count,
        "tag": a.tag,
        "rounds": rounds.len(),
        "spawn_library_all_ready_ms": r2(median(&mut lib)),
        "spawn_rest_all_ready_ms": r2(median(&mut rest)),
        "spawn_ratio": (median(&mut ratios) * 1000.0).round() / 1000.0,
        "exec_ms": { "direct": p50_p99(exec_direct.clone()), "rest": p50_p99(exec_rest.clone()) },
        "eval_ms": { "direct": p50_p99(eval_direct.clone()), "rest": p50_p99(eval_rest.clone()) },
        "get_sandbox_ms": p50_p99(all(|r| &r.get_rest)),
        "exec_overhead_p50_ms": overhead(&exec_rest, &exec_direct),
        "eval_overhead_p50_ms": overhead(&eval_rest, &eval_direct),
        "machine": machine(),
    });
    if a.json {
        println!("{out}");
    } else {
        println!("{}", serde_json::to_string_pretty(&out)?);
    }
    Ok(0)
}
