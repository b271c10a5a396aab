//! Linux tier: nothing secret, and no privilege, in a VMM. The daemon runs with a bearer token (from a file,
//! and in its environment as a client would set it) and a TLS key; the spawner it
//! executes and a sandbox's VMM forked from that spawner must hold neither, in memory,
//! environment or descriptors, nor any descriptor of the daemon's (its TCP listener, its
//! lock, database and audit log).

use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

struct Env {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    daemon: Option<Child>,
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = self.command(&["kill", "--all"]).output();
        if let Some(mut d) = self.daemon.take() {
            let _ = d.kill();
            let _ = d.wait();
        }
    }
}

impl Env {
    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_forkvm"));
        c.arg("--daemon")
            .arg(format!("unix:{}", self.dir.join("run/forkvmd.sock").display()))
            .args(args)
            .env("FORKVM_STORE", self.dir.join("store"))
            .env("FORKVM_RUN", self.dir.join("run"))
            .env_remove("FORKVM_DAEMON")
            .env_remove("FORKVM_TOKEN");
        c
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.command(args).output().unwrap();
        assert!(out.status.success(), "forkvm {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    }
}

/// 32 random hex digits: a token that appears nowhere by chance.
fn random_token() -> String {
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom").unwrap().read_exact(&mut b).unwrap();
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Pids of `pid`'s children (every thread's).
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
        let text = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        out.extend(text.split_whitespace().filter_map(|p| p.parse::<u32>().ok()));
    }
    out
}

fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

/// Which of `needles` occur in a readable mapping of process `pid`. Mappings of the
/// sandbox's memory image and anything larger than 64 MiB (guest memory) are skipped:
/// they are the guest's, not the VMM's.
/// Whether a connection to a VMM's control socket is answered (a status request).
fn control_answers(stream: std::os::unix::net::UnixStream) -> bool {
    forkvm_vmm::control::ControlClient::over(stream).and_then(|mut c| c.status()).is_ok()
}

/// Whether a connection to a VMM's vsock listener is served: anything but end of file
/// (the guest's agent answers `OK`, or the VMM refuses a port with a line).
fn vsock_answers(mut stream: std::os::unix::net::UnixStream) -> bool {
    use std::io::Write;
    stream.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    let _ = stream.write_all(b"CONNECT 1024\n");
    let mut b = [0u8; 1];
    matches!(stream.read(&mut b), Ok(1))
}

/// Sandboxes `ids` (run directories under `sandboxes`) serve forkvm's clients only: a
/// client here is answered; a plain connection from here (root, but not connecting as a
/// client) is dropped; and so is one from a process in the jail of VMM `jailed_pid`
/// without privileges — a neighbour VMM taken over by its guest — which cannot connect as
/// a client.
fn only_clients_are_served(sandboxes: &std::path::Path, jailed_pid: u32, ids: [&str; 2]) {
    use std::os::unix::net::UnixStream;
    let control = |id: &str| sandboxes.join(id).join("control.sock");
    let vsock = |id: &str| sandboxes.join(id).join("vsock.sock");
    for id in ids {
        assert!(control_answers(forkvm_proto::trusted_peer::connect(control(id)).unwrap()), "{id}: a client");
        assert!(vsock_answers(forkvm_proto::trusted_peer::connect(vsock(id)).unwrap()), "{id}: a client's vsock");
        assert!(!control_answers(UnixStream::connect(control(id)).unwrap()), "{id}: a plain connection was served");
        assert!(!vsock_answers(UnixStream::connect(vsock(id)).unwrap()), "{id}: a plain vsock connection was served");
    }
    let mnt = std::fs::File::open(format!("/proc/{jailed_pid}/ns/mnt")).unwrap();
    let (control, vsock) = (control(ids[1]), vsock(ids[1]));
    // SAFETY: the child makes system calls, connects and leaves with `_exit`.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        use std::os::fd::AsRawFd;
        // SAFETY: setns on a namespace descriptor we hold.
        let entered = unsafe { libc::setns(mnt.as_raw_fd(), libc::CLONE_NEWNS) } == 0;
        let code = if !entered || forkvm_vmm::host::privileges::drop_privileges(None).is_err() {
            3
        } else if forkvm_proto::trusted_peer::connect(&control).is_ok_and(control_answers) {
            1
        } else if forkvm_proto::trusted_peer::connect(&vsock).is_ok_and(vsock_answers) {
            2
        } else {
            0
        };
        // SAFETY: leaves the forked copy without running the test's destructors.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    let code = libc::WEXITSTATUS(status);
    assert_eq!(code, 0, "from the jail without privileges: 1 control answered, 2 vsock answered, 3 could not enter");
}

/// The uid process `pid` runs as.
fn uid_of(pid: u32) -> u32 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status.lines().find_map(|l| l.strip_prefix("Uid:")).unwrap().split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Runs `attempt` in a process confined as sandbox uid `uid`'s VMM is — in the jail of
/// VMM `jailed_pid` (its mount namespace), under that uid without privileges and under
/// the VMM's seccomp filter — and returns how it ended: `Ok(exit code)` or
/// `Err(signal)`. A call the filter denies ends it with `EXIT_SECCOMP_DENIED`.
fn as_neighbour(jailed_pid: u32, uid: u32, attempt: impl FnOnce() -> i32) -> Result<i32, i32> {
    let mnt = std::fs::File::open(format!("/proc/{jailed_pid}/ns/mnt")).unwrap();
    // SAFETY: the child makes system calls, runs `attempt` and leaves with `_exit`.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        use std::os::fd::AsRawFd;
        // SAFETY: setns on a namespace descriptor we hold.
        let entered = unsafe { libc::setns(mnt.as_raw_fd(), libc::CLONE_NEWNS) } == 0;
        let ids = forkvm_vmm::host::ids::SandboxIds::of(uid);
        let confined = entered
            && forkvm_vmm::host::privileges::drop_privileges(Some(ids)).is_ok()
            && forkvm_vmm::host::seccomp::enforce().is_ok();
        let code = if confined { attempt() } else { 100 };
        // SAFETY: leaves the forked copy without running the test's destructors.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    if libc::WIFEXITED(status) {
        Ok(libc::WEXITSTATUS(status))
    } else {
        Err(libc::WTERMSIG(status))
    }
}

/// 0 when opening `path` (read-only) fails for want of permission, 1 when it opens, 2
/// when it fails otherwise.
fn open_denied(path: &std::path::Path) -> i32 {
    match std::fs::File::open(path) {
        Ok(_) => 1,
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => 0,
        Err(_) => 2,
    }
}

fn found_in_memory(pid: u32, needles: &[(&str, &[u8])]) -> Vec<String> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let mut mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut found = Vec::new();
    for line in maps.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (range, perms, path) = (f[0], f[1], f.get(5).copied().unwrap_or(""));
        let (start, end) = range.split_once('-').unwrap();
        let (start, end) = (u64::from_str_radix(start, 16).unwrap(), u64::from_str_radix(end, 16).unwrap());
        if !perms.starts_with('r') || end - start > 64 << 20 || path.contains("memory") || path.starts_with("[v") {
            continue;
        }
        let mut buf = vec![0u8; (end - start) as usize];
        if mem.seek(SeekFrom::Start(start)).is_err() || mem.read_exact(&mut buf).is_err() {
            continue;
        }
        for (name, needle) in needles {
            if memchr::memmem::find(&buf, needle).is_some() {
                found.push(format!("{name} in {line}"));
            }
        }
    }
    found
}

/// Where process `pid`'s descriptors point.
fn fds(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .map(|p| p.display().to_string())
        .collect()
}

/// `(thread, field, value)` for every thread of `pid` whose capability sets are not
/// empty, that lacks `no_new_privs` or that runs without a seccomp filter.
fn unconfined_threads(pid: u32) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        let field = |name: &str| {
            status.lines().find_map(|l| l.strip_prefix(name)).map(|v| v.trim().to_string()).unwrap_or_default()
        };
        let tid = task.file_name().to_string_lossy().into_owned();
        for (name, want) in [
            ("CapEff:", "0000000000000000"),
            ("CapPrm:", "0000000000000000"),
            ("CapInh:", "0000000000000000"),
            ("CapBnd:", "0000000000000000"),
            ("CapAmb:", "0000000000000000"),
            ("NoNewPrivs:", "1"),
            ("Seccomp:", "2"),
        ] {
            if field(name) != want {
                out.push((tid.clone(), name.to_string(), field(name)));
            }
        }
    }
    out
}

/// `socket:[inode]` of the TCP sockets listening on `port`.
fn tcp_listeners(port: u16) -> Vec<String> {
    let mut out = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        for line in std::fs::read_to_string(table).unwrap_or_default().lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let local_port = f[1].rsplit(':').next().and_then(|p| u16::from_str_radix(p, 16).ok());
            if local_port == Some(port) && f[3] == "0A" {
                out.push(format!("socket:[{}]", f[9]));
            }
        }
    }
    out
}

#[test]
fn no_vmm_holds_a_secret_a_descriptor_of_the_daemon_or_a_privilege() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let (cert_pem, key_pem, token_file) = (dir.join("cert.pem"), dir.join("key.pem"), dir.join("token"));
    let key_text = cert.signing_key.serialize_pem();
    std::fs::write(&cert_pem, cert.cert.pem()).unwrap();
    std::fs::write(&key_pem, &key_text).unwrap();
    let token = random_token();
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    let mut env = Env { _tmp: tmp, dir: dir.clone(), daemon: None };
    let mut daemon = Command::new(env!("CARGO_BIN_EXE_forkvm"))
        .args(["daemon", "--bind", "127.0.0.1:0", "--token-file"])
        .arg(&token_file)
        .arg("--tls-cert")
        .arg(&cert_pem)
        .arg("--tls-key")
        .arg(&key_pem)
        .env("FORKVM_STORE", dir.join("store"))
        .env("FORKVM_RUN", dir.join("run"))
        .env("FORKVM_TOKEN", &token)
        .env_remove("FORKVM_DAEMON")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(daemon.stdout.take().unwrap());
    let port: u16 = loop {
        let mut line = String::new();
        assert!(out.read_line(&mut line).unwrap() > 0, "the daemon exited");
        if let Some(a) = line.trim().strip_prefix("forkvmd listening on https://") {
            break a.rsplit(':').next().unwrap().parse().unwrap();
        }
    };
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    let daemon_pid = daemon.id();
    env.daemon = Some(daemon);

    env.ok(&["snapshot", "create", "--image", "tiny", "--tag", "t"]);
    let made: serde_json::Value = serde_json::from_str(&env.ok(&["fork", "--tag", "t", "-n", "1", "--json"])).unwrap();
    let vmm = made["sandboxes"][0]["pid"].as_u64().expect("the sandbox's VMM pid") as u32;
    let spawners: Vec<u32> = children(daemon_pid).into_iter().filter(|p| cmdline(*p).contains("__spawner")).collect();
    assert_eq!(spawners.len(), 1, "the daemon's children: {:?}", children(daemon_pid));
    let spawner = spawners[0];
    assert!(cmdline(spawner).starts_with(env!("CARGO_BIN_EXE_forkvm")), "the spawner is our binary, executed");

    // The daemon itself holds them (the scan can find them).
    let key_body: Vec<&str> = key_text.lines().filter(|l| !l.starts_with("-----")).collect();
    let key_line = key_body[key_body.len() / 2];
    let needles: [(&str, &[u8]); 2] = [("the token", token.as_bytes()), ("the TLS key", key_line.as_bytes())];
    assert!(!found_in_memory(daemon_pid, &needles[..1]).is_empty(), "the scan finds the daemon's token");

    let daemon_files: Vec<String> = [token_file.clone(), key_pem.clone(), cert_pem.clone()]
        .into_iter()
        .chain(["forkvmd.lock", "state.db", "audit.log"].map(|f| dir.join("store/forkvmd").join(f)))
        .map(|p| p.display().to_string())
        .chain(tcp_listeners(port))
        .collect();
    assert!(!tcp_listeners(port).is_empty(), "the daemon's TCP listener is visible");
    // A VMM has no capability and cannot gain one, and runs under its seccomp filter, on
    // every thread; so does a child of a running sandbox, forked by its VMM.
    let forked: serde_json::Value = serde_json::from_str(&env.ok(&[
        "fork",
        "--from-sandbox",
        made["sandboxes"][0]["sandbox_id"].as_str().unwrap(),
        "-n",
        "1",
        "--json",
    ]))
    .unwrap();
    let child = forked["sandboxes"][0]["pid"].as_u64().expect("the forked child's VMM pid") as u32;
    for (what, pid) in [("the VMM", vmm), ("the forked VMM", child)] {
        assert!(std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().count() > 1, "{what} runs its threads");
        assert_eq!(unconfined_threads(pid), Vec::new(), "{what} (pid {pid}) keeps a privilege or runs unfiltered");
        let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
        let core = limits.lines().find(|l| l.starts_with("Max core file size")).unwrap();
        assert_eq!(core.split_whitespace().skip(4).take(2).collect::<Vec<_>>(), ["0", "0"], "{what}: {core}");
        let files = limits.lines().find(|l| l.starts_with("Max open files")).unwrap();
        let mut ours = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit writes the struct it is given (the daemon inherits our limits).
        unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut ours) };
        let want = forkvm_vmm::host::rlimits::VMM_MAX_FILES.min(ours.rlim_max).to_string();
        assert_eq!(files.split_whitespace().skip(3).take(2).collect::<Vec<_>>(), [&want, &want], "{what}: {files}");
        let locked = limits.lines().find(|l| l.starts_with("Max locked memory")).unwrap();
        assert_eq!(locked.split_whitespace().skip(3).take(2).collect::<Vec<_>>(), ["0", "0"], "{what}: {locked}");
    }

    // Each sandbox runs under a uid of its own, from forkvm's range, which owns its run
    // directory; a child of a running sandbox shares its source's (its VMM forked it).
    let range = forkvm_vmm::host::ids::SANDBOX_ID_RANGE;
    let (uid, child_uid) = (uid_of(vmm), uid_of(child));
    assert!(range.contains(&uid), "the VMM runs as uid {uid}, outside {range:?}");
    assert_eq!(child_uid, uid, "the forked VMM shares its source's uid");
    let other: serde_json::Value = serde_json::from_str(&env.ok(&["fork", "--tag", "t", "-n", "1", "--json"])).unwrap();
    let other_vmm = other["sandboxes"][0]["pid"].as_u64().unwrap() as u32;
    let other_uid = uid_of(other_vmm);
    assert!(range.contains(&other_uid) && other_uid != uid, "a second sandbox's uid {other_uid} (the first's {uid})");
    let a_id = made["sandboxes"][0]["sandbox_id"].as_str().unwrap();
    let a_run = dir.join("run/sandboxes").join(a_id);
    {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let meta = std::fs::metadata(&a_run).unwrap();
        assert_eq!((meta.uid(), meta.permissions().mode() & 0o777), (uid, 0o700), "its run directory is its own");
    }
    // Its branch is the store's (root's) once taken, like every snapshot.
    env.ok(&["branch", a_id, "--tag", "a-branch", "--json"]);
    let a_memory = dir.join("store/snapshots/a-branch/memory.img");
    {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(&a_memory).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (0, 0), "the branch was adopted");
    }
    // A neighbour taken over by its guest — the other sandbox's uid, in the same jail,
    // under the same filter — cannot open the first's memory image, run directory or
    // console log, nor the tag's image; cannot execute, open a network socket or trace.
    let tag_memory = dir.join("store/snapshots/t/memory.img");
    for path in [&a_memory, &tag_memory, &a_run.join("console.log"), &a_run] {
        assert_eq!(
            as_neighbour(other_vmm, other_uid, || open_denied(path)),
            Ok(0),
            "the neighbour opens {}",
            path.display()
        );
    }
    let killed = Ok(forkvm_vmm::host::seccomp::EXIT_SECCOMP_DENIED);
    let exec = || {
        let argv: [*const libc::c_char; 2] = [c"/bin/true".as_ptr(), std::ptr::null()];
        // SAFETY: a NUL-terminated path and argument list; the filter ends the process first.
        unsafe { libc::execve(argv[0], argv.as_ptr(), std::ptr::null()) };
        1
    };
    assert_eq!(as_neighbour(other_vmm, other_uid, exec), killed, "the neighbour executes a program");
    let inet = || {
        // SAFETY: plain integer arguments; the filter ends the process first.
        unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
        1
    };
    assert_eq!(as_neighbour(other_vmm, other_uid, inet), killed, "the neighbour opens a network socket");
    let trace = move || {
        // SAFETY: plain integer arguments; the filter ends the process first.
        unsafe { libc::ptrace(libc::PTRACE_ATTACH, vmm as libc::pid_t, 0, 0) };
        1
    };
    assert_eq!(as_neighbour(other_vmm, other_uid, trace), killed, "the neighbour traces the first VMM");

    // Each serves forkvm's clients only: not a neighbour VMM that can name its sockets.
    let ids =
        [made["sandboxes"][0]["sandbox_id"].as_str().unwrap(), forked["sandboxes"][0]["sandbox_id"].as_str().unwrap()];
    only_clients_are_served(&dir.join("run/sandboxes"), vmm, ids);

    // The API shows it: the jail as the kernel reports it.
    let client = forkvm_client::Client::new(forkvm_client::Endpoint::Unix(dir.join("run/forkvmd.sock")), None).unwrap();
    let jail = client.get_sandbox(made["sandboxes"][0]["sandbox_id"].as_str().unwrap()).unwrap().jail.unwrap();
    assert_eq!(jail.seccomp, "filter", "{jail:?}");
    assert_eq!(jail.uid, uid, "the API shows its own uid: {jail:?}");
    assert!(jail.no_capabilities && jail.no_new_privs && jail.threads > 1, "{jail:?}");
    assert_eq!(jail.seccomp_filtered_threads, jail.threads, "{jail:?}");
    let mut namespaces = jail.own_namespaces.clone();
    namespaces.sort();
    assert_eq!(namespaces, ["ipc", "mnt", "net", "pid", "uts"], "{jail:?}");
    let listed = client.list_sandboxes().unwrap();
    assert!(listed.iter().all(|s| s.jail.is_none()), "lists leave the jail out: {listed:?}");

    // Its root is its jail: forkvm's own files at their paths, nothing else of the host.
    // (`/proc/<pid>/root` resolves paths as the VMM does.)
    for (what, pid) in [("the VMM", vmm), ("the forked VMM", child)] {
        let inside = |p: &std::path::Path| std::path::PathBuf::from(format!("/proc/{pid}/root{}", p.display()));
        let sandbox_dir = dir.join("run/sandboxes");
        assert!(inside(&sandbox_dir).is_dir(), "{what} sees the run directories");
        assert!(inside(&dir.join("store/snapshots")).is_dir(), "{what} sees the store");
        for absent in [
            token_file.as_path(),
            key_pem.as_path(),
            std::path::Path::new("/etc/passwd"),
            &dir.join("run/forkvmd.sock"),
            &dir.join("run/registry.db"),
        ] {
            assert!(!inside(absent).exists(), "{what} can name {}", absent.display());
        }
        // No cgroup file either: its starter moved it into its group, and it cannot move
        // itself out or raise its limits.
        let cgroup_root = forkvm_vmm::host::cgroup::CgroupRoot::detect().expect("a cgroup on this host");
        for group_dir in cgroup_root.forkvm_dirs().unwrap() {
            assert!(!inside(&group_dir).exists(), "{what} can name {}", group_dir.display());
        }
        // Hidden under an empty directory (read here with our privileges; the VMM, without
        // any, cannot even list it: mode 0).
        let state = inside(&dir.join("store/forkvmd"));
        assert_eq!(std::fs::read_dir(&state).map(|d| d.count()).ok(), Some(0), "{what} sees the daemon's state");
        assert!(!inside(&dir.join("store/forkvmd/state.db")).exists(), "{what} can name the daemon's database");
        for ns in ["net", "pid", "mnt"] {
            let of = |p: u32| std::fs::read_link(format!("/proc/{p}/ns/{ns}")).unwrap();
            assert_ne!(of(pid), of(daemon_pid), "{what} shares the daemon's {ns} namespace");
        }
        // In its pid namespace it has another pid, and cannot see the daemon's processes.
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let nspid: Vec<&str> =
            status.lines().find_map(|l| l.strip_prefix("NSpid:")).unwrap().split_whitespace().collect();
        assert_eq!(nspid.len(), 2, "{what}: NSpid {nspid:?}");
        assert_eq!(nspid[0], pid.to_string(), "{what}: the API gives its pid in ours");
    }

    // Each VMM runs in a cgroup of its own, in every hierarchy, with the default CPU and
    // tasks limits, beside the daemon's and the spawner's own groups (the daemon is this
    // test's child: it started in our cgroups).
    let root = forkvm_vmm::host::cgroup::CgroupRoot::detect().expect("a cgroup on this host");
    let group_path = |pid: u32, controller: forkvm_vmm::host::cgroup::Controller| -> String {
        let lines = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
        let line = lines
            .lines()
            .find(|l| match root.version() {
                forkvm_vmm::host::cgroup::CgroupVersion::V1 => {
                    l.split(':').nth(1).is_some_and(|c| c.split(',').any(|c| c == controller.name()))
                }
                forkvm_vmm::host::cgroup::CgroupVersion::V2 => l.starts_with("0::"),
            })
            .unwrap_or_else(|| panic!("pid {pid}: no {} line in {lines}", controller.name()));
        line.splitn(3, ':').nth(2).unwrap().to_string()
    };
    for controller in root.controllers() {
        let daemon_group = group_path(daemon_pid, controller);
        let forkvm = daemon_group.strip_suffix("/daemon").unwrap_or_else(|| panic!("the daemon is in {daemon_group}"));
        assert!(forkvm.ends_with("/forkvm"), "the daemon's group {daemon_group} is not under forkvm/");
        assert_eq!(group_path(spawner, controller), format!("{forkvm}/spawner"), "the spawner's {}", controller.name());
        for (what, pid, sandbox) in [
            ("the VMM", vmm, made["sandboxes"][0]["sandbox_id"].as_str().unwrap()),
            ("the forked VMM", child, forked["sandboxes"][0]["sandbox_id"].as_str().unwrap()),
        ] {
            assert_eq!(group_path(pid, controller), format!("{forkvm}/sb-{sandbox}"), "{what}'s {}", controller.name());
        }
    }
    if root.version() == forkvm_vmm::host::cgroup::CgroupVersion::V1
        && root.controllers().contains(&forkvm_vmm::host::cgroup::Controller::Cpu)
    {
        // The cpu hierarchy's forkvm directory is the one whose groups have cpu.shares.
        let dirs = root.forkvm_dirs().unwrap();
        let cpu =
            dirs.iter().find(|d| d.join("daemon/cpu.shares").exists()).expect("forkvm/daemon in the cpu hierarchy");
        let shares =
            |service: &str| std::fs::read_to_string(cpu.join(service).join("cpu.shares")).unwrap().trim().to_string();
        assert_eq!((shares("daemon"), shares("spawner")), ("8192".to_string(), "4096".to_string()));
    }
    for (what, _pid, sandbox) in [
        ("the VMM", vmm, made["sandboxes"][0]["sandbox_id"].as_str().unwrap()),
        ("the forked VMM", child, forked["sandboxes"][0]["sandbox_id"].as_str().unwrap()),
    ] {
        let name = format!("sb-{sandbox}");
        let group = root.open(&name).unwrap_or_else(|| panic!("{what} has no cgroup {name}"));
        let limits = root.limits_of(&group);
        if root.controllers().contains(&forkvm_vmm::host::cgroup::Controller::Cpu) {
            assert_eq!(limits.cpu_millis, Some(forkvm_sandbox::start::DEFAULT_CPU_MILLIS), "{what}");
        }
        if root.controllers().contains(&forkvm_vmm::host::cgroup::Controller::Pids) {
            assert_eq!(limits.pids_max, Some(forkvm_sandbox::start::DEFAULT_PIDS_MAX), "{what}");
        }
    }

    for (what, pid) in [("the spawner", spawner), ("the VMM", vmm), ("the forked VMM", child)] {
        assert_eq!(found_in_memory(pid, &needles), Vec::<String>::new(), "{what} (pid {pid}) holds a secret");
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
        let environ = String::from_utf8_lossy(&environ);
        assert!(!environ.contains("FORKVM_TOKEN") && !environ.contains("FORKVMD_"), "{what}'s environment: {environ}");
        let held: Vec<String> = fds(pid).into_iter().filter(|f| daemon_files.contains(f)).collect();
        assert_eq!(held, Vec::<String>::new(), "{what} (pid {pid}) holds the daemon's descriptors: {:?}", fds(pid));
    }
}
