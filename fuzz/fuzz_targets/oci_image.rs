//! OCI images on arbitrary bytes: what `forkvm template from-oci` reads from a user's
//! image archive, and what the confined unpack applies as a layer.
//!
//! The first input byte picks the mode; the rest (at most 64 KiB) is the input:
//! * even — the rest is a layer (tar, or gzip/zstd as it sniffs), applied onto
//!   `<fence>/root`, twice (a second layer over the first: whiteouts and opaque markers
//!   then find something to remove). Afterwards nothing but `root/` exists in the fence
//!   and the process's scratch directory holds only the fence, whether the apply
//!   succeeded or not: no entry, link or hard link reaches outside the root.
//! * odd — the rest is an image archive (OCI or `docker save`), imported into a store
//!   under the fence; afterwards the store holds only `blobs/sha256/<hex>` files whose
//!   bytes hash to their names.

#![no_main]

use forkvm_fuzz::{scratch, walk};
use forkvm_image::oci::{apply_layer, import, BlobStore, Digest};
use libfuzzer_sys::fuzz_target;
use std::path::PathBuf;

const MAX_INPUT: usize = 64 << 10;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    if rest.len() > MAX_INPUT {
        return;
    }
    let fence = forkvm_fuzz::fresh_dir("oci");
    if mode % 2 == 0 {
        let root = fence.join("root");
        std::fs::create_dir(&root).expect("harness: root");
        let dir = std::fs::File::open(&root).expect("harness: opening root");
        let mut budget = 16 << 20;
        let _ = apply_layer(&dir, rest, &mut budget);
        let _ = apply_layer(&dir, rest, &mut budget);
        let outside: Vec<PathBuf> = walk(&fence).into_iter().filter(|p| !p.starts_with("root")).collect();
        assert_eq!(outside, Vec::<PathBuf>::new(), "a layer wrote outside its root");
    } else {
        let archive = fence.join("image.tar");
        std::fs::write(&archive, rest).expect("harness: writing the archive");
        let store = BlobStore::new(fence.join("store"));
        let _ = import(&archive, &store);
        for p in walk(&fence.join("store")) {
            let path = fence.join("store").join(&p);
            if std::fs::symlink_metadata(&path).expect("stat").is_dir() {
                continue;
            }
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            assert!(p.starts_with("blobs/sha256"), "the store holds {}", p.display());
            let bytes = std::fs::read(&path).expect("reading a blob");
            assert_eq!(Digest::of(&bytes).hex(), name, "blob {} does not hash to its name", p.display());
        }
    }
    let names: Vec<_> = std::fs::read_dir(scratch()).expect("scratch").flatten().map(|e| e.file_name()).collect();
    assert_eq!(names, ["oci"], "the harness's scratch directory holds more than the fence");
});
