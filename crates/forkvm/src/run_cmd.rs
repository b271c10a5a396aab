//! `forkvm run --image T -- CMD...`: a sandbox from template T runs one command, its
//! output streams back as it is produced, and `forkvm` exits with the command's status.
//!
//! First use of a template builds what is missing (guest kernel, image) and boots it
//! once into a template snapshot; every run after that restores the snapshot (copy-on-
//! write) and re-identifies the sandbox before the command runs.

use anyhow::{bail, Context, Result};
use clap::Args;
use forkvm_image::progress::ProgressView;
use forkvm_proto::ExecRequest;
use forkvm_sandbox::{ensure_template_snapshot, Artifacts, Sandbox};
use std::io::Write;

#[derive(Args, Debug)]
pub struct RunArgs {
    /// Template name: built in (tiny, python) or from the template directory.
    #[arg(long, default_value = "tiny")]
    pub image: String,
    /// Run the command through `sh -c` (one string) instead of as an argv.
    #[arg(long)]
    pub shell: bool,
    /// Environment for the command: KEY=VALUE, repeatable.
    #[arg(long = "env", short = 'e')]
    pub env: Vec<String>,
    /// Working directory in the guest.
    #[arg(long)]
    pub cwd: Option<String>,
    /// Kill the command after this many seconds (exit status 124, like timeout(1)).
    #[arg(long)]
    pub timeout: Option<f64>,
    /// vCPUs of the sandbox (the template boots on that many once, cached); default: the
    /// template's `vcpus`, else 1.
    #[arg(long)]
    pub vcpus: Option<u8>,
    /// Print timings to stderr.
    #[arg(long, short = 'v')]
    pub verbose: bool,
    /// The command.
    #[arg(trailing_var_arg = true, required = true)]
    pub command: Vec<String>,
}

pub fn run(a: RunArgs) -> Result<i32> {
    let env = a
        .env
        .iter()
        .map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .with_context(|| format!("--env {kv:?} is not KEY=VALUE"))
        })
        .collect::<Result<Vec<_>>>()?;
    if a.timeout.is_some_and(|t| t.is_nan() || t <= 0.0) {
        bail!("--timeout must be a positive number of seconds");
    }
    let mut view = ProgressView::new();
    let artifacts = Artifacts::ensure(&a.image, &mut |e| view.show(&e))
        .and_then(|art| art.with_vcpus(a.vcpus, &mut |e| view.show(&e)));
    view.finish();
    let artifacts = artifacts?;
    let template = ensure_template_snapshot(artifacts).context("preparing the template snapshot")?;
    if let (Some(s), true) = (template.boot_seconds, a.verbose) {
        eprintln!("forkvm: booted template {} once in {s:.1} s; later runs restore it", template.artifacts.image.name);
    }
    let started = std::time::Instant::now();
    let mut sandbox = Sandbox::start(&template).context("starting the sandbox")?;
    let mut req = if a.shell { ExecRequest::shell(a.command.join(" ")) } else { ExecRequest::argv(a.command.clone()) };
    req.env = env;
    req.cwd = a.cwd.clone();
    req.timeout_ms = a.timeout.map(|t| (t * 1000.0) as u64);
    let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
    let status = sandbox.client.exec(
        &req,
        None,
        &mut |b| {
            let _ = out.write_all(b);
            let _ = out.flush();
        },
        &mut |b| {
            let _ = err.write_all(b);
            let _ = err.flush();
        },
    );
    let status = match status {
        Ok(s) => s,
        Err(e) => {
            sandbox.keep_run_dir();
            return Err(e)
                .with_context(|| format!("running the command (console log kept in {})", sandbox.run_dir.display()));
        }
    };
    if a.verbose {
        eprintln!(
            "forkvm: sandbox {} ready in {:.0} ms, command took {} ms, total {:.0} ms",
            sandbox.id,
            sandbox.ready_ms,
            status.duration_ms,
            started.elapsed().as_secs_f64() * 1e3
        );
    }
    Ok(match (status.timed_out, status.code, status.signal) {
        (true, _, _) => {
            eprintln!("forkvm: the command timed out and was killed");
            124
        }
        (_, Some(code), _) => code,
        (_, None, Some(sig)) => 128 + sig,
        _ => 1,
    })
}
