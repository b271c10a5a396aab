//! Lazy restore tests (unit tier: no KVM, no root), on real vaults built from real
//! layered disks: byte-exactness against the eager restore and a model, what is
//! fetched and how often, crash safety of the cache, corrupt chunks, stacking,
//! retention pins, playbooks and prefetch.

use super::*;
use crate::layered_disk::{inspect, LayerStack, DATA_FILE};
use crate::vault::{DiskInput, KeyStore, RetentionPolicy, VaultErrorKind};
use std::fs;
use std::path::PathBuf;

const BS: usize = BLOCK_SIZE as usize;
/// 6 MiB and a partial last block.
const SIZE: usize = 6 * 1024 * 1024 + 1000;

use crate::test_rng::Rng;

/// A vault holding two snapshots of one random disk, and the disk's content as of
/// the newest (`model`).
struct Env {
    tmp: tempfile::TempDir,
    vault: Arc<Vault>,
    base: PathBuf,
    model: Vec<u8>,
    seq: u64,
    n: std::cell::Cell<u32>,
}

impl Env {
    fn new(seed: u64) -> Env {
        let tmp = tempfile::tempdir().unwrap();
        let keys = KeyStore::open(&tmp.path().join("keys")).unwrap();
        let vault = Arc::new(Vault::open(&tmp.path().join("vault"), keys.sandbox_key("sb-1").unwrap()).unwrap());
        let mut rng = Rng(seed);
        let base = tmp.path().join("base.img");
        let mut model = rng.bytes(SIZE);
        fs::write(&base, &model).unwrap();
        let mut stack = LayerStack::create(&base, &[], &tmp.path().join("top0")).unwrap();
        let mut write = |stack: &mut LayerStack, offset: usize, data: &[u8]| {
            stack.write_at(data, offset as u64).unwrap();
            model[offset..offset + data.len()].copy_from_slice(data);
        };
        let mut sealed = Vec::new();
        for round in 0..2 {
            for _ in 0..50 {
                let offset = rng.below(SIZE as u64 - 1) as usize;
                let len = (1 + rng.below(96 * 1024) as usize).min(SIZE - offset);
                let data = if rng.below(6) == 0 { vec![0; len] } else { rng.bytes(len) };
                write(&mut stack, offset, &data);
            }
            write(&mut stack, SIZE - 500, &rng.bytes(500));
            sealed.push(stack.seal(&tmp.path().join(format!("top{}", round + 1))).unwrap().dir);
            let input = DiskInput { id: "data".into(), base_key: "blank-v1".into(), layers: sealed.clone() };
            vault.snapshot(&[input]).unwrap();
        }
        Env { tmp, vault, base, model, seq: 2, n: Default::default() }
    }

    fn path(&self, what: &str) -> PathBuf {
        self.n.set(self.n.get() + 1);
        self.tmp.path().join(format!("t-{what}{}", self.n.get()))
    }

    fn open(&self) -> Arc<VaultLayer> {
        let cache = self.path("cache");
        Arc::new(VaultLayer::open(Arc::clone(&self.vault), self.seq, "data", &cache).unwrap())
    }

    /// A stack over `layer` with a fresh top.
    fn stack(&self, layer: &Arc<VaultLayer>) -> LayerStack {
        let lower: Arc<dyn LazyLower> = layer.clone();
        LayerStack::create_over(&self.base, lower, &[], &self.path("top")).unwrap()
    }

    fn map(&self) -> crate::vault::DiskMap {
        self.vault.disk_map(self.seq, "data").unwrap()
    }
}

fn read(layer: &VaultLayer, offset: usize, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    layer.read_at(&mut buf, offset as u64).unwrap();
    buf
}

fn read_stack(stack: &LayerStack, offset: usize, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    stack.read_at(&mut buf, offset as u64).unwrap();
    buf
}

fn random_range(rng: &mut Rng) -> (usize, usize) {
    let offset = rng.below(SIZE as u64) as usize;
    let len = (1 + rng.below(160 * 1024) as usize).min(SIZE - offset);
    (offset, len)
}

/// Extents of `map` overlapping bytes `offset..offset+len`.
fn extents_touched(map: &crate::vault::DiskMap, ranges: &[(usize, usize)]) -> usize {
    map.extents
        .iter()
        .filter(|(first, count, _)| {
            let (lo, hi) = (*first as usize * BS, (*first + *count) as usize * BS);
            ranges.iter().any(|&(o, l)| o < hi && o + l > lo)
        })
        .count()
}

#[test]
fn lazy_reads_match_the_eager_restore_byte_exact() {
    let env = Env::new(1);
    let eager_dir = env.path("eager");
    env.vault.restore_layer(env.seq, "data", &eager_dir).unwrap();
    let eager = LayerStack::create(&env.base, std::slice::from_ref(&eager_dir), &env.path("etop")).unwrap();
    let layer = env.open();
    let lower: Arc<dyn LazyLower> = layer.clone();
    let lazy = LayerStack::create_over(&env.base, lower, &[], &env.path("ltop")).unwrap();
    assert_eq!(lazy.stats().lower_blocks, env.map().blocks());
    assert!(layer.filled_fraction() == 0.0 && env.map().extents.len() > 50, "{}", env.map().extents.len());
    let mut rng = Rng(2);
    for _ in 0..300 {
        let (offset, len) = random_range(&mut rng);
        let got = read_stack(&lazy, offset, len);
        assert!(got == read_stack(&eager, offset, len), "{len} bytes at {offset}");
        assert!(got == env.model[offset..offset + len], "{len} bytes at {offset}");
    }
    assert!(layer.filled_fraction() > 0.0);
    assert!(read_stack(&lazy, 0, SIZE) == env.model);
    assert!(layer.is_complete() && layer.filled_fraction() == 1.0);
    let s = layer.stats();
    assert_eq!((s.fetched_extents, s.filled_extents, s.fetch_errors), (s.extents, s.extents, 0));
    assert_eq!(s.misses, s.extents, "single-threaded: every extent fetched by a read, once");
}

#[test]
fn only_touched_extents_are_fetched_and_only_once() {
    let env = Env::new(3);
    let map = env.map();
    let layer = env.open();
    let mut rng = Rng(4);
    let ranges: Vec<(usize, usize)> = (0..12).map(|_| random_range(&mut rng)).collect();
    let before = env.vault.chunk_reads();
    for &(o, l) in &ranges {
        let got = read(&layer, o, l);
        // The layer alone serves its map's blocks; the rest (the stack's base) reads as zeros.
        for (k, (g, m)) in got.iter().zip(&env.model[o..o + l]).enumerate() {
            let b = ((o + k) / BS) as u64;
            assert_eq!(*g, if layer.is_present(b) { *m } else { 0 }, "byte {}", o + k);
        }
    }
    let touched = extents_touched(&map, &ranges);
    assert!(touched > 0 && touched < map.extents.len());
    assert_eq!(env.vault.chunk_reads() - before, touched as u64, "one chunk decrypt per touched extent");
    let s = layer.stats();
    assert_eq!((s.fetched_extents, s.misses), (touched as u64, touched as u64));
    // Again: all local, nothing decrypted.
    for &(o, l) in &ranges {
        read(&layer, o, l);
    }
    assert_eq!(env.vault.chunk_reads() - before, touched as u64);
    assert!(layer.stats().hits >= touched as u64);
    // A block outside the map is not fetched (a stack reads it from the base).
    let hole = (0..map.size / BLOCK_SIZE).find(|&b| !layer.is_present(b)).unwrap();
    assert!(!layer.fetch_extent_containing(hole).unwrap());
    let inside = map.extents[map.extents.len() / 2].0;
    assert!(layer.fetch_extent_containing(inside).unwrap() && layer.is_filled(inside));
}

#[test]
fn eight_concurrent_readers_fetch_each_extent_exactly_once() {
    let env = Env::new(5);
    let layer = env.open();
    let lower: Arc<dyn LazyLower> = layer.clone();
    let stack = Arc::new(LayerStack::create_over(&env.base, lower, &[], &env.path("top")).unwrap());
    let model = Arc::new(env.model.clone());
    let before = env.vault.chunk_reads();
    let barrier = Arc::new(std::sync::Barrier::new(8));
    let handles: Vec<_> = (0..8u64)
        .map(|t| {
            let (stack, model, barrier) = (Arc::clone(&stack), Arc::clone(&model), Arc::clone(&barrier));
            std::thread::spawn(move || {
                barrier.wait();
                // Every thread covers the whole disk, in its own order of 64 KiB pieces.
                let mut pieces: Vec<usize> = (0..SIZE.div_ceil(1 << 16)).collect();
                let mut rng = Rng(100 + t);
                for i in (1..pieces.len()).rev() {
                    pieces.swap(i, rng.below(i as u64 + 1) as usize);
                }
                for p in pieces {
                    let (o, l) = (p << 16, (1usize << 16).min(SIZE - (p << 16)));
                    assert!(read_stack(&stack, o, l) == model[o..o + l], "thread {t}: piece {p}");
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let s = layer.stats();
    assert_eq!(env.vault.chunk_reads() - before, s.extents, "each extent decrypted exactly once");
    assert_eq!((s.fetched_extents, s.misses), (s.extents, s.extents));
    assert_eq!(s.hits + s.waits + s.misses, 8 * s.extents);
}

#[test]
fn a_kill_between_data_and_bitmap_leaves_nothing_claimed_and_reopens_byte_exact() {
    let env = Env::new(6);
    let map = env.map();
    let cache = env.path("cache");
    let open = |env: &Env| VaultLayer::open(Arc::clone(&env.vault), env.seq, "data", &cache).unwrap();
    let half = map.extents.len() / 2;
    let (persisted, unpersisted) = (&map.extents[..half], &map.extents[half..]);
    {
        let layer = open(&env);
        for e in persisted {
            layer.fetch_extent_containing(e.0).unwrap();
        }
        layer.persist().unwrap();
        let on_disk = inspect(&cache).unwrap();
        assert!(!on_disk.sealed && on_disk.id == layer.id() && on_disk.parent == LayerId::BASE);
        assert_eq!(on_disk.blocks, persisted.iter().map(|e| e.1).sum::<u64>());
        // Data written, bits only in memory: then the process is killed (dropped
        // without a persist) before the next safe point.
        for e in unpersisted {
            layer.fetch_extent_containing(e.0).unwrap();
        }
        assert!(layer.is_complete());
        assert_eq!(inspect(&cache).unwrap().blocks, on_disk.blocks, "fills are not durable before a persist");
    }
    // The data of unpersisted extents may not have reached the disk: make it garbage,
    // and leave a half-written bitmap temp as a kill during a persist would.
    let data = fs::OpenOptions::new().write(true).open(cache.join(DATA_FILE)).unwrap();
    for e in unpersisted.iter().step_by(2) {
        let at = e.0 * BLOCK_SIZE;
        data.write_all_at(&vec![0xee; BS.min((map.size - at) as usize)], at).unwrap();
    }
    fs::write(cache.join("bitmap.tmp"), b"torn").unwrap();
    let before = env.vault.chunk_reads();
    let layer = open(&env);
    assert!(persisted.iter().all(|e| layer.is_filled(e.0)));
    assert!(unpersisted.iter().all(|e| !layer.is_filled(e.0)), "no block claims data it may not have");
    let mut buf = vec![0u8; SIZE];
    layer.read_at(&mut buf, 0).unwrap();
    let lower: Arc<dyn LazyLower> = Arc::new(layer);
    let stack = LayerStack::create_over(&env.base, lower, &[], &env.path("top")).unwrap();
    assert!(read_stack(&stack, 0, SIZE) == env.model, "byte-exact after reopen");
    assert_eq!(env.vault.chunk_reads() - before, unpersisted.len() as u64, "only unpersisted extents refetched");

    // A cache that is another snapshot's, or claims blocks outside the map, is refused.
    drop(stack);
    let foreign = inspect(&cache).unwrap();
    let err = VaultLayer::open(Arc::clone(&env.vault), 1, "data", &cache).unwrap_err();
    assert!(err.kind() == VaultErrorKind::Invalid && err.to_string().contains("lazy cache"), "{err}");
    let hole = (0..map.size / BLOCK_SIZE).find(|&b| !map.extents.iter().any(|e| e.0 <= b && b < e.0 + e.1)).unwrap();
    let mut bits = Bitmap::new(crate::layered_disk::blocks_for(map.size));
    bits.set_range(hole, hole + 1);
    let h = BitmapHeader { sealed: false, disk_size: map.size, id: foreign.id, parent: LayerId::BASE };
    crate::layered_disk::write_bitmap_file(&cache, &h, &bits).unwrap();
    let err = open_err(&env, &cache);
    assert!(err.contains("not in the snapshot's map"), "{err}");
}

use crate::layered_disk::BitmapHeader;

fn open_err(env: &Env, cache: &Path) -> String {
    VaultLayer::open(Arc::clone(&env.vault), env.seq, "data", cache).unwrap_err().to_string()
}

#[test]
fn a_corrupt_chunk_fails_the_read_clearly_and_marks_nothing() {
    let env = Env::new(7);
    let map = env.map();
    let layer = env.open();
    let (first, count, hex) = map.extents[map.extents.len() / 3].clone();
    let chunk = env.vault.chunks.path_of(&ChunkId::from_hex(&hex).unwrap());
    let good = fs::read(&chunk).unwrap();
    let mut bad = good.clone();
    bad[good.len() / 2] ^= 0x01;
    fs::write(&chunk, &bad).unwrap();
    let offset = first as usize * BS;
    let mut buf = vec![0u8; count as usize * BS];
    let err = layer.read_at(&mut buf, offset as u64).unwrap_err();
    assert_eq!(err.kind(), VaultErrorKind::Corrupt);
    assert!(err.to_string().contains("fails authentication") && err.to_string().contains(&hex), "{err}");
    assert!(!layer.is_filled(first) && layer.stats().filled_extents == 0 && layer.stats().fetch_errors == 1);
    layer.persist().unwrap();
    assert_eq!(inspect(layer.cache_dir()).unwrap().blocks, 0, "nothing marked on disk either");
    // Through a stack: a LowerRead error whose source is the vault's.
    let lower: Arc<dyn LazyLower> = layer.clone();
    let stack = LayerStack::create_over(&env.base, lower, &[], &env.path("top")).unwrap();
    let err = stack.read_at(&mut buf, offset as u64).unwrap_err();
    match &err {
        LayerError::LowerRead { layer: id, source, .. } => {
            assert_eq!(*id, layer.id());
            assert_eq!(source.downcast_ref::<VaultError>().map(VaultError::kind), Some(VaultErrorKind::Corrupt));
        }
        other => panic!("expected LowerRead, got {other}"),
    }
    // Other extents are unaffected; once the chunk is good again the read succeeds.
    let (o2, c2, _) = map.extents[0].clone();
    assert!(read(&layer, o2 as usize * BS, c2 as usize * BS) == env.model[o2 as usize * BS..(o2 + c2) as usize * BS]);
    fs::write(&chunk, &good).unwrap();
    assert!(read_stack(&stack, offset, buf.len()) == env.model[offset..offset + buf.len()]);
}

#[test]
fn a_stack_over_a_vault_layer_writes_seals_reopens_and_becomes_ordinary() {
    let env = Env::new(8);
    let cache = env.path("cache");
    let layer = Arc::new(VaultLayer::open(Arc::clone(&env.vault), env.seq, "data", &cache).unwrap());
    assert_eq!(layer.id().to_string(), env.map().layer_id, "the snapshot's layer id");
    let (top0, top1) = (env.path("top"), env.path("top"));
    let lower: Arc<dyn LazyLower> = layer.clone();
    let mut stack = LayerStack::create_lazy_over(&env.base, lower, &[], &top0).unwrap();
    assert!(stack.top().is_none());
    let mut model = env.model.clone();
    let mut rng = Rng(9);
    let write = |stack: &mut LayerStack, model: &mut Vec<u8>, rng: &mut Rng| {
        for _ in 0..40 {
            // Partial-block writes copy up through the vault layer.
            let offset = rng.below(SIZE as u64 - 1) as usize;
            let len = (1 + rng.below(20_000) as usize).min(SIZE - offset);
            let data = rng.bytes(len);
            stack.write_at(&data, offset as u64).unwrap();
            model[offset..offset + len].copy_from_slice(&data);
        }
    };
    write(&mut stack, &mut model, &mut rng);
    let sealed = stack.seal(&top1).unwrap();
    assert_eq!(inspect(&sealed.dir).unwrap().parent, layer.id(), "the sealed top sits on the vault layer");
    write(&mut stack, &mut model, &mut rng);
    stack.flush().unwrap();
    let fetched = layer.stats().fetched_extents;
    assert!(fetched > 0, "copy-ups fetched through the vault layer");
    assert_eq!(inspect(&cache).unwrap().blocks, layer.stats().filled_blocks, "the stack's flush persisted the cache");
    assert!(read_stack(&stack, 0, SIZE) == model);
    drop(stack);
    drop(layer);

    // Reopen (a new process): the cache resumes, the chain is checked.
    let before = env.vault.chunk_reads();
    let layer = Arc::new(VaultLayer::open(Arc::clone(&env.vault), env.seq, "data", &cache).unwrap());
    let lower: Arc<dyn LazyLower> = layer.clone();
    let stack = LayerStack::open_over(&env.base, lower, std::slice::from_ref(&sealed.dir), &top1).unwrap();
    assert!(read_stack(&stack, 0, SIZE) == model);
    assert_eq!(env.vault.chunk_reads() - before, layer.stats().extents - fetched, "persisted extents not refetched");
    assert!(!env.vault.pins().unwrap().is_empty());
    let err = LayerStack::open(&env.base, std::slice::from_ref(&cache), &env.path("x")).unwrap_err();
    assert!(matches!(err, LayerError::NotSealed { .. }), "an unfinished cache is no sealed layer: {err}");

    // Fill, seal the cache: an ordinary sealed layer, no longer pinning the snapshot.
    layer.materialize_all(3).unwrap();
    let done = layer.seal_cache().unwrap();
    assert_eq!((done.dir.as_path(), done.id), (cache.as_path(), layer.id()));
    assert!(env.vault.pins().unwrap().is_empty());
    drop(stack);
    let plain = LayerStack::open(&env.base, &[cache.clone(), sealed.dir.clone()], &top1).unwrap();
    assert!(read_stack(&plain, 0, SIZE) == model);
    // A layer whose parent is not the vault layer is refused over it.
    let other = env.path("eager");
    env.vault.restore_layer(env.seq, "data", &other).unwrap();
    let lower: Arc<dyn LazyLower> = layer.clone();
    let err = LayerStack::create_over(&env.base, lower, &[other], &env.path("t")).unwrap_err();
    assert!(matches!(err, LayerError::ChainBroken { .. }), "{err}");
    // Reopening a sealed cache serves it with no fetch at all.
    let before = env.vault.chunk_reads();
    let again = VaultLayer::open(Arc::clone(&env.vault), env.seq, "data", &cache).unwrap();
    let again = Arc::new(again);
    assert!(again.is_complete() && read_stack(&env.stack(&again), 0, SIZE) == env.model);
    assert_eq!(env.vault.chunk_reads(), before);
}

#[test]
fn retention_keeps_a_pinned_snapshot_until_the_cache_is_discarded() {
    let mut env = Env::new(10);
    env.seq = 1;
    let cache = env.path("cache");
    let layer = VaultLayer::open(Arc::clone(&env.vault), 1, "data", &cache).unwrap();
    let keep_last_one = RetentionPolicy { keep_last: 1, keep_hourly: 0, keep_daily: 0 };
    let report = env.vault.retain(&keep_last_one).unwrap();
    assert_eq!(report.kept, vec![1, 2], "seq 1 is pinned");
    let eager = env.path("eager");
    env.vault.restore_layer(1, "data", &eager).unwrap();
    let stack = LayerStack::create(&env.base, &[eager], &env.path("t")).unwrap();
    let layer = Arc::new(layer);
    let lazy = env.stack(&layer);
    assert!(read_stack(&lazy, 0, SIZE) == read_stack(&stack, 0, SIZE), "all of seq 1's chunks are still there");
    drop(lazy);
    drop(layer);
    VaultLayer::discard(&env.vault, 1, &cache).unwrap();
    assert!(!cache.exists() && env.vault.pins().unwrap().is_empty());
    assert_eq!(env.vault.retain(&keep_last_one).unwrap().removed, vec![1]);
    let err = VaultLayer::open(Arc::clone(&env.vault), 1, "data", &cache).unwrap_err();
    assert_eq!(err.kind(), VaultErrorKind::NotFound);
    assert!(!cache.exists());
}

/// Reads `blocks` one block each (as a booting guest would).
fn touch(layer: &VaultLayer, blocks: &[u64]) {
    for &b in blocks {
        read(layer, (b * BLOCK_SIZE) as usize, 512);
    }
}

/// Some blocks in the map, in a scrambled order.
fn some_blocks(env: &Env, n: usize, seed: u64) -> Vec<u64> {
    let map = env.map();
    let mut rng = Rng(seed);
    (0..n)
        .map(|_| {
            let e = &map.extents[rng.below(map.extents.len() as u64) as usize];
            e.0 + rng.below(e.1)
        })
        .collect()
}

#[test]
fn a_recording_lists_first_touches_in_order_once() {
    let env = Env::new(11);
    let map = env.map();
    let layer = env.open();
    read(&layer, 0, 10);
    layer.restart_recording();
    let (a, b) = (&map.extents[5], &map.extents[2]);
    touch(&layer, &[a.0 + a.1 - 1, b.0, a.0, b.0]);
    let (c, d) = (&map.extents[7], &map.extents[8]);
    // One read spanning two extents records both, in block order.
    read(&layer, (c.0 * BLOCK_SIZE) as usize, ((d.0 - c.0 + 1) * BLOCK_SIZE) as usize);
    let rec = layer.recording();
    let blocks: Vec<u64> = rec.touches.iter().map(|t| t.block).collect();
    let between: Vec<u64> = map.extents.iter().filter(|e| e.0 > c.0 && e.0 < d.0).map(|e| e.0).collect();
    let mut want = vec![a.0, b.0, c.0];
    want.extend(between);
    want.push(d.0);
    assert_eq!(blocks, want, "extents' first blocks, first touch only, the read before the restart not included");
    assert!(rec.touches.windows(2).all(|w| w[0].at_micros <= w[1].at_micros));
    // Prefetch and materialise do not record.
    layer.materialize_all(2).unwrap();
    assert_eq!(layer.stop_recording(), rec);
    assert!(layer.recording().touches.is_empty());
}

fn rec(touches: &[(u64, u32)]) -> Recording {
    Recording { touches: touches.iter().map(|&(block, at_micros)| Touch { block, at_micros }).collect() }
}

#[test]
fn playbooks_round_trip_and_malformed_files_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let mut p = Playbook::from_recording(1 << 20, &rec(&[(16, 5), (0, 9), (48, 2)]));
    p.merge(&rec(&[(0, 1), (32, 7)]));
    let path = tmp.path().join("data.play");
    p.save(&path).unwrap();
    assert!(!tmp.path().join("data.play.tmp").exists());
    let back = Playbook::load(&path).unwrap();
    assert_eq!(back, p);
    assert_eq!((back.runs(), back.len(), back.disk_size()), (2, 4, 1 << 20));
    let good = p.encode();
    let with_crc = |mut b: Vec<u8>| {
        let body = b.len() - 4;
        let crc = crc32fast::hash(&b[..body]);
        b[body..].copy_from_slice(&crc.to_le_bytes());
        b
    };
    let set = |at: usize, v: &[u8]| {
        let mut b = good.clone();
        b[at..at + v.len()].copy_from_slice(v);
        with_crc(b)
    };
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("empty", vec![], "shorter than a header"),
        ("truncated", good[..good.len() - 5].to_vec(), "truncated or trailing"),
        ("trailing", [&good[..], &[0u8; 16]].concat(), "truncated or trailing"),
        ("magic", set(0, b"FKVMLAYR"), "not a playbook"),
        ("version", set(8, &2u32.to_le_bytes()), "format version 2"),
        ("flags", set(12, &1u32.to_le_bytes()), "unknown flags"),
        ("count cap", set(32, &u64::MAX.to_le_bytes()), "more than the cap"),
        (
            "crc",
            {
                let mut b = good.clone();
                b[41] ^= 1;
                b
            },
            "checksum",
        ),
        ("disk size", set(16, &(u64::MAX).to_le_bytes()), "over the"),
        ("block past end", set(40, &(1u64 << 40).to_le_bytes()), "past the disk"),
        ("zero history", set(40 + 12, &0u32.to_le_bytes()), "empty history"),
        (
            "duplicate",
            {
                let e = good[40..48].to_vec();
                set(56, &e)
            },
            "listed twice",
        ),
    ];
    for (what, bytes, msg) in cases {
        let err = Playbook::decode(&bytes).unwrap_err().to_string();
        assert!(err.contains(msg), "{what}: {err}");
        fs::write(&path, &bytes).unwrap();
        assert!(matches!(Playbook::load(&path), Err(PlaybookError::Invalid { .. })), "{what}");
    }
    fs::write(&path, vec![0u8; 40 + 16 * MAX_PLAYBOOK_ENTRIES + 5]).unwrap();
    assert!(Playbook::load(&path).unwrap_err().to_string().contains("cap"));
    assert!(matches!(Playbook::load(&tmp.path().join("none")), Err(PlaybookError::Io { .. })));
}

#[test]
fn merge_follows_the_documented_rule() {
    let rule = MergeRule { keep_runs: 2, max_entries: 100 };
    let mut p = Playbook::new(1 << 20);
    p.merge_with(&rec(&[(10, 10), (20, 20), (10, 99), (1 << 30, 1)]), &rule);
    let view = |p: &Playbook| p.entries().iter().map(|e| (e.block, e.mean_micros, e.history)).collect::<Vec<_>>();
    assert_eq!(view(&p), vec![(10, 10, 1), (20, 20, 1)], "first touch counts; blocks past the end are ignored");
    p.merge_with(&rec(&[(20, 4), (30, 30)]), &rule);
    // 20: mean 20 + (4 - 20) / 2 = 12; 10 untouched this run, still within keep_runs.
    assert_eq!(view(&p), vec![(10, 10, 0b10), (20, 12, 0b11), (30, 30, 0b1)]);
    p.merge_with(&rec(&[(30, 30)]), &rule);
    assert_eq!(view(&p), vec![(20, 12, 0b110), (30, 30, 0b11)], "10 untouched in the last 2 runs: dropped");
    p.merge_with(&rec(&[]), &rule);
    assert_eq!(view(&p), vec![(30, 30, 0b110)]);
    assert_eq!(p.runs(), 4);
    // The mean's divisor is capped at 8: it follows a drift.
    let mut q = Playbook::new(1 << 20);
    for _ in 0..10 {
        q.merge(&rec(&[(1, 1000)]));
    }
    for _ in 0..30 {
        q.merge(&rec(&[(1, 0)]));
    }
    assert!(q.entries()[0].mean_micros < 30, "{}", q.entries()[0].mean_micros);
    // Ordered by mean first touch; the cap keeps the earliest.
    let mut r = Playbook::new(1 << 20);
    r.merge_with(&rec(&[(5, 50), (6, 10), (7, 30)]), &MergeRule { keep_runs: 4, max_entries: 2 });
    assert_eq!(r.blocks().collect::<Vec<_>>(), vec![6, 7]);
}

#[test]
fn prefetching_a_playbook_makes_the_same_reads_all_hits() {
    let env = Env::new(12);
    let blocks = some_blocks(&env, 60, 13);
    let first = env.open();
    touch(&first, &blocks);
    let playbook = Playbook::from_recording(first.size(), &first.stop_recording());
    assert!(playbook.len() > 10 && playbook.len() <= 60);
    assert_eq!(first.stats().misses, playbook.len() as u64);

    let second = env.open();
    let before = env.vault.chunk_reads();
    let report = second.prefetch(&playbook, 4).wait();
    assert_eq!(
        (report.planned, report.fetched, report.errors, report.stopped),
        (playbook.len() as u64, playbook.len() as u64, 0, false)
    );
    assert_eq!(env.vault.chunk_reads() - before, playbook.len() as u64);
    assert_eq!(inspect(second.cache_dir()).unwrap().blocks, second.stats().filled_blocks, "persisted at the end");
    touch(&second, &blocks);
    let s = second.stats();
    assert_eq!((s.misses, s.waits, s.prefetched_extents), (0, 0, playbook.len() as u64));
    assert_eq!(s.hits as usize, blocks.len());
    assert_eq!(env.vault.chunk_reads() - before, playbook.len() as u64, "the reads decrypted nothing");
    // A playbook naming blocks outside this map, or already local, plans nothing.
    let again = second.prefetch(&playbook, 2).wait();
    assert_eq!((again.planned, again.fetched), (0, 0));
}

#[test]
fn prefetch_with_concurrent_foreground_reads_stays_byte_exact_and_fetches_once() {
    let env = Env::new(14);
    let map = env.map();
    // A playbook of every extent, scrambled.
    let mut all: Vec<(u64, u32)> = map.extents.iter().map(|e| (e.0, 0)).collect();
    let mut rng = Rng(15);
    for (i, t) in all.iter_mut().enumerate() {
        t.1 = (rng.below(1000) * 1000 + i as u64) as u32;
    }
    let playbook = Playbook::from_recording(map.size, &rec(&all));
    assert_eq!(playbook.len(), map.extents.len());
    for round in 0..3u64 {
        let layer = env.open();
        let lower: Arc<dyn LazyLower> = layer.clone();
        let stack = Arc::new(LayerStack::create_over(&env.base, lower, &[], &env.path("top")).unwrap());
        let before = env.vault.chunk_reads();
        let prefetch = layer.prefetch(&playbook, 3);
        let model = Arc::new(env.model.clone());
        let readers: Vec<_> = (0..4u64)
            .map(|t| {
                let (stack, model) = (Arc::clone(&stack), Arc::clone(&model));
                std::thread::spawn(move || {
                    let mut rng = Rng(round * 10 + t);
                    for _ in 0..150 {
                        let (o, l) = random_range(&mut rng);
                        assert!(read_stack(&stack, o, l) == model[o..o + l], "{l} bytes at {o}");
                    }
                })
            })
            .collect();
        for r in readers {
            r.join().unwrap();
        }
        let report = if round == 2 { prefetch.stop() } else { prefetch.wait() };
        assert_eq!(report.errors, 0);
        let s = layer.stats();
        assert_eq!(env.vault.chunk_reads() - before, s.fetched_extents, "no extent fetched twice");
        assert_eq!(s.fetched_extents, s.prefetched_extents + s.misses);
        if round < 2 {
            assert!(layer.is_complete() && report.fetched + report.skipped == report.planned);
        }
        assert!(read_stack(&stack, 0, SIZE) == env.model);
        assert!(layer.is_complete());
    }
}

#[test]
fn stopping_a_prefetch_is_prompt_and_dropping_one_stops_it() {
    let env = Env::new(16);
    let map = env.map();
    let playbook = Playbook::from_recording(map.size, &rec(&map.extents.iter().map(|e| (e.0, 0)).collect::<Vec<_>>()));
    let layer = env.open();
    let report = layer.prefetch(&playbook, 1).stop();
    assert!(report.fetched + report.skipped < report.planned || !report.stopped);
    drop(layer.prefetch(&playbook, 2));
    assert!(read_stack(&env.stack(&layer), 0, SIZE) == env.model);
}

#[test]
fn the_benchmark_serves_the_same_bytes_three_ways() {
    let env = Env::new(17);
    let blocks = some_blocks(&env, 40, 18);
    let reads: Vec<(u64, usize)> = blocks.iter().map(|&b| (b * BLOCK_SIZE, BS.min(SIZE - b as usize * BS))).collect();
    let scratch = env.path("bench");
    let report = bench_first_reads(Arc::clone(&env.vault), env.seq, "data", &env.base, &reads, &scratch, 2).unwrap();
    let names: Vec<&str> = report.runs.iter().map(|r| r.name).collect();
    assert_eq!(names, vec!["eager", "lazy", "lazy+playbook"]);
    let (eager, lazy, play) = (&report.runs[0], &report.runs[1], &report.runs[2]);
    assert_eq!(eager.chunk_reads, report.extents);
    assert_eq!(lazy.chunk_reads, report.playbook_entries as u64);
    assert_eq!(lazy.misses, report.playbook_entries as u64);
    assert_eq!(play.hits + play.waits + play.misses, reads.len() as u64);
    assert!(env.vault.pins().unwrap().is_empty());
    assert!(fs::read_dir(&scratch).unwrap().next().is_none(), "the benchmark cleans up");
}

#[test]
fn merging_into_a_file_creates_it_learns_and_replaces_what_is_not_a_playbook_for_this_size() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a/b/p.playbook");
    let rule = MergeRule::default();
    let one = Playbook::merge_into_file(&path, 1 << 20, &rec(&[(3, 10), (7, 5)]), &rule).unwrap();
    assert_eq!((one.runs(), one.len()), (1, 2));
    let two = Playbook::merge_into_file(&path, 1 << 20, &rec(&[(9, 1)]), &rule).unwrap();
    assert_eq!((two.runs(), two.len()), (2, 3), "learned on top of the saved one");
    assert_eq!(Playbook::load(&path).unwrap(), two);
    // Another disk size, or garbage: a new playbook.
    let other = Playbook::merge_into_file(&path, 2 << 20, &rec(&[(1, 1)]), &rule).unwrap();
    assert_eq!((other.runs(), other.len(), other.disk_size()), (1, 1, 2 << 20));
    fs::write(&path, b"not a playbook").unwrap();
    let fresh = Playbook::merge_into_file(&path, 2 << 20, &rec(&[(1, 1)]), &rule).unwrap();
    assert_eq!(fresh.runs(), 1);
}

#[test]
fn a_pin_whose_anchor_is_gone_is_dropped_at_once_for_a_cache_after_a_grace_otherwise() {
    let mut env = Env::new(12);
    env.seq = 1;
    // A lazy restore whose process died without unpinning (SIGKILL): its cache (the
    // pin's anchor) is removed later with its run directory.
    let run = env.path("run");
    let cache = run.join("cache");
    drop(VaultLayer::open(Arc::clone(&env.vault), 1, "data", &cache).unwrap());
    let holder = VaultLayer::pin_holder(&cache).unwrap();
    // An archive-like pin whose anchor exists, and an unanchored one on seq 2.
    let anchor = env.path("archive-dir");
    std::fs::create_dir_all(&anchor).unwrap();
    env.vault.pin_while(1, "archive", Some(&anchor)).unwrap();
    env.vault.pin(2, "manual").unwrap();
    let keep_last_one = RetentionPolicy { keep_last: 1, keep_hourly: 0, keep_daily: 0 };
    let age = |seq: u64, holder: &str, by: std::time::Duration| {
        let path = env.vault.root().join("pins").join(format!("{seq:016}.{holder}"));
        let f = std::fs::File::options().write(true).open(path).unwrap();
        f.set_modified(std::time::SystemTime::now() - by).unwrap();
    };
    let old = crate::vault::pins::ANCHOR_GRACE + std::time::Duration::from_secs(60);

    // Cache still there: kept, however old the pin.
    std::fs::create_dir_all(&cache).unwrap();
    age(1, &holder, old);
    let r = env.vault.retain(&keep_last_one).unwrap();
    assert_eq!((r.kept.clone(), r.stale_pins.len()), (vec![1, 2], 0), "{r:?}");
    // Cache gone: a lazy layer's pin is dropped at once, however young (its cache was
    // made before it); the archive's still holds seq 1.
    std::fs::remove_dir_all(&run).unwrap();
    assert!(!cache.exists());
    env.vault.pin_while(1, &holder, Some(&cache)).unwrap();
    assert_eq!(crate::vault::pins::live_holders(env.vault.root()).unwrap(), vec!["archive", "manual"]);
    let r = env.vault.retain(&keep_last_one).unwrap();
    assert_eq!(r.stale_pins, vec![(1, holder.clone())]);
    assert_eq!(r.kept, vec![1, 2]);
    // Another holder's pin whose anchor is gone but young is kept (its anchor may be
    // about to be made, as an archive's is).
    env.vault.pin_while(1, "archive-2", Some(&env.path("not-yet"))).unwrap();
    assert_eq!(env.vault.retain(&keep_last_one).unwrap().stale_pins, vec![]);
    env.vault.unpin(1, "archive-2").unwrap();
    // The archive goes: its pin is dropped too, and seq 1 with it. An unanchored pin
    // (seq 2, also the newest) is never dropped.
    std::fs::remove_dir_all(&anchor).unwrap();
    age(1, "archive", old);
    age(2, "manual", old);
    let r = env.vault.retain(&keep_last_one).unwrap();
    assert_eq!((r.stale_pins, r.removed, r.kept), (vec![(1, "archive".to_string())], vec![1], vec![2]));
    assert_eq!(env.vault.pins().unwrap(), vec![(2, "manual".to_string())]);
}

#[test]
fn a_pin_whose_cache_was_sealed_is_dropped_at_once_by_retention() {
    let mut env = Env::new(13);
    env.seq = 1;
    let layer = env.open();
    let other = env.open();
    layer.materialize_all(2).unwrap();
    let sealed = layer.seal_cache().unwrap();
    // What a VMM under its sandbox's uid leaves: it may not remove its pin (root's).
    env.vault.pin_while(1, layer.holder(), Some(&sealed.dir)).unwrap();
    let keep_last_one = RetentionPolicy { keep_last: 1, keep_hourly: 0, keep_daily: 0 };
    let r = env.vault.retain(&keep_last_one).unwrap();
    assert_eq!(r.stale_pins, vec![(1, layer.holder().to_string())], "young, but its cache is sealed: {r:?}");
    assert_eq!(r.kept, vec![1, 2], "the unsealed cache's pin still holds seq 1: {r:?}");
    assert_eq!(env.vault.pins().unwrap(), vec![(1, other.holder().to_string())]);
    // The sealed cache reads on without the vault.
    drop(other);
    let _ = VaultLayer::discard(&env.vault, 1, &env.tmp.path().join("none"));
    assert_eq!(read(&layer, 0, 4096).len(), 4096);
}

#[test]
fn chunks_are_named_only_through_the_vault_a_process_opened() {
    use std::os::unix::fs::PermissionsExt;
    let env = Env::new(14);
    let root = env.vault.root().to_path_buf();
    let mode = |p: &std::path::Path| fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode(&root), 0o700, "the vault itself stays closed");
    assert_eq!(mode(&root.join("chunks")), 0o711);
    let fanouts: Vec<PathBuf> = fs::read_dir(root.join("chunks")).unwrap().map(|e| e.unwrap().path()).collect();
    assert!(!fanouts.is_empty());
    for f in &fanouts {
        assert_eq!(mode(f), 0o711, "{}", f.display());
        for c in fs::read_dir(f).unwrap() {
            assert_eq!(mode(&c.unwrap().path()), 0o644);
        }
    }
    // A vault written before the rule is brought to it when opened.
    fs::set_permissions(root.join("chunks"), fs::Permissions::from_mode(0o700)).unwrap();
    fs::set_permissions(&fanouts[0], fs::Permissions::from_mode(0o700)).unwrap();
    let chunk = fs::read_dir(&fanouts[0]).unwrap().next().unwrap().unwrap().path();
    fs::set_permissions(&chunk, fs::Permissions::from_mode(0o600)).unwrap();
    let keys = KeyStore::open(&env.tmp.path().join("keys")).unwrap();
    drop(Vault::open(&root, keys.sandbox_key("sb-1").unwrap()).unwrap());
    assert_eq!((mode(&root.join("chunks")), mode(&fanouts[0]), mode(&chunk)), (0o711, 0o711, 0o644));
    // An open vault reads its chunks from the directory it opened, wherever it is now.
    let layer = env.open();
    let moved = env.tmp.path().join("vault-moved");
    fs::rename(&root, &moved).unwrap();
    let stack = env.stack(&layer);
    assert!(read_stack(&stack, 0, SIZE) == env.model, "the disk reads back through the open vault");
    fs::rename(&moved, &root).unwrap();
}
