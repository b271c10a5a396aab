//! Chains end to end on synthetic snapshots (no VM): diffs, assembly, lineage, pack.

use super::*;
use crate::chunk_store::{ChunkSeal, ChunkStore};
use crate::dir::{MEMORY_IMG, SNAPSHOT_JSON};
use crate::metadata::{minimal_meta, read_meta, replace_meta, write_meta, DevicesMeta, DiskMeta, SnapshotStatus};
use crate::pack_archive::PackTrust;
use std::fs;
use std::os::unix::fs::FileExt;

const MEM: u64 = 4 << 20;
const PAGES: u64 = MEM / 4096;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

struct Env {
    _tmp: tempfile::TempDir,
    store: Store,
    cache: AssembledCache,
    scratch: PathBuf,
}

fn env() -> Env {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(tmp.path().join("store"));
    store.ensure().unwrap();
    let cache = AssembledCache::new(&tmp.path().join("cache"));
    let scratch = tmp.path().join("scratch");
    fs::create_dir(&scratch).unwrap();
    Env { store, cache, scratch, _tmp: tmp }
}

/// Memory of the base: scattered random pages, the rest zero.
fn base_memory(rng: &mut Rng) -> Vec<u8> {
    let mut mem = vec![0u8; MEM as usize];
    for page in 0..PAGES {
        if rng.next().is_multiple_of(3) {
            let at = (page * 4096) as usize;
            for b in &mut mem[at..at + 4096] {
                *b = rng.next() as u8;
            }
        }
    }
    mem
}

/// What a command run in a child might do: rewrite some pages, zero some, rewrite some
/// with identical bytes.
fn mutate(mem: &mut [u8], rng: &mut Rng, marker: u8) {
    for _ in 0..40 {
        let page = (rng.next() % PAGES) as usize;
        let at = page * 4096;
        match rng.next() % 3 {
            0 => mem[at..at + 4096].fill(0),
            1 => mem[at..at + 4096].fill(marker),
            _ => mem[at + (rng.next() % 4096) as usize] ^= 0x5a,
        }
    }
}

/// A whole-image snapshot with `mem` as memory, a vmstate and one read-only disk,
/// written at `dir` (in the store or a staging place).
fn write_image_snapshot(dir: &Path, tag: &str, mem: &[u8], disk: &Path) {
    fs::create_dir_all(dir.join(DISK_DIR)).unwrap();
    let mut meta = minimal_meta(tag, SnapshotStatus::Ready);
    meta.mem_size_bytes = MEM;
    meta.devices = Some(DevicesMeta {
        vsock_cid: Some(3),
        rng: true,
        disks: vec![DiskMeta { file: "root.img".into(), read_only: true, id: "forkvm-root".into(), layers: None }],
        net: None,
    });
    write_meta(&dir.join(SNAPSHOT_JSON), &meta).unwrap();
    fs::write(dir.join(VMSTATE_BIN), format!("vmstate of {tag}")).unwrap();
    let f = crate::memory_image::create_image(&dir.join(MEMORY_IMG), MEM).unwrap();
    crate::memory_image::write_sparse(&f, 0, mem).unwrap();
    crate::store::link_or_copy(disk, &dir.join(DISK_DIR).join("root.img")).unwrap();
}

fn disk(env: &Env) -> PathBuf {
    let p = env.scratch.join("root.img");
    if !p.exists() {
        fs::write(&p, vec![7u8; 64 << 10]).unwrap();
    }
    p
}

fn read_image(path: &Path) -> Vec<u8> {
    let f = fs::File::open(path).unwrap();
    let mut buf = vec![0u8; MEM as usize];
    f.read_exact_at(&mut buf, 0).unwrap();
    buf
}

/// Assembles `tag` from scratch (cache evicted) and returns its memory.
fn assembled(env: &Env, tag: &str) -> Vec<u8> {
    let chain = resolve(&env.store, tag).unwrap();
    let (path, _) = env.cache.memory_for(&env.store, &chain).unwrap();
    read_image(&path)
}

fn assembled_fresh(env: &Env, tag: &str) -> Vec<u8> {
    let chain = resolve(&env.store, tag).unwrap();
    env.cache.evict(chain.head().meta.content_hash.as_deref().unwrap());
    let (path, stats) = env.cache.memory_for(&env.store, &chain).unwrap();
    assert!(stats.is_some(), "an evicted image must be assembled again");
    read_image(&path)
}

/// Base `base` (ingested) and diffs `l1..=depth`, each a mutation of the one below.
/// Returns the memory of every link, base first.
fn build_chain(env: &Env, depth: usize, seed: u64) -> Vec<Vec<u8>> {
    let mut rng = Rng(seed);
    let mut mem = base_memory(&mut rng);
    write_image_snapshot(&env.store.tag_dir("base").unwrap(), "base", &mem, &disk(env));
    let r = ingest(&env.store, &env.cache, "base").unwrap();
    assert!(r.changed && is_hash(&r.content_hash));
    let mut all = vec![mem.clone()];
    let mut parent = "base".to_string();
    for level in 1..=depth {
        mutate(&mut mem, &mut rng, level as u8);
        let tag = format!("l{level}");
        let staged_dir = env.scratch.join(format!("staged-{tag}"));
        write_image_snapshot(&staged_dir, &tag, &mem, &disk(env));
        let staged = SnapshotDir::open(&staged_dir).unwrap();
        let chain = resolve(&env.store, &parent).unwrap();
        let r = write_diff(&env.store, &env.cache, &chain, &staged, &tag, None).unwrap();
        assert_eq!(r.parent_tag.as_deref(), Some(parent.as_str()));
        assert!(r.pages > 0 && r.pages < PAGES / 4, "a diff holds only changed pages: {}", r.pages);
        all.push(mem.clone());
        parent = tag;
    }
    all
}

fn store_files(env: &Env) -> Vec<(PathBuf, u64)> {
    fn walk(dir: &Path, out: &mut Vec<(PathBuf, u64)>) {
        for e in fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else {
                out.push((p.clone(), fs::metadata(&p).unwrap().len()));
            }
        }
    }
    let mut out = Vec::new();
    walk(env.store.root(), &mut out);
    out.retain(|(p, _)| !p.ends_with(".lock"));
    out.sort();
    out
}

#[test]
fn ingest_keeps_memory_and_caches_the_image() {
    let env = env();
    let mem = build_chain(&env, 0, 1).remove(0);
    let snap = env.store.lookup("base").unwrap();
    assert!(snap.is_chunked());
    // memory.img stays until garbage collection (a spawn may be about to open it).
    assert!(snap.memory_path().exists());
    collect_garbage(&env.store).unwrap();
    assert!(!snap.memory_path().exists(), "garbage collection drops a chunked snapshot's memory.img");
    let chain = resolve(&env.store, "base").unwrap();
    let (path, stats) = env.cache.memory_for(&env.store, &chain).unwrap();
    assert!(stats.is_none(), "ingest left the image in the cache");
    assert_eq!(read_image(&path), mem);
    assert_eq!(assembled_fresh(&env, "base"), mem);
    // A second ingest is a no-op.
    assert!(!ingest(&env.store, &env.cache, "base").unwrap().changed);
}

#[test]
fn every_depth_assembles_to_its_own_memory() {
    let env = env();
    let mems = build_chain(&env, 3, 7);
    for (depth, mem) in mems.iter().enumerate() {
        let tag = if depth == 0 { "base".to_string() } else { format!("l{depth}") };
        let chain = resolve(&env.store, &tag).unwrap();
        assert_eq!(chain.depth(), depth);
        assert_eq!(assembled(&env, &tag), *mem, "cached image of {tag}");
        assert_eq!(assembled_fresh(&env, &tag), *mem, "image of {tag} assembled from chunks");
    }
    // The links really differ from each other (the test would not notice a no-op diff).
    assert_ne!(mems[1], mems[2]);
}

#[test]
fn compact_equals_the_head_and_shares_its_chunks() {
    let env = env();
    let mems = build_chain(&env, 3, 9);
    let r = compact(&env.store, &env.cache, "l3", "flat").unwrap();
    // Windows no diff touched are the base's chunks already.
    assert!(r.chunks_reused > r.chunks_new, "{r:?}");
    let flat = env.store.lookup("flat").unwrap();
    assert_eq!(flat.meta.parent_tag, None);
    assert_eq!(flat.meta.branched_from.as_deref(), Some("compact:l3"));
    assert_eq!(resolve(&env.store, "flat").unwrap().depth(), 0);
    assert_eq!(assembled_fresh(&env, "flat"), mems[3]);
    assert!(compact(&env.store, &env.cache, "l3", "l3").is_err());
    assert_eq!(compact(&env.store, &env.cache, "l3", "flat").unwrap_err().code(), forkvm_api::ErrorCode::Conflict);
}

#[test]
fn info_reports_lineage_and_sizes() {
    let env = env();
    build_chain(&env, 3, 11);
    let i = info(&env.store, "l1").unwrap();
    assert_eq!(i.chain_depth, 1);
    assert_eq!(i.parent_tag.as_deref(), Some("base"));
    assert_eq!(i.ancestors, ["base"]);
    assert_eq!(i.dependents, ["l2"]);
    assert_eq!(i.descendants, ["l3", "l2"]);
    assert!(i.bootable && i.problem.is_none());
    assert!(i.logical_bytes > 0 && i.logical_bytes < MEM / 4, "{}", i.logical_bytes);
    let head = info(&env.store, "l3").unwrap();
    assert_eq!(head.ancestors, ["base", "l1", "l2"]);
    assert!(head.dependents.is_empty());
    let base = info(&env.store, "base").unwrap();
    assert_eq!(base.chain_depth, 0);
    assert!(head.chain_physical_bytes > base.physical_bytes);
    assert_eq!(info(&env.store, "nope").unwrap_err().code(), forkvm_api::ErrorCode::NotFound);
}

#[test]
fn rmi_refuses_cascades_and_forces() {
    let env = env();
    build_chain(&env, 3, 13);
    let err = remove(&env.store, &env.cache, "l1", RemoveMode::Refuse).unwrap_err();
    assert!(err.to_string().contains("l2"), "{err}");
    assert_eq!(err.state(), Some("has_dependents"));
    assert!(env.store.lookup("l1").is_ok(), "a refused rmi removes nothing");

    // Force: l2 and l3 are orphaned and say so.
    let r = remove(&env.store, &env.cache, "l1", RemoveMode::Force).unwrap();
    assert_eq!(r.removed, ["l1"]);
    assert_eq!(r.orphaned, ["l2"]);
    let err = resolve(&env.store, "l3").unwrap_err();
    assert!(matches!(err, ChainError::ParentMissing { .. }), "{err}");
    assert!(err.to_string().contains("\"l1\""), "{err}");
    let i = info(&env.store, "l2").unwrap();
    assert!(!i.bootable && i.problem.unwrap().contains("l1"));
    // l1's own pages are no longer referenced by l1 (l2's are still there).
    assert!(resolve(&env.store, "base").is_ok());

    // Cascade from base removes what is left of its subtree (nothing: l2 lost its parent
    // edge), so rebuild and cascade.
    let env = env_with_chain(3, 17);
    let before = ChunkStore::open(env.store.root()).usage().unwrap().0;
    let r = remove(&env.store, &env.cache, "l1", RemoveMode::Cascade).unwrap();
    assert_eq!(r.removed, ["l3", "l2", "l1"]);
    assert!(r.chunks_removed > 0, "the subtree's chunks are collected");
    let after = ChunkStore::open(env.store.root()).usage().unwrap().0;
    assert_eq!(before - after, r.chunks_removed);
    assert!(env.store.lookup("l2").is_err() && env.store.lookup("l3").is_err());
    // The base still assembles from its chunks.
    assert!(resolve(&env.store, "base").is_ok());
    let _ = assembled_fresh(&env, "base");
}

fn env_with_chain(depth: usize, seed: u64) -> Env {
    let env = env();
    build_chain(&env, depth, seed);
    env
}

#[test]
fn a_replaced_parent_or_tampered_link_is_refused() {
    let env = env_with_chain(2, 19);
    // Tampered memory.map: the recorded content hash no longer matches at assembly.
    let l2 = env.store.lookup("l2").unwrap();
    let mut bytes = fs::read(l2.memory_map_path()).unwrap();
    let n = bytes.len();
    bytes[n - 40] ^= 1;
    fs::write(l2.memory_map_path(), &bytes).unwrap();
    let chain = resolve(&env.store, "l2").unwrap();
    env.cache.evict(l2.meta.content_hash.as_deref().unwrap());
    let err = env.cache.memory_for(&env.store, &chain).unwrap_err();
    assert!(matches!(err, ChainError::ContentMismatch { .. } | ChainError::PageMap { .. }), "{err}");

    // A parent replaced by another snapshot under the same tag.
    let l1_dir = env.store.tag_dir("l1").unwrap();
    let mut meta = read_meta(&l1_dir.join(SNAPSHOT_JSON)).unwrap();
    meta.content_hash = Some("0".repeat(64));
    replace_meta(&l1_dir, &meta).unwrap();
    let err = resolve(&env.store, "l2").unwrap_err();
    assert!(matches!(err, ChainError::ParentChanged { .. }), "{err}");
    assert_eq!(err.state(), Some("not_bootable"));
}

#[test]
fn gc_keeps_referenced_chunks_only() {
    let env = env_with_chain(2, 23);
    let chunks = ChunkStore::open(env.store.root());
    let stray = chunks.put(b"nobody references this").unwrap().id;
    let report = collect_garbage(&env.store).unwrap();
    assert_eq!(report.removed, 1);
    assert!(!chunks.contains(&stray));
    let _ = assembled_fresh(&env, "l2");
}

#[test]
fn pack_unpack_round_trips_into_an_empty_store() {
    let env = env_with_chain(3, 29);
    let mems: Vec<Vec<u8>> = ["base", "l1", "l2", "l3"].iter().map(|t| assembled(&env, t)).collect();
    let out = env.scratch.join("chain.tar.zst");
    let p = pack(&env.store, &env.cache, "l3", &out).unwrap();
    assert_eq!(p.links, ["base", "l1", "l2", "l3"]);
    assert_eq!(p.disks, 1, "a disk shared by every link is packed once");
    assert!(p.pack_bytes > 0 && p.pack_bytes < p.logical_bytes);

    let other = env_empty_store(&env, "other");
    let u = unpack(&other, &out).unwrap();
    assert_eq!(u.imported, ["base", "l1", "l2", "l3"]);
    let cache2 = AssembledCache::new(&env.scratch.join("cache2"));
    for (tag, mem) in ["base", "l1", "l2", "l3"].iter().zip(&mems) {
        let chain = resolve(&other, tag).unwrap();
        let (path, stats) = cache2.memory_for(&other, &chain).unwrap();
        assert!(stats.is_some());
        assert_eq!(read_image(&path), *mem, "{tag} after unpack");
    }
    assert_eq!(fs::read(other.tag_dir("l3").unwrap().join(DISK_DIR).join("root.img")).unwrap(), vec![7u8; 64 << 10]);
    // Unpacking again reuses every link; a pack never writes over a different snapshot.
    let again = unpack(&other, &out).unwrap();
    assert_eq!(again.reused, ["base", "l1", "l2", "l3"]);
    assert!(again.imported.is_empty());
    assert!(
        ChainError::from(StoreError::Exists { tag: "x".into(), store: PathBuf::new() }).code()
            == forkvm_api::ErrorCode::Conflict
    );
    assert!(fs::read_dir(staging_root(&other)).unwrap().next().is_none(), "no staging left behind");
}

#[test]
fn signed_packs_are_trusted_by_their_key_only_and_refusals_write_nothing() {
    use crate::pack_archive::signature::{generate_key, read_secret_key};
    let env = env_with_chain(1, 41);
    let (ours, theirs) = (env.scratch.join("ours.key"), env.scratch.join("theirs.key"));
    let ours_pub = generate_key(&ours).unwrap();
    let theirs_pub = generate_key(&theirs).unwrap();
    let signed = env.scratch.join("signed.tar.zst");
    pack_signed(&env.store, &env.cache, "l1", &signed, Some(&read_secret_key(&ours).unwrap())).unwrap();
    let unsigned = env.scratch.join("unsigned.tar.zst");
    pack(&env.store, &env.cache, "l1", &unsigned).unwrap();
    let trust_ours = PackTrust::from_files(std::slice::from_ref(&ours_pub)).unwrap();
    let trust_theirs = PackTrust::from_files(&[theirs_pub]).unwrap();

    let other = env_empty_store(&env, "other");
    let before = files_under(other.root());
    for (pack_path, trust, why) in
        [(&unsigned, &trust_ours, "not signed"), (&signed, &trust_theirs, "not a trusted key")]
    {
        let err = unpack_trusted(&other, pack_path, trust).unwrap_err();
        assert_eq!(err.code(), forkvm_api::ErrorCode::BadRequest, "{err}");
        assert!(err.to_string().contains(why), "{err}");
        assert_eq!(files_under(other.root()), before, "a refused pack wrote into the store");
    }
    let u = unpack_trusted(&other, &signed, &trust_ours).unwrap();
    assert_eq!(u.imported, ["base", "l1"]);
    let key = std::fs::read_to_string(&ours_pub).unwrap();
    assert!(key.trim().ends_with(u.signed_by.as_deref().unwrap()), "{u:?}");
    // Without a trusted key, unsigned packs still unpack (and say so).
    let third = env_empty_store(&env, "third");
    assert_eq!(unpack(&third, &unsigned).unwrap().signed_by, None);
}

#[test]
fn unpack_reuses_an_existing_base_and_refuses_a_different_one() {
    let env = env_with_chain(2, 31);
    let out = env.scratch.join("chain.tar.zst");
    pack(&env.store, &env.cache, "l2", &out).unwrap();
    // Same store, l1 and l2 removed: the base is reused, the rest imported.
    remove(&env.store, &env.cache, "l1", RemoveMode::Cascade).unwrap();
    let u = unpack(&env.store, &out).unwrap();
    assert_eq!(u.reused, ["base"]);
    assert_eq!(u.imported, ["l1", "l2"]);
    assert!(u.chunks_present > 0);
    assert!(resolve(&env.store, "l2").is_ok());

    // Another store whose "base" is a different snapshot: refused, nothing imported.
    let other = env_empty_store(&env, "other");
    let mut rng = Rng(99);
    let mem = base_memory(&mut rng);
    write_image_snapshot(&other.tag_dir("base").unwrap(), "base", &mem, &disk(&env));
    let before = files_under(other.root());
    let err = unpack(&other, &out).unwrap_err();
    assert_eq!(err.code(), forkvm_api::ErrorCode::Conflict, "{err}");
    assert_eq!(files_under(other.root()), before);
}

#[test]
fn a_flipped_byte_or_truncation_leaves_the_store_unchanged() {
    let env = env_with_chain(2, 37);
    let out = env.scratch.join("chain.tar.zst");
    pack(&env.store, &env.cache, "l2", &out).unwrap();
    let good = fs::read(&out).unwrap();
    let other = env_empty_store(&env, "other");
    let before = files_under(other.root());
    let bad = env.scratch.join("bad.tar.zst");
    for i in 1..=12u64 {
        let mut bytes = good.clone();
        let at = (bytes.len() as u64 * i / 13) as usize;
        bytes[at] ^= 0x01;
        fs::write(&bad, &bytes).unwrap();
        assert!(unpack(&other, &bad).is_err(), "flipped byte at {at} accepted");
        assert_eq!(files_under(other.root()), before, "store changed by a refused pack (byte {at})");
    }
    fs::write(&bad, &good[..good.len() * 2 / 3]).unwrap();
    assert!(unpack(&other, &bad).is_err());
    assert_eq!(files_under(other.root()), before);
    assert!(unpack(&other, &out).is_ok(), "the intact pack still imports");
    let _ = store_files(&env);
}

fn env_empty_store(env: &Env, name: &str) -> Store {
    let s = Store::open(env.scratch.join(name));
    s.ensure().unwrap();
    s
}

/// Files under `root`, except empty staging directories (created and removed by unpack).
fn files_under(root: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    walk(root, &mut out);
    out.retain(|p| !p.ends_with(".lock"));
    out.sort();
    out
}

#[path = "layer_tests.rs"]
mod layers;

/// Stages `mem` as `tag` and publishes it as a diff over `parent`, sealed with `seal`.
fn sealed_diff(
    env: &Env,
    cache: &AssembledCache,
    parent: &str,
    tag: &str,
    mem: &[u8],
    seal: &MemorySeal,
) -> ConvertReport {
    let staged_dir = env.scratch.join(format!("staged-{tag}"));
    write_image_snapshot(&staged_dir, tag, mem, &disk(env));
    let chain = resolve(&env.store, parent).unwrap();
    write_diff(&env.store, cache, &chain, &SnapshotDir::open(&staged_dir).unwrap(), tag, Some(seal)).unwrap()
}

/// `tag`'s memory assembled again through `cache`.
fn assembled_through(env: &Env, cache: &AssembledCache, tag: &str) -> Result<Vec<u8>, ChainError> {
    let chain = resolve(&env.store, tag).unwrap();
    cache.evict(chain.head().meta.content_hash.as_deref().unwrap());
    cache.memory_for(&env.store, &chain).map(|(path, _)| read_image(&path))
}

#[test]
fn sealed_diffs_assemble_with_their_key_only_and_share_what_did_not_change() {
    let env = env();
    let keys = env.scratch.join("keys");
    let cache = env.cache.clone().with_keys_dir(&keys);
    let key = crate::vault::KeyStore::open(&keys).unwrap().sandbox_key("sb1").unwrap();
    let seal = MemorySeal { owner: "sb1".into(), seal: ChunkSeal::of_key(&key) };
    let mut rng = Rng(41);
    let mut mem = base_memory(&mut rng);
    write_image_snapshot(&env.store.tag_dir("base").unwrap(), "base", &mem, &disk(&env));
    ingest(&env.store, &cache, "base").unwrap();
    // Two checkpoints over the base: the second changes one page more than the first.
    mutate(&mut mem, &mut rng, 1);
    let first = mem.clone();
    let c1 = sealed_diff(&env, &cache, "base", "c1", &first, &seal);
    mem[4096..4096 + 8].copy_from_slice(b"changed!");
    let second = mem.clone();
    let c2 = sealed_diff(&env, &cache, "base", "c2", &second, &seal);
    assert!(c1.chunks_new > 0 && c2.chunks_reused > 0 && c2.chunks_new < c1.chunks_new, "{c1:?}\n{c2:?}");
    let c1_dir = env.store.lookup("c1").unwrap();
    assert_eq!(c1_dir.meta.memory_sealed_by.as_deref(), Some("sb1"));
    // Every chunk of its own is sealed: nothing of it is plain zstd in the store.
    let map = crate::page_map::PageMap::read_file(&c1_dir.memory_map_path()).unwrap();
    let plain = ChunkStore::open(env.store.root());
    let mut sealed_chunks = 0;
    for e in &map.extents {
        if let crate::page_map::ExtentContent::Chunk(id) = e.content {
            let bytes = fs::read(plain.path_of(&id)).unwrap();
            assert!(bytes.starts_with(&crate::vault::SEALED_CHUNK_MAGIC) && zstd::decode_all(&bytes[..]).is_err());
            sealed_chunks += 1;
        }
    }
    assert!(sealed_chunks > 0);
    assert_eq!(assembled_through(&env, &cache, "c1").unwrap(), first);
    assert_eq!(assembled_through(&env, &cache, "c2").unwrap(), second);
    // Without its key (another host's keys, or a purged sandbox): refused, naming whose.
    let keyless = env.cache.clone().with_keys_dir(&env.scratch.join("other-keys"));
    let e = assembled_through(&env, &keyless, "c1").unwrap_err();
    assert!(matches!(e, ChainError::Sealed { .. }) && e.to_string().contains("sandbox sb1 has no key"), "{e}");
    assert_eq!(e.state(), Some("not_bootable"));
    // The garbage collector keeps sealed chunks that a snapshot references.
    collect_garbage(&env.store).unwrap();
    assert_eq!(assembled_through(&env, &cache, "c2").unwrap(), second);
    // Compacting keeps it sealed; packing refuses it.
    compact(&env.store, &cache, "c2", "flat").unwrap();
    assert_eq!(env.store.lookup("flat").unwrap().meta.memory_sealed_by.as_deref(), Some("sb1"));
    assert_eq!(assembled_through(&env, &cache, "flat").unwrap(), second);
    let e = pack(&env.store, &cache, "c2", &env.scratch.join("c2.tar.zst")).unwrap_err();
    assert!(matches!(e, ChainError::Sealed { .. }) && e.to_string().contains("not packed"), "{e}");
}
