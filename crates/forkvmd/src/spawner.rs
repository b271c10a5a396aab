//! The spawner: a single-threaded helper process that starts sandbox VMMs for the daemon.
//!
//! Spawning forks the caller once per sandbox (the caller is the zygote: it reads the
//! snapshot once and every child inherits it). A child of a multi-threaded process only
//! gets the forking thread, with any lock another thread held stuck forever, so the
//! tokio daemon must not be that caller. Nor may anything a VMM is forked from hold a
//! secret: a guest that escapes into its VMM would find it there. So the daemon starts
//! this helper by executing its own binary again (`forkvm __spawner`, [`main`]) with a
//! socket pair's end as its only descriptor besides stdio and an environment without
//! the daemon's configuration: a fresh address space that never saw the token, the TLS
//! key or the pack signing key, whose only channel to the daemon is the socket. It gets
//! one JSON line per spawn, starts the VMMs ([`forkvm_sandbox::start_vmms`]), answers
//! with their records and goes back to waiting. Waiting for the guests and
//! re-identifying them happens in the daemon, in parallel, since that needs no fork.
//!
//! The helper dies with the daemon (`PR_SET_PDEATHSIG`), never mid-way through anything
//! the restarted daemon could not clean up: its VMMs are recorded as `starting` in the
//! registry before it is asked to create them. It reaps the VMMs it forked.
//!
//! Orders and answers are typed ([`Order`], [`Answer`], errors as
//! [`forkvm_api::ErrorCode`]) but carry no protocol version: the spawner is the daemon's
//! own binary, executed by it, so both ends are always the same build. (The VMM control
//! socket is versioned because a VMM outlives the daemon that started it.)

use forkvm_api::ErrorCode;
use forkvm_sandbox::start::restore::PendingRestore;
use forkvm_sandbox::start::rewind::PendingRewind;
use forkvm_sandbox::{Registry, SandboxRecord, SpawnOptions, SpawnSource, StartedVmms};
use forkvm_snapshot::Store;
use forkvm_vmm::host::jail::Jail;
use forkvm_vmm::host::seccomp::Seccomp;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

/// One spawn: VMMs with these ids from snapshot `tag`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SpawnOrder {
    pub tag: String,
    pub ids: Vec<String>,
    pub limits: SpawnOptions,
    /// Volumes to put into each child's slots (leased by the spawner once the rows exist).
    #[serde(default)]
    pub volumes: Vec<forkvm_sandbox::volumes::VolumeMount>,
}

/// Why the spawner could not start them: the library error's code and message.
#[derive(Debug, Clone, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct SpawnRefused {
    pub code: ErrorCode,
    pub message: String,
}

impl SpawnRefused {
    fn internal(message: String) -> SpawnRefused {
        SpawnRefused { code: ErrorCode::Internal, message }
    }
}

/// What the spawner is asked: every kind of VMM start (each forks).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Order {
    Spawn(SpawnOrder),
    /// Archived sandbox `id` from its archive ([`forkvm_sandbox::start::restore::start_restore`]).
    Restore {
        id: String,
    },
    /// Running sandbox `id` back at snapshot `tag`, in place
    /// ([`forkvm_sandbox::start::rewind::start_rewind`]).
    Rewind {
        id: String,
        tag: String,
    },
    /// New sandbox `id` cold-booted on a disk snapshot of `source`
    /// ([`forkvm_sandbox::start::disk::start_disk_fork`]).
    DiskFork {
        source: String,
        seq: Option<u64>,
        id: String,
        limits: SpawnOptions,
        #[serde(default)]
        restore: forkvm_sandbox::start::disk::DiskRestore,
    },
}

#[derive(Debug, Serialize, Deserialize)]
enum Answer {
    Started(StartedVmms),
    Restoring(PendingRestore),
    Rewinding(PendingRewind),
    Booting(SandboxRecord),
    Refused(SpawnRefused),
}

/// The API error for a refusal (`conflict_state`: the state a conflict reports).
pub fn refused(r: SpawnRefused, conflict_state: &str) -> crate::error::ApiError {
    let mut e = crate::error::ApiError::new(r.code, r.message);
    if e.code == ErrorCode::Conflict {
        e.state = Some(conflict_state.to_string());
    }
    e
}

/// The daemon's handle on its spawner.
#[derive(Debug)]
pub struct Spawner {
    stream: Mutex<BufReader<UnixStream>>,
    pid: libc::pid_t,
}

/// The hidden subcommand of the `forkvm` binary that runs [`main`].
pub const SPAWNER_COMMAND: &str = "__spawner";
/// The descriptor the spawner finds its socket on.
const SPAWNER_FD: RawFd = 3;
/// Environment variables the spawner does not get: the daemon's configuration (its
/// token file, TLS files and pack signing key among it) and a client's token.
fn withheld(var: &std::ffi::OsStr) -> bool {
    let var = var.to_string_lossy();
    var.starts_with("FORKVMD_") || var == "FORKVM_TOKEN"
}

impl Spawner {
    /// Starts the spawner: `exe __spawner` (`exe` is the `forkvm` binary) with the
    /// registry and store roots as arguments, its end of a socket pair as descriptor 3
    /// and nothing else inherited (every descriptor of ours is close-on-exec), stdin
    /// from /dev/null, our stdout and stderr for its logs.
    pub fn start(exe: &Path, registry: &Registry, store: &Store) -> std::io::Result<Spawner> {
        use std::os::unix::process::CommandExt;
        let (ours, theirs) = UnixStream::pair()?;
        let theirs_fd = theirs.as_raw_fd();
        let mut command = std::process::Command::new(exe);
        command
            .arg(SPAWNER_COMMAND)
            .arg("--parent")
            .arg(std::process::id().to_string())
            .arg("--run-root")
            .arg(registry.root())
            .arg("--store")
            .arg(store.root())
            .stdin(std::process::Stdio::null());
        if registry.seccomp() == Seccomp::Off {
            command.arg("--no-seccomp");
        }
        if registry.jail() == Jail::Off {
            command.arg("--no-jail");
        }
        for (var, _) in std::env::vars_os().filter(|(v, _)| withheld(v)) {
            command.env_remove(var);
        }
        // SAFETY: between fork and exec only async-signal-safe calls: dup2 (which also
        // clears close-on-exec on the copy), fcntl and prctl.
        unsafe {
            command.pre_exec(move || {
                // dup2 onto itself would keep close-on-exec: clear it instead.
                let moved = if theirs_fd == SPAWNER_FD {
                    libc::fcntl(SPAWNER_FD, libc::F_SETFD, 0)
                } else {
                    libc::dup2(theirs_fd, SPAWNER_FD)
                };
                if moved < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0);
                Ok(())
            });
        }
        let child = command.spawn()?;
        drop(theirs);
        Ok(Spawner { stream: Mutex::new(BufReader::new(ours)), pid: child.id() as libc::pid_t })
    }

    /// Starts the VMMs of `order` (blocking; call from a blocking thread).
    pub fn start_vmms(&self, order: &SpawnOrder) -> Result<StartedVmms, SpawnRefused> {
        match self.ask(&Order::Spawn(order.clone()))? {
            Answer::Started(s) => Ok(s),
            other => Err(self.unexpected(&other)),
        }
    }

    /// Starts archived sandbox `id`'s VMM (blocking); the guest is not yet answering.
    pub fn start_restore(&self, id: &str) -> Result<PendingRestore, SpawnRefused> {
        match self.ask(&Order::Restore { id: id.to_string() })? {
            Answer::Restoring(p) => Ok(p),
            other => Err(self.unexpected(&other)),
        }
    }

    /// Stops running sandbox `id`'s VMM and starts one from snapshot `tag` under the same
    /// id (blocking); the guest is not yet answering.
    pub fn start_rewind(&self, id: &str, tag: &str) -> Result<PendingRewind, SpawnRefused> {
        match self.ask(&Order::Rewind { id: id.to_string(), tag: tag.to_string() })? {
            Answer::Rewinding(p) => Ok(p),
            other => Err(self.unexpected(&other)),
        }
    }

    /// Restores a disk snapshot of `source` for new sandbox `id` and starts its cold boot
    /// (blocking); the guest is not yet answering.
    pub fn start_disk_fork(
        &self,
        source: &str,
        seq: Option<u64>,
        id: &str,
        limits: SpawnOptions,
        restore: forkvm_sandbox::start::disk::DiskRestore,
    ) -> Result<SandboxRecord, SpawnRefused> {
        let order = Order::DiskFork { source: source.into(), seq, id: id.into(), limits, restore };
        match self.ask(&order)? {
            Answer::Booting(r) => Ok(r),
            other => Err(self.unexpected(&other)),
        }
    }

    fn unexpected(&self, a: &Answer) -> SpawnRefused {
        SpawnRefused::internal(format!("the spawner (pid {}) answered {a:?}", self.pid))
    }

    fn ask(&self, order: &Order) -> Result<Answer, SpawnRefused> {
        let lost = |what: &str, e: &dyn std::fmt::Display| {
            SpawnRefused::internal(format!("the spawner process (pid {}): {what}: {e}", self.pid))
        };
        let mut line = serde_json::to_string(order).map_err(|e| lost("encoding the order", &e))?;
        line.push('\n');
        let mut stream = self.stream.lock().unwrap_or_else(|p| p.into_inner());
        stream.get_mut().write_all(line.as_bytes()).map_err(|e| lost("sending the order", &e))?;
        let mut answer = String::new();
        match stream.read_line(&mut answer) {
            Ok(0) => return Err(lost("reading its answer", &"it exited")),
            Ok(_) => {}
            Err(e) => return Err(lost("reading its answer", &e)),
        }
        match serde_json::from_str(&answer).map_err(|e| lost("decoding its answer", &e))? {
            Answer::Refused(r) => Err(r),
            other => Ok(other),
        }
    }
}

/// The spawner process (`forkvm __spawner --parent PID --run-root DIR --store DIR
/// [--no-seccomp] [--no-jail]`,
/// started by [`Spawner::start`]): serves orders on descriptor 3 until the daemon closes
/// it or dies; returns the exit code.
pub fn main(parent: libc::pid_t, run_root: &Path, store_root: &Path, seccomp: Seccomp, jail: Jail) -> i32 {
    // SAFETY: fcntl on a descriptor number; F_GETFD reads its flags only.
    if unsafe { libc::fcntl(SPAWNER_FD, libc::F_GETFD) } < 0 {
        eprintln!("forkvm {SPAWNER_COMMAND}: descriptor {SPAWNER_FD} is not open: only forkvmd starts the spawner");
        return 2;
    }
    // SAFETY: descriptor 3 is open (checked above) and owned by nothing else in this
    // process: the daemon put its end of the socket pair there for us.
    let stream = unsafe { UnixStream::from_raw_fd(SPAWNER_FD) };
    crate::own_cgroup::join(forkvm_vmm::host::cgroup::Service::Spawner);
    // The spawner finds dead sandboxes too (a restore checks the id is free): it salvages
    // like the daemon.
    let mut registry = Registry::open(run_root).salvaging_into(store_root);
    if seccomp == Seccomp::Off {
        registry = registry.without_seccomp();
    }
    if jail == Jail::Off {
        registry = registry.without_jail();
    }
    // Sandbox networks come from here: slots are made ahead, off the spawn path.
    if forkvm_sandbox::network::available() {
        forkvm_sandbox::network::pool::start();
    }
    serve(parent, stream, &registry, &Store::open(store_root))
}

/// The spawner's loop; returns its exit code.
fn serve(parent: libc::pid_t, stream: UnixStream, registry: &Registry, store: &Store) -> i32 {
    // SAFETY: prctl with integer arguments; getppid has no preconditions.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0);
        if libc::getppid() != parent {
            return 0; // the daemon died before the death signal was armed
        }
    }
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    let Ok(mut writer) = stream.try_clone() else { return 1 };
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    loop {
        reap_children();
        match reader.read_line(&mut line) {
            Ok(0) => return 0, // the daemon closed its end
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => continue,
            Err(_) => return 1,
        }
        let answer = match serde_json::from_str::<Order>(&line) {
            Ok(order) => execute(&order, registry, store),
            Err(e) => Answer::Refused(SpawnRefused::internal(format!("bad order: {e}"))),
        };
        line.clear();
        let Ok(mut out) = serde_json::to_string(&answer) else { return 1 };
        out.push('\n');
        if writer.write_all(out.as_bytes()).is_err() {
            return 0;
        }
    }
}

fn execute(order: &Order, registry: &Registry, store: &Store) -> Answer {
    let refused = |code: ErrorCode, message: String| Answer::Refused(SpawnRefused { code, message });
    let order = match order {
        Order::Spawn(o) => o,
        Order::Restore { id } => {
            return match forkvm_sandbox::start::restore::start_restore(registry, store, id) {
                Ok(p) => Answer::Restoring(p),
                Err(e) => refused(e.code(), e.to_string()),
            }
        }
        Order::Rewind { id, tag } => {
            return match forkvm_sandbox::start::rewind::start_rewind(registry, store, id, tag) {
                Ok(p) => Answer::Rewinding(p),
                Err(e) => refused(e.code(), e.to_string()),
            }
        }
        Order::DiskFork { source, seq, id, limits, restore } => {
            return match forkvm_sandbox::start::disk::start_disk_fork(
                registry, store, source, *seq, id, *restore, limits,
            ) {
                Ok(r) => Answer::Booting(r.record),
                Err(e) => refused(e.code(), e.to_string()),
            };
        }
    };
    let source = match SpawnSource::from_tag(store, &order.tag) {
        Ok(s) => s,
        Err(e) => return refused(e.code(), e.to_string()),
    };
    match forkvm_sandbox::start_vmms_with(registry, &source, &order.ids, &order.limits, &order.volumes) {
        Ok(started) => Answer::Started(started),
        Err(e) => refused(e.code(), e.to_string()),
    }
}

/// Reaps VMMs that stopped, so they do not linger as zombies of the spawner.
fn reap_children() {
    loop {
        let mut status = 0;
        // SAFETY: waitpid on any child, non-blocking; `status` is a valid out pointer.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid <= 0 {
            return;
        }
    }
}
