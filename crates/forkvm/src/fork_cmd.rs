//! `forkvm fork`: N child VMs from one snapshot, left running, each with its own control
//! socket and console log under the run directory. `--snapshot DIR` forks any snapshot
//! without devices (test guests); `--image T` forks Linux sandboxes from template T's
//! snapshot, re-identifies each, and can run a command in every one (`--exec`).

use anyhow::{bail, Context, Result};
use clap::Args;
use forkvm_vmm::control::{ControlClient, Request};
use forkvm_vmm::zygote::{ChildSpec, Zygote};
use serde::Serialize;
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct ForkArgs {
    /// Snapshot directory to fork from (a VM without devices, e.g. a test guest).
    #[arg(long, required_unless_present = "image", conflicts_with = "image")]
    pub snapshot: Option<PathBuf>,
    /// Template whose Linux sandbox snapshot to fork (built and booted once if missing).
    #[arg(long)]
    pub image: Option<String>,
    /// With --image: shell command to run in every child after its identity is set.
    #[arg(long, requires = "image")]
    pub exec: Option<String>,
    /// With --image: shut the children down after --exec (default: leave them running).
    #[arg(long, requires = "image")]
    pub rm: bool,
    /// Number of children.
    #[arg(short = 'n', long, default_value_t = 1)]
    pub count: usize,
    /// Directory for the children's control sockets and console logs.
    #[arg(long)]
    pub run_dir: PathBuf,
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

pub fn run(a: ForkArgs) -> Result<i32> {
    if a.count == 0 || a.count > MAX_CHILDREN {
        bail!("-n must be between 1 and {MAX_CHILDREN}, got {}", a.count);
    }
    let snapshot = match (&a.snapshot, &a.image) {
        (Some(s), None) => s.clone(),
        (None, Some(image)) => return run_linux(&a, image),
        _ => bail!("say what to fork: --snapshot DIR or --image TEMPLATE"),
    };
    std::fs::create_dir_all(&a.run_dir)
        .with_context(|| format!("creating the run directory {}", a.run_dir.display()))?;
    let t0 = Instant::now();
    let zygote = Zygote::new(&snapshot)?;
    let prepare_ms = t0.elapsed().as_secs_f64() * 1e3;
    let t1 = Instant::now();
    let mut children = Vec::new();
    for index in 0..a.count {
        let socket = a.run_dir.join(format!("child-{index}.sock"));
        let console = a.run_dir.join(format!("child-{index}.log"));
        let spec = ChildSpec {
            socket: Some(socket.clone()),
            console_log: Some(console.clone()),
            console_stream: None,
            detach: true,
            devices: Default::default(),
            labels: Default::default(),
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
        if let Some(status) = forkvm_vmm::zygote::exit_status(c.pid) {
            bail!("it exited with status {status:#x}");
        }
        if let Ok(mut client) = ControlClient::connect(&c.socket) {
            let s = client.call(&Request::Status {})?;
            if s["state"] == "running" {
                return Ok(());
            }
            bail!("it is {}", s["state"]);
        }
        if Instant::now() > deadline {
            bail!("no control socket after 30 s");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// `--image`: Linux sandboxes forked from a template snapshot.
fn run_linux(a: &ForkArgs, image: &str) -> Result<i32> {
    let mut view = crate::image_cmd::ProgressView::new();
    let artifacts = forkvm_sandbox::Artifacts::ensure(image, &mut |e| view.show(&e));
    view.finish();
    let template = forkvm_sandbox::ensure_template_snapshot(artifacts?).context("preparing the template snapshot")?;
    let started = Instant::now();
    let children = forkvm_sandbox::fork_children(&template, a.count, &a.run_dir)?;
    let all_ready_ms = started.elapsed().as_secs_f64() * 1e3;
    let mut failed = false;
    let mut rows = Vec::new();
    for c in &children {
        let mut row = serde_json::json!({
            "index": c.index, "pid": c.pid, "sandbox_id": c.id, "socket": c.control_socket,
            "vsock": c.vsock, "console": c.console, "ready_ms": (c.ready_ms * 10.0).round() / 10.0,
        });
        if let Some(cmd) = &a.exec {
            let out = c.client.exec_collect(&forkvm_proto::ExecRequest::shell(cmd.clone()), b"");
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
        if a.rm {
            if let Ok(mut ctl) = ControlClient::connect(&c.control_socket) {
                let _ = ctl.call(&Request::Shutdown {});
            }
        }
        rows.push(row);
    }
    let report = serde_json::json!({
        "template": template.artifacts.image.name, "snapshot": template.dir, "n": a.count,
        "all_ready_ms": (all_ready_ms * 10.0).round() / 10.0, "children": rows,
    });
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        for r in &rows {
            print!("child {} sandbox {} pid {}", r["index"], r["sandbox_id"].as_str().unwrap_or(""), r["pid"]);
            match r.get("exec") {
                Some(e) => println!(": exit {}\n{}", e["exit_code"], e["stdout"].as_str().unwrap_or("")),
                None => println!(),
            }
        }
        println!("{} sandboxes of {} ready in {all_ready_ms:.0} ms", a.count, template.artifacts.image.name);
    }
    Ok(if failed { 1 } else { 0 })
}
