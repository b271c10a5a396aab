//! `forkvm fork`: N child VMs from one snapshot, left running, each with its own control
//! socket and console log under the run directory.

use anyhow::{bail, Context, Result};
use clap::Args;
use forkvm_vmm::control::{ControlClient, Request};
use forkvm_vmm::zygote::{ChildSpec, Zygote};
use serde::Serialize;
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct ForkArgs {
    /// Snapshot directory to fork from.
    #[arg(long)]
    pub snapshot: PathBuf,
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
    std::fs::create_dir_all(&a.run_dir)
        .with_context(|| format!("creating the run directory {}", a.run_dir.display()))?;
    let t0 = Instant::now();
    let zygote = Zygote::new(&a.snapshot)?;
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
        snapshot: a.snapshot.clone(),
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
        let mut status = 0;
        // SAFETY: waitpid on our own child with WNOHANG has no memory preconditions.
        if unsafe { libc::waitpid(c.pid, &mut status, libc::WNOHANG) } == c.pid {
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
