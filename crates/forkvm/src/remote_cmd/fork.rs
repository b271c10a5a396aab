//! `fork --tag T` (a spawn) and `fork --from-sandbox ID` (a fork of a running sandbox)
//! through the daemon, then `--exec`/`--eval` in each and `--rm`, reporting as the
//! local verb does. `--image` has no API (make a tag first); `--snapshot DIR` forks
//! device-less test guests on this host and stays local.

use super::{round1, RemoteArgs, Spinner, EXEC_TIMEOUT_SECS};
use crate::fork_cmd::ForkArgs;
use anyhow::{bail, Result};
use forkvm_client::api::{CreateSandboxRequest, ExecRequest, ForkSandboxRequest, MAX_SANDBOXES_PER_CALL};
use forkvm_client::Client;
use serde_json::json;
use std::time::Instant;

/// Where the sandboxes come from.
#[derive(Clone, Copy)]
enum Source<'a> {
    Tag(&'a str),
    Sandbox(&'a str),
}

pub fn fork(a: &ForkArgs, remote: &RemoteArgs) -> Result<Option<i32>> {
    if a.image.is_some() {
        remote.refuse_local(
            "fork --image",
            "make a tag with `forkvm snapshot create --image T --tag X`, then `forkvm fork --tag X`",
        )?;
        return Ok(None);
    }
    if a.tag.is_none() && a.from_sandbox.is_none() {
        return Ok(None);
    }
    let Some(client) = remote.client()? else { return Ok(None) };
    let n = u32::try_from(a.count).ok().filter(|n| (1..=MAX_SANDBOXES_PER_CALL).contains(n));
    let Some(n) = n else {
        bail!("-n must be between 1 and {MAX_SANDBOXES_PER_CALL} through the daemon, got {}", a.count)
    };
    let (what, spinner) = match (&a.tag, &a.from_sandbox, &a.snapshot) {
        (Some(tag), None, None) => (Source::Tag(tag), Spinner::start(format!("{n} sandboxes from tag {tag}"))),
        (None, Some(id), None) => (Source::Sandbox(id), Spinner::start(format!("{n} forks of {id}"))),
        _ => bail!("say what to fork, once: --tag TAG, --from-sandbox ID, --image TEMPLATE or --snapshot DIR"),
    };
    let started = Instant::now();
    let sandboxes = match what {
        Source::Tag(tag) => client.spawn(&CreateSandboxRequest {
            snapshot_tag: tag.to_string(),
            n,
            memory_limit_mib: a.mem_limit_mib,
            per_child_netns: false,
            prewarm: false,
            live_fork: false,
            hugepages: false,
            ttl_seconds: None,
        })?,
        Source::Sandbox(id) => {
            client.fork(id, &ForkSandboxRequest { n, memory_limit_mib: a.mem_limit_mib, ttl_seconds: None })?
        }
    };
    let what = match what {
        Source::Tag(tag) => format!("tag {tag}"),
        Source::Sandbox(id) => format!("running sandbox {id}"),
    };
    let all_ready_ms = started.elapsed().as_secs_f64() * 1e3;
    let mut failed = false;
    let mut rows = Vec::new();
    for (index, sb) in sandboxes.iter().enumerate() {
        spinner.set_message(format!("sandbox {}/{} ({})", index + 1, sandboxes.len(), sb.id));
        let mut row = serde_json::to_value(sb)?;
        row["index"] = json!(index);
        row["sandbox_id"] = json!(sb.id);
        if let Some(cmd) = &a.exec {
            let req = ExecRequest { cmd: Some(cmd.clone()), timeout_secs: EXEC_TIMEOUT_SECS, ..ExecRequest::default() };
            row["exec"] = match client.exec(&sb.id, &req) {
                Ok(r) => {
                    failed |= r.exit_code != 0;
                    serde_json::to_value(&r)?
                }
                Err(e) => {
                    failed = true;
                    json!({ "error": e.to_string() })
                }
            };
        }
        if let Some(code) = &a.eval {
            row["eval"] = match client.eval(&sb.id, code) {
                Ok(r) => {
                    failed |= r.error.is_some();
                    serde_json::to_value(&r)?
                }
                Err(e) => {
                    failed = true;
                    json!({ "error": e.to_string() })
                }
            };
        }
        if a.rm {
            client.kill_sandbox(&sb.id)?;
        }
        rows.push(row);
    }
    drop(spinner);
    print_report(a, &client, &what, n, all_ready_ms, &rows)?;
    Ok(Some(if failed { 1 } else { 0 }))
}

fn print_report(
    a: &ForkArgs,
    client: &Client,
    what: &str,
    n: u32,
    all_ready_ms: f64,
    rows: &[serde_json::Value],
) -> Result<()> {
    if a.json {
        let report = json!({
            "from": what, "n": n, "daemon": client.endpoint().to_string(), "all_ready_ms": round1(all_ready_ms),
            "removed": a.rm, "sandboxes": rows,
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    for r in rows {
        print!("{} pid {}", r["sandbox_id"].as_str().unwrap_or(""), r["pid"]);
        if let Some(e) = r.get("exec") {
            print!(": exit {}\n{}", e["exit_code"], e["stdout"].as_str().unwrap_or(""));
        }
        if let Some(e) = r.get("eval") {
            print!(": {e}");
        }
        println!();
    }
    println!("{n} sandboxes from {what} ready in {all_ready_ms:.0} ms");
    Ok(())
}
