//! The volume store without a VM: a writer's tops (written with the layered-disk
//! engine, as its VMM would) are taken in once it no longer runs; a snapshot shares
//! the layers; names, sizes and removals are checked.

use super::*;
use forkvm_snapshot::LayerStack;

fn store() -> (tempfile::TempDir, Volumes, Registry) {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(tmp.path().join("store"));
    let registry = Registry::open(tmp.path().join("run")).salvaging_into(store.root());
    (tmp, Volumes::of(&store), registry)
}

/// What a writer's VMM leaves: `blocks` 4 KiB blocks of `byte` written to a top in
/// `writers/<id>/top-0` over the volume's layers, flushed, not sealed (a kill).
fn write_as(v: &Volumes, name: &str, id: &str, byte: u8, blocks: u64) {
    let dir = v.root.join(name);
    let m = VolumeMeta::read(&dir, name).unwrap();
    let wdir = dir.join("writers").join(id);
    std::fs::create_dir_all(&wdir).unwrap();
    let mut stack =
        LayerStack::create_lazy(&dir.join(meta::BASE_FILE), &m.layer_dirs(&dir), &wdir.join("top-0")).unwrap();
    for b in 0..blocks {
        stack.write_at(&[byte; 4096], (100 + b) * 4096).unwrap();
    }
    stack.flush().unwrap();
}

fn read_block(v: &Volumes, name: &str, block: u64) -> u8 {
    let dir = v.root.join(name);
    let m = VolumeMeta::read(&dir, name).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let stack =
        LayerStack::create_lazy(&dir.join(meta::BASE_FILE), &m.layer_dirs(&dir), &tmp.path().join("t")).unwrap();
    let mut buf = [0u8; 4096];
    stack.read_at(&mut buf, block * 4096).unwrap();
    buf[0]
}

#[test]
fn a_stopped_writers_tops_are_taken_in_and_a_snapshot_shares_them() {
    let (_tmp, v, registry) = store();
    let made = v.create("data", 16 << 20).unwrap();
    assert_eq!((made.size_bytes, made.layers, made.writer), (16 << 20, 0, None));
    assert!(matches!(v.create("data", 16 << 20), Err(VolumeError::Exists(_))));
    assert!(matches!(v.create("../x", 16 << 20), Err(VolumeError::Name { .. })));
    assert!(matches!(v.create("small", 1 << 20), Err(VolumeError::Size(_))));
    assert!(matches!(v.create("odd", (16 << 20) + 1), Err(VolumeError::Size(_))));
    assert!(matches!(v.get(&registry, "nope"), Err(VolumeError::NotFound(_))));

    // A writer that is gone (no registry row): its top becomes the volume's layer.
    write_as(&v, "data", "aaaa", 0x11, 3);
    let info = v.get(&registry, "data").unwrap();
    assert_eq!((info.layers, info.writer.as_deref()), (1, None));
    assert!(!v.root.join("data/writers/aaaa").exists(), "its directory goes once taken in");
    assert_eq!(read_block(&v, "data", 101), 0x11);

    // A second one stacks on it; an empty writer directory (a spawn that failed) adds nothing.
    write_as(&v, "data", "bbbb", 0x22, 1);
    std::fs::create_dir_all(v.root.join("data/writers/cccc")).unwrap();
    let info = v.get(&registry, "data").unwrap();
    assert_eq!(info.layers, 2);
    assert_eq!((read_block(&v, "data", 100), read_block(&v, "data", 101)), (0x22, 0x11));
    assert_eq!(read_block(&v, "data", 3000), 0, "the base shows through");

    // A snapshot shares the layers; the two diverge.
    let copy = v.snapshot(&registry, "data", "copy").unwrap();
    assert_eq!((copy.layers, copy.snapshot_of.as_deref()), (2, Some("data")));
    write_as(&v, "data", "dddd", 0x33, 1);
    assert_eq!(v.get(&registry, "data").unwrap().layers, 3);
    assert_eq!(read_block(&v, "copy", 100), 0x22);
    assert_eq!(read_block(&v, "data", 100), 0x33);
    assert!(matches!(v.snapshot(&registry, "data", "copy"), Err(VolumeError::Exists(_))));

    let names: Vec<String> = v.list(&registry).unwrap().into_iter().map(|i| i.name).collect();
    assert_eq!(names, ["copy", "data"]);
    v.remove(&registry, "data").unwrap();
    assert_eq!(read_block(&v, "copy", 100), 0x22, "a snapshot outlives its source");
    v.remove(&registry, "copy").unwrap();
    assert!(v.list(&registry).unwrap().is_empty());
    let left: Vec<_> = std::fs::read_dir(&v.root).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_broken_volume_json_is_refused_by_name() {
    let (_tmp, v, registry) = store();
    v.create("data", 16 << 20).unwrap();
    let path = v.root.join("data").join(meta::META_FILE);
    let good = std::fs::read_to_string(&path).unwrap();
    for bad in
        [good.replace("\"layers\": []", "\"layers\": [\"../x\"]"), good.replace("\"data\"", "\"other\""), "{".into()]
    {
        std::fs::write(&path, bad).unwrap();
        assert!(matches!(v.get(&registry, "data"), Err(VolumeError::Meta { .. })));
    }
}

#[test]
fn an_idle_volume_with_many_layers_has_them_merged_into_one() {
    let (_tmp, v, registry) = store();
    v.create("data", 16 << 20).unwrap();
    for i in 0..=MAX_LAYERS as u8 {
        // Each writer writes block 100 + i, and block 99 over and over.
        let dir = v.root.join("data");
        let m = VolumeMeta::read(&dir, "data").unwrap();
        let wdir = dir.join("writers").join(format!("w{i:02}"));
        std::fs::create_dir_all(&wdir).unwrap();
        let base = dir.join(meta::BASE_FILE);
        let mut stack = LayerStack::create_lazy(&base, &m.layer_dirs(&dir), &wdir.join("top-0")).unwrap();
        stack.write_at(&[i + 1; 4096], (100 + u64::from(i)) * 4096).unwrap();
        stack.write_at(&[i + 1; 4096], 99 * 4096).unwrap();
        stack.flush().unwrap();
        drop(stack);
        let info = v.get(&registry, "data").unwrap();
        let expect = if usize::from(i) + 1 > MAX_LAYERS { 1 } else { usize::from(i) + 1 };
        assert_eq!(info.layers, expect, "after writer {i}");
    }
    for i in 0..=MAX_LAYERS as u8 {
        assert_eq!(read_block(&v, "data", 100 + u64::from(i)), i + 1);
    }
    assert_eq!(read_block(&v, "data", 99), MAX_LAYERS as u8 + 1, "the newest copy");
    let dirs = std::fs::read_dir(v.root.join("data/layers")).unwrap().count();
    assert_eq!(dirs, 1, "the merged layers' directories are gone");
    // A writer on the merged layer is taken in on top of it.
    write_as(&v, "data", "after", 0x77, 1);
    assert_eq!(v.get(&registry, "data").unwrap().layers, 2);
    assert_eq!((read_block(&v, "data", 100), read_block(&v, "data", 101)), (0x77, 2));
}
