//! The `forkvm` binary end to end: VMM processes, control sockets, restore in a new
//! process, fan-out, and the errors a user sees.

use forkvm_testguest::{count_hash, monitor, COUNT_COUNTER_ADDR};
use forkvm_vmm::control::{ControlClient, Request};
use forkvm_vmm::persist::VmState;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(30);

fn forkvm() -> Command {
    Command::new(env!("CARGO_BIN_EXE_forkvm"))
}

/// A VMM process that is killed if the test ends early.
struct Vmm {
    child: Child,
    socket: PathBuf,
    console: PathBuf,
}

impl Vmm {
    fn start(args: &[&str], dir: &Path, name: &str) -> Vmm {
        let socket = dir.join(format!("{name}.sock"));
        let console = dir.join(format!("{name}.log"));
        let child = forkvm()
            .args(args)
            .arg("--socket")
            .arg(&socket)
            .arg("--console")
            .arg(&console)
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let vmm = Vmm { child, socket, console };
        wait_until(|| vmm.socket.exists(), "control socket");
        vmm
    }

    fn client(&self) -> ControlClient {
        ControlClient::connect(&self.socket).unwrap()
    }

    fn wait_console(&self, needle: &str) -> String {
        let mut text = String::new();
        wait_until(
            || {
                text = std::fs::read_to_string(&self.console).unwrap_or_default();
                text.contains(needle)
            },
            needle,
        );
        text
    }

    fn wait_exit(&mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + T;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(Instant::now() < deadline, "VMM did not exit");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Vmm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Kills the given processes when dropped, so a failing test leaves no VMMs behind.
struct KillOnDrop(Vec<i32>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        for &p in &self.0 {
            // SAFETY: signalling processes this test started.
            unsafe { libc::kill(p, libc::SIGKILL) };
        }
    }
}

fn wait_until(mut cond: impl FnMut() -> bool, what: &str) {
    let deadline = Instant::now() + T;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn read_u64_at(file: &Path, offset: u64) -> u64 {
    let f = std::fs::File::open(file).unwrap();
    let mut b = [0u8; 8];
    f.read_exact_at(&mut b, offset).unwrap();
    u64::from_le_bytes(b)
}

#[test]
fn without_kvm_the_cli_says_so() {
    let out =
        forkvm().args(["boot", "--guest", "hello"]).env("FORKVM_KVM_DEVICE", "/nonexistent/kvm").output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/kvm does not exist: this host has no KVM"), "{err}");
    let out = forkvm().args(["doctor"]).env("FORKVM_KVM_DEVICE", "/nonexistent/kvm").output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("FAIL"));
}

#[test]
fn doctor_passes_here() {
    let out = forkvm().args(["doctor", "--json"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ok"], true, "{v}");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let net = v["checks"].as_array().unwrap().iter().find(|c| c["check"] == "network").expect("a network check");
        assert_eq!(net["ok"], true, "root gets sandbox networks here: {net}");
    }
}

#[test]
fn a_counting_guest_snapshotted_mid_run_continues_in_a_new_process_from_the_exact_count() {
    let tmp = tempfile::tempdir().unwrap();
    let n: u64 = 400_000_000;
    let mut parent =
        Vmm::start(&["boot", "--guest", "count", "--arg", &n.to_string(), "--mem-mib", "16"], tmp.path(), "parent");
    parent.wait_console("counting\n");
    std::thread::sleep(Duration::from_millis(30));
    let snap = tmp.path().join("mid-run");
    parent.client().call(&Request::Snapshot { dir: snap.clone() }).unwrap();
    parent.client().call(&Request::Shutdown {}).unwrap();
    parent.wait_exit();

    // The snapshot froze the loop part-way: the published counter and the vCPU's
    // counter register agree (the store may trail the increment by one step).
    let published = read_u64_at(&snap.join("memory.img"), COUNT_COUNTER_ADDR);
    assert!(published > 0 && published < n, "snapshot taken mid-run: counter {published} of {n}");
    let state = VmState::decode(&std::fs::read(snap.join("vmstate.bin")).unwrap()).unwrap();
    let rcx = state.vcpus[0].regs.rcx;
    assert!(rcx == published || rcx == published + 1, "register {rcx} vs memory {published}");

    // Restored paused in a new process, then resumed: it finishes with the hash of an
    // uninterrupted run, which any lost or repeated step would change.
    let mut child = Vmm::start(&["restore", "--paused", "--snapshot", snap.to_str().unwrap()], tmp.path(), "child");
    let status = child.client().call(&Request::Status {}).unwrap();
    assert_eq!(status["state"], "paused");
    assert_ne!(status["pid"], serde_json::json!(std::process::id()));
    child.client().call(&Request::Resume {}).unwrap();
    let expected = format!("count={n:016x} hash={:016x}\n", count_hash(n));
    let text = child.wait_console(&expected);
    assert!(!text.contains("counting"), "the child continued, it did not start over: {text:?}");
    assert!(child.wait_exit().success());
}

#[test]
fn control_socket_rejects_bad_requests_and_keeps_serving() {
    let tmp = tempfile::tempdir().unwrap();
    let vmm = Vmm::start(&["boot", "--guest", "echo", "--mem-mib", "8"], tmp.path(), "echo");
    vmm.wait_console("echo ready\n");
    let mut c = vmm.client();
    let e = c.call_raw("{not json\n").unwrap_err().to_string();
    assert!(e.contains("bad request"), "{e}");
    let e = c.call_raw("{\"op\":\"pause\",\"now\":true}\n").unwrap_err().to_string();
    assert!(e.contains("unknown field `now`"), "{e}");
    let e = c.call_raw("{\"op\":\"reboot\"}\n").unwrap_err().to_string();
    assert!(e.contains("unknown variant `reboot`"), "{e}");
    let e = c.call(&Request::SendInput { hex: "zz".into() }).unwrap_err().to_string();
    assert!(e.contains("not hex"), "{e}");
    assert_eq!(c.call(&Request::Pause {}).unwrap()["state"], "paused");
    assert_eq!(c.call(&Request::Pause {}).unwrap()["state"], "paused", "pause is idempotent");
    c.send_input(b"queued while paused").unwrap();
    assert_eq!(c.call(&Request::Resume {}).unwrap()["state"], "running");
    vmm.wait_console("queued while paused");
    // The CLI's `ctl` verb speaks the same protocol.
    let out = forkvm().args(["ctl", "--socket"]).arg(&vmm.socket).arg("status").output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["guest"]["name"], "echo");
    let out = forkvm().args(["ctl", "--socket"]).arg(&vmm.socket).arg("frobnicate").output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown control request"));
}

/// Sends one monitor command through a child's control socket and waits for the next
/// reply line in its console log.
fn monitor_call(client: &mut ControlClient, log: &Path, replies_before: usize, cmd: &[u8]) -> String {
    client.send_input(cmd).unwrap();
    let mut line = String::new();
    wait_until(
        || {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            match text.lines().nth(replies_before) {
                Some(l) if text.ends_with('\n') || text.lines().count() > replies_before + 1 => {
                    line = l.to_string();
                    true
                }
                _ => false,
            }
        },
        "monitor reply",
    );
    line
}

#[test]
fn a_hundred_children_of_a_512_mib_snapshot_each_keep_their_own_memory() {
    let tmp = tempfile::tempdir().unwrap();
    let mem: u64 = 512 << 20;
    let (fill_base, seed) = (2u64 << 20, 0x1234_5678u64);
    let args = [
        "boot",
        "--guest",
        "monitor",
        "--mem-mib",
        "512",
        "--arg",
        &fill_base.to_string(),
        "--arg",
        &(mem - fill_base).to_string(),
        "--arg",
        &seed.to_string(),
    ];
    let mut parent = Vmm::start(&args, tmp.path(), "parent");
    parent.wait_console("ready\n");
    let snap = tmp.path().join("warm");
    parent.client().call(&Request::Snapshot { dir: snap.clone() }).unwrap();
    parent.client().call(&Request::Shutdown {}).unwrap();
    parent.wait_exit();
    let image = snap.join("memory.img");
    let before = crc32fast::hash(&std::fs::read(&image).unwrap());

    let run = tmp.path().join("run");
    let out = forkvm()
        .args(["fork", "-n", "100", "--json", "--snapshot"])
        .arg(&snap)
        .arg("--run-dir")
        .arg(&run)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let children = report["children"].as_array().unwrap();
    assert_eq!(children.len(), 100);
    let pids: Vec<i32> = children.iter().map(|c| c["pid"].as_i64().unwrap() as i32).collect();
    let _reaper = KillOnDrop(pids.clone());

    // Marker slots live below the filled range, so they start out zero in every child.
    let slots: u64 = 0x18_0000;
    let marker = |i: u64| 0xc0de_0000_0000_0000 | (i + 1);
    let mut clients: Vec<ControlClient> =
        children.iter().map(|c| ControlClient::connect(Path::new(c["socket"].as_str().unwrap())).unwrap()).collect();
    let logs: Vec<PathBuf> = children.iter().map(|c| PathBuf::from(c["console"].as_str().unwrap())).collect();
    for (i, c) in clients.iter_mut().enumerate() {
        let i = i as u64;
        assert_eq!(monitor_call(c, &logs[i as usize], 0, &monitor::write(slots + 8 * i, marker(i))), "ok");
    }
    for (i, c) in clients.iter_mut().enumerate() {
        let iu = i as u64;
        // Its own marker is there, the sum over all 100 slots is its marker alone (no
        // other child's write is visible), and the parent's pattern is intact.
        assert_eq!(monitor_call(c, &logs[i], 1, &monitor::read(slots + 8 * iu)), format!("={:016x}", marker(iu)));
        assert_eq!(
            monitor_call(c, &logs[i], 2, &monitor::sum(slots, 8 * 100)),
            format!("={:016x}", marker(iu)),
            "child {i}"
        );
        let probe = fill_base + 0x1000_0000 + 8 * iu;
        assert_eq!(
            monitor_call(c, &logs[i], 3, &monitor::read(probe)),
            format!("={:016x}", monitor::pattern_word(seed, probe))
        );
    }
    // Every child is a process of its own with its own KVM VM.
    let mut distinct = pids.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 100);
    for c in clients.iter_mut() {
        c.call(&Request::Shutdown {}).unwrap();
    }
    for c in children {
        let sock = PathBuf::from(c["socket"].as_str().unwrap());
        wait_until(|| !sock.exists(), "child socket removed at shutdown");
    }
    let after = crc32fast::hash(&std::fs::read(&image).unwrap());
    assert_eq!(before, after, "memory.img must be byte-identical after 100 children wrote to their memory");
}

#[test]
fn fork_refuses_bad_input_plainly() {
    let tmp = tempfile::tempdir().unwrap();
    let out = forkvm()
        .args(["fork", "-n", "2", "--snapshot", "/nonexistent/snap", "--run-dir"])
        .arg(tmp.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/snap"));
    let out = forkvm().args(["fork", "-n", "0", "--snapshot", "/x", "--run-dir"]).arg(tmp.path()).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("-n must be between 1"));
    let out = forkvm().args(["fork", "--tag", "a", "--image", "b"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("say what to fork, once"));
    let out = forkvm().args(["fork", "--snapshot", "/x"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("--snapshot needs --run-dir"));
    let out = forkvm().args(["boot", "--guest", "nosuch"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown test guest"));
    let out = forkvm().args(["boot", "--guest", "hello", "--mem-mib", "3"]).output().unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not a positive multiple of 2 MiB"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn forkvm_run_streams_output_and_exits_with_the_command_status() {
    let out =
        forkvm().args(["run", "--image", "tiny", "--", "sh", "-c", "echo out; echo err >&2; exit 7"]).output().unwrap();
    assert_eq!(out.status.code(), Some(7), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "out\n");
    assert!(String::from_utf8_lossy(&out.stderr).contains("err\n"));
    let out = forkvm().args(["run", "--image", "tiny", "--", "uname", "-r"]).output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("6.1."), "{}", String::from_utf8_lossy(&out.stdout));
    let out = forkvm().args(["run", "--image", "nonexistent", "--", "true"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("no template \"nonexistent\""));
}
