//! The chunk store survives a crash at any point: `snapshot-compact` and `unpack` are
//! killed (SIGKILL) at spread-out moments of their work, then `snapshot sweep` runs, and
//! every snapshot that exists must assemble, from its chunks, to exactly its memory;
//! the interrupted one either exists complete or not at all; nothing is left in staging.
//! Synthetic snapshots (no VM): this is about the store, not the guest.

use forkvm_snapshot::chain::{self, AssembledCache};
use forkvm_snapshot::{
    create_image, write_meta, write_sparse, DevicesMeta, DiskMeta, GuestIdentity, MemoryFormat, SnapshotDir,
    SnapshotMeta, SnapshotStatus, Store, DISK_DIR, METADATA_FORMAT_VERSION, SNAPSHOT_JSON, VMSTATE_BIN,
};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const MEM: u64 = 32 << 20;

struct Env {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
}

impl Env {
    fn store(&self) -> Store {
        Store::open(self.dir.join("store"))
    }

    fn cache(&self) -> AssembledCache {
        AssembledCache::new(&self.dir.join("cache"))
    }

    fn command(&self, store: &Path, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_forkvm"));
        c.args(args)
            .env("FORKVM_STORE", store)
            .env("FORKVM_CACHE", self.dir.join("cache"))
            .env("FORKVM_RUN", self.dir.join("run"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        c
    }
}

/// Deterministic memory: page `p` is non-zero when `p % every == 0`.
fn memory(seed: u8, every: u64) -> Vec<u8> {
    let mut mem = vec![0u8; MEM as usize];
    for p in (0..MEM / 4096).filter(|p| p % every == 0) {
        let at = (p * 4096) as usize;
        for (i, b) in mem[at..at + 4096].iter_mut().enumerate() {
            *b = (i as u64 ^ p ^ seed as u64).wrapping_mul(2654435761) as u8 | 1;
        }
    }
    mem
}

fn write_snapshot(dir: &Path, tag: &str, mem: &[u8], disk: &Path) {
    std::fs::create_dir_all(dir.join(DISK_DIR)).unwrap();
    let meta = SnapshotMeta {
        format_version: METADATA_FORMAT_VERSION,
        tag: tag.into(),
        created_at_unix_ms: 0,
        status: SnapshotStatus::Ready,
        mem_size_bytes: MEM,
        vcpu_count: 1,
        irqchip: "split".into(),
        guest: GuestIdentity { kind: "linux".into(), name: "synthetic".into(), content_hash: None },
        parent_tag: None,
        parent_hash: None,
        branched_from: None,
        volumes: vec![],
        memory_bytes_allocated: 0,
        writer_pid: None,
        devices: Some(DevicesMeta {
            vsock_cid: Some(3),
            rng: true,
            disks: vec![DiskMeta { file: "disk0.img".into(), read_only: true, id: "forkvm-root".into(), layers: None }],
            net: None,
        }),
        template: None,
        memory_format: MemoryFormat::Image,
        content_hash: None,
        default_limits: None,
        default_network: None,
        memory_sealed_by: None,
    };
    write_meta(&dir.join(SNAPSHOT_JSON), &meta).unwrap();
    std::fs::write(dir.join(VMSTATE_BIN), format!("state of {tag}")).unwrap();
    let f = create_image(&dir.join("memory.img"), MEM).unwrap();
    write_sparse(&f, 0, mem).unwrap();
    std::fs::hard_link(disk, dir.join(DISK_DIR).join("disk0.img")).unwrap();
}

/// base (ingested) and l1, l2 (diffs); returns their memories.
fn build(env: &Env) -> Vec<Vec<u8>> {
    let store = env.store();
    store.ensure().unwrap();
    let disk = env.dir.join("disk0.img");
    std::fs::write(&disk, vec![5u8; 1 << 20]).unwrap();
    let mems = vec![memory(1, 2), memory(2, 3), memory(3, 5)];
    write_snapshot(&store.tag_dir("base").unwrap(), "base", &mems[0], &disk);
    chain::ingest(&store, &env.cache(), "base").unwrap();
    for (i, tag) in ["l1", "l2"].iter().enumerate() {
        let staged = env.dir.join(format!("staged-{tag}"));
        write_snapshot(&staged, tag, &mems[i + 1], &disk);
        let parent = chain::resolve(&store, if i == 0 { "base" } else { "l1" }).unwrap();
        chain::write_diff(&store, &env.cache(), &parent, &SnapshotDir::open(&staged).unwrap(), tag, None).unwrap();
    }
    mems
}

fn image(path: &Path) -> Vec<u8> {
    let mut buf = vec![0u8; MEM as usize];
    std::fs::File::open(path).unwrap().read_exact_at(&mut buf, 0).unwrap();
    buf
}

/// Every snapshot in `store` assembles from its chunks (fresh cache) to its memory.
fn check_store(store: &Store, scratch_cache: &Path, expect: &dyn Fn(&str) -> Option<Vec<u8>>, when: &str) {
    let _ = std::fs::remove_dir_all(scratch_cache);
    let cache = AssembledCache::new(scratch_cache);
    for e in store.list() {
        assert_eq!(e.meta.status, SnapshotStatus::Ready, "{when}: {} left in state writing", e.tag);
        let chain = chain::resolve(store, &e.tag).unwrap_or_else(|err| panic!("{when}: {} unresolvable: {err}", e.tag));
        let (path, _) =
            cache.memory_for(store, &chain).unwrap_or_else(|err| panic!("{when}: {} does not assemble: {err}", e.tag));
        if let Some(mem) = expect(&e.tag) {
            assert!(image(&path) == mem, "{when}: {} assembles to the wrong memory", e.tag);
        }
    }
    let staging = chain::staging_root(store);
    assert!(std::fs::read_dir(&staging).map(|mut d| d.next().is_none()).unwrap_or(true), "{when}: staging left behind");
}

/// Runs `cmd` and SIGKILLs it after `delay` (or lets it finish); returns whether it finished.
fn run_and_kill(mut cmd: Command, delay: Duration) -> bool {
    let mut child = cmd.spawn().unwrap();
    let started = Instant::now();
    while started.elapsed() < delay {
        if let Some(status) = child.try_wait().unwrap() {
            return status.success();
        }
        std::thread::sleep(Duration::from_micros(500));
    }
    let _ = child.kill();
    let _ = child.wait();
    false
}

/// How long `cmd` takes when left alone.
fn duration_of(mut cmd: Command) -> Duration {
    let t = Instant::now();
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    t.elapsed()
}

#[test]
fn compact_killed_at_any_point_leaves_a_consistent_store() {
    let tmp = tempfile::tempdir().unwrap();
    let env = Env { dir: tmp.path().to_path_buf(), _tmp: tmp };
    let mems = build(&env);
    let store_path = env.dir.join("store");
    let full = duration_of(env.command(&store_path, &["snapshot-compact", "--from", "l2", "--to", "probe"]));
    env.command(&store_path, &["rmi", "probe"]).output().unwrap();
    let expect = |tag: &str| match tag {
        "base" => Some(mems[0].clone()),
        "l1" => Some(mems[1].clone()),
        _ => Some(mems[2].clone()),
    };
    let mut finished = 0;
    for i in 0..8u32 {
        // Spread the kills over the whole run, including its first and last moments.
        let delay = full.mul_f64(f64::from(i) / 6.0);
        let to = format!("flat{i}");
        // Evict the cache so the compact has real work (assembly) as well as chunking.
        let _ = std::fs::remove_dir_all(env.dir.join("cache"));
        if run_and_kill(env.command(&store_path, &["snapshot-compact", "--from", "l2", "--to", &to]), delay) {
            finished += 1;
        }
        let sweep = env.command(&store_path, &["snapshot", "sweep"]).output().unwrap();
        assert!(sweep.status.success(), "{}", String::from_utf8_lossy(&sweep.stderr));
        check_store(&env.store(), &env.dir.join("check-cache"), &expect, &format!("compact killed after {delay:?}"));
    }
    assert!(finished < 8, "no run was interrupted: the test did not test crashes");
}

#[test]
fn unpack_killed_at_any_point_imports_whole_links_or_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let env = Env { dir: tmp.path().to_path_buf(), _tmp: tmp };
    let mems = build(&env);
    let pack = env.dir.join("chain.tar.zst");
    let out = env
        .command(&env.dir.join("store"), &["pack", "--tag", "l2", "--out", pack.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let probe = env.dir.join("probe-store");
    let full = duration_of(env.command(&probe, &["unpack", pack.to_str().unwrap()]));
    let expect = |tag: &str| match tag {
        "base" => Some(mems[0].clone()),
        "l1" => Some(mems[1].clone()),
        "l2" => Some(mems[2].clone()),
        other => panic!("unexpected snapshot {other}"),
    };
    let target = env.dir.join("target-store");
    let mut interrupted = 0;
    for i in 0..8u32 {
        let _ = std::fs::remove_dir_all(&target);
        let delay = full.mul_f64(f64::from(i) / 6.0);
        if !run_and_kill(env.command(&target, &["unpack", pack.to_str().unwrap()]), delay) {
            interrupted += 1;
        }
        let _ = env.command(&target, &["snapshot", "sweep"]).output().unwrap();
        let store = Store::open(&target);
        check_store(&store, &env.dir.join("check-cache"), &expect, &format!("unpack killed after {delay:?}"));
        // Links arrive base first: an imported child always has its parent.
        let tags: Vec<String> = store.list().into_iter().map(|e| e.tag).collect();
        assert!(["base", "l1", "l2"].starts_with(&tags.iter().map(String::as_str).collect::<Vec<_>>()), "{tags:?}");
        // Unpacking again completes whatever was interrupted.
        let again = env.command(&target, &["unpack", pack.to_str().unwrap()]).output().unwrap();
        assert!(again.status.success(), "{}", String::from_utf8_lossy(&again.stderr));
        check_store(&Store::open(&target), &env.dir.join("check-cache"), &expect, "unpack after a crash");
        assert_eq!(Store::open(&target).list().len(), 3);
    }
    assert!(interrupted > 0, "no run was interrupted: the test did not test crashes");
}
