//! Linux tier, through the CLI: every sandbox's own layered data disk (under the root
//! overlay), its branches and forks, and its encrypted continuous disk snapshots —
//! a SIGKILL during a snapshot write leaves the previous complete one, and the store
//! holds no plaintext. The template is booted once (cached); every sandbox is a restore.
//!
//! Disk snapshots are checked from the host: `disk-export` writes one out as a raw
//! ext4 image, `e2fsck` replays its journal (a snapshot is a crash-consistent cut), and
//! `debugfs` reads files from it (the overlay's upper directory is `/upper` there).

#[path = "common/disk_image.rs"]
mod disk_image;

use disk_image::{fsck, read_in_image};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Instant;

/// A private store, registry and key directory for one test; kills its sandboxes when dropped.
struct Env {
    tmp: tempfile::TempDir,
    store: PathBuf,
    run: PathBuf,
    keys: PathBuf,
    /// Extra environment for every command (test hooks).
    extra_env: Vec<(&'static str, String)>,
}

impl Env {
    fn new() -> Env {
        let tmp = tempfile::tempdir().unwrap();
        let (store, run, keys) = (tmp.path().join("store"), tmp.path().join("run"), tmp.path().join("keys"));
        Env { tmp, store, run, keys, extra_env: Vec::new() }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_forkvm"));
        c.args(args).env("FORKVM_STORE", &self.store).env("FORKVM_RUN", &self.run).env("FORKVM_KEYS", &self.keys);
        c.envs(self.extra_env.iter().map(|(k, v)| (k, v)));
        c
    }

    fn cmd(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.cmd(args);
        assert!(out.status.success(), "forkvm {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    }

    fn json(&self, args: &[&str]) -> serde_json::Value {
        serde_json::from_str(&self.ok(args)).unwrap()
    }

    fn fork(&self, from: &str, what: &str, n: usize) -> Vec<String> {
        let v = self.json(&["fork", from, what, "-n", &n.to_string(), "--json"]);
        v["sandboxes"].as_array().unwrap().iter().map(|s| s["sandbox_id"].as_str().unwrap().to_string()).collect()
    }

    /// Runs a shell command in sandbox `id`; returns its stdout.
    fn sh(&self, id: &str, script: &str) -> String {
        self.ok(&["exec", id, "--", "sh", "-c", script])
    }

    /// Sequence numbers of the sandbox's disk snapshots, oldest first.
    fn seqs(&self, id: &str) -> Vec<u64> {
        let v = self.json(&["disk-snapshots", id, "--json"]);
        v.as_array().unwrap().iter().map(|s| s["seq"].as_u64().unwrap()).collect()
    }

    /// Exports disk snapshot `seq` of `id` and replays its journal; returns the image.
    fn export(&self, id: &str, seq: u64) -> PathBuf {
        let out = self.tmp.path().join(format!("export-{id}-{seq}.img"));
        let _ = std::fs::remove_file(&out);
        self.ok(&["disk-export", id, "--seq", &seq.to_string(), "--out", out.to_str().unwrap()]);
        fsck(&out);
        out
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = self.cmd(&["kill", "--all"]);
    }
}

fn md5(bytes: &[u8]) -> String {
    let mut c = Command::new("md5sum").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    use std::io::Write;
    c.stdin.take().unwrap().write_all(bytes).unwrap();
    let out = c.wait_with_output().unwrap();
    String::from_utf8(out.stdout).unwrap().split_whitespace().next().unwrap().to_string()
}

/// Writes about `kib` KiB of numbers (`seq`, starting at `start`: every 64 KiB of it
/// differs from every other, so none dedups) to `/root/<name>` in `id`, syncs, and
/// returns their md5 as the guest computed it. Small: every byte a guest writes goes
/// through its kernel, whose code is emulated here (~12 s per MiB, measured).
fn write_numbers(env: &Env, id: &str, name: &str, start: u64, kib: u64) -> String {
    let end = start + (kib << 10) / 10;
    let out = env.sh(id, &format!("seq {start} {end} > /root/{name} && sync && md5sum /root/{name}"));
    out.split_whitespace().next().unwrap().to_string()
}

#[test]
fn each_sandbox_writes_its_own_disk_and_forks_and_branches_carry_it() {
    let env = Env::new();
    env.ok(&["snapshot", "create", "--image", "tiny", "--tag", "t"]);
    let parent = env.fork("--tag", "t", 1).remove(0);
    // The root is an overlay whose writable half is the sandbox's own 4 GiB disk.
    let mounts = env.sh(&parent, "cat /proc/mounts");
    assert!(
        mounts.lines().any(|l| l.starts_with("overlay / overlay ") && l.contains("upperdir=/overlay/upper")),
        "{mounts}"
    );
    let df = env.sh(&parent, "df -k / | tail -n 1");
    let total_kib: u64 = df.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or(0);
    assert!(total_kib > 3 << 20, "the writable root is not the data disk: {df}");
    env.sh(&parent, "echo parent > /root/who && sync");

    // Children of the running sandbox see its files and then diverge, each on its own disk.
    let report = env.json(&["fork", "--from-sandbox", &parent, "-n", "2", "--json"]);
    let kids: Vec<String> =
        report["sandboxes"].as_array().unwrap().iter().map(|s| s["sandbox_id"].as_str().unwrap().into()).collect();
    for (i, k) in kids.iter().enumerate() {
        assert_eq!(env.sh(k, "cat /root/who"), "parent\n");
        env.sh(k, &format!("echo child{i} > /root/who && sync"));
    }
    env.sh(&parent, "echo parent2 > /root/who && sync");
    assert_eq!(env.sh(&kids[0], "cat /root/who"), "child0\n");
    assert_eq!(env.sh(&kids[1], "cat /root/who"), "child1\n");
    assert_eq!(env.sh(&parent, "cat /root/who"), "parent2\n");

    // A live branch captures the disk with the memory; its children start from there.
    env.ok(&["branch", &kids[0], "--tag", "k0", "--mode", "live"]);
    env.sh(&kids[0], "echo later > /root/who && sync");
    for k in env.fork("--tag", "k0", 2) {
        assert_eq!(env.sh(&k, "cat /root/who"), "child0\n");
    }
    assert_eq!(env.sh(&kids[0], "cat /root/who"), "later\n");

    // The branch took over the layers it captured (the store's now, not the sandbox's
    // uid's): forks of the running sandbox still inherit them, and forks of those.
    let own_layers = env.run.join("sandboxes").join(&kids[0]).join("disks/disk1");
    let owners: Vec<(String, u32)> = std::fs::read_dir(&own_layers)
        .unwrap()
        .filter_map(|e| {
            let e = e.unwrap();
            let m = std::fs::metadata(e.path().join("data")).ok()?;
            Some((e.file_name().to_string_lossy().into_owned(), std::os::unix::fs::MetadataExt::uid(&m)))
        })
        .collect();
    assert!(owners.iter().any(|(_, uid)| *uid == 0), "no layer in {} is root's: {owners:?}", own_layers.display());
    let grandkid = env.fork("--from-sandbox", &kids[0], 1).remove(0);
    assert_eq!(env.sh(&grandkid, "cat /root/who"), "later\n");
    env.sh(&grandkid, "echo grandkid > /root/who && sync");
    let great = env.fork("--from-sandbox", &grandkid, 1).remove(0);
    assert_eq!(env.sh(&great, "cat /root/who"), "grandkid\n");
    env.ok(&["kill", &great, &grandkid]);

    // Sealed layers are shared by hard link, not copied: the tag's layers are links.
    let layers = env.store.join("snapshots/k0/disk/disk1.img.layers");
    let mut linked = 0;
    for l in std::fs::read_dir(&layers).unwrap() {
        use std::os::unix::fs::MetadataExt;
        let data = std::fs::metadata(l.unwrap().path().join("data")).unwrap();
        linked += usize::from(data.nlink() > 1);
    }
    assert!(linked > 0, "no layer of the branch is shared with its sandbox");
}

#[test]
fn a_disk_snapshot_killed_mid_write_leaves_the_previous_one_whole() {
    let mut env = Env::new();
    // Each chunk the vault writes is followed by a pause (a test hook), so the kills
    // below land inside the writes rather than before or after them.
    env.extra_env.push(("FORKVM_FAULT_INJECTION", "1".into()));
    env.extra_env.push(("FORKVM_DISK_SNAPSHOT_STALL_MS", "150".into()));
    env.ok(&["snapshot", "create", "--image", "tiny", "--tag", "t"]);
    let id = env.fork("--tag", "t", 1).remove(0);

    // Round 0, uninterrupted: the reference duration of a snapshot of ~512 KiB.
    let mut files: Vec<(String, String)> = Vec::new();
    files.push(("f0".into(), write_numbers(&env, &id, "f0", 100_000_000, 512)));
    let started = Instant::now();
    let first = env.json(&["disk-snapshot", &id, "--json"]);
    let full = started.elapsed();
    assert_eq!(first["seq"], 1);
    assert!(first["written_chunks"].as_u64().unwrap() >= 8, "{first}");

    // Each round writes a new file, then SIGKILLs a snapshot at a fraction of that time.
    let mut interrupted = 0;
    let mut complete: Vec<(String, String)> = files.clone();
    for (round, fraction) in [0.15, 0.35, 0.55, 0.75, 0.95].into_iter().enumerate() {
        let name = format!("f{}", round + 1);
        let sum = write_numbers(&env, &id, &name, (round as u64 + 2) * 100_000_000, 512);
        let before = *env.seqs(&id).last().unwrap();
        let mut child =
            env.command(&["disk-snapshot", &id]).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
        std::thread::sleep(full.mul_f64(fraction));
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
        let status = child.wait().unwrap();
        let after = *env.seqs(&id).last().unwrap();
        files.push((name.clone(), sum.clone()));
        if after == before {
            interrupted += usize::from(status.code().is_none());
        } else {
            assert_eq!(after, before + 1, "a killed snapshot may only complete or not exist");
            complete = files.clone();
        }
        // The newest snapshot is complete: it holds exactly the files written before it.
        let image = env.export(&id, after);
        for (f, want) in &files {
            let got = read_in_image(&image, &format!("/upper/root/{f}"));
            if complete.iter().any(|(c, _)| c == f) {
                let got = got.unwrap_or_else(|| panic!("round {round}: {f} missing from snapshot {after}"));
                assert_eq!(&md5(&got), want, "round {round}: {f} differs in snapshot {after}");
            } else {
                assert!(got.is_none(), "round {round}: {f} was written after snapshot {after} yet is in it");
            }
        }
        std::fs::remove_file(&image).unwrap();
    }
    assert!(interrupted > 0, "no snapshot was actually interrupted (reference run took {full:?})");

    // The next snapshot picks up every layer the killed ones missed.
    let last = env.json(&["disk-snapshot", &id, "--json"]);
    let image = env.export(&id, last["seq"].as_u64().unwrap());
    for (f, want) in &files {
        let got = read_in_image(&image, &format!("/upper/root/{f}")).unwrap_or_else(|| panic!("{f} missing"));
        assert_eq!(&md5(&got), want, "{f} differs in the final snapshot");
    }
    // Nothing a killed writer left behind is taken for a snapshot, and every one listed reads.
    for seq in env.seqs(&id) {
        std::fs::remove_file(env.export(&id, seq)).unwrap();
    }
}

#[test]
fn the_store_holds_no_plaintext_of_what_the_guest_wrote() {
    let env = Env::new();
    env.ok(&["snapshot", "create", "--image", "tiny", "--tag", "t"]);
    let id = env.fork("--tag", "t", 1).remove(0);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let nonce = format!("{:016x}", (now as u64) ^ u64::from(std::process::id()));
    let canary = format!("FORKVM-CANARY-{nonce}");
    env.sh(&id, &format!("yes {canary} | head -c 4194304 > /root/canary && sync"));
    let r = env.json(&["disk-snapshot", &id, "--json"]);
    assert!(r["written_bytes"].as_u64().unwrap() > 0, "{r}");
    // Positive control: the sandbox's own (live, local) disk holds it in the clear, so
    // the search below can find it when it is there.
    assert!(contains_anywhere(&env.run, canary.as_bytes()), "the search does not find the canary in the live disk");
    assert!(!contains_anywhere(&env.store, canary.as_bytes()), "plaintext of the guest's file in the store");
    assert!(!contains_anywhere(&env.keys, canary.as_bytes()), "plaintext of the guest's file next to the keys");
    // The keys are apart from the data.
    assert!(!env.keys.starts_with(&env.store) && !env.store.starts_with(&env.keys));
    assert!(env.store.join("vault").join(&id).is_dir());

    // An archive holds memory too: a tmpfs file lives only in guest memory (and the
    // disk file above in its page cache). A plain branch (a tag, which is the user's
    // unencrypted copy) shows the search finds them in a memory image...
    let in_memory = format!("FORKVM-MEMORY-CANARY-{nonce}");
    env.sh(&id, &format!("yes {in_memory} | head -c 1048576 > /tmp/in-memory"));
    env.ok(&["branch", &id, "--tag", "probe"]);
    let probe = env.store.join("snapshots").join("probe");
    assert!(contains_anywhere(&probe, in_memory.as_bytes()), "the search does not find the canary in a memory image");
    env.ok(&["rmi", "probe"]);
    // The tag the sandbox runs from is in use: its removal is refused, naming it.
    let out = env.cmd(&["rmi", "t"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains(&id) && err.contains("--force"), "{err}");
    // ...and the archive, memory and disks, holds neither in the clear.
    env.json(&["archive", &id, "--json"]);
    assert!(!contains_anywhere(&env.store, in_memory.as_bytes()), "plaintext of the guest's memory in the store");
    assert!(!contains_anywhere(&env.store, canary.as_bytes()), "plaintext of the guest's file in the store");
    // What was encrypted comes back whole.
    env.ok(&["unarchive", &id]);
    let yes = |line: &str, len: usize| md5(&format!("{line}\n").repeat(len / line.len() + 1).as_bytes()[..len]);
    let guest_md5 =
        |path: &str| env.sh(&id, &format!("md5sum < {path}")).split_whitespace().next().unwrap().to_string();
    assert_eq!(guest_md5("/tmp/in-memory"), yes(&in_memory, 1 << 20));
    assert_eq!(guest_md5("/root/canary"), yes(&canary, 4 << 20));
    // kill --purge leaves nothing: archive, vault and key gone.
    env.ok(&["kill", "--purge", &id]);
    assert!(!env.store.join("vault").join(&id).exists());
    assert!(!env.keys.join("sandboxes").join(format!("{id}.key")).exists());
    assert!(std::fs::read_dir(env.store.join("archives")).unwrap().next().is_none());
}

/// Whether any file under `dir` contains `needle`: GNU grep, which skips the holes of
/// sparse files (layer data files are multi-GiB and mostly holes).
fn contains_anywhere(dir: &Path, needle: &[u8]) -> bool {
    if !dir.exists() {
        return false;
    }
    let out = Command::new("grep")
        .args(["-r", "-l", "-F", "-a", "--"])
        .arg(std::str::from_utf8(needle).unwrap())
        .arg(dir)
        .output()
        .expect("grep runs");
    // 0: found; 1: not found; 2: trouble (which must not pass for "not found").
    match out.status.code() {
        Some(0) => true,
        Some(1) => false,
        _ => panic!("grep over {} failed: {}", dir.display(), String::from_utf8_lossy(&out.stderr)),
    }
}

#[test]
fn archive_then_unarchive_keeps_files_and_running_processes() {
    let env = Env::new();
    env.ok(&["snapshot", "create", "--image", "tiny", "--tag", "t"]);
    let id = env.fork("--tag", "t", 1).remove(0);
    env.sh(&id, "echo kept > /root/kept && sync");
    // A process that runs across the archive: it appends a line a second to a tmpfs file.
    env.sh(&id, "(while true; do echo tick >> /tmp/ticks; sleep 1; done) >/dev/null 2>&1 & echo $! > /tmp/loop.pid");
    let ticks = |env: &Env| env.sh(&id, "wc -l < /tmp/ticks").trim().parse::<u32>().unwrap();

    for round in 0..2 {
        let r = env.json(&["archive", &id, "--json"]);
        assert!(r["disk_snapshot_seq"].as_u64().is_some(), "{r}");
        // ps lists it archived (as the daemon's does): no process, no address.
        let ps = env.json(&["ps", "--json"]);
        let listed: Vec<_> = ps.as_array().unwrap().iter().filter(|s| s["id"] == id.as_str()).collect();
        assert_eq!(listed.len(), 1, "round {round}: {ps}");
        assert_eq!(
            (&listed[0]["state"], &listed[0]["pid"]),
            (&serde_json::json!("archived"), &serde_json::Value::Null)
        );
        assert_eq!(env.json(&["archives", "--json"]), serde_json::json!([id]));
        let out = env.cmd(&["exec", &id, "--", "true"]);
        assert!(!out.status.success(), "an archived sandbox has no process to exec in");

        env.ok(&["unarchive", &id]);
        let expected: String =
            std::iter::once("kept\n".to_string()).chain((0..round).map(|r| format!("round{r}\n"))).collect();
        assert_eq!(env.sh(&id, "cat /root/kept"), expected, "round {round}");
        env.sh(&id, "kill -0 $(cat /tmp/loop.pid)");
        let before = ticks(&env);
        std::thread::sleep(std::time::Duration::from_millis(2500));
        assert!(ticks(&env) > before, "round {round}: the loop stopped running");
        assert!(env.fails_unarchive(&id).contains("running"), "unarchive of a running sandbox is refused");
        env.sh(&id, &format!("echo round{round} >> /root/kept && sync"));
        // The first disk snapshot after the restore settles the lazy disk and uploads
        // only the new write: the vault's lineage goes on through the restore.
        let r = env.json(&["disk-snapshot", &id, "--json"]);
        assert!(r["written_bytes"].as_u64().unwrap() < 1 << 20, "round {round}: {r}");
    }
    assert_eq!(env.sh(&id, "cat /root/kept"), "kept\nround0\nround1\n");
    // Kill is the destructive verb: the archive goes with the sandbox.
    env.ok(&["kill", &id]);
    assert_eq!(env.json(&["archives", "--json"]), serde_json::json!([]));
    let left: Vec<_> = std::fs::read_dir(env.store.join("archives")).unwrap().flatten().collect();
    assert!(left.is_empty(), "{left:?}");
}

impl Env {
    fn fails_unarchive(&self, id: &str) -> String {
        let out = self.cmd(&["unarchive", id]);
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    }
}

#[test]
fn layers_the_vault_holds_are_merged_and_everything_still_reads_them() {
    let mut env = Env::new();
    env.extra_env.push(("FORKVM_COMPACT_LAYERS", "3".into()));
    env.ok(&["snapshot", "create", "--image", "tiny", "--tag", "t"]);
    let id = env.fork("--tag", "t", 1).remove(0);
    let disk_dir = env.run.join("sandboxes").join(&id).join("disks").join("disk1");
    let entries = |prefix: &str| {
        let mut v: Vec<String> = std::fs::read_dir(&disk_dir)
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| n.starts_with(prefix))
            .collect();
        v.sort();
        v
    };
    let mut compacted = Vec::new();
    let mut child = None;
    for round in 0..3 {
        env.sh(&id, &format!("echo round{round} >> /root/log && sync"));
        if round == 1 {
            // A live fork shares the source's layers so far; it must survive their merge.
            child = Some(env.fork("--from-sandbox", &id, 1).remove(0));
        }
        let r = env.json(&["disk-snapshot", &id, "--json"]);
        compacted.push(r["compacted_layers"].as_u64().unwrap());
    }
    // Three own layers by the third snapshot (the fork sealed one more): merged then.
    assert_eq!(compacted[..2], [0, 0], "{compacted:?}");
    assert!(compacted[2] >= 3, "{compacted:?}");
    assert_eq!(entries("merged-").len(), 1, "{:?}", entries(""));
    assert!(entries("top-").len() <= 1, "the merged tops are gone: {:?}", entries(""));
    assert_eq!(env.sh(&id, "cat /root/log"), "round0\nround1\nround2\n");

    // The vault's lineage goes on: the next snapshot uploads only the new write.
    env.sh(&id, "echo round3 >> /root/log && sync");
    let r = env.json(&["disk-snapshot", &id, "--json"]);
    assert!(r["written_bytes"].as_u64().unwrap() < 1 << 20, "{r}");
    let image = env.export(&id, r["seq"].as_u64().unwrap());
    assert_eq!(read_in_image(&image, "/upper/root/log").unwrap(), b"round0\nround1\nround2\nround3\n");
    // A branch carries the merged layer, and the child forked before the merge still
    // branches (its own links to the layers it shares).
    env.ok(&["branch", &id, "--tag", "after-merge"]);
    let kid = env.fork("--tag", "after-merge", 1).remove(0);
    assert_eq!(env.sh(&kid, "cat /root/log"), "round0\nround1\nround2\nround3\n");
    let child = child.unwrap();
    env.ok(&["branch", &child, "--tag", "child-branch"]);
    let grandchild = env.fork("--tag", "child-branch", 1).remove(0);
    assert_eq!(env.sh(&grandchild, "cat /root/log"), "round0\nround1\n");
}

#[test]
fn a_sandbox_whose_vmm_dies_has_its_disk_writes_salvaged_into_its_vault() {
    let env = Env::new();
    env.ok(&["snapshot", "create", "--image", "tiny", "--tag", "t"]);
    let id = env.fork("--tag", "t", 1).remove(0);
    // One disk snapshot, then more writes that only the run directory holds.
    env.sh(&id, "echo before > /root/salvage && sync");
    let first = env.json(&["disk-snapshot", &id, "--json"])["seq"].as_u64().unwrap();
    env.sh(&id, "echo after >> /root/salvage && sync");
    let ps = env.json(&["ps", "--json"]);
    let pid = ps.as_array().unwrap().iter().find(|s| s["id"] == id.as_str()).unwrap()["pid"].as_i64().unwrap();
    // The VMM dies without being asked to.
    // SAFETY: signals a process by pid; no memory is involved.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    while std::path::Path::new(&format!("/proc/{pid}")).exists() {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // Reads show it gone and change nothing: the run directory (and the writes in it)
    // stays for the sweep, which salvages, then cleans up.
    let ps = env.json(&["ps", "--json"]);
    assert!(ps.as_array().unwrap().iter().all(|s| s["id"] != id.as_str()), "{ps}");
    assert!(env.run.join("sandboxes").join(&id).exists(), "a read removed the run directory");
    assert_eq!(env.seqs(&id).last(), Some(&first), "a read salvaged");
    let swept = env.json(&["sweep", "--json"]);
    assert_eq!(swept["sandboxes"], serde_json::json!([id]), "{swept}");
    assert!(!env.run.join("sandboxes").join(&id).exists(), "the run directory was removed after the salvage");
    let seqs = env.seqs(&id);
    assert!(seqs.last().is_some_and(|&s| s > first), "no salvage snapshot after {first}: {seqs:?}");
    let image = env.export(&id, *seqs.last().unwrap());
    assert_eq!(read_in_image(&image, "/upper/root/salvage").unwrap(), b"before\nafter\n");

    // A guest that stops itself (a reboot: this kernel has no ACPI, so `poweroff` only
    // halts it): its VMM exits without being asked to and leaves its run directory for
    // the same salvage.
    let other = env.fork("--tag", "t", 1).remove(0);
    env.sh(&other, "echo written > /root/poweroff && sync");
    let _ = env.cmd(&["exec", &other, "--", "sh", "-c", "reboot -f"]);
    let deadline = Instant::now() + std::time::Duration::from_secs(60);
    while env.json(&["ps", "--json"]).as_array().unwrap().iter().any(|s| s["id"] == other.as_str()) {
        assert!(Instant::now() < deadline, "the guest did not stop");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    env.ok(&["sweep"]);
    let seqs = env.seqs(&other);
    let image = env.export(&other, *seqs.last().expect("a salvage snapshot"));
    assert_eq!(read_in_image(&image, "/upper/root/poweroff").unwrap(), b"written\n");
}
