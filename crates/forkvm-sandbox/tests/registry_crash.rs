//! Crash test of the registry's protocol: a worker process walks sandboxes through every
//! transition the library makes — a spawn (rows `starting`, VMMs forked, one write, the
//! agents ready), an idle pause, an archive (archive complete, row `archived`, VMM
//! stopped), a restore (row `restoring`, VMM started, archive linked, `running`) and a
//! kill — in the order `spawn.rs`, `archive/` and `lifecycle.rs` make them, and is killed
//! with SIGKILL right after each step in turn (and somewhere inside the next), sometimes
//! with one of its VMMs killed too. After each kill, [`Registry::recover`] must leave
//! the one registry consistent: no start left half done, every running row with a live
//! VMM, every archived row with its archive and no VMM, no VMM or run directory without
//! a row, no archive without a row; and a second recovery finds nothing to do.
//!
//! No KVM: the VMMs are stand-in processes and the archives stand-in directories,
//! because what is tested is the registry (rows, owners, compare-and-set, sweep,
//! recovery), at dozens of crash points a run. A stand-in serves a control socket in its
//! run directory as a VMM does, stops when asked (removing its run directory), and is
//! noted (`vmm.start`) right after it is forked, as `start::snapshot::start_vmms` notes a VMM.
//! Recovery runs 100 ms after the kill, as a restarted daemon would at the earliest, and
//! once every stand-in forked before the kill serves its socket.
//! `forkvm/tests/daemon_restart.rs` kills a real daemon mid-spawn and mid-branch with
//! real Linux VMMs.

use forkvm_sandbox::registry::{record_alive, Origin, SandboxRecord};
use forkvm_sandbox::{Registry, SandboxState, StateReason};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Steps of one worker round (the lines it prints).
const STEPS: usize = 13;

fn registry(root: &Path) -> Registry {
    Registry::open(root.join("run")).salvaging_into(&root.join("store"))
}

/// A stand-in VMM for `run_dir`: this test binary running [`stand_in_vmm`], its command
/// line carrying `marker`.
fn start_vmm(marker: &str, run_dir: &Path) -> i32 {
    Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "stand_in_vmm", marker, "--nocapture"])
        .env("FORKVM_STAND_IN_DIR", run_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("the stand-in starts")
        .id() as i32
}

/// The stand-in VMM process: serves `control.sock` in its run directory until asked to
/// shut down, then removes the run directory and exits, as a VMM does.
#[test]
#[ignore = "a stand-in VMM process of the crash test; runs only when that test starts it"]
fn stand_in_vmm() {
    let dir = PathBuf::from(std::env::var("FORKVM_STAND_IN_DIR").expect("run by the crash test"));
    // Never outlives a crash test that failed before stopping it.
    std::thread::spawn(|| {
        std::thread::sleep(Duration::from_secs(600));
        std::process::exit(0);
    });
    let listener = std::os::unix::net::UnixListener::bind(dir.join("control.sock")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(600);
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let mut line = String::new();
        let _ = std::io::BufReader::new(&conn).read_line(&mut line);
        let _ = writeln!(&conn, r#"{{"v":2,"ok":true,"result":null}}"#);
        if line.contains("shutdown") || Instant::now() > deadline {
            let _ = std::fs::remove_dir_all(&dir);
            std::process::exit(0);
        }
    }
}

fn archive_dir(root: &Path, id: &str) -> PathBuf {
    root.join("store/archives").join(id)
}

/// The worker (run by `a_kill_9_at_every_transition_leaves_the_registry_consistent` as
/// a separate process, which it kills).
#[test]
#[ignore = "the crash test's worker process; runs only when that test starts it"]
fn crash_worker() {
    let root = PathBuf::from(std::env::var("FORKVM_CRASH_ROOT").expect("run by the crash test"));
    let marker = std::env::var("FORKVM_CRASH_MARK").unwrap();
    let tag = std::env::var("FORKVM_CRASH_TAG").unwrap();
    let reg = registry(&root);
    let mut out = std::io::stdout().lock();
    let mut step = |name: &str| {
        writeln!(out, "step: {name}").unwrap();
        out.flush().unwrap();
    };
    for round in 0.. {
        let ids: Vec<String> = (0..3).map(|i| format!("{tag}-{round}-{i}")).collect();
        let origin = Origin { template: Some("t".into()), ..Origin::default() };
        // A spawn (`start::snapshot::start_vmms`, `ready::finish_within`).
        let mut records: Vec<SandboxRecord> =
            ids.iter().map(|id| reg.new_record(id, origin.clone()).unwrap()).collect();
        reg.begin(&records.iter().collect::<Vec<_>>(), None).unwrap();
        step("begun");
        for r in &mut records {
            let dir = reg.create_run_dir(&r.id).unwrap();
            r.pid = start_vmm(&marker, &dir);
            reg.note_started(r);
        }
        step("forked");
        reg.write_all(&records.iter().collect::<Vec<_>>()).unwrap();
        step("written");
        reg.mark_ready(&ids.iter().map(String::as_str).collect::<Vec<_>>()).unwrap();
        step("ready");
        // An idle pause (the daemon's lifecycle tick).
        assert!(reg
            .transition(&ids[0], &[SandboxState::Running], SandboxState::Paused, Some(StateReason::Idle))
            .unwrap());
        step("paused");
        // An archive (`archive::archive`): complete first, then the row, then the VMM.
        let a = archive_dir(&root, &ids[1]);
        let partial = a.with_file_name(format!("{}.partial", ids[1]));
        std::fs::create_dir_all(&partial).unwrap();
        std::fs::write(partial.join("archive.json"), "{}").unwrap();
        std::fs::rename(&partial, &a).unwrap();
        step("archive written");
        let live = [SandboxState::Running, SandboxState::Paused];
        assert!(reg.transition(&ids[1], &live, SandboxState::Archived, Some(StateReason::Api)).unwrap());
        step("archived");
        forkvm_sandbox::verbs::kill_record(&reg, &records[1]).unwrap();
        step("archived VMM stopped");
        // A restore (`start::restore::start_restore`, `finish_restore`).
        assert!(reg.transition(&ids[1], &[SandboxState::Archived], SandboxState::Restoring, None).unwrap());
        step("restore claimed");
        let mut restored = reg.new_record(&ids[1], origin.clone()).unwrap();
        let dir = reg.create_run_dir(&ids[1]).unwrap();
        restored.pid = start_vmm(&marker, &dir);
        reg.write(&restored).unwrap();
        step("restore started");
        std::os::unix::fs::symlink(&a, restored.dir().archive_link()).unwrap();
        step("restore linked");
        assert!(reg.transition(&ids[1], &[SandboxState::Restoring], SandboxState::Running, None).unwrap());
        step("restored");
        // Kills (`lifecycle::kill_record`; the restored one's archive goes with it).
        for r in [&records[0], &restored, &records[2]] {
            forkvm_sandbox::verbs::kill_record(&reg, r).unwrap();
        }
        step("killed");
    }
}

/// Kills the stand-in VMMs carrying its marker when dropped, so that a failed run leaves
/// none behind.
struct StopStandIns(String);

impl Drop for StopStandIns {
    fn drop(&mut self) {
        for pid in processes_with(&self.0) {
            // SAFETY: kill(2) on a stand-in VMM this test started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// Pids of live processes whose command line carries `marker`.
fn processes_with(marker: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(marker) && forkvm_sandbox::registry::vmm_alive(pid) {
            out.push(pid);
        }
    }
    out
}

/// The run directory stand-in `pid` serves (from its environment).
fn stand_in_dir(pid: i32) -> Option<PathBuf> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    environ
        .split(|b| *b == 0)
        .find_map(|v| v.strip_prefix(b"FORKVM_STAND_IN_DIR="))
        .map(|d| PathBuf::from(String::from_utf8_lossy(d).into_owned()))
}

/// Waits (up to 5 s) until every stand-in carrying `marker` serves its control socket or
/// has gone: a restarted daemon recovers once the VMMs its starter forked are up. A fixed
/// pause was not enough on a loaded host, where a fresh stand-in can take longer than
/// 100 ms to bind its socket.
fn wait_for_stand_ins(marker: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    for pid in processes_with(marker) {
        let Some(dir) = stand_in_dir(pid) else { continue };
        while !dir.join("control.sock").exists()
            && forkvm_sandbox::registry::vmm_alive(pid)
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// What must hold after recovery (see the module doc); a message naming what does not.
fn check_consistent(root: &Path, reg: &Registry, marker: &str) -> Result<(), String> {
    let rows = reg.rows();
    let mut vmm_pids = Vec::new();
    for row in &rows {
        let r = &row.record;
        match row.state {
            SandboxState::Starting | SandboxState::Restoring => {
                return Err(format!("{} is still {} after recovery", r.id, row.state))
            }
            SandboxState::Running | SandboxState::Paused => {
                if !(r.pid > 0 && r.run_dir.is_dir() && record_alive(r)) {
                    return Err(format!("{} is {} without a live VMM", r.id, row.state));
                }
                vmm_pids.push(r.pid);
            }
            SandboxState::Archived => {
                if !archive_dir(root, &r.id).join("archive.json").is_file() {
                    return Err(format!("{} is archived without an archive", r.id));
                }
                if r.run_dir.exists() || r.pid != 0 {
                    return Err(format!("{} is archived but still has a run directory or a VMM", r.id));
                }
            }
        }
    }
    for pid in processes_with(marker) {
        // One that was asked to stop removes its run directory, then exits: it gets a
        // moment to be gone.
        let exiting = stand_in_dir(pid).is_some_and(|d| !d.exists());
        let deadline = Instant::now() + Duration::from_secs(1);
        while exiting && forkvm_sandbox::registry::vmm_alive(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        if !vmm_pids.contains(&pid) && forkvm_sandbox::registry::vmm_alive(pid) {
            return Err(format!("VMM {pid} runs without a row"));
        }
    }
    for e in std::fs::read_dir(root.join("run/sandboxes")).into_iter().flatten().flatten() {
        let id = e.file_name().to_string_lossy().into_owned();
        if !rows.iter().any(|r| r.id() == id && r.state.is_live()) {
            return Err(format!("run directory {id} without a running row"));
        }
    }
    for e in std::fs::read_dir(root.join("store/archives")).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let complete = e.path().join("archive.json").is_file();
        let id = match name.strip_suffix(".partial") {
            // One being written (the next archive of that sandbox starts by removing it).
            Some(_) if !complete => continue,
            Some(id) => id.to_string(),
            None if !complete => return Err(format!("archive {name} is left incomplete")),
            None => name,
        };
        if !rows.iter().any(|r| r.id() == id) {
            return Err(format!("archive {id} without a row"));
        }
    }
    Ok(())
}

#[test]
fn a_kill_9_at_every_transition_leaves_the_registry_consistent() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let marker = format!("3600.{}", std::process::id());
    let _stop = StopStandIns(marker.clone());
    let reg = registry(root);
    let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ u64::from(std::process::id());
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let started = Instant::now();
    let mut crashes = 0;
    let mut vmm_kills = 0;
    // Every step, twice each (the second time with a VMM killed as well), then random
    // points; bounded in count and time. `FORKVM_CRASH_KILLS=1000` runs longer.
    let kills: usize = std::env::var("FORKVM_CRASH_KILLS").ok().and_then(|v| v.parse().ok()).unwrap_or(3 * STEPS);
    let limit = Duration::from_secs(if kills > 3 * STEPS { 1800 } else { 120 });
    for i in 0..kills.max(2 * STEPS) {
        if started.elapsed() > limit {
            break;
        }
        let after = if i < 2 * STEPS { i % STEPS } else { next() as usize % STEPS };
        let mut worker = Command::new(std::env::current_exe().unwrap())
            .args(["--ignored", "--exact", "crash_worker", "--nocapture", "--test-threads=1"])
            .env("FORKVM_CRASH_ROOT", root)
            .env("FORKVM_CRASH_MARK", &marker)
            .env("FORKVM_CRASH_TAG", format!("c{i}"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = std::io::BufReader::new(worker.stdout.take().unwrap()).lines();
        // The harness prints lines of its own too; the worker's name its steps.
        let mut seen = 0;
        let deadline = Instant::now() + Duration::from_secs(20);
        while seen <= after {
            let line = lines.next().expect("the worker stopped early").unwrap();
            seen += usize::from(line.contains("step: "));
            assert!(Instant::now() < deadline, "the worker is stuck");
        }
        // Somewhere between this step and the next.
        std::thread::sleep(Duration::from_micros(next() % 400));
        worker.kill().unwrap();
        worker.wait().unwrap();
        crashes += 1;
        if i >= STEPS && i % 2 == 1 {
            let vmms = processes_with(&marker);
            if let Some(&pid) = vmms.get(next() as usize % vmms.len().max(1)) {
                // SAFETY: kill(2) on a stand-in VMM this test's worker started.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                vmm_kills += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
        wait_for_stand_ins(&marker);
        let recovered = reg.recover();
        if let Err(e) = check_consistent(root, &reg, &marker) {
            panic!(
                "after a kill -9 after step {after} of round {i}: {e}\nrecovered: {recovered:?}\nrows: {:#?}",
                reg.rows()
            );
        }
        let again = reg.recover();
        assert!(again.swept.is_empty(), "a second recovery had work left: {again:?}");
    }
    // Everything left stops cleanly.
    for row in reg.rows() {
        if row.state.is_live() {
            forkvm_sandbox::verbs::kill_record(&reg, &row.record).unwrap();
        } else {
            reg.remove(row.id()).unwrap();
        }
    }
    assert!(processes_with(&marker).is_empty(), "stand-in VMMs left running");
    assert!(crashes >= 2 * STEPS, "only {crashes} crashes in the time allowed");
    assert!(vmm_kills > 0, "no VMM was killed");
    eprintln!("registry crash test: {crashes} kills of the worker, {vmm_kills} of a VMM");
}
