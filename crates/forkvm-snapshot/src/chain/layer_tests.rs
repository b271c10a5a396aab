//! Chains whose snapshots have a layered disk: a sparse 64 MiB base with a few MiB of
//! data and sealed layers shared by hard link between links (each child adds one).

use super::*;
use crate::layered_disk::{LayerStack, BITMAP_FILE, DATA_FILE};
use crate::pack_archive::{extract_pack, PackLimits, PackWriter};
use std::io::Write;
use std::os::unix::fs::MetadataExt;

const DISK: u64 = 64 << 20;
const MIB: usize = 1 << 20;

/// A layered disk being built in the scratch directory: the base, and a stack whose
/// sealed layers are what snapshots list.
struct Disk {
    base: PathBuf,
    stack: LayerStack,
    scratch: PathBuf,
    tops: usize,
}

fn random(rng: &mut Rng, len: usize) -> Vec<u8> {
    (0..len).map(|_| rng.next() as u8).collect()
}

impl Disk {
    /// A sparse base with 2.5 MiB of data at three places, and two sealed layers.
    fn new(env: &Env, rng: &mut Rng) -> Disk {
        let base = env.scratch.join("base-disk.img");
        let f = fs::File::create(&base).unwrap();
        f.set_len(DISK).unwrap();
        for (at, len) in [(0, MIB), (30 * MIB, MIB), (60 * MIB + 4096, MIB / 2)] {
            f.write_all_at(&random(rng, len), at as u64).unwrap();
        }
        f.sync_all().unwrap();
        let stack = LayerStack::create(&base, &[], &env.scratch.join("top0")).unwrap();
        let mut disk = Disk { base, stack, scratch: env.scratch.clone(), tops: 0 };
        disk.seal_one(rng);
        disk.seal_one(rng);
        disk
    }

    /// Writes a few unaligned runs into the top and seals it.
    fn seal_one(&mut self, rng: &mut Rng) {
        for _ in 0..3 {
            let len = 1 + (rng.next() % (300 << 10)) as usize;
            let at = rng.next() % (DISK - len as u64);
            self.stack.write_at(&random(rng, len), at).unwrap();
        }
        self.tops += 1;
        self.stack.seal(&self.scratch.join(format!("top{}", self.tops))).unwrap();
    }

    /// (id, directory) of each sealed layer, oldest first.
    fn sealed(&self) -> Vec<(String, PathBuf)> {
        self.stack.sealed_layers().iter().map(|l| (l.id().to_string(), l.dir().to_path_buf())).collect()
    }
}

/// The whole disk as a stack over `base` and `layers` reads it (through a fresh top).
fn disk_bytes(base: &Path, layers: &[PathBuf], scratch: &Path) -> Vec<u8> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let top = scratch.join(format!("read-top-{}", N.fetch_add(1, Ordering::Relaxed)));
    let stack = LayerStack::create(base, layers, &top).unwrap();
    let mut buf = vec![0u8; DISK as usize];
    stack.read_at(&mut buf, 0).unwrap();
    drop(stack);
    fs::remove_dir_all(&top).unwrap();
    buf
}

/// What `tag`'s layered disk reads as, in `store`.
fn snapshot_disk(store: &Store, tag: &str, scratch: &Path) -> Vec<u8> {
    let snap = store.lookup(tag).unwrap();
    let d = &snap.meta.devices.as_ref().unwrap().disks[0];
    let disk_dir = snap.path.join(DISK_DIR);
    disk_bytes(&disk_dir.join(&d.file), &d.layer_dirs(&disk_dir), scratch)
}

/// A whole-image snapshot at `dir` whose disk is `disk`'s base and sealed layers (hard links).
fn write_layered_snapshot(dir: &Path, tag: &str, mem: &[u8], disk: &Disk) {
    write_image_snapshot(dir, tag, mem, &disk.base);
    let sealed = disk.sealed();
    let mut meta = read_meta(&dir.join(SNAPSHOT_JSON)).unwrap();
    let d = &mut meta.devices.as_mut().unwrap().disks[0];
    d.layers = Some(sealed.iter().map(|(id, _)| id.clone()).collect());
    let disk_dir = dir.join(DISK_DIR);
    for (id, from) in &sealed {
        let to = d.layer_dir(&disk_dir, id);
        fs::create_dir_all(&to).unwrap();
        for f in [DATA_FILE, BITMAP_FILE] {
            fs::hard_link(from.join(f), to.join(f)).unwrap();
        }
    }
    write_meta(&dir.join(SNAPSHOT_JSON), &meta).unwrap();
}

/// `base` (2 layers) and diffs `l1..=depth` (each one more layer). Returns each link's disk.
fn layered_chain(env: &Env, depth: usize, seed: u64) -> Vec<Vec<u8>> {
    let mut rng = Rng(seed);
    let mut disk = Disk::new(env, &mut rng);
    let mut mem = base_memory(&mut rng);
    write_layered_snapshot(&env.store.tag_dir("base").unwrap(), "base", &mem, &disk);
    ingest(&env.store, &env.cache, "base").unwrap();
    let mut disks = vec![snapshot_disk(&env.store, "base", &env.scratch)];
    let mut parent = "base".to_string();
    for level in 1..=depth {
        mutate(&mut mem, &mut rng, level as u8);
        disk.seal_one(&mut rng);
        let tag = format!("l{level}");
        let staged_dir = env.scratch.join(format!("staged-{tag}"));
        write_layered_snapshot(&staged_dir, &tag, &mem, &disk);
        let staged = SnapshotDir::open(&staged_dir).unwrap();
        let chain = resolve(&env.store, &parent).unwrap();
        write_diff(&env.store, &env.cache, &chain, &staged, &tag, None).unwrap();
        disks.push(snapshot_disk(&env.store, &tag, &env.scratch));
        parent = tag;
    }
    // The links' disks really differ (a layer that changed nothing would not be tested).
    assert!(disks.windows(2).all(|w| w[0] != w[1]));
    disks
}

fn layer_names(store: &Store, tag: &str) -> Vec<String> {
    let snap = store.lookup(tag).unwrap();
    snap.meta.devices.unwrap().disks[0].layers.clone().unwrap()
}

fn layer_dir(store: &Store, tag: &str, name: &str) -> PathBuf {
    store.tag_dir(tag).unwrap().join(DISK_DIR).join("root.img.layers").join(name)
}

#[test]
fn a_layered_chain_packs_sparse_and_unpacks_byte_exact() {
    let env = env();
    let disks = layered_chain(&env, 2, 41);
    let tags = ["base", "l1", "l2"];
    let out = env.scratch.join("chain.tar.zst");
    let p = pack(&env.store, &env.cache, "l2", &out).unwrap();
    assert_eq!((p.disks, p.layers), (1, 4), "shared base and layers are packed once");
    let head = env.store.lookup("l2").unwrap();
    let allocated = disks::allocated_bytes(&head.path, &head.meta);
    assert!(allocated > (2 * MIB) as u64 && allocated < (8 * MIB) as u64, "{allocated}");
    assert_eq!(info(&env.store, "l2").unwrap().disk_bytes, allocated);
    assert!(p.pack_bytes < 2 * allocated + MEM, "pack {} bytes, disk data {allocated} bytes", p.pack_bytes);
    assert!(p.logical_bytes < DISK / 4, "entries hold the data, not the 64 MiB disk: {}", p.logical_bytes);

    let other = env_empty_store(&env, "other");
    let u = unpack(&other, &out).unwrap();
    assert_eq!(u.imported, tags);
    for (tag, want) in tags.iter().zip(&disks) {
        assert_eq!(layer_names(&other, tag), layer_names(&env.store, tag));
        assert!(snapshot_disk(&other, tag, &env.scratch) == *want, "{tag}'s disk differs after unpack");
        verify(&resolve(&other, tag).unwrap()).unwrap();
    }
    // Shared layers and base are hard links between the unpacked links, and sparse.
    let first = &layer_names(&other, "base")[0];
    let ino = |tag: &str| fs::metadata(layer_dir(&other, tag, first).join(DATA_FILE)).unwrap().ino();
    assert!(ino("base") == ino("l1") && ino("l1") == ino("l2"));
    let base_img = other.tag_dir("l2").unwrap().join(DISK_DIR).join("root.img");
    let m = fs::metadata(&base_img).unwrap();
    assert_eq!(m.len(), DISK);
    assert!(m.blocks() * 512 < (8 * MIB) as u64, "the unpacked base is sparse: {} bytes", m.blocks() * 512);
    assert!(fs::read_dir(staging_root(&other)).unwrap().next().is_none(), "no staging left behind");
}

/// The tar inside a pack, and a pack made of a tar.
fn tar_of(pack: &Path) -> Vec<u8> {
    zstd::decode_all(fs::File::open(pack).unwrap()).unwrap()
}

fn write_pack(tar: &[u8], path: &Path) {
    let mut enc = zstd::Encoder::new(fs::File::create(path).unwrap(), 3).unwrap();
    enc.include_checksum(true).unwrap();
    enc.write_all(tar).unwrap();
    enc.finish().unwrap();
}

/// Offset of the data of entry `name` in a tar.
fn entry_data(tar: &[u8], name: &str) -> usize {
    let at = (0..tar.len())
        .step_by(512)
        .find(|&h| tar[h..].starts_with(name.as_bytes()) && tar[h + name.len()] == 0)
        .unwrap_or_else(|| panic!("{name} not in the pack"));
    at + 512
}

/// Rewrites `pack` into `out` with entry `name` edited and the manifest re-hashed (a
/// consistent pack with other content).
fn rewrite(env: &Env, pack: &Path, out: &Path, name: &str, edit: impl Fn(&mut Vec<u8>)) {
    let dir = env.scratch.join(format!("rewrite-{}", out.file_name().unwrap().to_string_lossy()));
    fs::create_dir(&dir).unwrap();
    let manifest = extract_pack(pack, &dir, &|_| true, &PackLimits::default()).unwrap();
    let _ = fs::remove_file(out);
    let mut w = PackWriter::create(out).unwrap();
    for e in &manifest.entries {
        let mut bytes = fs::read(dir.join(&e.name)).unwrap();
        if e.name == name {
            edit(&mut bytes);
        }
        w.add_bytes(&e.name, &bytes).unwrap();
    }
    w.finish(manifest.meta).unwrap();
}

#[test]
fn damaged_layers_in_a_pack_are_refused_with_the_store_unchanged() {
    let env = env();
    layered_chain(&env, 1, 43);
    let out = env.scratch.join("chain.tar.zst");
    pack(&env.store, &env.cache, "l1", &out).unwrap();
    let other = env_empty_store(&env, "other");
    let before = files_under(other.root());
    let refused = |path: &Path, what: &str, expect: &str| {
        let err = unpack(&other, path).expect_err(what).to_string();
        assert!(err.contains(expect), "{what}: {err}");
        assert_eq!(files_under(other.root()), before, "{what}: the store changed");
    };
    // A flipped byte in the tar (the manifest's hash catches it).
    let tar = tar_of(&out);
    let bad = env.scratch.join("bad.tar.zst");
    for (entry, skip) in [("layers/0/bitmap", 100), ("layers/1/data", 32 + 16 * 3 + 5000), ("disks/0", 40 + 4096)] {
        let mut t = tar.clone();
        t[entry_data(&tar, entry) + skip] ^= 0x10;
        write_pack(&t, &bad);
        refused(&bad, entry, "BLAKE3");
    }
    // Consistent packs with a damaged layer bitmap or sparse header.
    let bitmap_flip = env.scratch.join("bitmap.tar.zst");
    rewrite(&env, &out, &bitmap_flip, "layers/0/bitmap", |b| b[80] ^= 1);
    refused(&bitmap_flip, "re-hashed bitmap", "layer");
    let header_flip = env.scratch.join("header.tar.zst");
    rewrite(&env, &out, &header_flip, "layers/1/data", |b| b[0] ^= 1);
    refused(&header_flip, "re-hashed sparse magic", "sparse");
    let size_flip = env.scratch.join("size.tar.zst");
    rewrite(&env, &out, &size_flip, "layers/1/data", |b| b[20] ^= 0x40);
    refused(&size_flip, "re-hashed sparse size (another valid size)", "layer");
    let swapped = env.scratch.join("swapped.tar.zst");
    let first_bitmap = fs::read(env.scratch.join("rewrite-bitmap.tar.zst/layers/0/bitmap")).unwrap();
    rewrite(&env, &out, &swapped, "layers/1/bitmap", |b| b.clone_from(&first_bitmap));
    refused(&swapped, "a layer's bitmap replaced by another's", "layer");
    assert!(unpack(&other, &out).is_ok(), "the intact pack still imports");
}

#[test]
fn verify_refuses_layers_listed_in_the_wrong_order_or_name() {
    let env = env();
    layered_chain(&env, 1, 47);
    let dir = env.store.tag_dir("l1").unwrap();
    let good = read_meta(&dir.join(SNAPSHOT_JSON)).unwrap();
    // Rewrites l1's snapshot.json with its layer list edited and a matching content hash.
    let relist = |edit: &dyn Fn(&mut Vec<String>)| {
        let mut meta = good.clone();
        edit(meta.devices.as_mut().unwrap().disks[0].layers.as_mut().unwrap());
        meta.content_hash = None;
        meta.content_hash = Some(content_hash(&dir, &meta).unwrap());
        replace_meta(&dir, &meta).unwrap();
    };
    relist(&|l| l.swap(0, 1));
    let err = resolve(&env.store, "l1").unwrap_err();
    assert!(matches!(err, ChainError::DiskLayer { .. }), "{err}");
    assert!(err.to_string().contains("l1") && err.to_string().contains("root.img"), "{err}");
    assert!(err.to_string().contains("wrong order"), "{err}");
    assert_eq!(err.state(), Some("not_bootable"));

    // A layer directory holding another layer than its name says.
    let names = layer_names(&env.store, "base");
    let (a, b) = (layer_dir(&env.store, "l1", &names[0]), layer_dir(&env.store, "l1", &names[1]));
    let tmp = env.scratch.join("swap");
    fs::rename(&a, &tmp).unwrap();
    fs::rename(&b, &a).unwrap();
    fs::rename(&tmp, &b).unwrap();
    relist(&|l| l.swap(0, 1));
    let err = resolve(&env.store, "l1").unwrap_err();
    assert!(err.to_string().contains("wrong name"), "{err}");
    // verify (assembly, pack) checks every link, not only the head.
    let chain = Chain { links: vec![env.store.lookup("l1").unwrap()] };
    assert!(matches!(verify(&chain).unwrap_err(), ChainError::DiskLayer { .. }));
    assert!(resolve(&env.store, "base").is_ok(), "the base's own layers are intact");
}

#[test]
fn compact_and_diff_keep_the_layers() {
    let env = env();
    let disks = layered_chain(&env, 2, 53);
    assert_eq!(layer_names(&env.store, "l2").len(), 4);
    assert_eq!(layer_names(&env.store, "l2")[..3], layer_names(&env.store, "l1")[..]);
    compact(&env.store, &env.cache, "l2", "flat").unwrap();
    assert_eq!(layer_names(&env.store, "flat"), layer_names(&env.store, "l2"));
    assert!(snapshot_disk(&env.store, "flat", &env.scratch) == disks[2]);
    let newest = layer_names(&env.store, "l2").pop().unwrap();
    let ino = |tag: &str| fs::metadata(layer_dir(&env.store, tag, &newest).join(DATA_FILE)).unwrap().ino();
    assert_eq!(ino("flat"), ino("l2"), "layers are hard-linked, not copied");
    verify(&resolve(&env.store, "flat").unwrap()).unwrap();
}

#[test]
fn a_missing_layer_makes_the_snapshot_unbootable_naming_it() {
    let env = env();
    layered_chain(&env, 1, 59);
    let newest = layer_names(&env.store, "l1").pop().unwrap();
    fs::remove_dir_all(layer_dir(&env.store, "l1", &newest)).unwrap();
    let i = info(&env.store, "l1").unwrap();
    assert!(!i.bootable);
    let problem = i.problem.unwrap();
    assert!(problem.contains(&newest) && problem.contains("root.img") && problem.contains("l1"), "{problem}");
    assert_eq!(resolve(&env.store, "l1").unwrap_err().state(), Some("not_bootable"));
    assert!(info(&env.store, "base").unwrap().bootable, "the base does not use that layer");
    assert!(pack(&env.store, &env.cache, "l1", &env.scratch.join("p.tar.zst")).is_err());
}
