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
    /// Also destroy their disk snapshots (key, then vault): nothing of them is left.
    /// Works on a sandbox deleted before too.
    #[arg(long)]
    pub purge: bool,
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

/// The `--mode` of `branch`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum BranchModeArg {
    Full,
    Live,
    Diff,
}

impl BranchModeArg {
    /// The API's name of the mode.
    pub fn name(self) -> &'static str {
        match self {
            BranchModeArg::Full => "full",
            BranchModeArg::Live => "live",
            BranchModeArg::Diff => "diff",
        }
    }
}

#[derive(Args, Debug)]
pub struct BranchArgs {
    /// The running sandbox to branch.
    pub id: String,
    /// The new tag (default `branch-<id>-<seq>`).
    #[arg(long)]
    pub tag: Option<String>,
    /// `full` (pause, write, resume), `live` (pause, fork, resume; written in the
    /// background) or `diff` (like full, keeping only the pages that differ from the tag
    /// the sandbox was spawned from: a chain link over it).
    #[arg(long, value_enum, default_value = "full")]
    pub mode: BranchModeArg,
    /// Diff mode: the parent the caller expects (refused if the sandbox came from another tag).
    #[arg(long)]
    pub parent_tag: Option<String>,
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
    // The daemon's shape and rows (`GET /v1/sandboxes`).
    let list: Vec<forkvm_client::api::SandboxInfo> = forkvm_sandbox::info::listed(&Registry::open_default())
        .iter()
        .map(forkvm_sandbox::info::sandbox_info)
        .collect();
    crate::remote_cmd::print_sandboxes(&list, a.json)?;
    Ok(0)
}

pub fn kill(a: KillArgs, remote: &RemoteArgs) -> Result<i32> {
    if let Some(code) = crate::remote_cmd::kill(&a, remote)? {
        return Ok(code);
    }
    let registry = Registry::open_default();
    if a.all {
        // Everything goes, so what dead sandboxes left goes too (salvaged first).
        registry.sweep();
    }
    let ids: Vec<String> = if a.all { registry.list().into_iter().map(|r| r.id).collect() } else { a.ids };
    if ids.is_empty() && !a.all {
        bail!("name the sandboxes to kill, or --all");
    }
    let store = Store::open_default();
    for id in ids {
        if forkvm_sandbox::delete(&registry, &store, &id, a.purge)? == forkvm_sandbox::Deleted::Nothing {
            bail!(
                "sandbox {id:?} not found: not running, not archived{}",
                if a.purge { ", no disk snapshots" } else { "" }
            );
        }
    }
    Ok(0)
}

#[derive(clap::Args, Debug)]
pub struct SweepArgs {
    /// Print one JSON object: `{"sandboxes": [ids removed], "snapshots": [names removed]}`.
    #[arg(long)]
    pub json: bool,
}

/// The explicit clean-up pass ([`Registry::recover`]: the sweep, then archives without
/// a row recorded; [`Store::sweep`]).
pub fn sweep(a: SweepArgs) -> Result<i32> {
    let recovered = Registry::open_default().recover();
    let swept = &recovered.swept;
    let snapshots = Store::open_default().sweep();
    let mut sandboxes: Vec<&String> =
        [&swept.stopped, &swept.interrupted, &swept.archived, &swept.orphans].into_iter().flatten().collect();
    sandboxes.sort();
    if a.json {
        println!("{}", serde_json::json!({ "sandboxes": sandboxes, "snapshots": snapshots, "detail": recovered }));
    } else {
        let lines = [
            (&swept.stopped, "removed sandbox {} (its VMM had stopped)"),
            (&swept.interrupted, "removed sandbox {} (its start was interrupted)"),
            (&swept.archived, "sandbox {} is archived again (its VMM had stopped)"),
            (&swept.restored, "sandbox {} runs (its restore had finished)"),
            (&swept.orphans, "removed run directory {} (it never had a record)"),
            (&swept.uncommitted_archives, "removed the archive of {} (its removal was interrupted)"),
            (&recovered.adopted_archives, "recorded sandbox {} as archived (its archive had no record)"),
        ];
        for (ids, text) in lines {
            for id in ids {
                println!("{}", text.replace("{}", id));
            }
        }
        for name in &snapshots {
            println!("removed snapshot leftover {name}");
        }
    }
    Ok(0)
}

/// The memory playbook's recording after a spawn's first call (`memory_playbook`).
fn learn_after_first_call(registry: &Registry, id: &str) {
    if let Some(r) = forkvm_sandbox::memory_playbook::pending_first_call(registry, id) {
        forkvm_sandbox::memory_playbook::learn_after_first_call(&r);
    }
}

pub fn exec(a: ExecArgs, remote: &RemoteArgs) -> Result<i32> {
    if let Some(code) = crate::remote_cmd::exec(&a, remote)? {
        return Ok(code);
    }
    let registry = Registry::open_default();
    let client = agent(&registry, &a.id)?;
    let out = client.exec_collect(&forkvm_proto::ExecRequest::argv(a.command), b"")?;
    std::io::stdout().write_all(&out.stdout)?;
    std::io::stderr().write_all(&out.stderr)?;
    learn_after_first_call(&registry, &a.id);
    Ok(out.status.code.unwrap_or(128 + out.status.signal.unwrap_or(0)))
}

pub fn eval(a: EvalArgs, remote: &RemoteArgs) -> Result<i32> {
    if let Some(code) = crate::remote_cmd::eval(&a, remote)? {
        return Ok(code);
    }
    let registry = Registry::open_default();
    let client = agent(&registry, &a.id)?;
    let r = client.eval(&a.code)?;
    learn_after_first_call(&registry, &a.id);
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
    let mode = match a.mode {
        BranchModeArg::Diff => return branch_diff(&a),
        BranchModeArg::Full => BranchMode::Full,
        BranchModeArg::Live => BranchMode::Live,
    };
    if a.parent_tag.is_some() {
        bail!("--parent-tag applies to --mode diff");
    }
    let report = forkvm_sandbox::branch(
        &Registry::open_default(),
        &Store::open_default(),
        &a.id,
        a.tag.as_deref(),
        mode,
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

/// `branch --mode diff`: a chain link over the tag the sandbox was spawned from.
fn branch_diff(a: &BranchArgs) -> Result<i32> {
    if a.no_wait {
        bail!("--no-wait applies to --mode live only");
    }
    let store = Store::open_default();
    let tag = match &a.tag {
        Some(t) => t.clone(),
        None => (1..).map(|n| format!("branch-{}-{n}", a.id)).find(|t| store.check_free(t).is_ok()).unwrap_or_default(),
    };
    let (diff, pause_ms) =
        forkvm_sandbox::branch_diff(&Registry::open_default(), &store, &a.id, &tag, a.parent_tag.as_deref())?;
    if a.json {
        let mut v = serde_json::to_value(&diff)?;
        v["mode"] = "diff".into();
        v["pause_ms"] = pause_ms.into();
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!(
            "{tag} (diff over {}, {} pages): paused {pause_ms:.1} ms",
            diff.parent_tag.as_deref().unwrap_or("-"),
            diff.pages
        );
    }
    Ok(0)
}
