//! `forkvm-agent`: parses flags and runs the agent library (see `lib.rs` for the startup
//! order). When it is PID 1 a fatal error resets the guest instead of panicking the kernel.

use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use forkvm_agent::identity::{IdentitySys, LinuxSys, RecordingSys};
use forkvm_agent::interp::Interp;
use forkvm_agent::reaper::Reaper;
use forkvm_agent::server::{Agent, Listener};
use forkvm_agent::vsock::VsockListener;
use forkvm_agent::xstate::{self, VectorState};
use forkvm_agent::{identity, init};

/// Flags. Kernel command-line `KEY=value` words reach PID 1 as environment, so every
/// flag can also be set from the kernel command line through its env name.
#[derive(Debug, Parser)]
#[command(version, about = "forkvm guest agent")]
struct Args {
    /// AF_VSOCK port to listen on.
    #[arg(long, env = "FORKVM_AGENT_VSOCK_PORT", default_value_t = 1024)]
    vsock_port: u32,
    /// Listen on this Unix socket instead of vsock (host tests).
    #[arg(long, env = "FORKVM_AGENT_LISTEN_UNIX")]
    listen_unix: Option<PathBuf>,
    /// Python for the warm interpreter; no `eval` without it.
    #[arg(long, env = "FORKVM_AGENT_PYTHON")]
    python: Option<PathBuf>,
    /// Hostname set at boot when PID 1.
    #[arg(long, env = "FORKVM_AGENT_HOSTNAME", default_value = "forkvm")]
    hostname: String,
    /// Record identity system calls as JSON lines in this file instead of making them.
    #[arg(long)]
    identity_record: Option<PathBuf>,
    /// With --identity-record: make the credited-entropy call fail (tests the fallback).
    #[arg(long, requires = "identity_record")]
    identity_record_fail_credit: bool,
}

fn main() {
    // `forkvm-agent as-user ...`: the trampoline of execs that name a guest user
    // (spawn.rs). First, before anything else the agent does at startup.
    if let Some(args) = forkvm_agent::spawn::as_user_args() {
        std::process::exit(forkvm_agent::spawn::as_user_main(args));
    }
    // `forkvm-agent --vector-state`: what xstate.rs decides from, as this process sees it
    // (tests compare it with what PID 1 did).
    if std::env::args().nth(1).as_deref() == Some("--vector-state") {
        let (cpu, kernel) = (xstate::cpu_xfeatures(), xstate::kernel_xfeatures());
        let unsaved = xstate::unsaved(cpu, kernel);
        let leaf1 = std::arch::x86_64::__cpuid(1);
        let leaf7 = std::arch::x86_64::__cpuid_count(7, 0);
        println!(
            "cpu={cpu:#x} kernel={} unsaved={unsaved:#x} glibc_unsaved={:#x} osxsave={} ospke={}",
            kernel.map_or("unknown".into(), |k| format!("{k:#x}")),
            unsaved & xstate::GLIBC_XFEATURES,
            leaf1.ecx >> 27 & 1,
            leaf7.ecx >> 4 & 1
        );
        return;
    }
    // `forkvm-agent vector-check [--processes N] [--switches N]` and
    // `forkvm-agent vector-hold RESULT`: see vector_check.rs. They run with glibc on SSE,
    // so a kernel that loses vector state corrupts only the registers they test (their
    // own code uses no others) and they live to report it.
    let subcommand = std::env::args().nth(1);
    if matches!(subcommand.as_deref(), Some("vector-check" | "vector-hold")) {
        if let Some(e) = xstate::keep_glibc_on_sse() {
            eprintln!("forkvm-agent: re-executing with glibc kept to SSE failed: {e}");
            std::process::exit(2);
        }
    }
    match subcommand.as_deref() {
        Some("vector-check") => std::process::exit(vector_check_cmd(std::env::args().skip(2))),
        Some("vector-hold") => std::process::exit(vector_hold_cmd(std::env::args().skip(2))),
        _ => {}
    }
    // First, while single-threaded: may re-execute the agent (see xstate.rs).
    let vector_state = xstate::avoid_unsaved_vector_state();
    let pid1 = init::is_pid1();
    if let Err(e) = run(pid1, vector_state) {
        eprintln!("forkvm-agent: fatal: {e:#}");
        if pid1 {
            init::shutdown(true);
        }
        std::process::exit(1);
    }
}

/// Limits that keep a mistyped count from running for hours in an emulated guest.
const MAX_PROCESSES: u32 = 64;
const MAX_SWITCHES: u32 = 1_000_000;

fn vector_check_cmd(mut args: impl Iterator<Item = String>) -> i32 {
    let (mut processes, mut switches) = (3u32, 2000u32);
    while let Some(flag) = args.next() {
        let value = args.next().and_then(|v| v.parse::<u32>().ok());
        match (flag.as_str(), value) {
            ("--processes", Some(v)) if (1..=MAX_PROCESSES).contains(&v) => processes = v,
            ("--switches", Some(v)) if (1..=MAX_SWITCHES).contains(&v) => switches = v,
            _ => {
                eprintln!(
                    "usage: forkvm-agent vector-check [--processes 1..={MAX_PROCESSES}] [--switches 1..={MAX_SWITCHES}]"
                );
                return 2;
            }
        }
    }
    match forkvm_agent::vector_check::run(processes, switches) {
        Ok(report) => {
            println!("{}", serde_json::to_string(&report).unwrap_or_default());
            i32::from(!report.failures().is_empty())
        }
        Err(e) => {
            eprintln!("forkvm-agent vector-check: {e}");
            2
        }
    }
}

fn vector_hold_cmd(mut args: impl Iterator<Item = String>) -> i32 {
    let (Some(result), None) = (args.next(), args.next()) else {
        eprintln!("usage: forkvm-agent vector-hold RESULT-FILE (holds registers until SIGUSR1)");
        return 2;
    };
    match forkvm_agent::vector_check::hold(std::path::Path::new(&result)) {
        Ok(ok) => i32::from(!ok),
        Err(e) => {
            eprintln!("forkvm-agent vector-hold: {e}");
            2
        }
    }
}

fn run(pid1: bool, vector_state: VectorState) -> anyhow::Result<()> {
    // Before any thread exists: SIGCHLD must be blocked in all of them.
    let reaper = Reaper::start().context("starting the reaper")?;
    if std::env::var_os("PATH").is_none() {
        // Still single-threaded apart from the reaper, which never reads the environment.
        std::env::set_var("PATH", forkvm_agent::spawn::DEFAULT_PATH);
    }
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FORKVM_AGENT_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    match vector_state {
        VectorState::Saved => {}
        VectorState::Avoided { unsaved } => tracing::info!(
            unsaved = format_args!("{unsaved:#x}"),
            "the kernel does not save all vector state the CPU offers: glibc kept to SSE (GLIBC_TUNABLES)"
        ),
        VectorState::Exposed { unsaved, error } => tracing::error!(
            unsaved = format_args!("{unsaved:#x}"),
            %error,
            "the kernel does not save all vector state the CPU offers, and re-executing with GLIBC_TUNABLES failed"
        ),
    }
    // As PID 1 our argv is whatever words of the kernel command line the kernel did not
    // understand (`noxsave`, ...): configuration comes from the environment only.
    let args = if pid1 { Args::parse_from(["forkvm-agent"]) } else { Args::parse() };
    if pid1 {
        if init::root_is_read_only() {
            init::overlay_root().context("setting up the overlay root")?;
        }
        for (target, e) in init::mount_early() {
            tracing::warn!(target, error = %e, "early mount failed");
        }
        if let Err(e) = LinuxSys.set_hostname(&args.hostname) {
            tracing::warn!(error = %e, "setting the boot hostname");
        }
    }
    let interp = match &args.python {
        Some(python) => match Interp::start(python.clone(), reaper.clone()) {
            Ok(i) => Some(i),
            Err(e) => {
                tracing::error!(error = %e, "warm interpreter did not start; eval will retry");
                None
            }
        },
        None => None,
    };
    let identity_sys: Box<dyn identity::IdentitySys> = match args.identity_record {
        Some(path) => Box::new(RecordingSys::new(path, args.identity_record_fail_credit)),
        None => Box::new(LinuxSys),
    };
    let listener = match &args.listen_unix {
        Some(path) => {
            let _ = std::fs::remove_file(path);
            let l = UnixListener::bind(path).with_context(|| format!("binding Unix socket {}", path.display()))?;
            tracing::info!(path = %path.display(), "listening on Unix socket");
            Listener::Unix(l)
        }
        None => {
            let l = VsockListener::bind(args.vsock_port)
                .with_context(|| format!("binding vsock port {}", args.vsock_port))?;
            tracing::info!(port = args.vsock_port, "listening on vsock");
            Listener::Vsock(l)
        }
    };
    Arc::new(Agent::new(reaper, interp, identity_sys, pid1)).serve(listener);
    Ok(())
}
