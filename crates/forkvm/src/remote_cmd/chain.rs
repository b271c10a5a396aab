//! The chain verbs through the daemon: `snapshot-diff` (spawn, run, diff branch, kill),
//! `snapshot-info`, `rmi`, `snapshot-compact`, `pack` (streamed to a file), `unpack`
//! (the file streamed up). `--json` prints the API's objects.

use super::{RemoteArgs, Spinner};
use crate::chain_cmd::{CompactArgs, PackArgs, RmiArgs, SnapshotDiffArgs, SnapshotInfoArgs, UnpackArgs};
use anyhow::{bail, Context, Result};
use forkvm_client::api::{BranchSandboxRequest, CreateSandboxRequest, ExecRequest};
use forkvm_client::Client;
use std::time::Instant;

fn print<T: serde::Serialize>(json: bool, value: &T, line: impl FnOnce() -> String) -> Result<Option<i32>> {
    if json {
        println!("{}", serde_json::to_string_pretty(value)?);
    } else {
        println!("{}", line());
    }
    Ok(Some(0))
}

pub fn snapshot_diff(a: &SnapshotDiffArgs, remote: &RemoteArgs) -> Result<Option<i32>> {
    let Some(client) = remote.client()? else { return Ok(None) };
    let started = Instant::now();
    let spinner = Spinner::start(format!("snapshot-diff {} over {}", a.tag, a.from));
    let req = CreateSandboxRequest::new(a.from.clone(), 1);
    let sandbox = client.spawn(&req)?.into_iter().next().context("the daemon spawned no sandbox")?;
    let result = run_and_branch(&client, &sandbox.id, a);
    let killed = client.kill_sandbox(&sandbox.id);
    drop(spinner);
    let snap = result?;
    killed.with_context(|| format!("killing sandbox {}", sandbox.id))?;
    let ms = started.elapsed().as_secs_f64() * 1e3;
    print(a.json, &snap, || format!("{}: diff over {} in {ms:.0} ms", snap.tag, a.from))
}

fn run_and_branch(client: &Client, id: &str, a: &SnapshotDiffArgs) -> Result<forkvm_client::api::SnapshotInfo> {
    for cmd in &a.exec {
        let req = ExecRequest {
            cmd: Some(cmd.clone()),
            timeout_secs: crate::sandbox_cmd::EXEC_TIMEOUT_SECS,
            ..Default::default()
        };
        let out = client.exec(id, &req)?;
        if out.exit_code != 0 {
            bail!(
                "exec {cmd:?} failed (exit code {}); nothing was snapshotted:\n{}{}",
                out.exit_code,
                out.stdout,
                out.stderr
            );
        }
    }
    for code in &a.eval {
        let r = client.eval(id, code)?;
        if let Some(e) = r.error {
            bail!("eval {code:?} raised {e}; nothing was snapshotted");
        }
    }
    let req = BranchSandboxRequest {
        tag: Some(a.tag.clone()),
        mode: Some("diff".into()),
        parent_tag: Some(a.from.clone()),
        ..Default::default()
    };
    Ok(client.branch(id, &req)?)
}

pub fn snapshot_info(a: &SnapshotInfoArgs, remote: &RemoteArgs) -> Result<Option<i32>> {
    let Some(client) = remote.client()? else { return Ok(None) };
    let i = client.snapshot_info(&a.tag)?;
    print(a.json, &i, || {
        let list = |v: &[String]| if v.is_empty() { "-".to_string() } else { v.join(", ") };
        format!(
            "tag: {}\nchain depth: {}\nparent_tag: {}\nancestors: {}\ndependents: {}",
            i.tag,
            i.chain_depth,
            i.parent_tag.as_deref().unwrap_or("-"),
            list(&i.ancestors),
            list(&i.dependents)
        )
    })
}

pub fn rmi(a: &RmiArgs, remote: &RemoteArgs) -> Result<Option<i32>> {
    let Some(client) = remote.client()? else { return Ok(None) };
    client.delete_snapshot(&a.tag, a.cascade, a.force)?;
    print(a.json, &serde_json::json!({ "removed": a.tag }), || format!("removed {}", a.tag))
}

pub fn compact(a: &CompactArgs, remote: &RemoteArgs) -> Result<Option<i32>> {
    let Some(client) = remote.client()? else { return Ok(None) };
    let snap = client.compact_snapshot(&a.from, &a.to)?;
    print(a.json, &snap, || format!("{}: flat copy of {}", snap.tag, a.from))
}

pub fn pack(a: &PackArgs, remote: &RemoteArgs) -> Result<Option<i32>> {
    let Some(client) = remote.client()? else { return Ok(None) };
    if a.sign.is_some() {
        bail!("--sign signs a local pack; through a daemon, the daemon signs with its --pack-signing-key");
    }
    if a.out.exists() {
        bail!("{} exists: choose another --out", a.out.display());
    }
    let partial = a.out.with_extension("partial");
    let mut file = std::fs::File::create_new(&partial).with_context(|| format!("creating {}", partial.display()))?;
    let written = client.pack_snapshot(&a.tag, &mut file);
    let written =
        match written.map_err(anyhow::Error::from).and_then(|n| file.sync_all().map(|_| n).map_err(Into::into)) {
            Ok(n) => n,
            Err(e) => {
                let _ = std::fs::remove_file(&partial);
                return Err(e);
            }
        };
    std::fs::rename(&partial, &a.out).with_context(|| format!("publishing {}", a.out.display()))?;
    let report = serde_json::json!({ "tag": a.tag, "path": a.out, "pack_bytes": written });
    print(a.json, &report, || format!("{}: {} ({written} bytes)", a.tag, a.out.display()))
}

pub fn unpack(a: &UnpackArgs, remote: &RemoteArgs) -> Result<Option<i32>> {
    let Some(client) = remote.client()? else { return Ok(None) };
    if !a.trust.is_empty() {
        bail!("--trust applies to a local unpack; through a daemon, the daemon's --trust-pack-key decides");
    }
    let r = client.unpack_snapshot_file(&a.pack)?;
    print(a.json, &r, || format!("{}: imported {}; reused {}", r.head, r.imported.join(", "), r.reused.join(", ")))
}
