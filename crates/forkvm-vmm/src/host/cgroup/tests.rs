//! Detection and group handling on fake trees, then the real thing on this host (root;
//! fails loudly if the host has no usable memory cgroup).

use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::*;

const MIB: u64 = 1 << 20;

/// The cgroup lines of the CI host's mountinfo: v1 controllers plus a cgroup2 without memory.
const HYBRID_MOUNTINFO: &str = "\
22 1 0:21 / / rw,relatime - overlay overlay rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
const HYBRID_CGROUP: &str = "9:name=systemd:/\n4:memory:/process_api/3b89\n1:cpu:/\n0::/\n";

const V2_MOUNTINFO: &str = "\
22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
25 22 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate
";
const V2_CGROUP: &str = "0::/forkvmd.service\n";

/// Writes `files` (path relative to `root`, content) into a fresh fake tree.
fn fake_tree(files: &[(&str, &str)]) -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    for (path, content) in files {
        let path = root.path().join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, content).unwrap();
    }
    root
}

/// Limits with only a memory limit.
fn mem(bytes: u64) -> Limits {
    Limits { memory_bytes: Some(bytes), ..Limits::default() }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

#[test]
fn detects_v1_only() {
    let tree = fake_tree(&[("sys/fs/cgroup/memory/process_api/3b89/tasks", "")]);
    let mountinfo: String =
        HYBRID_MOUNTINFO.lines().filter(|l| !l.contains("cgroup2")).map(|l| l.to_owned() + "\n").collect();
    let root = CgroupRoot::detect_from(&mountinfo, HYBRID_CGROUP, tree.path()).unwrap();
    assert_eq!(root.version(), CgroupVersion::V1);
    assert_eq!(root.dir(), tree.path().join("sys/fs/cgroup/memory/process_api/3b89/forkvm"));
}

#[test]
fn a_process_in_a_sandbox_group_finds_the_same_forkvm_group() {
    let tree = fake_tree(&[("sys/fs/cgroup/memory/process_api/3b89/forkvm/sb-1/tasks", "")]);
    let inside = "9:name=systemd:/\n4:memory:/process_api/3b89/forkvm/sb-1\n1:cpu:/forkvm/sb-1\n0::/\n";
    let root = CgroupRoot::detect_from(HYBRID_MOUNTINFO, inside, tree.path()).unwrap();
    assert_eq!(root.dir(), tree.path().join("sys/fs/cgroup/memory/process_api/3b89/forkvm"));
}

#[test]
fn detects_v1_mounted_from_a_subtree_with_escaped_mount_point() {
    let tree = fake_tree(&[("cg/my mem/ours/tasks", "")]);
    let mountinfo = "40 31 0:32 /docker/abc /cg/my\\040mem rw - cgroup cgroup rw,memory\n";
    let root = CgroupRoot::detect_from(mountinfo, "4:memory:/docker/abc/ours\n", tree.path()).unwrap();
    assert_eq!(root.dir(), tree.path().join("cg/my mem/ours/forkvm"));
}

#[test]
fn detects_v2_only_when_it_offers_memory() {
    let tree = fake_tree(&[("sys/fs/cgroup/forkvmd.service/cgroup.controllers", "cpu io memory pids\n")]);
    let root = CgroupRoot::detect_from(V2_MOUNTINFO, V2_CGROUP, tree.path()).unwrap();
    assert_eq!(root.version(), CgroupVersion::V2);
    assert_eq!(root.dir(), tree.path().join("sys/fs/cgroup/forkvmd.service/forkvm"));
}

#[test]
fn v2_without_memory_and_no_v1_is_an_error_naming_what_was_checked() {
    let tree = fake_tree(&[("sys/fs/cgroup/forkvmd.service/cgroup.controllers", "cpu pids\n")]);
    let err = CgroupRoot::detect_from(V2_MOUNTINFO, V2_CGROUP, tree.path()).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, CgroupError::NoMemoryController { .. }), "{msg}");
    assert!(msg.contains("memory not listed in") && msg.contains("forkvmd.service/cgroup.controllers"), "{msg}");
    assert!(msg.contains("no cgroup v1 mount with the memory controller"), "{msg}");
}

#[test]
fn hybrid_like_the_ci_host_picks_v1() {
    let tree = fake_tree(&[
        ("sys/fs/cgroup/unified/cgroup.controllers", ""),
        ("sys/fs/cgroup/memory/process_api/3b89/tasks", ""),
    ]);
    let root = CgroupRoot::detect_from(HYBRID_MOUNTINFO, HYBRID_CGROUP, tree.path()).unwrap();
    assert_eq!(root.version(), CgroupVersion::V1);
    assert_eq!(root.dir(), tree.path().join("sys/fs/cgroup/memory/process_api/3b89/forkvm"));
}

#[test]
fn no_cgroup_mounts_is_an_error_naming_what_was_checked() {
    let tree = fake_tree(&[]);
    let err = CgroupRoot::detect_from("22 1 0:21 / / rw - ext4 /dev/sda1 rw\n", "0::/\n", tree.path()).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("no cgroup2 mount in mountinfo"), "{msg}");
    assert!(msg.contains("no cgroup v1 mount with the memory controller in mountinfo"), "{msg}");
}

/// A v2 tree whose own group (`forkvmd.service`) delegates memory, plus `extra` files.
fn v2_root(extra: &[(&str, &str)], delegates: &str) -> (tempfile::TempDir, CgroupRoot) {
    let own = "sys/fs/cgroup/forkvmd.service";
    let mut files = vec![
        (format!("{own}/cgroup.controllers"), "cpu memory pids".to_string()),
        (format!("{own}/cgroup.subtree_control"), delegates.to_string()),
    ];
    files.extend(extra.iter().map(|(p, c)| (format!("{own}/{p}"), c.to_string())));
    let files: Vec<(&str, &str)> = files.iter().map(|(p, c)| (p.as_str(), c.as_str())).collect();
    let tree = fake_tree(&files);
    let root = CgroupRoot::detect_from(V2_MOUNTINFO, V2_CGROUP, tree.path()).unwrap();
    (tree, root)
}

#[test]
fn v2_create_enables_memory_and_writes_the_limit() {
    let (_tree, root) = v2_root(&[], "memory\n");
    let group = root.create("sb-1", &mem(256 * MIB)).unwrap();
    assert_eq!(read(&root.dir().join("cgroup.subtree_control")), "+memory");
    assert_eq!(read(&group.dir().join("memory.max")), "268435456");
    assert!(!group.dir().join("memory.swap.max").exists(), "no swap accounting in this tree");
    assert_eq!(group.name(), "sb-1");
    assert_eq!(group.memory_limit_bytes().unwrap(), 256 * MIB);
    assert!(matches!(root.create("sb-1", &mem(MIB)), Err(CgroupError::AlreadyExists(_))));
    assert_eq!(root.open("sb-1").unwrap().dir(), group.dir());
    assert!(root.open("sb-2").is_none());

    std::fs::write(group.dir().join("memory.max"), "max\n").unwrap();
    assert_eq!(group.memory_limit_bytes().unwrap(), u64::MAX);
    std::fs::write(group.dir().join("cgroup.procs"), "12\n345\n").unwrap();
    assert_eq!(group.pids().unwrap(), vec![12, 345]);
}

#[test]
fn v2_create_enables_every_delegated_controller_and_writes_each_limit() {
    let (_tree, root) = v2_root(&[], "cpu memory pids\n");
    assert_eq!(root.controllers(), [Controller::Memory, Controller::Cpu, Controller::Pids]);
    let limits = Limits { memory_bytes: Some(64 * MIB), cpu_millis: Some(1500), pids_max: Some(300) };
    let group = root.create("sb", &limits).unwrap();
    assert_eq!(read(&root.dir().join("cgroup.subtree_control")), "+memory +cpu +pids");
    assert_eq!(read(&group.dir().join("cpu.max")), "150000 100000");
    assert_eq!(read(&group.dir().join("pids.max")), "300");
    assert_eq!(root.limits_of(&group), limits);
}

#[test]
fn v2_skips_limits_of_controllers_not_delegated() {
    let (_tree, root) = v2_root(&[], "memory\n");
    assert_eq!(root.controllers(), [Controller::Memory]);
    let group = root.create("sb", &Limits { memory_bytes: None, cpu_millis: Some(1000), pids_max: Some(10) }).unwrap();
    assert!(!group.dir().join("cpu.max").exists() && !group.dir().join("pids.max").exists());
    assert!(!group.dir().join("memory.max").exists(), "no memory limit asked for");
}

/// A v1 tree like this host's: memory under a subtree, cpu and pids at their roots.
#[test]
fn v1_makes_the_group_in_every_hierarchy_with_each_limit() {
    let mountinfo = format!("{HYBRID_MOUNTINFO}37 31 0:34 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n");
    let tree = fake_tree(&[
        ("sys/fs/cgroup/memory/process_api/3b89/x", ""),
        ("sys/fs/cgroup/cpu/x", ""),
        ("sys/fs/cgroup/pids/x", ""),
    ]);
    let own = "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/3b89\n1:cpu:/\n0::/\n";
    let root = CgroupRoot::detect_from(&mountinfo, own, tree.path()).unwrap();
    assert_eq!(root.controllers(), [Controller::Memory, Controller::Cpu, Controller::Pids]);
    let limits = Limits { memory_bytes: Some(64 * MIB), cpu_millis: Some(2000), pids_max: Some(4352) };
    let group = root.create("sb-7", &limits).unwrap();
    let at = |p: &str| tree.path().join(p);
    assert_eq!(read(&at("sys/fs/cgroup/memory/process_api/3b89/forkvm/sb-7/memory.limit_in_bytes")), "67108864");
    assert_eq!(read(&at("sys/fs/cgroup/cpu/forkvm/sb-7/cpu.cfs_quota_us")), "200000");
    assert_eq!(read(&at("sys/fs/cgroup/cpu/forkvm/sb-7/cpu.cfs_period_us")), "100000");
    assert_eq!(read(&at("sys/fs/cgroup/pids/forkvm/sb-7/pids.max")), "4352");
    assert_eq!(root.limits_of(&group), limits);
    assert_eq!(root.open("sb-7").unwrap().dir(), group.dir());
    // A leftover in one hierarchy makes the name taken, and nothing else is made.
    std::fs::create_dir_all(at("sys/fs/cgroup/pids/forkvm/sb-8")).unwrap();
    assert!(matches!(root.create("sb-8", &limits), Err(CgroupError::AlreadyExists(_))));
    assert!(!at("sys/fs/cgroup/memory/process_api/3b89/forkvm/sb-8").exists());
    assert!(!at("sys/fs/cgroup/cpu/forkvm/sb-8").exists());
}

#[test]
fn v2_create_turns_swap_off_where_swap_is_accounted() {
    let (_tree, root) =
        v2_root(&[("forkvm/cgroup.subtree_control", "memory\n"), ("forkvm/memory.swap.max", "max\n")], "memory\n");
    let group = root.create("sb", &mem(64 * MIB)).unwrap();
    assert_eq!(read(&group.dir().join("memory.max")), "67108864");
    assert_eq!(read(&group.dir().join("memory.swap.max")), "0");
    assert_eq!(read(&root.dir().join("cgroup.subtree_control")), "memory\n", "already enabled: left alone");
}

#[test]
fn v2_parent_that_does_not_delegate_memory_is_a_clear_error() {
    let (_tree, root) = v2_root(&[], "pids\n");
    let err = root.create("sb", &mem(64 * MIB)).unwrap_err();
    assert!(matches!(err, CgroupError::MemoryNotDelegated { .. }), "{err}");
    assert!(err.to_string().contains("does not delegate the memory controller"), "{err}");
    assert!(!root.dir().exists());
}

#[test]
fn names_are_validated() {
    let (_tree, root) = v2_root(&[], "memory\n");
    for bad in ["", "a/b", "..", "a b", "exiting", "é", &"x".repeat(65)] {
        assert!(matches!(root.create(bad, &mem(MIB)), Err(CgroupError::InvalidName(_))), "{bad:?} accepted");
    }
    assert!(root.create(&"x".repeat(64), &mem(MIB)).is_ok());
    assert!(root.create("Ok_name-9", &mem(MIB)).is_ok());
}

/// Kills and reaps the child if a test fails half-way.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn real_root() -> CgroupRoot {
    CgroupRoot::detect().unwrap_or_else(|e| panic!("this host must have a memory cgroup (CI runs as root): {e}"))
}

/// The caller's line of /proc/<pid>/cgroup for the hierarchy `version` uses.
fn cgroup_line(pid: &str, version: CgroupVersion) -> String {
    let text = read(Path::new(&format!("/proc/{pid}/cgroup")));
    let wanted = |l: &&str| match version {
        CgroupVersion::V1 => l.split(':').nth(1).is_some_and(|c| c.split(',').any(|c| c == "memory")),
        CgroupVersion::V2 => l.starts_with("0::"),
    };
    text.lines().find(wanted).unwrap_or_else(|| panic!("no memory cgroup line in {text}")).to_string()
}

#[test]
fn real_create_join_sweep_remove() {
    let root = real_root();
    let name = format!("t-join-{}", std::process::id());
    let group = root.create(&name, &mem(64 * MIB)).unwrap();
    assert_eq!(group.memory_limit_bytes().unwrap(), 64 * MIB);

    let mut child = KillOnDrop(Command::new("sleep").arg("30").spawn().unwrap());
    group.join(child.0.id()).unwrap();
    assert_eq!(group.pids().unwrap(), vec![child.0.id()]);
    assert!(cgroup_line(&child.0.id().to_string(), root.version()).ends_with(&format!("/forkvm/{name}")));

    // Sweep removes the unwanted empty group, never the one with a live process.
    let empty = format!("t-sweep-{}", std::process::id());
    root.create(&empty, &mem(64 * MIB)).unwrap();
    let removed = root.sweep(&|n| n != name && n != empty);
    assert_eq!(removed, vec![empty.clone()]);
    assert!(group.dir().is_dir() && root.open(&empty).is_none());

    child.0.kill().unwrap();
    child.0.wait().unwrap();
    let dir = group.dir().to_path_buf();
    group.remove().unwrap();
    assert!(!dir.exists());
}

#[test]
fn real_memory_limit_oom_kills() {
    let root = real_root();
    let group = root.create(&format!("t-oom-{}", std::process::id()), &mem(32 * MIB)).unwrap();
    // `tail` on /dev/zero buffers one endless line; `read` holds it until we have joined it.
    let mut child = KillOnDrop(
        Command::new("/bin/sh")
            .args(["-c", "read x; exec tail /dev/zero"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    group.join(child.0.id()).unwrap();
    child.0.stdin.take().unwrap().write_all(b"\n").unwrap();

    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "not OOM-killed within 10 s");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status}");
    let events = match root.version() {
        CgroupVersion::V1 => read(&group.dir().join("memory.failcnt")).trim().parse::<u64>().unwrap(),
        CgroupVersion::V2 => read(&group.dir().join("memory.events"))
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse::<u64>().ok())
            .unwrap(),
    };
    assert!(events > 0, "the limit was never hit");
    group.remove().unwrap();
}

#[test]
fn v2_services_get_their_own_group_and_weight_and_find_the_same_root() {
    let (tree, root) = v2_root(&[], "cpu memory pids");
    let dir = root.join_service(Service::Daemon).unwrap();
    assert_eq!(dir, root.dir().join("daemon"));
    assert_eq!(read(&dir.join("cgroup.procs")), "0");
    assert_eq!(read(&dir.join("cpu.weight")), "800");
    // From inside its group (whose cgroup.controllers the kernel would fill), the
    // daemon finds the forkvm group it is in.
    std::fs::write(dir.join("cgroup.controllers"), "cpu memory pids").unwrap();
    let inside = CgroupRoot::detect_from(V2_MOUNTINFO, "0::/forkvmd.service/forkvm/daemon\n", tree.path());
    assert_eq!(inside.unwrap().dir(), root.dir());
}

#[test]
fn v1_services_join_every_hierarchy_with_cpu_shares() {
    let tree = fake_tree(&[("sys/fs/cgroup/memory/process_api/3b89/tasks", ""), ("sys/fs/cgroup/cpu/tasks", "")]);
    let root = CgroupRoot::detect_from(HYBRID_MOUNTINFO, HYBRID_CGROUP, tree.path()).unwrap();
    let dir = root.join_service(Service::Spawner).unwrap();
    assert_eq!(dir, tree.path().join("sys/fs/cgroup/memory/process_api/3b89/forkvm/spawner"));
    assert_eq!(read(&dir.join("cgroup.procs")), "0");
    let cpu = tree.path().join("sys/fs/cgroup/cpu/forkvm/spawner");
    assert_eq!((read(&cpu.join("cgroup.procs")).as_str(), read(&cpu.join("cpu.shares")).as_str()), ("0", "4096"));
    let inside = "4:memory:/process_api/3b89/forkvm/spawner\n1:cpu:/forkvm/spawner\n";
    assert_eq!(CgroupRoot::detect_from(HYBRID_MOUNTINFO, inside, tree.path()).unwrap().dir(), root.dir());
}

#[test]
fn service_names_are_no_sandbox_names_and_sweeps_keep_their_groups() {
    for name in ["daemon", "spawner"] {
        assert!(matches!(validate_name(name), Err(CgroupError::InvalidName(_))), "{name}");
    }
    let (_tree, root) = v2_root(&[], "memory");
    let dir = root.join_service(Service::Daemon).unwrap();
    // The fake group's cgroup.procs says "0"; empty it as if the daemon had gone.
    std::fs::write(dir.join("cgroup.procs"), "").unwrap();
    assert_eq!(root.sweep(&|_| false), Vec::<String>::new());
    assert!(dir.is_dir());
}

#[test]
fn cpu_stat_usage_is_read_from_its_line() {
    let v2 = "usage_usec 123456\nuser_usec 100000\nsystem_usec 23456\nnr_periods 0\n";
    assert_eq!(super::cpu_stat_usage_usec(v2), Some(123456));
    assert_eq!(super::cpu_stat_usage_usec("user_usec 5\n"), None);
    assert_eq!(super::cpu_stat_usage_usec("usage_usec x\n"), None);
}
