//! `forkvm bench files --tag T --mib N`: large files and trees through a `forkvm daemon`
//! started for the bench, as one JSON object: an N MiB upload (hashed as it streams and
//! checked by its SHA-256), its download, the guest's SHA-256 of it, and a directory
//! holding it out and in as tar, each in MiB/s; and what they cost in memory: the
//! daemon's RSS sampled every 20 ms (its growth over the run) and the agent's peak RSS
//! (`VmHWM` of the guest's PID 1) before and after.
//!
//! Every byte crosses the guest kernel, which is emulated on PVM hosts (PLATFORM.md):
//! the rates are guest-bound there; the memory figures are what the issue asks to keep
//! bounded whatever the size.

use crate::util::{machine, r2};
use anyhow::{bail, Context, Result};
use clap::Args;
use forkvm_client::api::{CreateSandboxRequest, ExecRequest};
use forkvm_client::{Client, Endpoint, WriteFileOptions};
use serde_json::json;
use sha2::{Digest, Sha256};
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct BenchFilesArgs {
    /// Tag to spawn the sandbox from.
    #[arg(long)]
    pub tag: String,
    /// MiB of the file moved each way.
    #[arg(long, default_value_t = 64)]
    pub mib: u64,
    /// Print JSON only.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: BenchFilesArgs) -> Result<i32> {
    if !(1..=4096).contains(&a.mib) {
        bail!("--mib is 1..=4096");
    }
    let mut report = crate::api::with_bench_daemon_pid(|socket, pid| measure(socket, pid, &a))?;
    report["bench"] = "files".into();
    report["command"] = format!("forkvm bench files --tag {} --mib {} --json", a.tag, a.mib).into();
    report["machine"] = machine();
    if !a.json {
        eprintln!(
            "{} MiB: upload {} MiB/s, download {} MiB/s, guest sha256 {} MiB/s, tar out {} / in {} MiB/s; daemon RSS +{} MiB at most, agent peak {} -> {} MiB",
            a.mib,
            report["upload_mib_per_s"],
            report["download_mib_per_s"],
            report["checksum_mib_per_s"],
            report["tar_out_mib_per_s"],
            report["tar_in_mib_per_s"],
            report["daemon_rss_growth_mib"],
            report["agent_peak_rss_mib"]["before"],
            report["agent_peak_rss_mib"]["after"]
        );
    }
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(0)
}

/// A writer that hashes and counts what it is given (a download's sink).
#[derive(Default)]
struct Hashing {
    hasher: Sha256,
    bytes: u64,
}

impl Write for Hashing {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.hasher.update(buf);
        self.bytes += buf.len() as u64;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// RSS of `pid` in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// The guest agent's peak RSS in MiB (`VmHWM` of PID 1).
fn agent_peak_mib(client: &Client, id: &str) -> Result<f64> {
    let req = ExecRequest { cmd: Some("grep VmHWM /proc/1/status".into()), ..ExecRequest::default() };
    let out = client.exec(id, &req)?.stdout;
    let kib: f64 = out.split_whitespace().nth(1).and_then(|v| v.parse().ok()).context("VmHWM of the agent")?;
    Ok(r2(kib / 1024.0))
}

fn measure(socket: &std::path::Path, daemon_pid: u32, a: &BenchFilesArgs) -> Result<serde_json::Value> {
    let client = Client::new(Endpoint::Unix(socket.to_path_buf()), None)?;
    let sb = client.spawn(&CreateSandboxRequest::new(&a.tag, 1))?.pop().context("the spawn gave no sandbox")?;
    let agent_before = agent_peak_mib(&client, &sb.id)?;
    let bytes = a.mib << 20;
    let local = tempfile::NamedTempFile::new()?;
    let mut expected = Sha256::new();
    {
        let mut w = std::io::BufWriter::new(local.as_file());
        let mut block = vec![0u8; 1 << 20];
        for i in 0..a.mib {
            for (j, b) in block.iter_mut().enumerate() {
                *b = (i as usize).wrapping_mul(31).wrapping_add(j.wrapping_mul(2_654_435_761) >> 7) as u8;
            }
            expected.update(&block);
            w.write_all(&block)?;
        }
    }
    let expected = hex(&expected.finalize());

    // The daemon's RSS, sampled while the transfers run.
    let base = rss_kib(daemon_pid);
    let peak = Arc::new(AtomicU64::new(base));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, done) = (peak.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                peak.fetch_max(rss_kib(daemon_pid), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let rate = |secs: f64| r2(a.mib as f64 / secs);
    let path = "/tmp/bench-files/sub/big.bin";
    let t = Instant::now();
    let opts = WriteFileOptions { mode: None, create_parents: true };
    let written = client.write_file_from(&sb.id, path, &mut std::fs::File::open(local.path())?, &opts)?;
    let upload = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let mut down = Hashing::default();
    client.read_file(&sb.id, path, &mut down)?;
    let download = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let sum = client.file_checksum(&sb.id, path)?;
    let checksum = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let mut tar = tempfile::tempfile()?;
    let tar_bytes = client.read_tar(&sb.id, "/tmp/bench-files", &mut tar)?;
    let tar_out = t.elapsed().as_secs_f64();
    std::io::Seek::rewind(&mut tar)?;
    let t = Instant::now();
    client.write_tar(&sb.id, "/tmp/bench-files-in", &mut tar, None)?;
    let tar_in = t.elapsed().as_secs_f64();
    done.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    let agent_after = agent_peak_mib(&client, &sb.id)?;
    client.kill_sandbox(&sb.id)?;

    let down_sha = hex(&down.hasher.finalize());
    if written.sha256 != expected || down_sha != expected || sum.sha256 != expected || down.bytes != bytes {
        bail!(
            "the bytes changed on the way: sent {expected}, uploaded {}, downloaded {down_sha} ({} bytes), guest {}",
            written.sha256,
            down.bytes,
            sum.sha256
        );
    }
    Ok(json!({
        "tag": a.tag,
        "mib": a.mib,
        "upload_mib_per_s": rate(upload),
        "download_mib_per_s": rate(download),
        "checksum_mib_per_s": rate(checksum),
        "tar_out_mib_per_s": rate(tar_out),
        "tar_in_mib_per_s": rate(tar_in),
        "tar_bytes": tar_bytes,
        "seconds": { "upload": r2(upload), "download": r2(download), "checksum": r2(checksum), "tar_out": r2(tar_out), "tar_in": r2(tar_in) },
        "daemon_rss_growth_mib": r2((peak.load(Ordering::Relaxed).saturating_sub(base)) as f64 / 1024.0),
        "daemon_rss_base_mib": r2(base as f64 / 1024.0),
        "agent_peak_rss_mib": { "before": agent_before, "after": agent_after },
    }))
}
