//! `extract_pack` on arbitrary bytes: the untrusted `.tar.zst` a snapshot pack arrives as.
//!
//! The first input byte is flags; the rest (at most 64 KiB) is the pack:
//! * bit 0 clear — the rest is the pack file as is (zstd magic, frame checksum, ...);
//!   set — the rest is a tar stream, which the harness compresses into a checksummed zstd
//!   frame first, so the fuzzer spends its time on tar headers and the manifest rather
//!   than on the checksum.
//! * bit 1 — names must also pass the chain's grammar (`chunks/<hex>`, `disks/<n>`,
//!   `layers/<n>/{data,bitmap}`, `snapshots/<tag>/<file>`) instead of any safe name.
//!
//! Each run extracts into `<fence>/staging` with the pack at `<fence>/pack.tar.zst`, under
//! small limits (64 entries, 4 MiB each, 8 MiB in all), and then asserts:
//! * nothing but the pack and `staging/` exists in the fence, nor anything else in this
//!   process's scratch directory, and `staging/` holds only directories and regular
//!   files (no links) — whether the extraction succeeded or not;
//! * on success, `staging/` holds exactly the manifest's entries (and their parent
//!   directories), each with the listed size and BLAKE3.

#![no_main]

use forkvm_fuzz::{scratch, walk};
use forkvm_snapshot::{extract_pack, validate_tag, ChunkId, PackLimits};
use libfuzzer_sys::fuzz_target;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const MAX_INPUT: usize = 64 << 10;

fn chain_name(name: &str) -> bool {
    let index = |n: &str| !n.is_empty() && n.len() <= 6 && n.bytes().all(|b| b.is_ascii_digit());
    let parts: Vec<&str> = name.split('/').collect();
    match parts.as_slice() {
        ["chunks", hex] => ChunkId::from_hex(hex).is_ok(),
        ["disks", n] => index(n),
        ["layers", n, file] => index(n) && ["data", "bitmap"].contains(file),
        ["snapshots", tag, file] => {
            validate_tag(tag).is_ok() && ["snapshot.json", "vmstate.bin", "memory.map"].contains(file)
        }
        _ => false,
    }
}

fn compress(tar: &[u8]) -> Vec<u8> {
    let mut enc = zstd::Encoder::new(Vec::new(), 1).expect("harness: zstd");
    enc.include_checksum(true).expect("harness: zstd checksum");
    std::io::Write::write_all(&mut enc, tar).expect("harness: compressing");
    enc.finish().expect("harness: zstd finish")
}

fn fence_contents(fence: &Path) -> Vec<PathBuf> {
    walk(fence).into_iter().filter(|p| !p.starts_with("staging")).collect()
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else { return };
    if rest.len() > MAX_INPUT {
        return;
    }
    let fence = forkvm_fuzz::fresh_dir("pack");
    let pack = fence.join("pack.tar.zst");
    let staging = fence.join("staging");
    std::fs::create_dir(&staging).expect("harness: staging");
    let bytes = if flags & 1 != 0 { compress(rest) } else { rest.to_vec() };
    std::fs::write(&pack, &bytes).expect("harness: writing the pack");
    let limits =
        PackLimits { max_entries: 64, max_entry_bytes: 4 << 20, max_total_bytes: 8 << 20, max_manifest_bytes: 1 << 20 };
    let strict = flags & 2 != 0;
    let accept = move |name: &str| !strict || chain_name(name);
    let result = extract_pack(&pack, &staging, &accept, &limits);

    // Nothing outside staging, whatever happened.
    assert_eq!(fence_contents(&fence), [PathBuf::from("pack.tar.zst")], "extraction wrote outside staging");
    let names: Vec<_> = std::fs::read_dir(scratch()).expect("scratch").flatten().map(|e| e.file_name()).collect();
    assert_eq!(names, ["pack"], "extraction wrote into the scratch directory");
    let staged = walk(&staging);
    for p in &staged {
        let meta = std::fs::symlink_metadata(staging.join(p)).expect("stat staged path");
        assert!(meta.is_dir() || meta.is_file(), "staged {} is neither a file nor a directory", p.display());
        if meta.is_file() {
            use std::os::unix::fs::MetadataExt;
            assert_eq!(meta.nlink(), 1, "staged {} is hard-linked", p.display());
        }
    }

    let Ok(manifest) = result else { return };
    let mut expected = BTreeSet::new();
    for e in &manifest.entries {
        let path = staging.join(&e.name);
        let content = std::fs::read(&path).expect("a listed entry is staged");
        assert_eq!(content.len() as u64, e.size, "entry {:?} size", e.name);
        assert_eq!(blake3::hash(&content).to_hex().as_str(), e.blake3, "entry {:?} hash", e.name);
        let mut p = PathBuf::from(&e.name);
        expected.insert(p.clone());
        while p.pop() && !p.as_os_str().is_empty() {
            expected.insert(p.clone());
        }
    }
    assert_eq!(staged.into_iter().collect::<BTreeSet<_>>(), expected, "staging holds more than the manifest lists");
});
