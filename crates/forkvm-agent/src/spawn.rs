//! Starting an exec's process without forking the agent.
//!
//! `fork` copies the agent's page tables and then makes every page the agent writes
//! afterwards a copy-on-write fault; where the guest kernel is emulated (PVM hosts, see
//! PLATFORM.md) each fault costs milliseconds and an exec paid seconds for them.
//! `posix_spawn` (glibc: `clone(CLONE_VM | CLONE_VFORK)`) shares the agent's memory until
//! the child execs, so none of that happens. Everything the child needs is prepared here
//! first: the program found on `PATH`, argv and envp as C strings, the pipes.
//!
//! The child gets an empty signal mask and every signal at its default action (the agent
//! blocks SIGCHLD, std ignores SIGPIPE, and whatever started the agent may have ignored
//! others), its own process group, and stdin, stdout and stderr on the given pipes.
//!
//! `posix_spawn` cannot switch users. An exec that names a guest user starts the agent's
//! own binary as a trampoline, `forkvm-agent as-user UID GID GROUPS -- PATH ARGV...`
//! ([`as_user_main`]), which drops to the user and execs the program: one small exec of a
//! static binary instead of a fork of the agent.

use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The `PATH` a child searches when neither the request nor the agent sets one (and the
/// one the agent sets for itself as PID 1).
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The trampoline's subcommand (see the module doc).
pub const AS_USER: &str = "as-user";

/// The ids a child switches to before it execs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserIds {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

/// A process to start: what `posix_spawn` gets, all prepared before the clone.
#[derive(Debug)]
pub struct Program {
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    cwd: Option<PathBuf>,
    user: Option<UserIds>,
    stdin_piped: bool,
    /// A terminal's slave to run on, as the controlling terminal of a new session.
    terminal: Option<PathBuf>,
}

/// A started process: its pid (also its process group) and the agent's ends of its pipes
/// (none on a terminal: the caller holds its master).
#[derive(Debug)]
pub struct Spawned {
    pub pid: libc::pid_t,
    pub stdin: Option<File>,
    pub stdout: Option<File>,
    pub stderr: Option<File>,
}

impl Program {
    /// `args[0]` with the rest as arguments, in the agent's environment.
    pub fn new(args: Vec<OsString>) -> Program {
        Program { args, env: std::env::vars_os().collect(), cwd: None, user: None, stdin_piped: false, terminal: None }
    }

    /// Sets (or replaces) one environment variable.
    pub fn env(&mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> &mut Program {
        let (key, value) = (key.into(), value.into());
        match self.env.iter_mut().find(|(k, _)| *k == key) {
            Some(entry) => entry.1 = value,
            None => self.env.push((key, value)),
        }
        self
    }

    pub fn current_dir(&mut self, dir: impl Into<PathBuf>) -> &mut Program {
        self.cwd = Some(dir.into());
        self
    }

    pub fn has_cwd(&self) -> bool {
        self.cwd.is_some()
    }

    pub fn user(&mut self, ids: UserIds) -> &mut Program {
        self.user = Some(ids);
        self
    }

    /// Gives the child a pipe on stdin (otherwise `/dev/null`).
    pub fn stdin_piped(&mut self, piped: bool) -> &mut Program {
        self.stdin_piped = piped;
        self
    }

    /// Runs the program on the terminal whose slave is `slave`: it leads a new session
    /// (and process group) whose controlling terminal that is, with stdin, stdout and
    /// stderr on it.
    pub fn on_terminal(&mut self, slave: impl Into<PathBuf>) -> &mut Program {
        self.terminal = Some(slave.into());
        self
    }

    /// Where the program is: as given if it has a `/`, else the first executable file of
    /// that name on the child's `PATH`, as `execvp` would search it.
    fn resolve(&self) -> io::Result<PathBuf> {
        let name = self.args.first().map(OsString::as_os_str).unwrap_or_default();
        if name.is_empty() {
            return Err(io::Error::new(io::ErrorKind::NotFound, "the command is empty"));
        }
        if name.as_bytes().contains(&b'/') {
            return Ok(PathBuf::from(name));
        }
        let path = self.env.iter().find(|(k, _)| k == "PATH").map(|(_, v)| v.as_os_str());
        let path = path.unwrap_or(OsStr::new(DEFAULT_PATH));
        let mut denied = None;
        for dir in path.as_bytes().split(|b| *b == b':') {
            let dir = if dir.is_empty() { Path::new(".") } else { Path::new(OsStr::from_bytes(dir)) };
            let candidate = dir.join(name);
            match executable(&candidate) {
                Ok(true) => return Ok(candidate),
                Ok(false) => {}
                Err(e) => denied = denied.or(Some(e)),
            }
        }
        Err(denied.unwrap_or_else(|| io::Error::new(io::ErrorKind::NotFound, "not found on PATH")))
    }

    /// The path `posix_spawn` runs and the argv it passes: the program itself, or the
    /// agent's trampoline in front of it when a user is to be switched to.
    fn argv(&self, resolved: PathBuf) -> io::Result<(CString, Vec<CString>)> {
        let args = self.args.iter().map(|a| cstring(a.as_bytes()));
        let Some(ids) = &self.user else {
            return Ok((cstring(resolved.as_os_str().as_bytes())?, args.collect::<io::Result<_>>()?));
        };
        let agent = agent_binary()?;
        let groups = ids.groups.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
        let mut argv = vec![
            cstring(b"forkvm-agent")?,
            cstring(AS_USER.as_bytes())?,
            cstring(ids.uid.to_string().as_bytes())?,
            cstring(ids.gid.to_string().as_bytes())?,
            cstring(groups.as_bytes())?,
            cstring(b"--")?,
            cstring(resolved.as_os_str().as_bytes())?,
        ];
        for a in args {
            argv.push(a?);
        }
        Ok((cstring(agent.as_os_str().as_bytes())?, argv))
    }

    /// Starts the process (through [`crate::reaper::Reaper::spawn_program`], which
    /// registers its waiter atomically with respect to reaping).
    pub fn spawn(&self) -> io::Result<Spawned> {
        let (path, argv) = self.argv(self.resolve()?)?;
        let envp = self
            .env
            .iter()
            .map(|(k, v)| cstring(&[k.as_bytes(), b"=", v.as_bytes()].concat()))
            .collect::<io::Result<Vec<_>>>()?;
        let cwd = self.cwd.as_ref().map(|d| cstring(d.as_os_str().as_bytes())).transpose()?;
        let mut actions = FileActions::new()?;
        let mut ours = (None, None, None);
        match &self.terminal {
            // Opened in the child after its setsid (without O_NOCTTY): the session's
            // controlling terminal.
            Some(slave) => {
                let slave = cstring(slave.as_os_str().as_bytes())?;
                actions.open(0, &slave, libc::O_RDWR)?;
                actions.dup2_raw(0, 1)?;
                actions.dup2_raw(0, 2)?;
            }
            None => {
                let (stdin_child, stdin_ours) = if self.stdin_piped {
                    let (r, w) = pipe()?;
                    (r, Some(w))
                } else {
                    (OwnedFd::from(File::open("/dev/null")?), None)
                };
                let (stdout_ours, stdout_child) = pipe()?;
                let (stderr_ours, stderr_child) = pipe()?;
                actions.dup2(&stdin_child, 0)?;
                actions.dup2(&stdout_child, 1)?;
                actions.dup2(&stderr_child, 2)?;
                // The child's ends live until the spawn is done (posix_spawn dups them).
                actions.keep([stdin_child, stdout_child, stderr_child]);
                ours = (stdin_ours, Some(stdout_ours), Some(stderr_ours));
            }
        }
        if let Some(cwd) = &cwd {
            actions.chdir(cwd)?;
        }
        let attrs = Attrs::new(self.terminal.is_some())?;
        let argv_ptrs = null_terminated(&argv);
        let envp_ptrs = null_terminated(&envp);
        let mut pid: libc::pid_t = 0;
        // SAFETY: every pointer refers to a NUL-terminated string or a null-terminated
        // array of them that outlives the call; the actions and attributes are
        // initialized; glibc's posix_spawn returns the child's exec error, if any.
        let rc = unsafe {
            libc::posix_spawn(&mut pid, path.as_ptr(), &actions.0, &attrs.0, argv_ptrs.as_ptr(), envp_ptrs.as_ptr())
        };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        Ok(Spawned {
            pid,
            stdin: ours.0.map(File::from),
            stdout: ours.1.map(File::from),
            stderr: ours.2.map(File::from),
        })
    }
}

/// The agent's own binary, the trampoline: read from `/proc/self/exe` once, not per exec.
fn agent_binary() -> io::Result<&'static Path> {
    static AGENT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    if let Some(path) = AGENT.get() {
        return Ok(path);
    }
    let path = std::env::current_exe()?;
    Ok(AGENT.get_or_init(|| path))
}

/// Whether `path` is a regular file this process may execute; an error only for a file
/// that is there but not executable (so "permission denied" is reported over "not found").
fn executable(path: &Path) -> io::Result<bool> {
    let Ok(meta) = std::fs::metadata(path) else { return Ok(false) };
    if !meta.is_file() {
        return Ok(false);
    }
    let c = cstring(path.as_os_str().as_bytes())?;
    // SAFETY: access(2) reads a NUL-terminated path and nothing else.
    if unsafe { libc::access(c.as_ptr(), libc::X_OK) } == 0 {
        Ok(true)
    } else {
        Err(io::Error::last_os_error())
    }
}

fn cstring(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in the command"))
}

fn null_terminated(strings: &[CString]) -> Vec<*mut libc::c_char> {
    strings.iter().map(|s| s.as_ptr().cast_mut()).chain(std::iter::once(std::ptr::null_mut())).collect()
}

/// A close-on-exec pipe, (read end, write end), both above the standard descriptors (so
/// the child's `dup2` onto 0, 1 and 2 never meets one of them there).
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 just returned these descriptors; nothing else owns them.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    Ok((above_stdio(r)?, above_stdio(w)?))
}

fn above_stdio(fd: OwnedFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    // SAFETY: F_DUPFD_CLOEXEC makes a new descriptor ≥ 3 for an open one.
    let new = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
    if new < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fcntl just returned this descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}

/// `posix_spawn_file_actions_t`, destroyed when dropped, with the descriptors its
/// actions name kept open as long as it lives.
struct FileActions(libc::posix_spawn_file_actions_t, Vec<OwnedFd>);

impl FileActions {
    fn new() -> io::Result<FileActions> {
        // SAFETY: plain C struct, initialized by the call below before any other use.
        let mut actions: libc::posix_spawn_file_actions_t = unsafe { std::mem::zeroed() };
        // SAFETY: `actions` is writable.
        check(unsafe { libc::posix_spawn_file_actions_init(&mut actions) })?;
        Ok(FileActions(actions, Vec::new()))
    }

    fn dup2(&mut self, fd: &OwnedFd, to: libc::c_int) -> io::Result<()> {
        self.dup2_raw(fd.as_raw_fd(), to)
    }

    /// A dup2 in the child of a descriptor it has by then (`fd` open in the caller until
    /// the spawn, or made by an earlier action).
    fn dup2_raw(&mut self, fd: libc::c_int, to: libc::c_int) -> io::Result<()> {
        // SAFETY: initialized actions; glibc records the numbers.
        check(unsafe { libc::posix_spawn_file_actions_adddup2(&mut self.0, fd, to) })
    }

    /// Opens `path` in the child as descriptor `to`.
    fn open(&mut self, to: libc::c_int, path: &CString, flags: libc::c_int) -> io::Result<()> {
        // SAFETY: initialized actions; glibc copies the path.
        check(unsafe { libc::posix_spawn_file_actions_addopen(&mut self.0, to, path.as_ptr(), flags, 0) })
    }

    /// Keeps `fds` open until the actions are dropped (after the spawn).
    fn keep(&mut self, fds: impl IntoIterator<Item = OwnedFd>) {
        self.1.extend(fds);
    }

    fn chdir(&mut self, dir: &CString) -> io::Result<()> {
        // SAFETY: initialized actions; glibc copies the path.
        check(unsafe { libc::posix_spawn_file_actions_addchdir_np(&mut self.0, dir.as_ptr()) })
    }
}

impl Drop for FileActions {
    fn drop(&mut self) {
        // SAFETY: initialized in `new`, destroyed once.
        unsafe { libc::posix_spawn_file_actions_destroy(&mut self.0) };
    }
}

/// `posix_spawnattr_t`: empty mask, every signal at its default, a new process group
/// (or, with `session`, a new session, which leads its own group).
struct Attrs(libc::posix_spawnattr_t);

impl Attrs {
    fn new(session: bool) -> io::Result<Attrs> {
        // SAFETY: plain C structs, initialized by the calls below before any other use.
        let (mut raw, mut empty, mut all): (libc::posix_spawnattr_t, libc::sigset_t, libc::sigset_t) =
            unsafe { (std::mem::zeroed(), std::mem::zeroed(), std::mem::zeroed()) };
        // SAFETY: each call gets initialized, writable structures of its own types.
        unsafe {
            check(libc::posix_spawnattr_init(&mut raw))?;
            let mut attrs = Attrs(raw);
            libc::sigemptyset(&mut empty);
            libc::sigfillset(&mut all);
            // glibc's sigfillset leaves out its own two signals (32 and 33) and its
            // posix_spawn sets those to ignored unless they are in this set: put them in
            // by their bits (sigaddset refuses them), so no exec inherits them ignored.
            let words: *mut u64 = (&mut all as *mut libc::sigset_t).cast();
            *words |= (1 << 31) | (1 << 32);
            check(libc::posix_spawnattr_setsigmask(&mut attrs.0, &empty))?;
            check(libc::posix_spawnattr_setsigdefault(&mut attrs.0, &all))?;
            let mut flags = libc::POSIX_SPAWN_SETSIGMASK | libc::POSIX_SPAWN_SETSIGDEF;
            if session {
                flags |= libc::c_int::from(libc::POSIX_SPAWN_SETSID);
            } else {
                check(libc::posix_spawnattr_setpgroup(&mut attrs.0, 0))?;
                flags |= libc::POSIX_SPAWN_SETPGROUP;
            }
            check(libc::posix_spawnattr_setflags(&mut attrs.0, flags as libc::c_short))?;
            Ok(attrs)
        }
    }
}

impl Drop for Attrs {
    fn drop(&mut self) {
        // SAFETY: initialized in `new`, destroyed once.
        unsafe { libc::posix_spawnattr_destroy(&mut self.0) };
    }
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(rc))
    }
}

/// `forkvm-agent as-user UID GID GROUPS -- PATH ARGV...`: switches to the user (groups,
/// gid, uid, in that order) and execs PATH with ARGV in this environment. Returns only on
/// failure, with the exit code (126: the switch failed; 127: the exec did).
pub fn as_user_main(args: Vec<OsString>) -> i32 {
    let usage = "usage: forkvm-agent as-user UID GID GROUP,... -- PATH ARGV0 [ARG...]";
    let text = |i: usize| args.get(i).and_then(|a| a.to_str());
    let (Some(uid), Some(gid), Some(groups), Some("--"), Some(path)) = (
        text(0).and_then(|u| u.parse::<u32>().ok()),
        text(1).and_then(|g| g.parse::<u32>().ok()),
        text(2),
        text(3),
        args.get(4),
    ) else {
        eprintln!("{usage}");
        return 126;
    };
    let groups: Result<Vec<libc::gid_t>, _> =
        groups.split(',').filter(|g| !g.is_empty()).map(str::parse::<u32>).collect();
    let Ok(groups) = groups else {
        eprintln!("{usage}");
        return 126;
    };
    // SAFETY: plain system calls on a local array of its length.
    unsafe {
        if libc::setgroups(groups.len(), groups.as_ptr()) != 0 || libc::setgid(gid) != 0 || libc::setuid(uid) != 0 {
            eprintln!("forkvm-agent as-user: switching to uid {uid}: {}", io::Error::last_os_error());
            return 126;
        }
    }
    let argv: io::Result<Vec<CString>> = args[5..].iter().map(|a| cstring(a.as_bytes())).collect();
    let (Ok(path), Ok(argv)) = (cstring(path.as_bytes()), argv) else {
        eprintln!("forkvm-agent as-user: a NUL byte in the command");
        return 127;
    };
    let ptrs = null_terminated(&argv);
    // SAFETY: NUL-terminated path and a null-terminated argv that outlive the call.
    unsafe { libc::execv(path.as_ptr(), ptrs.as_ptr().cast()) };
    eprintln!("forkvm-agent as-user: {}: {}", path.to_string_lossy(), io::Error::last_os_error());
    127
}

/// The trampoline's arguments after the subcommand, if this process is the trampoline.
pub fn as_user_args() -> Option<Vec<OsString>> {
    let mut args = std::env::args_os().skip(1);
    (args.next().as_deref() == Some(OsStr::new(AS_USER))).then(|| args.collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn wait(pid: libc::pid_t) -> i32 {
        let mut status = 0;
        // SAFETY: waiting for our own child into a local.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        status
    }

    #[test]
    fn a_program_on_path_runs_in_its_directory_and_group_with_its_environment() {
        let dir = tempfile::tempdir().unwrap();
        let mut p =
            Program::new(vec!["sh".into(), "-c".into(), "pwd; echo $GREETING; cut -d' ' -f5 /proc/$$/stat".into()]);
        p.env("GREETING", "hi").current_dir(dir.path());
        let s = p.spawn().unwrap();
        let mut out = String::new();
        { s.stdout.unwrap() }.read_to_string(&mut out).unwrap();
        assert_eq!(wait(s.pid), 0);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], dir.path().canonicalize().unwrap().to_str().unwrap());
        assert_eq!(lines[1], "hi");
        assert_eq!(lines[2].trim(), s.pid.to_string(), "the child leads its own process group");
    }

    #[test]
    fn a_missing_program_or_a_nul_byte_is_an_error_before_anything_starts() {
        let e = Program::new(vec!["no-such-program-here".into()]).spawn().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
        let e = Program::new(vec!["/no/such/program".into()]).spawn().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
        let e = Program::new(vec![]).spawn().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
        let e = Program::new(vec!["echo".into(), "a\0b".into()]).spawn().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
    }

    #[test]
    fn the_child_starts_with_no_signal_blocked_or_ignored_not_even_glibcs_own() {
        // SAFETY: ignoring SIGUSR1 in this test process, as something that started the
        // agent might have; restored below.
        let old = unsafe { libc::signal(libc::SIGUSR1, libc::SIG_IGN) };
        let s = Program::new(vec!["sh".into(), "-c".into(), "grep -E '^Sig(Blk|Ign)' /proc/self/status".into()])
            .spawn()
            .unwrap();
        // SAFETY: restores the disposition saved above.
        unsafe { libc::signal(libc::SIGUSR1, old) };
        let mut out = String::new();
        { s.stdout.unwrap() }.read_to_string(&mut out).unwrap();
        assert_eq!(wait(s.pid), 0);
        assert_eq!(out, "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n");
    }

    #[test]
    fn stdin_is_null_unless_piped() {
        let s = Program::new(vec!["cat".into()]).spawn().unwrap();
        assert!(s.stdin.is_none());
        let mut out = Vec::new();
        { s.stdout.unwrap() }.read_to_end(&mut out).unwrap();
        assert_eq!((wait(s.pid), out.len()), (0, 0));
    }
}
