//! `forkvm fork`: N sandboxes from one snapshot, left running (or removed with `--rm`).
//! `--tag T` (the snapshot store), `--image T` (a template's cached snapshot) and
//! `--from-sandbox ID` (a running sandbox, no disk round trip) give registered Linux
//! sandboxes, each re-identified, optionally running `--exec CMD` or `--eval CODE`, on a
//! [`crate::backend::Backend`] (this host, or forkvmd with `--daemon`: the same report
//! either way, `host` timings only from this host); `--snapshot DIR --run-dir D` forks
//! any snapshot without devices (test guests), on this host.

use crate::backend::{self, Backend, NewFrom, Output};
use crate::remote_cmd::RemoteArgs;
use crate::sandbox_cmd::EXEC_TIMEOUT_SECS;
use anyhow::{bail, Context, Result};
use clap::Args;
use forkvm_client::api::{ExecRequest, ExecResponse};
use forkvm_vmm::control::ControlClient;
use forkvm_vmm::vmm::RunState;
use forkvm_vmm::zygote::{ChildSpec, Zygote};
use serde::Serialize;
use serde_json::json;
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
    /// A sandbox's checkpoint to start the new ones at: `ID@SEQ` (its tag is
    /// `ckpt-ID-SEQ`; `forkvm checkpoints ID` lists them).
    #[arg(long, value_name = "ID@SEQ", conflicts_with_all = ["tag", "from_sandbox", "image", "snapshot"])]
    pub from_checkpoint: Option<String>,
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
    #[command(flatten)]
    pub limits: crate::limit_args::LimitArgs,
    #[command(flatten)]
    pub network: crate::network_cmd::NetworkArgs,
    /// Volume to attach, NAME:/mount/point[:rw|ro|cow] (repeatable; rw, the default,
    /// needs -n 1: one writer at a time). See docs/volumes.md.
    #[arg(
        long = "volume",
        value_name = "NAME:/PATH[:MODE]",
        value_parser = parse_volume,
        conflicts_with_all = ["snapshot", "from_sandbox"]
    )]
    pub volumes: Vec<forkvm_sandbox::volumes::VolumeMount>,
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

fn parse_volume(s: &str) -> Result<forkvm_sandbox::volumes::VolumeMount, String> {
    forkvm_sandbox::volumes::parse_mount(s).map_err(|e| e.to_string())
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
    if a.count == 0 || a.count > MAX_CHILDREN {
        bail!("-n must be between 1 and {MAX_CHILDREN}, got {}", a.count);
    }
    if let Some(at) = &a.from_checkpoint {
        let tag = checkpoint_tag(at)?;
        return run_linux(&a, remote, NewFrom::Tag(&tag));
    }
    let snapshot = match (&a.snapshot, &a.tag, &a.image, &a.from_sandbox) {
        (Some(s), None, None, None) => s.clone(),
        (None, Some(tag), None, None) => return run_linux(&a, remote, NewFrom::Tag(tag)),
        (None, None, Some(image), None) => return run_linux(&a, remote, NewFrom::Image(image)),
        (None, None, None, Some(id)) => return run_linux(&a, remote, NewFrom::Sandbox(id)),
        _ => bail!("say what to fork, once: --tag TAG, --from-sandbox ID, --image TEMPLATE or --snapshot DIR"),
    };
    if a.network.policy().is_some() {
        bail!("--snapshot forks test guests without a network: --no-internet, --allow and --deny need --tag or --from-sandbox");
    }
    if a.limits.spawn_options().asks() {
        bail!("--snapshot forks unregistered test guests without cgroups: the limit flags need --tag, --image or --from-sandbox");
    }
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
            memory_source: None,
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

/// `--tag`, `--image` or `--from-sandbox`: Linux sandboxes, registered and re-identified,
/// on the backend `remote` names; then `--exec`/`--eval` in each and `--rm`.
fn run_linux(a: &ForkArgs, remote: &RemoteArgs, from: NewFrom<'_>) -> Result<i32> {
    let backend = backend::open(remote)?;
    let what = match from {
        NewFrom::Tag(tag) => format!("tag {tag}"),
        NewFrom::Image(image) => format!("template {image}"),
        NewFrom::Sandbox(id) => format!("running sandbox {id}"),
    };
    let started = Instant::now();
    let made = backend.start(from, a.count, &a.limits, a.network.policy().as_ref(), &a.volumes)?;
    let all_ready_ms = started.elapsed().as_secs_f64() * 1e3;
    let mut failed = false;
    let mut rows = Vec::new();
    for (index, sb) in made.sandboxes.iter().enumerate() {
        let mut row = serde_json::to_value(sb)?;
        row["index"] = json!(index);
        row["sandbox_id"] = json!(sb.id);
        if let Some(cmd) = &a.exec {
            row["exec"] = match exec_collected(backend.as_ref(), &sb.id, cmd) {
                Ok(r) => {
                    failed |= r.exit_code != 0;
                    serde_json::to_value(&r)?
                }
                Err(e) => {
                    failed = true;
                    json!({ "error": format!("{e:#}") })
                }
            };
        }
        if let Some(code) = &a.eval {
            row["eval"] = match backend.eval(&sb.id, code) {
                Ok(r) => {
                    failed |= r.error.is_some();
                    serde_json::to_value(&r)?
                }
                Err(e) => {
                    failed = true;
                    json!({ "error": format!("{e:#}") })
                }
            };
        }
        if a.rm {
            backend.delete(&sb.id, false)?;
        }
        rows.push(row);
    }
    if a.json {
        let report = json!({
            "from": what, "n": a.count, "daemon": backend.endpoint(), "all_ready_ms": round1(all_ready_ms),
            "host": made.host, "removed": a.rm, "sandboxes": rows,
        });
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
        println!("{} sandboxes from {what} ready in {all_ready_ms:.0} ms", a.count);
    }
    Ok(if failed { 1 } else { 0 })
}

/// Shell command `cmd` in sandbox `id`, its output collected, as the API's collected
/// exec answers.
fn exec_collected(backend: &dyn Backend, id: &str, cmd: &str) -> Result<ExecResponse> {
    let req = ExecRequest { cmd: Some(cmd.to_string()), timeout_secs: EXEC_TIMEOUT_SECS, ..ExecRequest::default() };
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let exit = backend.exec(id, &req, &mut |stream, chunk| match stream {
        Output::Stdout => stdout.extend_from_slice(chunk),
        Output::Stderr => stderr.extend_from_slice(chunk),
    })?;
    Ok(ExecResponse {
        truncated: false,
        stdout_bytes: stdout.len() as u64,
        stderr_bytes: stderr.len() as u64,
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
        exit_code: exit.exit_code,
        signal: exit.signal,
        timed_out: exit.timed_out,
        duration_ms: exit.duration_ms,
    })
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// The snapshot tag of checkpoint `ID@SEQ`.
fn checkpoint_tag(at: &str) -> Result<String> {
    let parsed = at.split_once('@').and_then(|(id, seq)| Some((id, seq.parse::<u64>().ok()?)));
    match parsed {
        Some((id, seq)) if !id.is_empty() && seq > 0 => Ok(format!("ckpt-{id}-{seq}")),
        _ => bail!("--from-checkpoint {at:?}: expected ID@SEQ, e.g. 4f2a9c@3"),
    }
}
