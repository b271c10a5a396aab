use super::*;

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Runs `body` in a forked child that entered `jail`; its exit code.
fn in_jail(jail: &JailNamespaces, body: impl FnOnce() -> i32) -> i32 {
    // SAFETY: the child makes system calls and filesystem checks only, and leaves by _exit.
    let pid = jail.forking_into(|| unsafe { libc::fork() }).unwrap();
    assert!(pid >= 0, "fork");
    if pid == 0 {
        let code = match jail.enter() {
            Ok(()) => body(),
            Err(e) => {
                eprintln!("{e}");
                99
            }
        };
        // SAFETY: ends the child without running the test harness's destructors.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(libc::WIFEXITED(status), "child status {status:#x}");
    libc::WEXITSTATUS(status)
}

#[test]
fn layout_keeps_the_widest_bind_and_only_hides_inside_binds() {
    let dir = tempfile::tempdir().unwrap();
    let sub = dir.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    let l = JailLayout::new()
        .bind(&sub, false)
        .bind(dir.path(), true)
        .bind(&sub, true)
        .bind(Path::new("/no/such/path"), true);
    assert_eq!(l.binds().len(), 1, "{l:?}");
    assert!(l.binds()[0].writable);
    let l = l.hide(&sub).hide(Path::new("/etc"));
    assert_eq!(l.hidden(), &[sub.canonicalize().unwrap()]);
    assert!(l.covers(&dir.path().join("file")));
    assert!(!l.covers(&sub.join("file")));
    assert!(!l.covers(Path::new("/etc/passwd")));
}

/// Inside: the bound directory is there (read-write), the hidden one is empty and
/// unreadable, the root is read-only, nothing else of the host is named (no /etc, /proc),
/// and the namespaces are not the test's.
#[test]
fn a_child_in_the_jail_sees_only_its_binds() {
    if !is_root() {
        eprintln!("skipped: making a jail needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::create_dir(&secret).unwrap();
    std::fs::write(secret.join("token"), "t0ken").unwrap();
    std::fs::write(dir.path().join("visible"), "hello").unwrap();
    let layout = JailLayout::new().bind(dir.path(), true).bind(Path::new("/dev/null"), true).hide(&secret);
    let (made, cpu) = (std::time::Instant::now(), crate::phase_timer::thread_cpu_time());
    let jail = JailNamespaces::shared(&layout).unwrap();
    eprintln!(
        "making the jail: {:?} wall, {:?} CPU of this thread (the helper's own CPU not included)",
        made.elapsed(),
        crate::phase_timer::thread_cpu_time().saturating_sub(cpu)
    );
    let again = JailNamespaces::shared(&layout).unwrap();
    assert!(Arc::ptr_eq(&jail, &again), "one jail per layout and process");
    let our_net = std::fs::read_link("/proc/self/ns/net").unwrap();
    let dir_path = dir.path().canonicalize().unwrap();
    let code = in_jail(&jail, || {
        let checks: [(&str, bool); 10] = [
            ("in the pid namespace after its init", std::process::id() == 2),
            ("bound file readable", std::fs::read_to_string(dir_path.join("visible")).is_ok_and(|s| s == "hello")),
            ("bound dir writable", std::fs::write(dir_path.join("written"), "x").is_ok()),
            ("hidden token unreadable", std::fs::read(dir_path.join("secret/token")).is_err()),
            ("no /etc/passwd", !Path::new("/etc/passwd").exists()),
            ("no /proc", !Path::new("/proc/self").exists()),
            ("root read-only", std::fs::create_dir("/escape").is_err()),
            ("/dev/null usable", std::fs::write("/dev/null", "x").is_ok()),
            ("cwd is /", std::env::current_dir().is_ok_and(|d| d == Path::new("/"))),
            ("host name", {
                let mut buf = [0u8; 64];
                // SAFETY: gethostname writes at most buf.len() bytes.
                unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) == 0 && buf.starts_with(b"forkvm\0") }
            }),
        ];
        match checks.iter().position(|(_, ok)| !ok) {
            None => 0,
            Some(i) => {
                eprintln!("jail check failed: {}", checks[i].0);
                10 + i as i32
            }
        }
    });
    assert_eq!(code, 0, "a check in the jail failed (see stderr)");
    assert_eq!(std::fs::read_to_string(dir.path().join("written")).unwrap(), "x");
    // The child's namespaces were not ours: its net namespace is the helper's.
    let theirs = &jail.namespaces.iter().find(|(n, _, _)| *n == "net").unwrap().2;
    let theirs = std::fs::read_link(format!("/proc/self/fd/{}", theirs.as_raw_fd())).unwrap();
    assert_ne!(theirs, our_net);
}

/// A layout whose path cannot be bound fails naming the step, and nothing is kept.
#[test]
fn a_bad_layout_fails_naming_the_step() {
    if !is_root() {
        eprintln!("skipped: making a jail needs root");
        return;
    }
    let layout = JailLayout {
        binds: vec![Bind { path: PathBuf::from("/no/such/forkvm/path"), writable: true }],
        hidden: vec![],
    };
    let err = JailNamespaces::shared(&layout).unwrap_err().to_string();
    assert!(err.contains("opening a path to bind"), "{err}");
}

fn gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

/// The pid namespace's init outlives the jail's maker letting go while a VMM still runs
/// there, and goes once that VMM is gone too.
#[test]
fn the_pid_namespace_init_stays_while_a_process_is_in_it() {
    if !is_root() {
        eprintln!("skipped: making a jail needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let jail = helper::make(&JailLayout::new().bind(dir.path(), true)).unwrap();
    let init = jail.init_pid();
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    // SAFETY: the child waits on its socket and exits; nothing else.
    let child = jail.forking_into(|| unsafe { libc::fork() }).unwrap();
    if child == 0 {
        // Like a VMM: keep nothing of the parent's but its own end (not the jail's pipe).
        crate::host::process::close_fds_except(&[theirs.as_raw_fd()]);
        let mut b = [0u8; 1];
        // SAFETY: reads one byte into a local, then exits.
        unsafe {
            libc::read(theirs.as_raw_fd(), b.as_mut_ptr().cast(), 1);
            libc::_exit(0);
        }
    }
    drop(theirs);
    drop(jail);
    std::thread::sleep(std::time::Duration::from_millis(1500));
    assert!(!gone(init), "the init left while a process was in its namespace");
    drop(ours);
    let mut status = 0;
    // SAFETY: waits for our own child.
    unsafe { libc::waitpid(child, &mut status, 0) };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !gone(init) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(gone(init), "the init stays after its namespace emptied and was let go");
}
