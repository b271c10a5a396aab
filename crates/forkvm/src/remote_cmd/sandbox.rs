//! `ps`, `kill`, `exec`, `eval`, `branch` through the daemon, printing what the local
//! verbs print (`--json`: the API's objects).

use super::{RemoteArgs, Spinner, EXEC_TIMEOUT_SECS};
use crate::sandbox_cmd::{BranchArgs, EvalArgs, ExecArgs, KillArgs, PsArgs};
use anyhow::{bail, Context, Result};
use forkvm_client::api::{BranchSandboxRequest, ExecEvent, ExecRequest};
use std::io::Write;
use std::time::Instant;

pub fn ps(a: &PsArgs, remote: &RemoteArgs) -> Result<Option<i32>> {
    let Some(client) = remote.client()? else { return Ok(None) };
    print_sandboxes(&client.list_sandboxes()?, a.json)?;
    Ok(Some(0))
}

/// `ps`'s output, the same with and without a daemon: the API's `SandboxInfo` list as
/// JSON, or one line each.
pub fn print_sandboxes(list: &[forkvm_client::api::SandboxInfo], json: bool) -> Result<()> {
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

pub fn kill(a: &KillArgs, remote: &RemoteArgs) -> Result<Option<i32>> {
    let Some(client) = remote.client()? else { return Ok(None) };
    let ids: Vec<String> =
        if a.all { client.list_sandboxes()?.into_iter().map(|s| s.id).collect() } else { a.ids.clone() };
    if ids.is_empty() && !a.all {
        bail!("name the sandboxes to kill, or --all");
    }
    for id in ids {
        let killed = if a.purge { client.purge_sandbox(&id) } else { client.kill_sandbox(&id) };
        match killed {
            Ok(()) => {}
            // With --all, one that stopped since the listing is already what we wanted.
            Err(e) if a.all && e.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Some(0))
}

/// Streams the command's output as it comes; exits with its code (124 on timeout,
/// 128 + N for signal N, as the daemon computes it).
pub fn exec(a: &ExecArgs, remote: &RemoteArgs) -> Result<Option<i32>> {
    let Some(client) = remote.client()? else { return Ok(None) };
    let req = ExecRequest { args: a.command.clone(), timeout_secs: EXEC_TIMEOUT_SECS, ..ExecRequest::default() };
    let (mut stdout, mut stderr) = (std::io::stdout().lock(), std::io::stderr().lock());
    let mut write_error = None;
    let exit = client.exec_stream(&a.id, &req, |event| {
        let written = match &event {
            ExecEvent::Stdout { data } => stdout.write_all(data.as_bytes()).and_then(|()| stdout.flush()),
            ExecEvent::Stderr { data } => stderr.write_all(data.as_bytes()).and_then(|()| stderr.flush()),
            _ => Ok(()),
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
    Ok(Some(exit.exit_code))
}

pub fn eval(a: &EvalArgs, remote: &RemoteArgs) -> Result<Option<i32>> {
    let Some(client) = remote.client()? else { return Ok(None) };
    let r = client.eval(&a.id, &a.code)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        // What the code printed, then its value or traceback (as the local verb).
        print!("{}", r.stdout);
        eprint!("{}", r.stderr);
        match &r.error {
            None => println!("{}", r.result.as_deref().unwrap_or_default()),
            Some(traceback) => eprint!("{traceback}"),
        }
    }
    Ok(Some(if r.error.is_some() { 1 } else { r.exit_code }))
}

pub fn branch(a: &BranchArgs, remote: &RemoteArgs) -> Result<Option<i32>> {
    let Some(client) = remote.client()? else { return Ok(None) };
    let req = BranchSandboxRequest {
        tag: a.tag.clone(),
        mode: Some(a.mode.name().to_string()),
        wait: !a.no_wait,
        parent_tag: a.parent_tag.clone(),
        ..Default::default()
    };
    let started = Instant::now();
    let spinner = Spinner::start(format!("branching {}", a.id));
    let snap = client.branch(&a.id, &req)?;
    drop(spinner);
    let return_ms = started.elapsed().as_secs_f64() * 1e3;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&snap)?);
    } else {
        // The daemon reports the pause; "returned" is this call's round trip.
        println!(
            "{} ({}, {}): paused {}, returned in {return_ms:.1} ms",
            snap.tag,
            snap.status,
            snap.dir,
            snap.pause_ms.map(|p| format!("{p:.1} ms")).unwrap_or_else(|| "-".into()),
        );
    }
    if let Some(w) = &snap.warning {
        eprintln!("forkvm: warning: {w}");
    }
    Ok(Some(0))
}
