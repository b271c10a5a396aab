//! `exec` through the daemon, streaming as the local verb does.

use super::{RemoteArgs, EXEC_TIMEOUT_SECS};
use crate::sandbox_cmd::ExecArgs;
use anyhow::{Context, Result};
use forkvm_client::api::{ExecEvent, ExecRequest};
use std::io::Write;

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
