//! Verbs on running sandboxes (found in the registry by id): `ps`, `kill`, `exec`,
//! `eval`, `branch`.

use crate::backend::{self, Output};
use crate::remote_cmd::RemoteArgs;
use anyhow::{bail, Context, Result};
use clap::Args;
use forkvm_client::api::{BranchSandboxRequest, ExecRequest, SandboxInfo};
use forkvm_sandbox::{Registry, SandboxState};
use forkvm_snapshot::Store;
use std::io::Write;
use std::time::Instant;

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
    /// Working directory (default: the template's `[exec] cwd`, else the user's home).
    #[arg(long)]
    pub cwd: Option<String>,
    /// An environment variable, `NAME=VALUE` (repeatable; over the template's `[exec] env`).
    #[arg(long = "env", short = 'e', value_parser = parse_env_var)]
    pub env: Vec<(String, String)>,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

#[derive(Args, Debug)]
pub struct WatchArgs {
    pub id: String,
    /// Absolute path of a directory in the sandbox.
    pub path: String,
    /// Also watch every directory below it, including ones made while it runs.
    #[arg(long, short = 'r')]
    pub recursive: bool,
    /// Stop after this many changes (default: until interrupted or the directory goes).
    #[arg(long)]
    pub count: Option<u64>,
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
    print_sandboxes(&backend::open(remote)?.list()?, a.json)?;
    Ok(0)
}

/// `ps`'s output: the API's `SandboxInfo` list as JSON, or one line each.
pub fn print_sandboxes(list: &[SandboxInfo], json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(list)?);
        return Ok(());
    }
    for s in list {
        println!(
            "{}  {:<8} pid {:>7}  {:<10} {}",
            s.id,
            s.state,
            s.pid.map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
            s.template.as_deref().unwrap_or("-"),
            s.snapshot_tag.as_deref().map(|t| format!("from tag {t}")).unwrap_or_default()
        );
    }
    Ok(())
}

pub fn kill(a: KillArgs, remote: &RemoteArgs) -> Result<i32> {
    let backend = backend::open(remote)?;
    if a.ids.is_empty() && !a.all {
        bail!("name the sandboxes to kill, or --all");
    }
    let ids: Vec<String> = if a.all {
        backend.sweep();
        let live = |s: &SandboxInfo| s.state != SandboxState::Archived.as_str();
        backend.list()?.into_iter().filter(live).map(|s| s.id).collect()
    } else {
        a.ids
    };
    for id in ids {
        match backend.delete(&id, a.purge) {
            Ok(()) => {}
            // With --all, one that stopped since the listing is already what we wanted.
            Err(e) if a.all && backend::not_found(&e) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(0)
}

#[derive(clap::Args, Debug)]
pub struct SweepArgs {
    /// Print one JSON object: `{"sandboxes": [ids acted on], "snapshots": [names removed],
    /// "detail": what recovery did, by kind}`.
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

/// The daemon's API needs a timeout; a command run from the CLI gets the longest (a day).
pub const EXEC_TIMEOUT_SECS: u64 = forkvm_sandbox::exec_view::MAX_TIMEOUT_SECS;

/// Streams the command's output as it comes; exits with its code (124 on timeout,
/// 128 + N for signal N, 127 for a program that is not there).
pub fn exec(a: ExecArgs, remote: &RemoteArgs) -> Result<i32> {
    let req = ExecRequest {
        args: a.command,
        timeout_secs: EXEC_TIMEOUT_SECS,
        cwd: a.cwd,
        env: a.env.into_iter().collect(),
        ..ExecRequest::default()
    };
    let (mut stdout, mut stderr) = (std::io::stdout().lock(), std::io::stderr().lock());
    let mut write_error = None;
    let exit = backend::open(remote)?.exec(&a.id, &req, &mut |stream, chunk| {
        let written = match stream {
            Output::Stdout => stdout.write_all(chunk).and_then(|()| stdout.flush()),
            Output::Stderr => stderr.write_all(chunk).and_then(|()| stderr.flush()),
        };
        if let Err(e) = written {
            write_error.get_or_insert(e);
        }
    })?;
    if let Some(e) = write_error {
        return Err(e).context("writing the command's output");
    }
    if exit.timed_out {
        eprintln!("forkvm: the command timed out after {EXEC_TIMEOUT_SECS} s");
    }
    Ok(exit.exit_code)
}

pub(crate) fn parse_env_var(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("{text:?} is not NAME=VALUE")),
    }
}

/// Prints the watch's lines (`GET .../files/watch`'s NDJSON) as they come: `armed`
/// first, then each change; keepalives are not printed. Ends after `--count` changes, or
/// with the `end` line when the directory goes away.
pub fn watch(a: WatchArgs, remote: &RemoteArgs) -> Result<i32> {
    use forkvm_client::api::WatchEvent;
    let mut out = std::io::stdout().lock();
    let mut changes = 0u64;
    let mut write_error = None;
    let ended = backend::open(remote)?.watch(&a.id, &a.path, a.recursive, &mut |event| {
        if matches!(event, WatchEvent::Keepalive) {
            return true;
        }
        let counted = matches!(event, WatchEvent::Change { .. } | WatchEvent::Overflow);
        let line = serde_json::to_string(&event).unwrap_or_default();
        if let Err(e) = writeln!(out, "{line}").and_then(|()| out.flush()) {
            write_error.get_or_insert(e);
            return false;
        }
        changes += u64::from(counted);
        a.count.is_none_or(|n| changes < n)
    })?;
    if let Some(e) = write_error {
        return Err(e).context("writing the watch's lines");
    }
    if let Some(reason) = ended {
        writeln!(out, "{}", serde_json::to_string(&WatchEvent::End { reason })?)?;
    }
    Ok(0)
}

pub fn eval(a: EvalArgs, remote: &RemoteArgs) -> Result<i32> {
    let r = backend::open(remote)?.eval(&a.id, &a.code)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        // What the code printed, then its value or traceback.
        print!("{}", r.stdout);
        eprint!("{}", r.stderr);
        match &r.error {
            None => println!("{}", r.result.as_deref().unwrap_or_default()),
            Some(traceback) => eprint!("{traceback}"),
        }
    }
    Ok(if r.error.is_some() { 1 } else { r.exit_code })
}

pub fn branch(a: BranchArgs, remote: &RemoteArgs) -> Result<i32> {
    if a.no_wait && a.mode != BranchModeArg::Live {
        bail!("--no-wait applies to --mode live only");
    }
    if a.parent_tag.is_some() && a.mode != BranchModeArg::Diff {
        bail!("--parent-tag applies to --mode diff");
    }
    let req = BranchSandboxRequest {
        tag: a.tag.clone(),
        mode: Some(a.mode.name().to_string()),
        wait: !a.no_wait,
        parent_tag: a.parent_tag.clone(),
        ..Default::default()
    };
    let started = Instant::now();
    let snap = backend::open(remote)?.branch(&a.id, &req)?;
    let return_ms = started.elapsed().as_secs_f64() * 1e3;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&snap)?);
    } else {
        println!(
            "{} ({}, {}, {}): paused {}, returned in {return_ms:.1} ms",
            snap.tag,
            snap.mode.as_deref().unwrap_or("-"),
            snap.status,
            snap.dir,
            snap.pause_ms_precise().map(|p| format!("{p:.1} ms")).unwrap_or_else(|| "-".into()),
        );
    }
    if let Some(w) = &snap.warning {
        eprintln!("forkvm: warning: {w}");
    }
    Ok(0)
}
