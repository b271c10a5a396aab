//! `forkvm bench mcp --tag T`: what reaching sandboxes through `forkvm mcp` costs an
//! agent, against REST, in one run. A daemon is started for the bench; `forkvm mcp` is
//! started on stdio by an MCP client (rmcp's), as an agent host would; then each round
//! alternates the same calls both ways, so host noise falls on both alike:
//!
//! * `list`: `list_sandboxes`: the daemon alone, no guest (the MCP layer's own cost);
//! * `exec`: `exec` of `true` in one sandbox (the guest's side, emulated here, dominates);
//! * `spawn_kill`: one sandbox spawned from T and killed.
//!
//! Each reports the medians both ways and their ratio. `session_start_ms` is the time
//! from starting `forkvm mcp` to an initialized session, `list_tools_ms` one tools/list;
//! `mcp_server_cpu_ms_per_list_call` is the MCP process's own CPU time per `list` call
//! (from `/proc`), the host cost an agent adds by going through MCP.

use crate::api::{time_calls, with_bench_daemon};
use crate::util::{machine, median, r2};
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use forkvm_client::api::{CreateSandboxRequest, ExecRequest};
use forkvm_client::{Client, Endpoint};
use rmcp::model::{CallToolRequestParams, JsonObject};
use rmcp::service::RunningService;
use rmcp::transport::TokioChildProcess;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{json, Value};
use std::time::Instant;

#[derive(Args, Debug)]
pub struct BenchMcpArgs {
    /// Tag to spawn from (`forkvm snapshot create --image python --tag T`).
    #[arg(long)]
    pub tag: String,
    /// Rounds (each: the calls through REST, then through MCP).
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// `list` calls per path per round.
    #[arg(long, default_value_t = 20)]
    pub list_calls: usize,
    /// `exec` calls per path per round.
    #[arg(long, default_value_t = 3)]
    pub exec_calls: usize,
    /// Print JSON only.
    #[arg(long)]
    pub json: bool,
}

type McpClient = RunningService<RoleClient, ()>;

/// Calls `tool` and returns its JSON reply; a tool error is an error.
fn call(rt: &tokio::runtime::Runtime, mcp: &McpClient, tool: &'static str, args: Value) -> Result<Value> {
    let args: JsonObject = serde_json::from_value(args)?;
    let result = rt.block_on(mcp.call_tool(CallToolRequestParams::new(tool).with_arguments(args)))?;
    let text = result.content.first().and_then(|c| c.as_text()).map(|t| t.text.clone()).unwrap_or_default();
    if result.is_error == Some(true) {
        bail!("MCP tool {tool} failed: {text}");
    }
    serde_json::from_str(&text).with_context(|| format!("the reply of MCP tool {tool}"))
}

/// CPU time (user + system) of process `pid`, in ms.
fn cpu_ms(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command (which may hold spaces) start at the last ')'.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).ok_or_else(|| anyhow!("odd /proc/{pid}/stat"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>()? + fields[12].parse::<f64>()?;
    // SAFETY: sysconf reads a constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok(ticks * 1e3 / hz)
}

fn both(rest: &mut [f64], mcp: &mut [f64]) -> Value {
    let (r, m) = (median(rest), median(mcp));
    json!({ "rest_ms": r2(r), "mcp_ms": r2(m), "mcp_over_rest": if r > 0.0 { json!(r2(m / r)) } else { Value::Null } })
}

fn measure(a: &BenchMcpArgs, socket: &std::path::Path) -> Result<Value> {
    let rest = Client::new(Endpoint::Unix(socket.to_path_buf()), None)?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let t = Instant::now();
    let mut command = tokio::process::Command::new(std::env::current_exe()?);
    command.arg("mcp").arg("--daemon").arg(format!("unix:{}", socket.display()));
    let (mcp, pid) = rt.block_on(async {
        let transport = TokioChildProcess::new(command)?;
        let pid = transport.id().context("the MCP server's pid")?;
        anyhow::Ok((().serve(transport).await?, pid))
    })?;
    let session_start_ms = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    let tools = rt.block_on(mcp.list_all_tools())?;
    let list_tools_ms = t.elapsed().as_secs_f64() * 1e3;

    let id = rest.spawn(&CreateSandboxRequest::new(&a.tag, 1))?.remove(0).id;
    let exec = ExecRequest { args: vec!["true".into()], ..ExecRequest::default() };
    let (mut list_rest, mut list_mcp, mut exec_rest, mut exec_mcp) = (vec![], vec![], vec![], vec![]);
    let (mut spawn_rest, mut spawn_mcp, mut cpu_per_list) = (vec![], vec![], vec![]);
    for _ in 0..a.rounds {
        list_rest.extend(time_calls(a.list_calls, || rest.list_sandboxes().map(drop).map_err(Into::into))?);
        let cpu0 = cpu_ms(pid)?;
        list_mcp.extend(time_calls(a.list_calls, || call(&rt, &mcp, "list_sandboxes", json!({})).map(drop))?);
        cpu_per_list.push((cpu_ms(pid)? - cpu0) / a.list_calls as f64);
        exec_rest.extend(time_calls(a.exec_calls, || rest.exec(&id, &exec).map(drop).map_err(Into::into))?);
        exec_mcp.extend(time_calls(a.exec_calls, || {
            let r = call(&rt, &mcp, "exec", json!({ "sandbox_id": id, "args": ["true"] }))?;
            if r["exit_code"] != 0 {
                bail!("exec true through MCP: {r}");
            }
            Ok(())
        })?);
        let t = Instant::now();
        let sb = rest.spawn(&CreateSandboxRequest::new(&a.tag, 1))?.remove(0).id;
        rest.kill_sandbox(&sb)?;
        spawn_rest.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        let sbs = call(&rt, &mcp, "spawn", json!({ "snapshot_tag": a.tag }))?;
        let sb = sbs[0]["id"].as_str().context("spawn's reply has no id")?.to_string();
        call(&rt, &mcp, "kill", json!({ "sandbox_id": sb }))?;
        spawn_mcp.push(t.elapsed().as_secs_f64() * 1e3);
    }
    rest.kill_sandbox(&id)?;
    rt.block_on(mcp.cancel())?;
    Ok(json!({
        "bench": "mcp",
        "tag": a.tag,
        "rounds": a.rounds,
        "tools": tools.len(),
        "session_start_ms": r2(session_start_ms),
        "list_tools_ms": r2(list_tools_ms),
        "list": both(&mut list_rest, &mut list_mcp),
        "exec": both(&mut exec_rest, &mut exec_mcp),
        "spawn_kill": both(&mut spawn_rest, &mut spawn_mcp),
        "mcp_server_cpu_ms_per_list_call": r2(median(&mut cpu_per_list)),
        "machine": machine(),
    }))
}

pub fn run(a: BenchMcpArgs) -> Result<i32> {
    if a.rounds == 0 || a.list_calls == 0 || a.exec_calls == 0 {
        bail!("--rounds, --list-calls and --exec-calls must be at least 1");
    }
    let report = with_bench_daemon(|socket| measure(&a, socket))?;
    if a.json {
        println!("{report}");
    } else {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    Ok(0)
}
