//! Lazy restore: a child VMM whose snapshot has no memory image maps empty memory and
//! fills it window by window from a memory source on the host, as its guest runs
//! (`vstate::lazy_memory`, `memory_windows`). The children are real VMM processes forked
//! by a lazy zygote; their memory comes over a socket from a host thread reading the
//! snapshot's page map and chunk store.

mod common;
use common::children::*;
use common::*;
use forkvm_snapshot::chain::assemble::AssembledCache;
use forkvm_snapshot::chain::convert::ingest;
use forkvm_snapshot::chain::resolve;
use forkvm_snapshot::memory_windows::{serve_windows, PageMapWindows, Served, WindowSource, WINDOW_BYTES};
use forkvm_snapshot::Store;
use forkvm_testguest::{monitor, TestGuest};
use forkvm_vmm::control::Request;
use forkvm_vmm::host::ids::SandboxIds;
use forkvm_vmm::vmm::ForkChild;
use forkvm_vmm::vstate::irqchip::IrqchipMode;
use forkvm_vmm::vstate::lazy_memory::LazyMemory;
use forkvm_vmm::zygote::{ChildSpec, Owned, Zygote, EXIT_MEMORY_LOST};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const MEM_MIB: u64 = 32;
/// The uid the children's VMMs run as (none of the host's).
const VMM_UID: u32 = 61_234;
const FILL: (u64, u64, u64) = (0x40_0000, 8 << 20, 0x1a2b);

/// A snapshot of the monitor guest in a store, chunked (`ingest`), with no `memory.img`
/// left anywhere: only a lazy restore can run it. Returns its directory and its memory
/// as windows read from the chain (what a lazy restore serves).
fn lazy_snapshot(dir: &Path) -> (PathBuf, PageMapWindows) {
    let (mut vmm, mut console) = boot_guest(TestGuest::Monitor, &[FILL.0, FILL.1, FILL.2], MEM_MIB, IrqchipMode::Split);
    console.wait_for("ready\n", T);
    vmm.pause().unwrap();
    let store = Store::open(dir.join("store"));
    let snap = store.tag_dir("lazy").unwrap();
    vmm.snapshot(&snap).unwrap();
    drop(vmm);
    let cache = AssembledCache::with_max_bytes(&dir.join("cache"), 1 << 30);
    ingest(&store, &cache, "lazy").unwrap();
    std::fs::remove_file(snap.join(forkvm_snapshot::MEMORY_IMG)).unwrap();
    std::fs::remove_dir_all(dir.join("cache")).unwrap();
    let chain = resolve(&store, "lazy").unwrap();
    let windows = cache.windows_for(&store, &chain).unwrap();
    (snap, windows)
}

/// Forks one lazy child of `snap` whose memory `source` serves from a host thread;
/// returns its pid, socket, console log and the thread (windows served).
fn spawn_lazy(
    dir: &Path,
    snap: &Path,
    mut source: impl WindowSource + 'static,
) -> (i32, PathBuf, PathBuf, std::thread::JoinHandle<Served>) {
    let (vmm_end, host_end) = UnixStream::pair().unwrap();
    let server = std::thread::spawn(move || serve_windows(host_end, &mut source).unwrap_or_default());
    let zygote = Zygote::lazy(snap).unwrap();
    let (socket, log) = (dir.join("child.sock"), dir.join("child.log"));
    // The VMM's uid makes its control socket here.
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let spec = ChildSpec {
        socket: Some(socket.clone()),
        console_log: Some(log.clone()),
        console_stream: None,
        detach: true,
        devices: Default::default(),
        labels: Default::default(),
        // As a sandbox's VMM runs: under its seccomp filters and its own uid, which can
        // no longer make the userfaultfd (made before it drops privileges).
        owned: Owned { ids: Some(SandboxIds::of(VMM_UID)), ..Owned::default() },
        memory_source: Some(vmm_end),
    };
    let pid = zygote.spawn(spec).unwrap();
    (pid, socket, log, server)
}

fn filled_sum() -> u64 {
    (0..FILL.1 / 8).fold(0u64, |s, k| s.wrapping_add(monitor::pattern_word(FILL.2, FILL.0 + 8 * k)))
}

#[test]
fn a_lazy_child_runs_on_memory_fetched_as_it_touches_it() {
    let dir = tempfile::tempdir().unwrap();
    let (snap, windows) = lazy_snapshot(dir.path());
    let started = Instant::now();
    // A remote's pace (1 ms a window) keeps the background pass behind the guest's
    // first touches, as on a real bucket.
    let (pid, socket, log, server) = spawn_lazy(dir.path(), &snap, Paced(windows));
    let mut client = wait_socket(&socket);
    // The whole fill, read by the guest: every window of it arrives intact.
    client.send_input(&monitor::sum(FILL.0, FILL.1)).unwrap();
    wait_log(&log, &format!("={:016x}\n", filled_sum()), 1);
    let answered_ms = started.elapsed().as_secs_f64() * 1e3;
    let windows = (MEM_MIB << 20) / WINDOW_BYTES;
    let deadline = Instant::now() + Duration::from_secs(60);
    let lazy = loop {
        let status = client.call(&Request::Status {}).unwrap();
        let lazy = status["lazy_memory"].clone();
        assert_eq!(lazy["windows"], windows, "{status}");
        assert!(lazy["failed"].is_null(), "{status}");
        if lazy["complete"] == true {
            break lazy;
        }
        assert!(Instant::now() < deadline, "the memory never completed: {status}");
        std::thread::sleep(Duration::from_millis(20));
    };
    let (on_demand, ahead) = (lazy["on_demand"].as_u64().unwrap(), lazy["ahead"].as_u64().unwrap());
    assert_eq!(on_demand + ahead, windows, "each window fetched once: {lazy}");
    assert!(on_demand > 0, "the guest's own touches were served: {lazy}");
    eprintln!("lazy child answered in {answered_ms:.1} ms; {on_demand} windows on demand, {ahead} ahead");
    // Complete memory is ordinary memory: the guest writes and reads it back.
    client.send_input(&monitor::write(0x180_0000, 0x77)).unwrap();
    wait_log(&log, "ok\n", 1);
    client.send_input(&monitor::read(0x180_0000)).unwrap();
    wait_log(&log, &format!("={:016x}\n", 0x77), 1);
    shutdown(&mut client, pid);
    let served = server.join().unwrap();
    assert_eq!(served, Served { windows, complete: true }, "the host served each window once");
}

/// Serves windows from `inner`, 1 ms each.
struct Paced<S>(S);

impl<S: WindowSource> WindowSource for Paced<S> {
    fn fill(&mut self, index: u64, out: &mut [u8]) -> Result<(), String> {
        std::thread::sleep(Duration::from_millis(1));
        self.0.fill(index, out)
    }
}

/// Serves windows from `inner` but refuses window `refuse`.
struct Refusing<S> {
    inner: S,
    refuse: u64,
}

impl<S: WindowSource> WindowSource for Refusing<S> {
    fn fill(&mut self, index: u64, out: &mut [u8]) -> Result<(), String> {
        if index == self.refuse {
            return Err("object storage answered 503".into());
        }
        self.inner.fill(index, out)
    }
}

#[test]
fn a_window_that_cannot_be_fetched_stops_the_vmm_with_the_reason_not_with_zeros() {
    let dir = tempfile::tempdir().unwrap();
    let (snap, windows) = lazy_snapshot(dir.path());
    let refuse = (FILL.0 + (1 << 20)) / WINDOW_BYTES;
    let source = Refusing { inner: windows, refuse };
    let (pid, socket, log, server) = spawn_lazy(dir.path(), &snap, source);
    // It may be gone before the test connects: the background fetch reaches the window
    // soon. If it is up, a sum over the window must never answer.
    if let Ok(mut client) = forkvm_vmm::control::ControlClient::connect(&socket) {
        let _ = client.send_input(&monitor::sum(FILL.0, FILL.1));
    }
    let text = wait_log(&log, "guest memory could not be fetched", 1);
    assert!(text.contains(&format!("window {refuse}")) && text.contains("503"), "{text}");
    assert!(!text.contains(&format!("={:016x}", filled_sum())), "the guest summed without its memory: {text}");
    let mut status = 0;
    // SAFETY: waits for a child of this process; `status` is a valid out pointer.
    let waited = unsafe { libc::waitpid(pid, &mut status, 0) };
    if waited == pid {
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == EXIT_MEMORY_LOST, "status {status:#x}");
    } else {
        let deadline = Instant::now() + Duration::from_secs(10);
        while alive(pid) {
            assert!(Instant::now() < deadline, "the VMM ran on without its memory");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    server.join().unwrap();
}

#[test]
fn a_fork_of_a_lazily_restored_vm_waits_for_its_memory_and_gets_all_of_it() {
    let dir = tempfile::tempdir().unwrap();
    let (snap, windows) = lazy_snapshot(dir.path());
    let prepared = forkvm_vmm::prepare_lazy(&snap).unwrap();
    let lazy = LazyMemory::map(prepared.state.mem_size).unwrap();
    let (mut console, out) = Console::pair();
    let failure = Box::new(|reason: String| panic!("{reason}"));
    let mut vmm =
        forkvm_vmm::restore_lazy(&kvm(), &prepared, lazy, Box::new(windows), failure, out, &Default::default(), false)
            .unwrap();
    // Forked at once, before the guest touched its fill: fork() copies the memory, so
    // it waits until every window is in, and the child's copy has no page missing (a
    // missing page would read as zero there).
    let child = ForkChild {
        socket: dir.path().join("fork.sock"),
        console_log: Some(dir.path().join("fork.log")),
        vsock_uds: None,
        labels: Default::default(),
        run_dir: None,
        rate_limits: None,
        disk_dir: None,
        tap: None,
    };
    let report = vmm.fork_running(std::slice::from_ref(&child)).unwrap();
    assert_eq!(vmm.status().lazy_memory.map(|l| l.complete), Some(true));
    let mut client = wait_socket(&child.socket);
    let log = child.console_log.clone().unwrap();
    client.send_input(&monitor::sum(FILL.0, FILL.1)).unwrap();
    wait_log(&log, &format!("={:016x}\n", filled_sum()), 1);
    vmm.send_serial_input(&monitor::sum(FILL.0, FILL.1)).unwrap();
    console.wait_for(&format!("={:016x}\n", filled_sum()), T);
    shutdown(&mut client, report.pids[0]);
}
