//! `forkvm fork`: N sandboxes from one snapshot, left running (or removed with `--rm`).
//! `--tag T` (the snapshot store), `--image T` (a template's cached snapshot) and
//! `--from-sandbox ID` (a running sandbox, no disk round trip) give registered Linux
//! sandboxes, each re-identified, optionally running `--exec CMD` or `--eval CODE`;
//! `--snapshot DIR --run-dir D` forks any snapshot without devices (test guests).

use crate::remote_cmd::RemoteArgs;
use anyhow::{bail, Context, Result};
use clap::Args;
use forkvm_sandbox::{spawn, Registry, SpawnOptions, SpawnSource, SpawnTimings};
use forkvm_snapshot::Store;
use forkvm_vmm::control::ControlClient;
use forkvm_vmm::vmm::RunState;
use forkvm_vmm::zygote::{ChildSpec, Zygote};
use serde::Serialize;
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct ForkArgs {
    /// Tag in the snapshot store to fork Linux sandboxes from.
    #[arg(long)]
    pub tag: Option<String>,
    /// Running sandbox to fork straight into N new ones (no disk round trip).
    #[arg(long)]
    pub from_sandbox: Option<String>,
    /// Template whose snapshot to fork (booted and warmed once, cached).
    #[arg(long)]
    pub image: Option<String>,
    /// Snapshot directory to fork from (a VM without devices, e.g. a test guest).
    #[arg(long)]
    pub snapshot: Option<PathBuf>,
    /// Shell command to run in every sandbox after its identity is set.
    #[arg(long, conflicts_with = "snapshot")]
    pub exec: Option<String>,
    /// Python code to evaluate in every sandbox's warm interpreter.
    #[arg(long, conflicts_with = "snapshot")]
    pub eval: Option<String>,
    /// Kill the sandboxes after --exec/--eval (default: leave them running).
    #[arg(long, conflicts_with = "snapshot")]
    pub rm: bool,
    /// Memory limit per sandbox, MiB (a cgroup per sandbox VMM).
    #[arg(long, conflicts_with = "snapshot")]
    pub mem_limit_mib: Option<u64>,
    /// Number of children.
    #[arg(short = 'n', long, default_value_t = 1)]
    pub count: usize,
    /// With --snapshot: directory for the children's control sockets and console logs.
    #[arg(long)]
    pub run_dir: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
struct Child {
    index: usize,
    pid: i32,
    socket: PathBuf,
    console: PathBuf,
}

#[derive(Debug, Serialize)]
struct ForkReport {
    snapshot: PathBuf,
    children: Vec<Child>,
    prepare_ms: f64,
    spawn_ms: f64,
    all_serving_ms: f64,
}

const MAX_CHILDREN: usize = 4096;

pub fn run(a: ForkArgs, remote: &RemoteArgs) -> Result<i32> {
    if let Some(code) = crate::remote_cmd::fork(&a, remote)? {
        return Ok(code);
    }
    if a.count == 0 || a.count > MAX_CHILDREN {
        bail!("-n must be between 1 and {MAX_CHILDREN}, got {}", a.count);
    }
    let snapshot = match (&a.snapshot, &a.tag, &a.image, &a.from_sandbox) {
        (Some(s), None, None, None) => s.clone(),
        (None, Some(tag), None, None) => return run_linux(&a, LinuxSource::Tag(tag)),
        (None, None, Some(image), None) => return run_linux(&a, LinuxSource::Image(image)),
        (None, None, None, Some(id)) => return run_linux(&a, LinuxSource::Sandbox(id)),
        _ => bail!("say what to fork, once: --tag TAG, --from-sandbox ID, --image TEMPLATE or --snapshot DIR"),
    };
    let Some(run_dir) = &a.run_dir else { bail!("--snapshot needs --run-dir DIR for the children's sockets") };
    let run_dir = run_dir.clone();
    std::fs::create_dir_all(&run_dir).with_context(|| format!("creating the run directory {}", run_dir.display()))?;
    let t0 = Instant::now();
    let zygote = Zygote::new(&snapshot)?;
    let prepare_ms = t0.elapsed().as_secs_f64() * 1e3;
    let t1 = Instant::now();
    let mut children = Vec::new();
    for index in 0..a.count {
        let socket = run_dir.join(format!("child-{index}.sock"));
        let console = run_dir.join(format!("child-{index}.log"));
        let spec = ChildSpec {
            socket: Some(socket.clone()),
            console_log: Some(console.clone()),
            console_stream: None,
            detach: true,
            devices: Default::default(),
            labels: Default::default(),
            owned: Default::default(),
        };
        let pid = zygote.spawn(spec).with_context(|| format!("starting child {index}"))?;
        children.push(Child { index, pid, socket, console });
    }
    let spawn_ms = t1.elapsed().as_secs_f64() * 1e3;
    for c in &children {
        wait_serving(c).with_context(|| {
            format!("child {} (pid {}) did not come up; see {}", c.index, c.pid, c.console.display())
        })?;
    }
    let report = ForkReport {
        snapshot: snapshot.clone(),
        children,
        prepare_ms,
        spawn_ms,
        all_serving_ms: t1.elapsed().as_secs_f64() * 1e3,
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        for c in &report.children {
            println!("child {:>4}  pid {:>7}  socket {}", c.index, c.pid, c.socket.display());
        }
        println!(
            "{} children from {} in {:.1} ms (spawn {:.1} ms, prepare {:.1} ms)",
            report.children.len(),
            report.snapshot.display(),
            report.all_serving_ms,
            report.spawn_ms,
            report.prepare_ms
        );
    }
    Ok(0)
}

/// Waits until the child's control socket answers `status` with a running VM.
fn wait_serving(c: &Child) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        // A child that already exited will never answer.
        if let Some(status) = forkvm_vmm::host::process::exit_status(c.pid) {
            bail!("it exited with status {status:#x}");
        }
        if let Ok(mut client) = ControlClient::connect(&c.socket) {
            let s = client.status()?;
            if s.state == RunState::Running {
                return Ok(());
            }
            bail!("it is {:?}", s.state);
        }
        if Instant::now() > deadline {
            bail!("no control socket after 30 s");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Where Linux sandboxes come from.
enum LinuxSource<'a> {
    Tag(&'a str),
    Image(&'a str),
    Sandbox(&'a str),
}

/// `--tag`, `--image` or `--from-sandbox`: Linux sandboxes, registered and re-identified.
fn run_linux(a: &ForkArgs, from: LinuxSource) -> Result<i32> {
    let registry = Registry::open_default();
    let opts = SpawnOptions { memory_limit_bytes: a.mem_limit_mib.map(|m| m << 20) };
    let (sandboxes, what, timings, pause_ms) = match from {
        LinuxSource::Tag(tag) => {
            let source = SpawnSource::from_tag(&Store::open_default(), tag)?;
            let (s, t) = spawn(&registry, &source, a.count, &opts)?;
            (s, format!("tag {tag}"), Some(t), None)
        }
        LinuxSource::Image(image) => {
            let template = forkvm_bench::util::template_snapshot(image)?;
            let source = SpawnSource::from_template(&template)?;
            let (s, t) = spawn(&registry, &source, a.count, &opts)?;
            (s, format!("template {image}"), Some(t), None)
        }
        LinuxSource::Sandbox(id) => {
            let started = Instant::now();
            let (s, pause) = forkvm_sandbox::fork_running(&registry, id, a.count, &opts)?;
            let t = SpawnTimings { all_ready_ms: started.elapsed().as_secs_f64() * 1e3, ..Default::default() };
            (s, format!("running sandbox {id}"), Some(t), Some(pause))
        }
    };
    let timings = timings.unwrap_or_default();
    let mut failed = false;
    let mut rows = Vec::new();
    for (index, sb) in sandboxes.iter().enumerate() {
        let r = &sb.record;
        let mut row = serde_json::json!({
            "index": index, "sandbox_id": r.id, "pid": r.pid, "hostname": format!("sb-{}", r.id),
            "run_dir": r.run_dir, "ready_ms": round1(sb.ready_ms),
        });
        if let Some(cmd) = &a.exec {
            let out = sb.client.exec_collect(&forkvm_proto::ExecRequest::shell(cmd.clone()), b"");
            row["exec"] = match out {
                Ok(o) => {
                    failed |= o.status.code != Some(0);
                    serde_json::json!({
                        "exit_code": o.status.code, "signal": o.status.signal, "timed_out": o.status.timed_out,
                        "stdout": String::from_utf8_lossy(&o.stdout), "stderr": String::from_utf8_lossy(&o.stderr),
                    })
                }
                Err(e) => {
                    failed = true;
                    serde_json::json!({ "error": e.to_string() })
                }
            };
        }
        if let Some(code) = &a.eval {
            row["eval"] = match sb.client.eval(code) {
                Ok(r) => {
                    failed |= matches!(r.outcome, forkvm_proto::EvalOutcome::Exception { .. });
                    serde_json::to_value(&r.outcome)?
                }
                Err(e) => {
                    failed = true;
                    serde_json::json!({ "error": e.to_string() })
                }
            };
        }
        if a.rm {
            forkvm_sandbox::verbs::kill_record(&registry, r)?;
        }
        rows.push(row);
    }
    let report = serde_json::json!({
        "from": what, "n": a.count, "prepare_ms": round1(timings.prepare_ms),
        "host_spawn_ms": round1(timings.host_spawn_ms), "all_ready_ms": round1(timings.all_ready_ms),
        "source_pause_ms": pause_ms.map(round1), "removed": a.rm, "sandboxes": rows,
        "memory_prefetch_pages": timings.memory_prefetch_pages,
    });
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        for r in &rows {
            print!("{} pid {}", r["sandbox_id"].as_str().unwrap_or(""), r["pid"]);
            if let Some(e) = r.get("exec") {
                print!(": exit {}\n{}", e["exit_code"], e["stdout"].as_str().unwrap_or(""));
            }
            if let Some(e) = r.get("eval") {
                print!(": {e}");
            }
            println!();
        }
        println!("{} sandboxes from {what} ready in {:.0} ms", a.count, timings.all_ready_ms);
    }
    Ok(if failed { 1 } else { 0 })
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}
