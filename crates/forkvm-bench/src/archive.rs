//! `forkvm bench archive`: what encrypting an archive costs, against the plaintext
//! capture it starts from, and what restoring one costs, against a restore from a tag.
//!
//! Each round takes one sandbox (spawned from the template snapshot, with a file on its
//! data disk) through:
//! 1. a plain full branch to a tag — what an archive wrote before archives were
//!    encrypted — and a spawn from that tag until the sandbox answers (the baseline
//!    restore), both then removed;
//! 2. `archive` (capture, memory and disk layers into the vault, sealed state);
//! 3. `unarchive`: the host half (state unsealed, memory decrypted, VMM started), then
//!    until the sandbox answers, then a first exec that reads the file (its blocks come
//!    lazily from the vault).
//!
//! Host-side costs (capture, encryption, decryption) are real here; the guest-side
//! times (ready, first exec) are inflated by the emulated guest kernel on PVM hosts.

use crate::util::in_scratch_dir;
use crate::util::{machine, median};
use anyhow::{bail, Context, Result};
use clap::Args;
use forkvm_proto::ExecRequest;
use forkvm_sandbox::archive;
use forkvm_sandbox::{ensure_template_snapshot, spawn, Artifacts, Registry, SpawnOptions, SpawnSource};
use forkvm_snapshot::Store;
use forkvm_vmm::vmm::BranchMode;
use serde_json::json;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct BenchArchiveArgs {
    /// The template to spawn the sandbox from.
    #[arg(long, default_value = "tiny")]
    pub template: String,
    /// Rounds (each archives and restores once, and branches and restores once).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Where to work [default: the system temp directory].
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

/// One round's measurements, in milliseconds unless named otherwise.
#[derive(Debug, Clone, Copy, Default)]
struct Round {
    plain_branch_ms: f64,
    plain_restore_ready_ms: f64,
    archive_ms: f64,
    archive_write_ms: f64,
    unarchive_host_ms: f64,
    unarchive_ready_ms: f64,
    first_exec_ms: f64,
    memory_allocated_bytes: f64,
    archive_dir_bytes: f64,
}

pub fn run(a: BenchArchiveArgs) -> Result<i32> {
    if a.runs == 0 {
        bail!("--runs must be at least 1");
    }
    let artifacts = Artifacts::ensure(&a.template, &mut |_| {}).context("the template's artefacts")?;
    let template = ensure_template_snapshot(artifacts).context("the template snapshot")?;
    let source = SpawnSource::from_template(&template)?;
    in_scratch_dir(a.dir.as_deref(), "archive", |root| {
        // SAFETY: single-threaded here; the keys must be the scratch directory's.
        unsafe { std::env::set_var("FORKVM_KEYS", root.join("keys")) };
        let registry = Registry::open(root.join("run"));
        let store = Store::open(root.join("store"));
        let (sbs, _) = spawn(&registry, &source, 1, &SpawnOptions::default())?;
        let id = sbs[0].record.id.clone();
        let script = "head -c 262144 /dev/urandom > /root/kept && sync && md5sum < /root/kept";
        let want = sbs[0].client.exec_collect(&ExecRequest::argv(["sh", "-c", script]), b"")?.stdout;
        let mut rounds = Vec::new();
        for round in 0..a.runs {
            let r = measure_round(&registry, &store, &id, &want, round).with_context(|| format!("round {round}"))?;
            eprintln!(
                "round {round}: archive {:.0} ms (plain branch {:.0} ms), unarchive host {:.0} ms, ready {:.0} ms \
                 (plain restore {:.0} ms), first exec {:.0} ms",
                r.archive_ms,
                r.plain_branch_ms,
                r.unarchive_host_ms,
                r.unarchive_ready_ms,
                r.plain_restore_ready_ms,
                r.first_exec_ms
            );
            rounds.push(r);
        }
        let _ = forkvm_sandbox::kill(&registry, &id);
        let of = |f: &dyn Fn(&Round) -> f64| {
            let mut v: Vec<f64> = rounds.iter().map(f).collect();
            (median(&mut v) * 10.0).round() / 10.0
        };
        let out = json!({
            "bench": "archive",
            "template": a.template,
            "runs": a.runs,
            "host": {
                "archive_ms": of(&|r| r.archive_ms),
                "archive_capture_and_seal_ms": of(&|r| r.archive_write_ms),
                "plain_full_branch_ms": of(&|r| r.plain_branch_ms),
                "archive_vs_plain_branch": of(&|r| r.archive_ms / r.plain_branch_ms),
                "unarchive_host_ms": of(&|r| r.unarchive_host_ms),
                "memory_allocated_mib": of(&|r| r.memory_allocated_bytes / (1 << 20) as f64),
                "archive_dir_mib": of(&|r| r.archive_dir_bytes / (1 << 20) as f64),
            },
            "guest": {
                "unarchive_to_ready_ms": of(&|r| r.unarchive_ready_ms),
                "plain_restore_to_ready_ms": of(&|r| r.plain_restore_ready_ms),
                "first_exec_after_unarchive_ms": of(&|r| r.first_exec_ms),
            },
            "note": "host: real costs; guest: inflated by the emulated guest kernel on PVM hosts. \
                     archive_dir_mib counts the hard-linked read-only images (root image, blank base) at full size",
            "machine": machine(),
            "command": std::env::args().collect::<Vec<_>>().join(" "),
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        Ok(0)
    })
}

fn measure_round(registry: &Registry, store: &Store, id: &str, want: &[u8], round: usize) -> Result<Round> {
    let mut r = Round::default();
    // The baseline: a plaintext full capture, and a restore from it.
    let tag = format!("plain-{round}");
    let t = Instant::now();
    let branched = forkvm_sandbox::branch(registry, store, id, Some(&tag), BranchMode::Full, true)?;
    r.plain_branch_ms = t.elapsed().as_secs_f64() * 1e3;
    r.memory_allocated_bytes = branched.memory_bytes_allocated.unwrap_or(0) as f64;
    let t = Instant::now();
    let (plain, _) = spawn(registry, &SpawnSource::from_tag(store, &tag)?, 1, &SpawnOptions::default())?;
    r.plain_restore_ready_ms = t.elapsed().as_secs_f64() * 1e3;
    forkvm_sandbox::kill_record(registry, &plain[0].record)?;
    std::fs::remove_dir_all(store.snapshots_dir().join(&tag)).context("removing the baseline tag")?;

    let report = archive::archive(registry, store, id, forkvm_sandbox::StateReason::Api)?;
    (r.archive_ms, r.archive_write_ms) = (report.total_ms, report.write_ms);
    r.archive_dir_bytes = dir_bytes(&report.dir) as f64;

    let t = Instant::now();
    let pending = forkvm_sandbox::start::restore::start_restore(registry, store, id)?;
    r.unarchive_host_ms = t.elapsed().as_secs_f64() * 1e3;
    let restored = forkvm_sandbox::start::restore::finish_restore(registry, store, pending, t)?;
    r.unarchive_ready_ms = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    let got = restored.client.exec_collect(&ExecRequest::argv(["sh", "-c", "md5sum < /root/kept"]), b"")?;
    r.first_exec_ms = t.elapsed().as_secs_f64() * 1e3;
    if got.stdout != want {
        bail!("the file differs after unarchive: {:?} vs {:?}", got.stdout, want);
    }
    Ok(r)
}

/// Allocated bytes of the files under `dir`.
fn dir_bytes(dir: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let Ok(m) = entry.metadata() else { continue };
        total += if m.is_dir() { dir_bytes(&entry.path()) } else { m.blocks() * 512 };
    }
    total
}
