//! `forkvm bench disk-fork`: restore → first exec of a disk-only fork, with the disk
//! restored eagerly, lazily, and lazily with the template's prefetch playbook — the
//! guest side of lazy restore (`bench lazy-restore` is the host side).
//!
//! The source is a disk snapshot holding `--fill-mib` MiB of files (what a sandbox
//! that cloned a repo and installed packages has). A guest here cannot write that much
//! (its kernel code is emulated: ~12 s per MiB), so the source's data disk is made on
//! the host: the template's blank data-disk base, copied, files written into its
//! overlay upper directory with `debugfs`, the changed blocks taken as one sealed layer
//! and snapshotted into an encrypted vault under a fresh sandbox id — exactly what a
//! sandbox's own disk snapshot holds. Then, `--runs` rounds of three disk forks (lazy,
//! lazy + playbook, eager; interleaved so the machine's drift spreads evenly), each:
//! host restore (decrypt all, or open lazily) → cold boot → agent ready → first exec
//! (`cat` of a small file of the source's, then a read of `--read-kib` KiB of a big
//! one). The playbook learns from every lazy boot, so the lazy + playbook forks replay
//! what earlier boots read. Everything runs in a scratch store and run directory,
//! removed afterwards.
//!
//! Reported (medians): host restore time, time to ready, first exec, the big read, and
//! the lazy layer's counters (guest reads that fetched, that found their block already
//! prefetched, extents fetched). The cold boot's guest kernel start-up is emulated on
//! PVM hosts (about a minute here) and dwarfs the restore; the host restore time and
//! the fetch counts are what carry over to hardware-virtualised hosts.

use crate::util::{in_scratch_dir, Rng};
use crate::util::{machine, median, r2};
use anyhow::{bail, Context, Result};
use clap::Args;
use forkvm_proto::ExecRequest;
use forkvm_sandbox::artifacts::Artifacts;
use forkvm_sandbox::disk_snapshots::{base_key, open_vault, write_owner, VaultOwner};
use forkvm_sandbox::source::DATA_DISK_ID;
use forkvm_sandbox::start::disk::{fork_from_disk, lazy_disks, DiskRestore};
use forkvm_sandbox::{Registry, SpawnOptions};
use forkvm_snapshot::layered_disk::{SealedLayerBuilder, BLOCK_SIZE};
use forkvm_snapshot::vault::DiskInput;
use forkvm_snapshot::{LayerId, Store};
use serde_json::json;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct BenchDiskForkArgs {
    /// The template to boot (its kernel, root image and data-disk base).
    #[arg(long, default_value = "tiny")]
    pub template: String,
    /// MiB of files on the source's disk.
    #[arg(long, default_value_t = 128)]
    pub fill_mib: u64,
    /// KiB the second exec reads from the source's biggest file.
    #[arg(long, default_value_t = 256)]
    pub read_kib: u64,
    /// Rounds of three forks (each a cold boot: about 70 s here).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Where to work [default: the system temp directory].
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

/// One fork's measurements.
#[derive(Debug, Clone)]
struct Run {
    restore: DiskRestore,
    restore_ms: f64,
    ready_ms: f64,
    first_exec_ms: f64,
    read_ms: f64,
    /// Lazy counters at ready, then after the two execs (absent when eager).
    misses_at_ready: Option<u64>,
    prefetched_at_ready: Option<u64>,
    hits_at_ready: Option<u64>,
    misses_in_execs: Option<u64>,
    fetched_bytes: Option<u64>,
}

pub fn run(a: BenchDiskForkArgs) -> Result<i32> {
    if a.runs == 0 || a.fill_mib == 0 {
        bail!("--runs and --fill-mib must be at least 1");
    }
    let artifacts = Artifacts::ensure(&a.template, &mut |_| {}).context("the template's artefacts")?;
    in_scratch_dir(a.dir.as_deref(), "disk-fork", |root| measure(&a, &artifacts, root))
}

fn measure(a: &BenchDiskForkArgs, artifacts: &Artifacts, root: &Path) -> Result<i32> {
    let store = Store::open(root.join("store"));
    let registry = Registry::open(root.join("run"));
    let source = forkvm_sandbox::start::new_sandbox_id();
    let made = Instant::now();
    let fill = make_source(a, artifacts, &store, &source, root)?;
    let make_ms = made.elapsed().as_secs_f64() * 1e3;
    let mut runs = Vec::new();
    let result = (|| -> Result<()> {
        for round in 0..a.runs {
            for restore in [DiskRestore::Lazy, DiskRestore::LazyPlaybook, DiskRestore::Eager] {
                let r = one_fork(a, &registry, &store, &source, restore)
                    .with_context(|| format!("round {round}, {} fork", restore.name()))?;
                eprintln!(
                    "round {round} {:>13}: restore {:>7.1} ms, ready {:>7.0} ms, first exec {:>6.0} ms, read {:>6.0} ms, misses at ready {:?}",
                    restore.name(),
                    r.restore_ms,
                    r.ready_ms,
                    r.first_exec_ms,
                    r.read_ms,
                    r.misses_at_ready
                );
                runs.push(r);
            }
        }
        Ok(())
    })();
    for r in registry.list() {
        let _ = forkvm_sandbox::verbs::kill_record(&registry, &r);
    }
    result?;
    let per_mode = |restore: DiskRestore| {
        let rs: Vec<&Run> = runs.iter().filter(|r| r.restore == restore).collect();
        let med = |f: &dyn Fn(&Run) -> f64| r2(median(&mut rs.iter().map(|r| f(r)).collect::<Vec<_>>()));
        let med_opt = |f: &dyn Fn(&Run) -> Option<u64>| {
            let mut v: Vec<f64> = rs.iter().filter_map(|r| f(r).map(|x| x as f64)).collect();
            if v.is_empty() {
                json!(null)
            } else {
                json!(median(&mut v))
            }
        };
        json!({
            "host_restore_ms": med(&|r| r.restore_ms),
            "restore_to_ready_ms": med(&|r| r.ready_ms),
            "first_exec_ms": med(&|r| r.first_exec_ms),
            "restore_to_first_exec_ms": med(&|r| r.ready_ms + r.first_exec_ms),
            "read_ms": med(&|r| r.read_ms),
            "guest_reads_that_fetched_at_ready": med_opt(&|r| r.misses_at_ready),
            "guest_reads_found_local_at_ready": med_opt(&|r| r.hits_at_ready),
            "extents_prefetched_at_ready": med_opt(&|r| r.prefetched_at_ready),
            "guest_reads_that_fetched_in_execs": med_opt(&|r| r.misses_in_execs),
            "fetched_kib": med_opt(&|r| r.fetched_bytes.map(|b| b >> 10)),
            "ready_ms_all": rs.iter().map(|r| r2(r.ready_ms)).collect::<Vec<_>>(),
        })
    };
    let out = json!({
        "bench": "disk-fork",
        "template": a.template,
        "source": {
            "fill_mib": a.fill_mib,
            "snapshot_blocks": fill.blocks,
            "made_on_host_ms": r2(make_ms),
        },
        "read_kib": a.read_kib,
        "runs": a.runs,
        "eager": per_mode(DiskRestore::Eager),
        "lazy": per_mode(DiskRestore::Lazy),
        "lazy_playbook": per_mode(DiskRestore::LazyPlaybook),
        "note": "host_restore_ms is real host time; boot, ready and exec times are guest-side and inflated on PVM \
                 hosts, where guest kernel code is emulated",
        "machine": machine(),
        "command": std::env::args().collect::<Vec<_>>().join(" "),
    });
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(0)
}

fn one_fork(
    a: &BenchDiskForkArgs,
    registry: &Registry,
    store: &Store,
    source: &str,
    restore: DiskRestore,
) -> Result<Run> {
    let f = fork_from_disk(registry, store, source, None, restore, &SpawnOptions::default())?;
    let at_ready = f.lazy.first().map(|d| d.report.clone());
    let exec = |argv: Vec<String>| -> Result<(f64, Vec<u8>)> {
        let t = Instant::now();
        let out = f.sandbox.client.exec_collect(&ExecRequest::argv(argv), b"")?;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        if out.status.code != Some(0) {
            bail!("exec exited with {:?}: {}", out.status, String::from_utf8_lossy(&out.stderr));
        }
        Ok((ms, out.stdout))
    };
    let (first_exec_ms, hello) = exec(vec!["cat".into(), "/bench/hello".into()])?;
    if hello != HELLO {
        bail!("/bench/hello reads {:?} in the fork", String::from_utf8_lossy(&hello));
    }
    let script = format!("head -c {} /bench/big | wc -c", a.read_kib << 10);
    let (read_ms, n) = exec(vec!["sh".into(), "-c".into(), script])?;
    if String::from_utf8_lossy(&n).trim() != (a.read_kib << 10).min(big_bytes(a)).to_string() {
        bail!("reading /bench/big gave {:?} bytes", String::from_utf8_lossy(&n).trim());
    }
    let after = lazy_disks(&f.sandbox.record, false)?.into_iter().next().map(|d| d.report);
    let run = Run {
        restore,
        restore_ms: f.restore_ms,
        ready_ms: f.sandbox.ready_ms,
        first_exec_ms,
        read_ms,
        misses_at_ready: at_ready.as_ref().map(|r| r.stats.misses),
        prefetched_at_ready: at_ready.as_ref().map(|r| r.stats.prefetched_extents),
        hits_at_ready: at_ready.as_ref().map(|r| r.stats.hits + r.stats.waits),
        misses_in_execs: after.as_ref().zip(at_ready.as_ref()).map(|(b, a)| b.stats.misses - a.stats.misses),
        fetched_bytes: after.as_ref().map(|r| r.stats.fetched_bytes),
    };
    forkvm_sandbox::verbs::kill_record(registry, &f.sandbox.record)?;
    Ok(run)
}

const HELLO: &[u8] = b"hello from the source\n";

/// The big file's size: half the fill (the rest is spread over smaller files).
fn big_bytes(a: &BenchDiskForkArgs) -> u64 {
    (a.fill_mib << 20) / 2
}

/// What [`make_source`] put in the vault.
struct Source {
    blocks: u64,
}

/// Makes sandbox `id`'s disk snapshot on the host (see the module doc).
fn make_source(a: &BenchDiskForkArgs, artifacts: &Artifacts, store: &Store, id: &str, root: &Path) -> Result<Source> {
    let base = &artifacts.scratch;
    let image = root.join("source.img");
    let cp = Command::new("cp").arg("--sparse=always").arg(base).arg(&image).status().context("running cp")?;
    if !cp.success() {
        bail!("copying the data-disk base {} failed", base.display());
    }
    let files = root.join("files");
    std::fs::create_dir_all(&files)?;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut random = |len: u64| -> Vec<u8> {
        let mut buf = vec![0u8; len as usize];
        rng.fill(&mut buf);
        buf
    };
    let mut cmds = String::from("mkdir upper\nmkdir upper/bench\nmkdir upper/bench/lib\n");
    std::fs::write(files.join("hello"), HELLO)?;
    cmds.push_str(&format!("write {} upper/bench/hello\n", files.join("hello").display()));
    std::fs::write(files.join("big"), random(big_bytes(a)))?;
    cmds.push_str(&format!("write {} upper/bench/big\n", files.join("big").display()));
    // The other half as 256 KiB files, like a package's modules.
    let small = 256 << 10;
    for i in 0..((a.fill_mib << 20) / 2).div_ceil(small) {
        let path = files.join(format!("m{i}"));
        std::fs::write(&path, random(small))?;
        cmds.push_str(&format!("write {} upper/bench/lib/m{i}\n", path.display()));
    }
    let script = root.join("debugfs.cmds");
    std::fs::write(&script, cmds)?;
    let out = Command::new("debugfs")
        .arg("-w")
        .arg("-f")
        .arg(&script)
        .arg(&image)
        .output()
        .context("running debugfs (e2fsprogs)")?;
    let said = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() || said.lines().any(|l| !l.starts_with("debugfs ")) {
        bail!("writing the source's files with debugfs failed: {said}");
    }
    std::fs::remove_dir_all(&files)?;

    let layer = root.join("source-layer");
    let blocks = diff_into_layer(base, &image, &layer)?;
    std::fs::remove_file(&image)?;
    let key = base_key(base).with_context(|| format!("hashing the base {}", base.display()))?;
    let vault = open_vault(store, id)?;
    vault.snapshot(&[DiskInput { id: DATA_DISK_ID.into(), base_key: key, layers: vec![layer.clone()] }])?;
    write_owner(store, id, &VaultOwner { template: Some(a.template.clone()), source_tag: None, vcpus: None })?;
    std::fs::remove_dir_all(&layer)?;
    Ok(Source { blocks })
}

/// Writes every block of `image` that differs from `base` (same size) into a new sealed
/// layer at `layer`, over the base. Only `image`'s allocated extents are compared (a
/// hole in a copy of a sparse base is a hole in the base). Returns the blocks taken.
fn diff_into_layer(base: &Path, image: &Path, layer: &Path) -> Result<u64> {
    let (b, i) = (File::open(base)?, File::open(image)?);
    let size = i.metadata()?.len();
    if b.metadata()?.len() != size {
        bail!("{} and {} differ in size", base.display(), image.display());
    }
    let mut builder = SealedLayerBuilder::create(layer, size, LayerId::BASE)?;
    let (mut ours, mut theirs) = (vec![0u8; BLOCK_SIZE as usize], vec![0u8; BLOCK_SIZE as usize]);
    let mut taken = 0;
    let mut pos = 0u64;
    while pos < size {
        // SAFETY: lseek on a descriptor `i` keeps open; no memory is passed.
        let data = unsafe { libc::lseek(i.as_raw_fd(), pos as libc::off_t, libc::SEEK_DATA) };
        if data < 0 {
            break; // ENXIO: only a hole remains.
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(i.as_raw_fd(), data, libc::SEEK_HOLE) };
        let (start, end) = ((data as u64) / BLOCK_SIZE * BLOCK_SIZE, (hole.max(data) as u64).min(size));
        let mut at = start;
        while at < end {
            let n = (size - at).min(BLOCK_SIZE) as usize;
            i.read_exact_at(&mut ours[..n], at)?;
            b.read_exact_at(&mut theirs[..n], at)?;
            if ours[..n] != theirs[..n] {
                builder.put_block(at / BLOCK_SIZE, &ours[..n])?;
                taken += 1;
            }
            at += BLOCK_SIZE;
        }
        pos = end.max(pos + 1);
    }
    builder.finish()?;
    Ok(taken)
}
