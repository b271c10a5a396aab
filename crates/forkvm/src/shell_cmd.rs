//! `forkvm shell ID [-- CMD...]` and `forkvm attach ID PID`: a sandbox's terminal on
//! this one. The command runs as a background process on a terminal of this terminal's
//! size (`proc_cmd`), so it outlives the session: `Ctrl-]` detaches, and `attach` comes
//! back to it with what it wrote meanwhile (as much as its ring kept). Keys go to it as
//! typed (raw mode: Ctrl-C interrupts the sandbox's command, not this one), resizes
//! follow this terminal, and the session ends with the command, with its exit code.

use crate::backend::processes::{self, AttachedEvent, AttachedInput, Processes};
use crate::remote_cmd::RemoteArgs;
use anyhow::Result;
use clap::Args;
use forkvm_client::api::{StartProcessRequest, TerminalSize};
use std::io::{Read, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The key that detaches (Ctrl-]).
const DETACH: u8 = 0x1d;
/// How often the window size is looked at.
const RESIZE_LOOK: Duration = Duration::from_millis(250);
/// The shell when no command is given: the image's bash if it has one, else sh.
const LOGIN_SHELL: &str = "if command -v bash >/dev/null 2>&1; then exec bash -l; else exec sh -l; fi";

#[derive(Debug, Args)]
pub struct ShellArgs {
    pub id: String,
    /// A guest user to run as.
    #[arg(long)]
    pub user: Option<String>,
    #[arg(long)]
    pub cwd: Option<String>,
    /// What to run instead of a login shell (after `--`).
    #[arg(last = true)]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct AttachArgs {
    pub id: String,
    pub pid: u32,
}

pub fn shell(a: ShellArgs, remote: &RemoteArgs) -> Result<i32> {
    let procs: Arc<dyn Processes> = processes::open(remote)?.into();
    let term = std::env::var("TERM").ok().filter(|t| !t.is_empty()).unwrap_or_else(|| "xterm-256color".into());
    let (args, cmd) = if a.command.is_empty() { (Vec::new(), Some(LOGIN_SHELL.into())) } else { (a.command, None) };
    let req = StartProcessRequest {
        args,
        cmd,
        env: [("TERM".to_string(), term)].into_iter().collect(),
        cwd: a.cwd,
        user: a.user,
        pty: Some(window_size().unwrap_or(TerminalSize { rows: 24, cols: 80 })),
        tag: Some("shell".into()),
        ..StartProcessRequest::default()
    };
    let p = procs.start(&a.id, &req)?;
    session(procs, &a.id, p.pid, Some(0))
}

pub fn attach(a: AttachArgs, remote: &RemoteArgs) -> Result<i32> {
    let procs: Arc<dyn Processes> = processes::open(remote)?.into();
    if let Some(size) = window_size() {
        // Best effort: a process without a terminal has no size to follow.
        let _ = procs.resize(&a.id, a.pid, size);
    }
    session(procs, &a.id, a.pid, None)
}

/// Runs the terminal session with process `pid` until it ends (its exit code) or the
/// user detaches (0), on one attachment: output read here, keys and resizes sent on it
/// from threads of their own.
fn session(procs: Arc<dyn Processes>, id: &str, pid: u32, offset: Option<u64>) -> Result<i32> {
    let mut attached = procs.attach(id, pid, offset)?;
    let keys = attached.input()?;
    let sizes = attached.input()?;
    let raw = RawMode::enable();
    let interactive = raw.is_some();
    {
        let id = id.to_string();
        std::thread::spawn(move || forward_keys(keys, &id, pid, interactive));
    }
    if interactive {
        std::thread::spawn(move || follow_size(sizes));
    }
    let mut out = std::io::stdout().lock();
    let mut end = None;
    while let Some(event) = attached.next()? {
        match event {
            AttachedEvent::Output(bytes) => {
                if out.write_all(&bytes).and_then(|()| out.flush()).is_err() {
                    break;
                }
            }
            AttachedEvent::End(p) => {
                end = Some(p);
                break;
            }
            AttachedEvent::Other => {}
        }
    }
    drop(raw);
    Ok(end.and_then(|p| p.exit).map_or(0, |e| e.exit_code))
}

/// Sends what is typed to the process; Ctrl-] detaches, the end of this input ends the
/// process's (not interactive: a pipe).
fn forward_keys(mut input: Box<dyn AttachedInput>, id: &str, pid: u32, interactive: bool) {
    let mut stdin = std::io::stdin().lock();
    let mut buf = [0u8; 4096];
    loop {
        let n = match stdin.read(&mut buf) {
            Ok(0) | Err(_) => {
                let _ = input.close_stdin();
                return;
            }
            Ok(n) => n,
        };
        let keys = &buf[..n];
        if interactive {
            if let Some(at) = keys.iter().position(|b| *b == DETACH) {
                let _ = input.send(&keys[..at]);
                input.detach();
                RawMode::restore_saved();
                eprintln!("\r\n[detached from process {pid}: forkvm attach {id} {pid}]");
                std::process::exit(0);
            }
        }
        if input.send(keys).is_err() {
            return;
        }
    }
}

/// Resizes the process's terminal whenever this one's size changes.
fn follow_size(mut input: Box<dyn AttachedInput>) {
    let mut last = window_size();
    loop {
        std::thread::sleep(RESIZE_LOOK);
        let now = window_size();
        if now != last {
            if let Some(size) = now {
                if input.resize(size).is_err() {
                    return;
                }
            }
            last = now;
        }
    }
}

/// This terminal's size (standard output's), if it is one.
fn window_size() -> Option<TerminalSize> {
    // SAFETY: winsize is plain data; TIOCGWINSZ fills it or fails.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: as above, on our own standard output.
    let rc = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut ws) };
    (rc == 0 && ws.ws_row > 0 && ws.ws_col > 0).then_some(TerminalSize { rows: ws.ws_row, cols: ws.ws_col })
}

/// This terminal's raw mode for the session, undone when dropped (or by
/// [`RawMode::restore_saved`] on the way out of another thread).
struct RawMode;

static SAVED: Mutex<Option<libc::termios>> = Mutex::new(None);

impl RawMode {
    /// Raw mode on standard input, if it is a terminal.
    fn enable() -> Option<RawMode> {
        // SAFETY: isatty on our own standard input.
        if unsafe { libc::isatty(libc::STDIN_FILENO) } != 1 {
            return None;
        }
        // SAFETY: termios is plain data, filled by tcgetattr.
        let mut t: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: tcgetattr/cfmakeraw/tcsetattr on our own terminal and a local struct.
        unsafe {
            if libc::tcgetattr(libc::STDIN_FILENO, &mut t) != 0 {
                return None;
            }
            *SAVED.lock().unwrap_or_else(|p| p.into_inner()) = Some(t);
            let mut raw = t;
            libc::cfmakeraw(&mut raw);
            if libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, &raw) != 0 {
                return None;
            }
        }
        Some(RawMode)
    }

    fn restore_saved() {
        if let Some(t) = SAVED.lock().unwrap_or_else(|p| p.into_inner()).take() {
            // SAFETY: restores the attributes saved from this terminal.
            unsafe { libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, &t) };
        }
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        RawMode::restore_saved();
    }
}
