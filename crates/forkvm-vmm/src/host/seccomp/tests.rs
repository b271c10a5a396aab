//! Each test runs its filtered code in a forked child (filters cannot be taken off the
//! test process) whose stderr is a pipe, and checks how the child ended and what it said.

use super::*;
use std::io::Read;
use std::os::fd::FromRawFd;

/// Runs `body` in a forked child under the VMM filters; returns (exit status, stderr).
fn filtered(body: impl FnOnce() -> i32) -> (i32, String) {
    let mut fds = [0; 2];
    // SAFETY: pipe writes two descriptors into the array.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: the child makes system calls and leaves through `_exit`; it runs `body`,
    // which only uses what a VMM thread would.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // SAFETY: descriptors of this child.
        unsafe {
            libc::dup2(fds[1], 2);
            libc::close(fds[0]);
        }
        let code = match enforce() {
            Ok(()) => body(),
            Err(e) => {
                eprintln!("enforce: {e}");
                99
            }
        };
        // SAFETY: ends the child without the test harness's destructors.
        unsafe { libc::_exit(code) };
    }
    // SAFETY: the write end belongs to the child now; the read end is ours alone.
    unsafe { libc::close(fds[1]) };
    let mut err = String::new();
    // SAFETY: fds[0] is an open descriptor nothing else owns.
    let _ = unsafe { std::fs::File::from_raw_fd(fds[0]) }.read_to_string(&mut err);
    let mut status = 0;
    // SAFETY: waits for the child forked above.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status), "child ended by signal: {status:#x}; stderr: {err}");
    (libc::WEXITSTATUS(status), err)
}

fn assert_denied(out: (i32, String), kind: &str, nr: libc::c_long) {
    let (code, err) = out;
    assert_eq!(code, EXIT_SECCOMP_DENIED, "stderr: {err}");
    let (start, call) = (format!("{} a {kind} thread", denied::DENIED_MARKER), format!(" made system call {nr}"));
    let line = err.lines().find(|l| l.starts_with(&start)).unwrap_or_else(|| panic!("expected {start:?} in {err:?}"));
    assert!(line.contains(&call) && line.ends_with("which its filter denies; the VMM stops"), "{line:?}");
}

/// A raw system call; the tests expect the filter to stop it before the kernel runs it.
fn raw(nr: libc::c_long, args: [usize; 4]) {
    // SAFETY: every call made through here is denied by the filter under test, which
    // ends the process before the kernel reads any argument; the pointers passed are
    // valid C strings or null anyway.
    unsafe { libc::syscall(nr, args[0], args[1], args[2], args[3]) };
}

#[test]
fn the_control_filter_denies_exec_network_sockets_ptrace_mount_namespaces_and_symlinks() {
    let argv: [*const libc::c_char; 2] = [c"/bin/true".as_ptr(), std::ptr::null()];
    let (target, link) = (c"/etc/passwd".as_ptr() as usize, c"/tmp/forkvm-seccomp-link".as_ptr() as usize);
    let calls: [(libc::c_long, [usize; 4]); 8] = [
        (libc::SYS_symlink, [target, link, 0, 0]),
        (libc::SYS_symlinkat, [target, libc::AT_FDCWD as usize, link, 0]),
        (libc::SYS_execve, [argv[0] as usize, argv.as_ptr() as usize, 0, 0]),
        (libc::SYS_socket, [libc::AF_INET as usize, libc::SOCK_STREAM as usize, 0, 0]),
        (libc::SYS_ptrace, [libc::PTRACE_ATTACH as usize, 1, 0, 0]),
        (libc::SYS_mount, [c"none".as_ptr() as usize, c"/mnt".as_ptr() as usize, c"tmpfs".as_ptr() as usize, 0]),
        (libc::SYS_unshare, [libc::CLONE_NEWUSER as usize, 0, 0, 0]),
        (libc::SYS_kill, [1, libc::SIGTERM as usize, 0, 0]),
    ];
    for (nr, args) in calls {
        assert_denied(
            filtered(|| {
                raw(nr, args);
                0
            }),
            "control",
            nr,
        );
    }
}

#[test]
fn a_thread_that_had_blocked_sigsys_still_says_which_call_was_denied() {
    let (code, err) = filtered(|| {
        let spawned = std::thread::spawn(|| {
            // SAFETY: a sigset on the stack, filled before use; changes this thread's mask.
            unsafe {
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigfillset(&mut set);
                libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            }
            enter_thread(ThreadKind::Device);
            raw(libc::SYS_ptrace, [libc::PTRACE_ATTACH as usize, 1, 0, 0]);
        });
        let _ = spawned.join();
        0
    });
    assert_denied((code, err), "device", libc::SYS_ptrace);
}

#[test]
fn no_thread_maps_executable_memory() {
    assert_denied(
        filtered(|| {
            let flags = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as usize;
            raw(libc::SYS_mmap, [0, 4096, (libc::PROT_READ | libc::PROT_EXEC) as usize, flags]);
            0
        }),
        "control",
        libc::SYS_mmap,
    );
}

#[test]
fn threads_start_through_clone_once_clone3_answers_enosys() {
    let (code, err) = filtered(|| {
        // SAFETY: clone3 with a null argument: the filter answers before the kernel reads it.
        let rc = unsafe { libc::syscall(libc::SYS_clone3, std::ptr::null::<u8>(), 0) };
        let enosys = rc == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS);
        let joined = std::thread::spawn(|| 7).join().ok() == Some(7);
        if enosys && joined {
            0
        } else {
            1
        }
    });
    assert_eq!(code, 0, "stderr: {err}");
}

#[test]
fn a_vcpu_thread_may_run_but_not_fork_or_open_sockets() {
    let on_vcpu = |call: fn()| {
        move || {
            let t = std::thread::spawn(move || {
                enter_thread(ThreadKind::Vcpu);
                call();
            });
            let _ = t.join();
            0
        }
    };
    assert_denied(
        filtered(on_vcpu(|| {
            // SAFETY: glibc's fork, which the vCPU filter stops before the kernel forks.
            unsafe { libc::fork() };
        })),
        "vcpu",
        libc::SYS_clone,
    );
    assert_denied(
        filtered(on_vcpu(|| raw(libc::SYS_socket, [libc::AF_UNIX as usize, libc::SOCK_STREAM as usize, 0, 0]))),
        "vcpu",
        libc::SYS_socket,
    );
    // What a vCPU does is allowed: a file written and read back.
    let (code, err) = filtered(on_vcpu(|| {
        let path = std::env::temp_dir().join(format!("forkvm-seccomp-{}", std::process::id()));
        let ok = std::fs::write(&path, b"disk").is_ok() && std::fs::read(&path).ok().as_deref() == Some(&b"disk"[..]);
        let _ = std::fs::remove_file(&path);
        if !ok {
            // SAFETY: ends the process with a status the test reads.
            unsafe { libc::_exit(1) };
        }
    }));
    assert_eq!(code, 0, "stderr: {err}");
}

#[test]
fn the_live_branch_writer_may_only_write_and_exit() {
    let (code, err) = filtered(|| {
        let file = tempfile_in_tmp();
        // SAFETY: plain fork of this single-threaded child; the grandchild makes system
        // calls only and leaves through `_exit`.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            enter_thread(ThreadKind::Writer);
            // SAFETY: a positional write to an open descriptor, then a call expected to trap.
            unsafe {
                use std::os::fd::AsRawFd;
                if libc::pwrite(file.as_raw_fd(), b"x".as_ptr().cast(), 1, 0) != 1 {
                    libc::_exit(1);
                }
                libc::openat(libc::AT_FDCWD, c"/etc/hostname".as_ptr(), libc::O_RDONLY);
                libc::_exit(2)
            }
        }
        let mut status = 0;
        // SAFETY: waits for the grandchild forked above.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        if libc::WIFEXITED(status) {
            libc::WEXITSTATUS(status)
        } else {
            3
        }
    });
    assert_denied((code, err), "writer", libc::SYS_openat);
}

fn tempfile_in_tmp() -> std::fs::File {
    let path = std::env::temp_dir().join(format!("forkvm-seccomp-writer-{}", std::process::id()));
    let f = std::fs::OpenOptions::new().create(true).truncate(true).read(true).write(true).open(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    f
}

#[test]
fn every_thread_of_a_filtered_process_reports_filter_mode() {
    let (code, err) = filtered(|| {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            enter_thread(ThreadKind::Device);
            let _ = rx.recv();
        });
        let status = crate::host::confinement::Confinement::of(std::process::id() as i32);
        let _ = tx.send(());
        let _ = t.join();
        match status {
            Some(c) if c.threads == 2 && c.seccomp_on_every_thread() && c.no_new_privs => 0,
            _ => 1,
        }
    });
    assert_eq!(code, 0, "stderr: {err}");
}

#[test]
fn a_denied_open_names_the_thread_and_the_path() {
    let (code, err) = filtered(|| {
        let t = std::thread::Builder::new().name("vsock-backend".into()).spawn(|| {
            enter_thread(ThreadKind::Device);
            raw(libc::SYS_openat, [libc::AT_FDCWD as usize, c"/etc/hostname".as_ptr() as usize, 0, 0]);
        });
        let _ = t.map(|t| t.join());
        0
    });
    assert_eq!(code, EXIT_SECCOMP_DENIED, "{err}");
    let said = "a device thread (vsock-backend) made system call 257 on \"/etc/hostname\", which its filter denies";
    assert!(err.contains(said), "expected {said:?} in {err:?}");
}
