//! Running an image build's package-manager steps without host root.
//!
//! A Debian image is made by apt, by dpkg's maintainer scripts and by pip: code from
//! package archives, run as root inside the tree it builds. Here that root is the root
//! of a user namespace whose ids map onto an unprivileged host range ([`IdRange`]), so
//! the code can write only what the build gave it: on the host its files belong to that
//! range, and host root's files are "nobody" to it (no `CAP_DAC_OVERRIDE` over them).
//!
//! The build also gets a private mount namespace in which its own directory is mounted
//! over `/tmp`. That is the one path it needs: the forkvm cache (under `/root` for the
//! daemon) is not searchable by the range, and nothing of the build is mounted where the
//! host can see it. The ext4 image is made in the same namespace, so `mkfs.ext4 -d`
//! reads the tree's owners as the guest will see them (`0`, not the host range).
//!
//! Only host root can map an arbitrary range (`CAP_SETUID` in the initial namespace),
//! which the old debootstrap build needed anyway; a non-root user gets a clear error.

use super::build::RootfsError;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

/// Where the build's directory appears inside its mount namespace.
pub const BUILD_DIR: &str = "/tmp";

/// systemd's "foreign UID range" (0x7FFE0000, 65536 ids): reserved for files of OS
/// images that are not the host's own, which is what a guest image's tree is.
const DEFAULT_BASE: u32 = 0x7FFE_0000;
const DEFAULT_COUNT: u32 = 65536;

/// The host ids a build's user namespace maps its ids `0..count` onto.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdRange {
    pub host_base: u32,
    pub count: u32,
}

impl IdRange {
    /// The range for builds: the first `/etc/subuid` range of the user running the
    /// build (by name or uid) with at least 65536 ids, else the foreign range.
    pub fn configured() -> IdRange {
        let uid = euid();
        let name = user_name(uid);
        std::fs::read_to_string("/etc/subuid")
            .ok()
            .and_then(|text| parse_subuid(&text, name.as_deref(), uid))
            .unwrap_or(IdRange { host_base: DEFAULT_BASE, count: DEFAULT_COUNT })
    }

    fn map_line(&self) -> String {
        format!("0 {} {}\n", self.host_base, self.count)
    }
}

fn euid() -> u32 {
    // SAFETY: geteuid cannot fail and touches no memory.
    unsafe { libc::geteuid() }
}

fn user_name(uid: u32) -> Option<String> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|l| {
        let mut f = l.split(':');
        let (name, _, id) = (f.next()?, f.next()?, f.next()?);
        (id.parse::<u32>().ok()? == uid).then(|| name.to_string())
    })
}

/// The first `/etc/subuid` line for `name` or `uid` with at least 65536 ids.
fn parse_subuid(text: &str, name: Option<&str>, uid: u32) -> Option<IdRange> {
    text.lines().find_map(|l| {
        let mut f = l.trim().split(':');
        let (who, base, count) = (f.next()?, f.next()?.parse::<u32>().ok()?, f.next()?.parse::<u32>().ok()?);
        let mine = Some(who) == name || who.parse::<u32>().ok() == Some(uid);
        (mine && count >= DEFAULT_COUNT && base > 0 && base.checked_add(DEFAULT_COUNT).is_some())
            .then_some(IdRange { host_base: base, count: DEFAULT_COUNT })
    })
}

/// Makes `dir` the build's directory: owned by the range's root, searchable by it.
pub fn prepare_build_dir(dir: &Path, ids: IdRange) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    std::os::unix::fs::chown(dir, Some(ids.host_base), Some(ids.host_base))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
}

/// Runs `cmd` as root of a user namespace mapped onto `ids`, with `build_dir` (made by
/// [`prepare_build_dir`]) mounted over `/tmp` and as its working directory, umask 022.
/// Its output goes to `log`; a failure names `step` and the log.
pub fn run_confined(
    step: &str,
    cmd: &mut Command,
    ids: IdRange,
    build_dir: &Path,
    log: &Path,
) -> Result<(), RootfsError> {
    let spawn_err = |source: std::io::Error| RootfsError::Spawn { step: step.into(), source };
    if euid() != 0 {
        return Err(RootfsError::NotRoot { step: step.into() });
    }
    let src = std::ffi::CString::new(build_dir.as_os_str().as_bytes())
        .map_err(|_| spawn_err(std::io::Error::other("the build directory's path holds a NUL")))?;
    let target = c"/tmp";
    let (ready_r, ready_w) = pipe().map_err(spawn_err)?;
    let (go_r, go_w) = pipe().map_err(spawn_err)?;
    let (ready_r_fd, ready_w_fd, go_r_fd, go_w_fd) =
        (ready_r.as_raw_fd(), ready_w.as_raw_fd(), go_r.as_raw_fd(), go_w.as_raw_fd());
    // SAFETY: the closure makes only raw system calls on memory it owns or that was
    // prepared before the fork (the CStrings, moved in), so it is async-signal-safe.
    unsafe {
        cmd.pre_exec(move || enter_namespaces(ready_r_fd, ready_w_fd, go_r_fd, go_w_fd, &src, target));
    }
    cmd.env("TMPDIR", BUILD_DIR).current_dir("/");
    // The child blocks in `pre_exec` until its maps are written, and `output()` blocks
    // this thread until the child has exec'd: another thread writes them.
    let mapper = std::thread::spawn(move || write_maps(ready_r, go_w, ids));
    let out = cmd.output();
    drop(ready_w); // so the mapper sees EOF if the child never got as far as writing
    drop(go_r);
    let mapped = mapper.join().unwrap_or_else(|_| Err(std::io::Error::other("the id mapper panicked")));
    if let Err(e) = mapped {
        return Err(RootfsError::UserNamespace { step: step.into(), source: e });
    }
    super::build::log_outcome(step, out.map_err(spawn_err)?, log)
}

/// A close-on-exec pipe: (read end, write end).
pub(crate) fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two fds into the array it is given.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both fds were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// The parent's half: reads the child's pid, writes its uid and gid maps, lets it go.
/// `Ok` without writing when the child never asked (it failed before).
fn write_maps(ready: OwnedFd, go: OwnedFd, ids: IdRange) -> std::io::Result<()> {
    let mut pid = [0u8; 4];
    let mut ready = std::fs::File::from(ready);
    if ready.read_exact(&mut pid).is_err() {
        return Ok(());
    }
    let pid = i32::from_ne_bytes(pid);
    let line = ids.map_line();
    for map in ["uid_map", "gid_map"] {
        std::fs::write(format!("/proc/{pid}/{map}"), &line)
            .map_err(|e| std::io::Error::new(e.kind(), format!("writing /proc/{pid}/{map} ({}): {e}", line.trim())))?;
    }
    std::fs::File::from(go).write_all(b"1")
}

fn check(ret: libc::c_int) -> std::io::Result<()> {
    if ret == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The child's half, between fork and exec: a private mount namespace with the build
/// directory over `/tmp`, then a user namespace, then (once mapped) uid and gid 0 in it.
fn enter_namespaces(
    ready_r: i32,
    ready_w: i32,
    go_r: i32,
    go_w: i32,
    src: &std::ffi::CStr,
    target: &std::ffi::CStr,
) -> std::io::Result<()> {
    // SAFETY: raw system calls on fds this child owns and on NUL-terminated strings
    // that outlive the calls; none of them allocates.
    unsafe {
        // The parent's ends: closed here, so EOF reaches each side if the other dies.
        libc::close(ready_r);
        libc::close(go_w);
        check(libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0))?;
        check(libc::unshare(libc::CLONE_NEWNS))?;
        check(libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ))?;
        check(libc::mount(src.as_ptr(), target.as_ptr(), std::ptr::null(), libc::MS_BIND, std::ptr::null()))?;
        check(libc::unshare(libc::CLONE_NEWUSER))?;
        let pid = libc::getpid().to_ne_bytes();
        if libc::write(ready_w, pid.as_ptr().cast(), pid.len()) != pid.len() as isize {
            return Err(std::io::Error::last_os_error());
        }
        libc::close(ready_w);
        let mut go = 0u8;
        if libc::read(go_r, (&mut go as *mut u8).cast(), 1) != 1 {
            return Err(std::io::Error::from_raw_os_error(libc::EPERM));
        }
        libc::close(go_r);
        check(libc::setgroups(0, std::ptr::null()))?;
        check(libc::setresgid(0, 0, 0))?;
        check(libc::setresuid(0, 0, 0))?;
        check(libc::chdir(target.as_ptr()))?;
        libc::umask(0o022);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subuid_lines_pick_the_users_first_big_enough_range() {
        let text = "alice:100000:65536\nroot:200000:1000\nroot:300000:65536\n0:400000:65536\n";
        assert_eq!(parse_subuid(text, Some("root"), 0), Some(IdRange { host_base: 300000, count: 65536 }));
        assert_eq!(
            parse_subuid("0:400000:70000\n", Some("root"), 0),
            Some(IdRange { host_base: 400000, count: 65536 })
        );
        assert_eq!(parse_subuid(text, Some("bob"), 1001), None);
        assert_eq!(parse_subuid("root:x:65536\nroot:0:65536\n", Some("root"), 0), None);
    }

    /// What runs in the build's namespace is root there and nobody on the host: it can
    /// write its build directory (owned by the range on the host) and nothing of host
    /// root's, and the directory is its `/tmp`.
    #[test]
    fn a_confined_step_is_root_inside_and_unprivileged_outside() {
        if euid() != 0 {
            eprintln!("skipped: needs root to map a user namespace");
            return;
        }
        let host = tempfile::tempdir().unwrap();
        let (build, victim) = (host.path().join("build"), host.path().join("victim"));
        std::fs::create_dir(&victim).unwrap();
        std::fs::write(victim.join("file"), "host root's").unwrap();
        let ids = IdRange { host_base: DEFAULT_BASE, count: DEFAULT_COUNT };
        prepare_build_dir(&build, ids).unwrap();
        let script = format!(
            "id -u > /tmp/id; echo pwned > {v}/file 2>/dev/null; echo x > {v}/new 2>/dev/null; \
             mkdir /tmp/made; touch /tmp/made/f; test \"$TMPDIR\" = /tmp",
            v = victim.display()
        );
        let log = host.path().join("log");
        run_confined("probe", Command::new("sh").args(["-c", &script]), ids, &build, &log)
            .unwrap_or_else(|e| panic!("{e}: {}", std::fs::read_to_string(&log).unwrap_or_default()));
        assert_eq!(std::fs::read_to_string(build.join("id")).unwrap().trim(), "0");
        assert_eq!(std::fs::read_to_string(victim.join("file")).unwrap(), "host root's");
        assert!(!victim.join("new").exists());
        use std::os::unix::fs::MetadataExt;
        let made = std::fs::metadata(build.join("made/f")).unwrap();
        assert_eq!((made.uid(), made.gid(), made.mode() & 0o777), (DEFAULT_BASE, DEFAULT_BASE, 0o644));
        // The mount was the child's own: nothing is left mounted on the host's /tmp.
        assert!(!Path::new("/tmp/made").exists());
        let failing = run_confined("failing step", Command::new("sh").args(["-c", "exit 3"]), ids, &build, &log);
        let e = failing.unwrap_err().to_string();
        assert!(e.contains("failing step") && e.contains("exit status: 3"), "{e}");
    }
}
