//! Host-side benchmark of a restore's first reads: eager vs lazy vs lazy with a playbook.
//!
//! Why this exists: the point of a lazy restore is the time until the guest has what
//! it reads first; this measures it on the real engine, without a guest, for a given
//! read sequence (e.g. one recorded from a boot). For the CLI (`forkvm bench …`).
//!
//! The three runs share the host's page cache: the chunk files the first run reads
//! are cached for the next two. Drop caches between separate invocations for cold
//! numbers.

use super::{Playbook, VaultLayer};
use crate::layered_disk::{LayerStack, LazyLower};
use crate::vault::{Vault, VaultError};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One way of serving the reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BenchRun {
    /// `eager`, `lazy` or `lazy+playbook`.
    pub name: &'static str,
    /// Until the disk can be read: the eager restore, or opening the lazy layer (and
    /// starting the prefetch).
    pub setup: Duration,
    /// From the start of the setup to the end of the first read.
    pub first_read: Duration,
    /// From the start of the setup to the end of the last read.
    pub all_reads: Duration,
    /// Chunks read and decrypted until the last read ended (prefetch included).
    pub chunk_reads: u64,
    /// Lazy runs: extent accesses that were local, fetched, or awaited.
    pub hits: u64,
    /// See `hits`.
    pub misses: u64,
    /// See `hits`.
    pub waits: u64,
}

/// What [`bench_first_reads`] measured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BenchReport {
    /// Reads in the sequence.
    pub reads: usize,
    /// Bytes they read.
    pub bytes: u64,
    /// Extents in the playbook the lazy run recorded (replayed by the third run).
    pub playbook_entries: usize,
    /// Extents in the snapshot's map.
    pub extents: u64,
    /// `eager`, `lazy`, `lazy+playbook`, in that order.
    pub runs: Vec<BenchRun>,
}

fn layer_err(step: &'static str) -> impl FnOnce(crate::layered_disk::LayerError) -> VaultError {
    move |source| VaultError::Layer { step, source }
}

/// Serves `reads` (`(offset, len)` on the disk) three ways from disk `disk_id` of
/// snapshot `seq`, over `base`, using `scratch` (created; emptied of what it made):
/// an eager [`Vault::restore_layer`]; a [`VaultLayer`] (recording a playbook); a fresh
/// `VaultLayer` prefetching that playbook on `prefetch_threads` threads while the
/// reads run. Checks that the three read the same bytes.
pub fn bench_first_reads(
    vault: Arc<Vault>,
    seq: u64,
    disk_id: &str,
    base: &Path,
    reads: &[(u64, usize)],
    scratch: &Path,
    prefetch_threads: usize,
) -> Result<BenchReport, VaultError> {
    crate::vault::fsutil::create_dir(scratch, 0o700)?;
    let run_reads = |stack: &LayerStack, t0: Instant| -> Result<(Duration, Duration, blake3::Hash), VaultError> {
        let mut h = blake3::Hasher::new();
        let mut first = None;
        for &(offset, len) in reads {
            let mut buf = vec![0u8; len];
            stack.read_at(&mut buf, offset).map_err(layer_err("reading the disk"))?;
            h.update(&buf);
            first.get_or_insert_with(|| t0.elapsed());
        }
        Ok((first.unwrap_or_default(), t0.elapsed(), h.finalize()))
    };
    let mut runs = Vec::with_capacity(3);

    // Eager.
    let (layer_dir, top) = (scratch.join("eager-layer"), scratch.join("eager-top"));
    let c0 = vault.chunk_reads();
    let t0 = Instant::now();
    vault.restore_layer(seq, disk_id, &layer_dir)?;
    let stack = LayerStack::create(base, std::slice::from_ref(&layer_dir), &top).map_err(layer_err("stacking"))?;
    let setup = t0.elapsed();
    let (first_read, all_reads, want) = run_reads(&stack, t0)?;
    let eager =
        BenchRun { name: "eager", setup, first_read, all_reads, chunk_reads: vault.chunk_reads() - c0, ..zero() };
    runs.push(eager);
    drop(stack);
    for d in [&layer_dir, &top] {
        std::fs::remove_dir_all(d).map_err(crate::vault::io_err("removing a bench layer", d))?;
    }

    // Lazy, then lazy with the playbook it recorded.
    let mut playbook = None;
    let mut extents = 0;
    for name in ["lazy", "lazy+playbook"] {
        let cache = scratch.join(format!("{}-cache", name.replace('+', "-")));
        let top = scratch.join(format!("{}-top", name.replace('+', "-")));
        let c0 = vault.chunk_reads();
        let t0 = Instant::now();
        let layer = Arc::new(VaultLayer::open(Arc::clone(&vault), seq, disk_id, &cache)?);
        let lower: Arc<dyn LazyLower> = layer.clone();
        let stack = LayerStack::create_over(base, lower, &[], &top).map_err(layer_err("stacking"))?;
        let prefetch = playbook.as_ref().map(|p| layer.prefetch(p, prefetch_threads));
        let setup = t0.elapsed();
        let (first_read, all_reads, got) = run_reads(&stack, t0)?;
        let chunk_reads = vault.chunk_reads() - c0;
        if let Some(p) = prefetch {
            p.stop();
        }
        if got != want {
            return Err(VaultError::Invalid {
                what: "bench",
                reason: format!("the {name} run read other bytes than the eager restore"),
            });
        }
        let s = layer.stats();
        extents = s.extents;
        runs.push(BenchRun {
            name,
            setup,
            first_read,
            all_reads,
            chunk_reads,
            hits: s.hits,
            misses: s.misses,
            waits: s.waits,
        });
        if playbook.is_none() {
            playbook = Some(Playbook::from_recording(layer.size(), &layer.stop_recording()));
        }
        drop(stack);
        drop(layer);
        VaultLayer::discard(&vault, seq, &cache)?;
        std::fs::remove_dir_all(&top).map_err(crate::vault::io_err("removing a bench layer", &top))?;
    }
    Ok(BenchReport {
        reads: reads.len(),
        bytes: reads.iter().map(|r| r.1 as u64).sum(),
        playbook_entries: playbook.map_or(0, |p| p.len()),
        extents,
        runs,
    })
}

fn zero() -> BenchRun {
    BenchRun {
        name: "",
        setup: Duration::ZERO,
        first_read: Duration::ZERO,
        all_reads: Duration::ZERO,
        chunk_reads: 0,
        hits: 0,
        misses: 0,
        waits: 0,
    }
}
