//! `forkvm mcp`: an MCP server that gives an agent forkvm's sandboxes as tools (spawn,
//! exec, eval, files, background processes, branch, fork, kill, snapshots) and resources (console log, file
//! tree). It is a client of forkvmd like the CLI and the SDKs: every tool is a daemon
//! call with the daemon's own checks, so the MCP server adds no way to the host.
//!
//! Two transports: stdio (the agent host starts `forkvm mcp`) and streamable HTTP
//! (`forkvm mcp --http ADDR`, loopback, behind a bearer token).

mod daemon;
pub mod http;
mod output;
mod params;
mod process_tools;
mod resources;
mod server;
mod tools;

pub use daemon::Daemon;
pub use tools::ForkvmMcp;

use rmcp::ServiceExt;

/// Serves one MCP session on stdin/stdout until the client closes it.
pub async fn serve_stdio(daemon: Daemon) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let running = ForkvmMcp::new(daemon).serve(rmcp::transport::stdio()).await?;
    running.waiting().await?;
    Ok(())
}

/// How `forkvm mcp` talks to its client.
#[derive(Debug)]
pub enum Transport {
    /// One session on stdin/stdout.
    Stdio,
    /// Streamable HTTP on `addr` at [`http::MCP_PATH`], behind `token`.
    Http { addr: std::net::SocketAddr, token: forkvmd::auth::Token },
}

/// Runs the server until its client leaves (stdio) or SIGINT/SIGTERM (HTTP).
pub fn run(daemon: Daemon, transport: Transport) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    // The client owns a runtime of its own, which must not be dropped on an async
    // thread: this reference outlives every clone the servers drop there.
    let outlives_the_runtime = daemon.clone();
    let result = rt.block_on(async move {
        match transport {
            Transport::Stdio => serve_stdio(daemon).await,
            Transport::Http { addr, token } => {
                let stop = tokio_util::sync::CancellationToken::new();
                let on_signal = stop.clone();
                tokio::spawn(async move {
                    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
                    let term = async move {
                        match term.as_mut() {
                            Some(t) => t.recv().await,
                            None => std::future::pending().await,
                        }
                    };
                    tokio::select! {
                        _ = tokio::signal::ctrl_c() => {}
                        _ = term => {}
                    }
                    on_signal.cancel();
                });
                http::serve(daemon, addr, token, stop, |bound| {
                    eprintln!("forkvm mcp: serving MCP on http://{bound}{}", http::MCP_PATH);
                })
                .await?;
                Ok(())
            }
        }
    });
    drop(rt);
    drop(outlives_the_runtime);
    result
}
