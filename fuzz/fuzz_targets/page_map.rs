//! `memory.map` (`PageMap`): a chunked snapshot's guest memory as extents of chunks.
//!
//! The first input byte picks the mode (`% 2`); the rest is:
//! * 0 — map file bytes (`PageMap::decode`, which `read_file` uses). An accepted map must
//!   re-encode to the same bytes. Maps of at most 1 MiB are then applied
//!   (`apply_page_map`) onto a patterned image with a store holding three known chunks
//!   (`forkvm_fuzz::page_map_chunks`); when that succeeds the image must hold exactly:
//!   the pattern outside the extents, zeros in Zero extents, each chunk's bytes in its.
//! * 1 — memory contents: byte 0 sets the size (1..=48 pages, so up to three 64 KiB
//!   windows) and bit 7 of byte 1 asks for a diff over a parent; then 3-byte records
//!   `(page, offset byte, value)` poke the memory (bit 6 of `page`: the parent instead,
//!   bit 7: both). `build_page_map` must describe it so that `apply_page_map` over an
//!   all-zero image (flat) or over the parent (diff) gives the memory back byte for byte,
//!   and the map must survive `encode`/`decode`.

#![no_main]

use forkvm_fuzz::Bytes;
use forkvm_snapshot::{apply_page_map, build_page_map, ChunkId, ChunkStore, ExtentContent, PageMap};
use libfuzzer_sys::fuzz_target;
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::OnceLock;

const PAGE: usize = 4096;
const MAX_APPLY: u64 = 1 << 20;

fn known_store() -> &'static (ChunkStore, HashMap<ChunkId, Vec<u8>>) {
    static STORE: OnceLock<(ChunkStore, HashMap<ChunkId, Vec<u8>>)> = OnceLock::new();
    STORE.get_or_init(|| {
        let store = ChunkStore::open(&forkvm_fuzz::scratch().join("page-map-store"));
        let mut known = HashMap::new();
        for c in forkvm_fuzz::page_map_chunks() {
            let put = store.put(&c).expect("harness: storing a known chunk");
            known.insert(put.id, c);
        }
        (store, known)
    })
}

fn image(path: &Path, content: &[u8]) -> File {
    let f = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(path).expect("harness: image");
    f.write_all_at(content, 0).expect("harness: image contents");
    f.set_len(content.len() as u64).expect("harness: image length");
    f
}

fn read_all(f: &File, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    f.read_exact_at(&mut out, 0).expect("harness: reading the image back");
    out
}

fn check_decode(bytes: &[u8]) {
    let Ok(map) = PageMap::decode(bytes) else { return };
    assert!(map.encode() == bytes, "an accepted memory.map does not re-encode to its bytes");
    if map.mem_size > MAX_APPLY {
        return;
    }
    let (store, known) = known_store();
    let dir = forkvm_fuzz::fresh_dir("page-map-apply");
    let before: Vec<u8> = (0..map.mem_size as usize).map(|i| (i / PAGE) as u8 ^ 0x5a).collect();
    let target = image(&dir.join("memory.img"), &before);
    if apply_page_map(&map, store, &target).is_err() {
        return;
    }
    let mut expected = before;
    for e in &map.extents {
        let (at, len) = (e.first_page as usize * PAGE, e.pages as usize * PAGE);
        match e.content {
            ExtentContent::Zero => expected[at..at + len].fill(0),
            ExtentContent::Chunk(id) => {
                let chunk = known.get(&id).expect("apply succeeded with a chunk the store lacks");
                expected[at..at + len].copy_from_slice(chunk);
            }
        }
    }
    assert!(read_all(&target, expected.len()) == expected, "apply_page_map wrote the wrong bytes");
}

fn check_build(data: &[u8]) {
    let mut b = Bytes::new(data);
    let pages = 1 + usize::from(b.u8() % 48);
    let diff = b.u8() & 0x80 != 0;
    let mut memory = vec![0u8; pages * PAGE];
    let mut parent = vec![0u8; pages * PAGE];
    while !b.is_empty() {
        let (page, offset, value) = (b.u8(), b.u8(), b.u8());
        let at = usize::from(page & 0x3f) % pages * PAGE + usize::from(offset) * 16;
        if page & 0x40 == 0 || page & 0x80 != 0 {
            memory[at] = value;
        }
        if page & 0x40 != 0 {
            parent[at] = value;
        }
    }
    let dir = forkvm_fuzz::fresh_dir("page-map-build");
    let store = ChunkStore::open(&dir.join("store"));
    let mem_file = image(&dir.join("memory.img"), &memory);
    let parent_file = diff.then(|| image(&dir.join("parent.img"), &parent));
    let (map, _) = build_page_map(&mem_file, parent_file.as_ref(), memory.len() as u64, &store)
        .expect("build_page_map of a well-formed image fails");
    assert_eq!(PageMap::decode(&map.encode()).expect("a built map must decode"), map, "built map round trip");
    let base = if diff { parent } else { vec![0u8; memory.len()] };
    let target = image(&dir.join("target.img"), &base);
    apply_page_map(&map, &store, &target).expect("applying a freshly built map fails");
    assert!(read_all(&target, memory.len()) == memory, "build then apply does not give the memory back");
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    match mode % 2 {
        0 => check_decode(rest),
        _ => check_build(rest),
    }
});
