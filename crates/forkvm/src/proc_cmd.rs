//! `forkvm proc start|ls|logs|input|kill ID ...`: background processes of a sandbox,
//! locally or through the daemon (`backend::processes`). docs/processes.md.

use crate::backend::processes;
use crate::remote_cmd::RemoteArgs;
use anyhow::{Context, Result};
use base64::Engine;
use clap::{Args, Subcommand};
use forkvm_client::api::{ProcessInfo, ProcessOutputEvent, StartProcessRequest, TerminalSize};
use std::io::Write;

#[derive(Debug, Args)]
pub struct ProcArgs {
    #[command(subcommand)]
    pub command: ProcCommand,
}

#[derive(Debug, Subcommand)]
pub enum ProcCommand {
    /// Start a command in the background; prints its pid (the whole record with --json).
    Start(StartArgs),
    /// The sandbox's background processes, running and ended.
    Ls(LsArgs),
    /// A process's output from an offset (the oldest kept by default), raw; --follow
    /// until it ends (then exit with its code).
    Logs(LogsArgs),
    /// Send standard input to a process's stdin (--close: end its input after).
    Input(InputArgs),
    /// Send a signal to a process's group (TERM by default).
    Kill(KillArgs),
}

#[derive(Debug, Args)]
pub struct StartArgs {
    pub id: String,
    /// Run on a terminal of ROWSxCOLS (e.g. 24x80).
    #[arg(long, value_parser = parse_size)]
    pub pty: Option<TerminalSize>,
    #[arg(long)]
    pub tag: Option<String>,
    /// Output bytes kept (1 MiB by default, at most 16 MiB).
    #[arg(long)]
    pub ring_bytes: Option<u64>,
    /// Kill it after this many seconds.
    #[arg(long)]
    pub timeout: Option<u64>,
    #[arg(long)]
    pub cwd: Option<String>,
    /// Environment variable KEY=VALUE (repeatable).
    #[arg(short = 'e', long = "env", value_parser = crate::sandbox_cmd::parse_env_var)]
    pub env: Vec<(String, String)>,
    /// A guest user to run as.
    #[arg(long)]
    pub user: Option<String>,
    #[arg(long)]
    pub json: bool,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct LsArgs {
    pub id: String,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct LogsArgs {
    pub id: String,
    pub pid: u32,
    #[arg(long)]
    pub offset: Option<u64>,
    #[arg(short, long)]
    pub follow: bool,
    /// The API's NDJSON lines instead of the raw bytes.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct InputArgs {
    pub id: String,
    pub pid: u32,
    #[arg(long)]
    pub close: bool,
}

#[derive(Debug, Args)]
pub struct KillArgs {
    pub id: String,
    pub pid: u32,
    /// A number or a name (TERM, KILL, INT, HUP, ...).
    #[arg(short, long, default_value = "TERM", value_parser = parse_signal)]
    pub signal: i32,
}

/// `ROWSxCOLS`.
pub fn parse_size(s: &str) -> Result<TerminalSize, String> {
    let (rows, cols) = s.split_once(['x', 'X']).ok_or_else(|| format!("{s:?} is not ROWSxCOLS (e.g. 24x80)"))?;
    let n = |v: &str| v.trim().parse::<u16>().map_err(|_| format!("{s:?} is not ROWSxCOLS (e.g. 24x80)"));
    Ok(TerminalSize { rows: n(rows)?, cols: n(cols)? })
}

/// A signal number, or a name with or without `SIG`.
pub fn parse_signal(s: &str) -> Result<i32, String> {
    if let Ok(n) = s.parse::<i32>() {
        return Ok(n);
    }
    let name = s.trim_start_matches("SIG").to_ascii_uppercase();
    Ok(match name.as_str() {
        "HUP" => 1,
        "INT" => 2,
        "QUIT" => 3,
        "KILL" => 9,
        "USR1" => 10,
        "USR2" => 12,
        "TERM" => 15,
        "CONT" => 18,
        "STOP" => 19,
        "WINCH" => 28,
        _ => return Err(format!("{s:?} is not a signal number or name (TERM, KILL, INT, HUP, ...)")),
    })
}

pub fn run(a: ProcArgs, remote: &RemoteArgs) -> Result<i32> {
    let procs = processes::open(remote)?;
    match a.command {
        ProcCommand::Start(s) => {
            let req = StartProcessRequest {
                args: s.command,
                env: s.env.into_iter().collect(),
                cwd: s.cwd,
                user: s.user,
                pty: s.pty,
                tag: s.tag,
                ring_bytes: s.ring_bytes,
                timeout_secs: s.timeout,
                ..StartProcessRequest::default()
            };
            let p = procs.start(&s.id, &req)?;
            if s.json {
                println!("{}", serde_json::to_string_pretty(&p)?);
            } else {
                println!("{}", p.pid);
            }
            Ok(0)
        }
        ProcCommand::Ls(l) => {
            let list = procs.list(&l.id)?;
            if l.json {
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                print_table(&list);
            }
            Ok(0)
        }
        ProcCommand::Logs(l) => logs(&*procs, &l),
        ProcCommand::Input(i) => {
            let n = procs.input(&i.id, i.pid, &mut std::io::stdin().lock(), i.close)?;
            eprintln!("{n} bytes to process {}", i.pid);
            Ok(0)
        }
        ProcCommand::Kill(k) => {
            procs.signal(&k.id, k.pid, k.signal)?;
            Ok(0)
        }
    }
}

fn print_table(list: &[ProcessInfo]) {
    println!("{:<8} {:<10} {:<12} {:>10}  COMMAND", "PID", "STATE", "TAG", "OUTPUT");
    for p in list {
        let state = match &p.exit {
            None => "running".to_string(),
            Some(e) => format!("exit {}", e.exit_code),
        };
        let tag = p.tag.as_deref().unwrap_or("-");
        println!("{:<8} {:<10} {:<12} {:>10}  {}", p.pid, state, tag, p.output_end, p.argv.join(" "));
    }
}

fn logs(procs: &dyn processes::Processes, l: &LogsArgs) -> Result<i32> {
    let (mut out, mut err) = (std::io::stdout().lock(), std::io::stderr().lock());
    let mut failed = None;
    let end = procs.output(&l.id, l.pid, l.offset, l.follow, &mut |e| {
        let written = if l.json {
            serde_json::to_string(e).map_err(std::io::Error::other).and_then(|s| writeln!(out, "{s}"))
        } else {
            match e {
                ProcessOutputEvent::Output { stream, data, .. } => {
                    let bytes = base64::engine::general_purpose::STANDARD.decode(data).unwrap_or_default();
                    if stream == "stderr" {
                        err.write_all(&bytes)
                    } else {
                        out.write_all(&bytes).and_then(|()| out.flush())
                    }
                }
                ProcessOutputEvent::From { skipped, offset } if *skipped > 0 => {
                    writeln!(err, "[{skipped} bytes before offset {offset} are no longer kept]")
                }
                _ => Ok(()),
            }
        };
        match written {
            Ok(()) => true,
            Err(e) => {
                failed = Some(e);
                false
            }
        }
    })?;
    if let Some(e) = failed {
        return Err(e).context("writing the output");
    }
    if l.json {
        if let Some(p) = &end {
            writeln!(out, "{}", serde_json::to_string(&ProcessOutputEvent::End { process: p.clone() })?)?;
        }
    }
    match end.and_then(|p| p.exit) {
        Some(exit) if l.follow => Ok(exit.exit_code),
        _ => Ok(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_signals_parse() {
        assert_eq!(parse_size("24x80").unwrap(), TerminalSize { rows: 24, cols: 80 });
        assert!(parse_size("24").is_err() && parse_size("ax80").is_err());
        assert_eq!(
            (parse_signal("9").unwrap(), parse_signal("SIGINT").unwrap(), parse_signal("term").unwrap()),
            (9, 2, 15)
        );
        assert!(parse_signal("NOPE").is_err());
    }
}
