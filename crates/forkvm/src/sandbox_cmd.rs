//! Verbs on running sandboxes (found in the registry by id): `ps`, `kill`, `exec`,
//! `eval`, `branch`.

use crate::remote_cmd::RemoteArgs;
use anyhow::{bail, Result};
use clap::Args;
use forkvm_sandbox::lifecycle::agent;
use forkvm_sandbox::Registry;
use forkvm_snapshot::Store;
use forkvm_vmm::vmm::BranchMode;
use std::io::Write;

#[derive(Args, Debug)]
pub struct PsArgs {
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct KillArgs {
    /// Sandbox ids.
    pub ids: Vec<String>,
    /// Kill every running sandbox.
    #[arg(long, conflicts_with = "ids")]
    pub all: bool,
}

#[derive(Args, Debug)]
pub struct ExecArgs {
    pub id: String,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

#[derive(Args, Debug)]
pub struct EvalArgs {
    pub id: String,
    /// Python code for the sandbox's warm interpreter.
    pub code: String,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct BranchArgs {
    /// The running sandbox to branch.
    pub id: String,
    /// The new tag (default `branch-<id>-<seq>`).
    #[arg(long)]
    pub tag: Option<String>,
    /// `full` (pause, write, resume) or `live` (pause, fork, resume; written in the background).
    #[arg(long, default_value = "full")]
    pub mode: BranchMode,
    /// Live mode: return as soon as the sandbox runs again (the snapshot is `writing`).
    #[arg(long)]
    pub no_wait: bool,
    #[arg(long)]
    pub json: bool,
}

pub fn ps(a: PsArgs, remote: &RemoteArgs) -> Result<i32> {
    if let Some(code) = crate::remote_cmd::ps(&a, remote)? {
        return Ok(code);
    }
    let list = Registry::open_default().list();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&list)?);
    } else {
        for r in &list {
            println!(
                "{}  pid {:>7}  {:<10} {}",
                r.id,
                r.pid,
                r.template.as_deref().unwrap_or("-"),
                r.source_tag.as_deref().map(|t| format!("from tag {t}")).unwrap_or_default()
            );
        }
    }
    Ok(0)
}

pub fn kill(a: KillArgs, remote: &RemoteArgs) -> Result<i32> {
    if let Some(code) = crate::remote_cmd::kill(&a, remote)? {
        return Ok(code);
    }
    let registry = Registry::open_default();
    let ids: Vec<String> = if a.all { registry.list().into_iter().map(|r| r.id).collect() } else { a.ids };
    if ids.is_empty() && !a.all {
        bail!("name the sandboxes to kill, or --all");
    }
    for id in ids {
        forkvm_sandbox::kill(&registry, &id)?;
    }
    Ok(0)
}

pub fn exec(a: ExecArgs, remote: &RemoteArgs) -> Result<i32> {
    if let Some(code) = crate::remote_cmd::exec(&a, remote)? {
        return Ok(code);
    }
    let client = agent(&Registry::open_default(), &a.id)?;
    let out = client.exec_collect(&forkvm_proto::ExecRequest::argv(a.command), b"")?;
    std::io::stdout().write_all(&out.stdout)?;
    std::io::stderr().write_all(&out.stderr)?;
    Ok(out.status.code.unwrap_or(128 + out.status.signal.unwrap_or(0)))
}

pub fn eval(a: EvalArgs, remote: &RemoteArgs) -> Result<i32> {
    if let Some(code) = crate::remote_cmd::eval(&a, remote)? {
        return Ok(code);
    }
    let client = agent(&Registry::open_default(), &a.id)?;
    let r = client.eval(&a.code)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r.outcome)?);
    }
    match r.outcome {
        forkvm_proto::EvalOutcome::Value { value_repr } => {
            if !a.json {
                println!("{}", value_repr.unwrap_or_default());
            }
            Ok(0)
        }
        forkvm_proto::EvalOutcome::Exception { traceback, .. } => {
            if !a.json {
                eprint!("{traceback}");
            }
            Ok(1)
        }
    }
}

pub fn branch(a: BranchArgs, remote: &RemoteArgs) -> Result<i32> {
    if let Some(code) = crate::remote_cmd::branch(&a, remote)? {
        return Ok(code);
    }
    let report = forkvm_sandbox::branch(
        &Registry::open_default(),
        &Store::open_default(),
        &a.id,
        a.tag.as_deref(),
        a.mode,
        !a.no_wait,
    )?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        let status = serde_json::to_value(report.status)?;
        println!(
            "{} ({}, {}): paused {:.1} ms, returned in {:.1} ms",
            report.tag,
            status.as_str().unwrap_or(""),
            report.dir.display(),
            report.pause_ms,
            report.return_ms
        );
    }
    Ok(0)
}
