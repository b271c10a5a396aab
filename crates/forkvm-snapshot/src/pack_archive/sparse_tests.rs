//! Sparse entries: round trips, coalescing under the cap, malformed headers refused.

use super::*;
use std::os::unix::fs::MetadataExt;

const MIB: u64 = 1 << 20;

/// A 64 MiB sparse file with data at three places; returns it and its bytes.
fn sparse_file(dir: &Path) -> (std::path::PathBuf, Vec<u8>) {
    let path = dir.join("disk.img");
    let f = File::create(&path).unwrap();
    f.set_len(64 * MIB).unwrap();
    let mut content = vec![0u8; (64 * MIB) as usize];
    for (at, len, byte) in [(0u64, MIB, 1u8), (20 * MIB + 4096, 3 * 4096, 2), (63 * MIB, MIB, 3)] {
        let data: Vec<u8> = (0..len).map(|i| byte.wrapping_add(i as u8)).collect();
        f.write_all_at(&data, at).unwrap();
        content[at as usize..(at + len) as usize].copy_from_slice(&data);
    }
    f.sync_all().unwrap();
    (path, content)
}

/// Encodes `extents` of `path` into memory.
fn encode(path: &Path, extents: &SparseExtents) -> Vec<u8> {
    let f = File::open(path).unwrap();
    let mut out = Vec::new();
    SparseEncoder::new(&f, extents).read_to_end(&mut out).unwrap();
    assert_eq!(out.len() as u64, extents.encoded_len());
    out
}

fn decode(dir: &Path, bytes: &[u8]) -> Result<(u64, std::path::PathBuf), PackError> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let src = dir.join(format!("entry-{n}"));
    let dst = dir.join(format!("decoded-{n}"));
    std::fs::write(&src, bytes).unwrap();
    decode_sparse("disks/0", &src, &dst).map(|size| (size, dst))
}

#[test]
fn round_trip_keeps_bytes_and_holes() {
    let tmp = tempfile::tempdir().unwrap();
    let (path, content) = sparse_file(tmp.path());
    let extents = SparseExtents::of_file(&File::open(&path).unwrap(), 64 * MIB).unwrap();
    assert!(!extents.extents().is_empty());
    assert!(extents.data_bytes() < 8 * MIB, "SEEK_DATA finds the holes: {:?}", extents.extents());
    let bytes = encode(&path, &extents);
    assert!((bytes.len() as u64) < 8 * MIB);
    let (size, out) = decode(tmp.path(), &bytes).unwrap();
    assert_eq!(size, 64 * MIB);
    assert_eq!(std::fs::read(&out).unwrap(), content);
    let allocated = std::fs::metadata(&out).unwrap().blocks() * 512;
    assert!(allocated < 8 * MIB, "the decoded file is sparse: {allocated} bytes allocated");
}

#[test]
fn empty_and_all_hole_files_round_trip() {
    let tmp = tempfile::tempdir().unwrap();
    for size in [0, 5 * MIB + 7] {
        let path = tmp.path().join(format!("blank-{size}"));
        File::create(&path).unwrap().set_len(size).unwrap();
        let extents = SparseExtents::of_file(&File::open(&path).unwrap(), size).unwrap();
        assert!(extents.extents().is_empty());
        let (got, out) = decode(tmp.path(), &encode(&path, &extents)).unwrap();
        assert_eq!(got, size);
        assert_eq!(std::fs::read(&out).unwrap(), vec![0u8; size as usize]);
    }
}

#[test]
fn push_merges_touching_extents_and_stays_under_the_cap() {
    let mut e = SparseExtents::with_cap(1 << 30, 4);
    e.push(0, 10);
    e.push(10, 10);
    assert_eq!(e.extents(), [(0, 20)]);
    for i in 1..100u64 {
        e.push(i * 4 * MIB, 4096);
    }
    assert!(e.extents().len() <= 4, "{:?}", e.extents());
    // Every pushed byte is still covered.
    for i in 1..100u64 {
        assert!(e.extents().iter().any(|&(o, l)| o <= i * 4 * MIB && i * 4 * MIB + 4096 <= o + l));
    }
    let mut clamped = SparseExtents::new(100);
    clamped.push(90, 50);
    clamped.push(200, 5);
    assert_eq!(clamped.extents(), [(90, 10)]);
}

/// A valid encoding of a 1 MiB file with two extents, to damage.
fn header(size: u64, extents: &[(u64, u64)]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&SPARSE_MAGIC);
    out.extend_from_slice(&SPARSE_VERSION.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&size.to_le_bytes());
    out.extend_from_slice(&(extents.len() as u64).to_le_bytes());
    for &(o, l) in extents {
        out.extend_from_slice(&o.to_le_bytes());
        out.extend_from_slice(&l.to_le_bytes());
    }
    for &(_, l) in extents {
        out.extend(std::iter::repeat_n(0xabu8, l.min(1 << 16) as usize));
    }
    out
}

#[test]
fn malformed_entries_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let good = header(MIB, &[(0, 100), (4096, 100)]);
    let (_, out) = decode(tmp.path(), &good).unwrap();
    assert_eq!(std::fs::read(&out).unwrap()[4096..4196], [0xab; 100]);

    let with = |edit: &dyn Fn(&mut Vec<u8>)| {
        let mut b = good.clone();
        edit(&mut b);
        b
    };
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("short", good[..20].to_vec()),
        ("magic", with(&|b| b[0] ^= 1)),
        ("version", with(&|b| b[8] = 9)),
        ("reserved", with(&|b| b[12] = 1)),
        ("trailing data", with(&|b| b.push(0))),
        (
            "truncated data",
            with(&|b| {
                b.pop();
            }),
        ),
        ("overlapping", header(MIB, &[(0, 5000), (4096, 100)])),
        ("touching", header(MIB, &[(0, 4096), (4096, 100)])),
        ("unsorted", header(MIB, &[(4096, 100), (0, 100)])),
        ("empty extent", header(MIB, &[(0, 0)])),
        ("beyond size", header(MIB, &[(MIB - 10, 100)])),
        ("offset overflow", header(MIB, &[(u64::MAX - 10, 100)])),
        ("size over the cap", header(MAX_SPARSE_SIZE + 1, &[])),
        ("huge count", with(&|b| b[24..32].copy_from_slice(&(MAX_SPARSE_EXTENTS + 1).to_le_bytes()))),
        ("count past the end", with(&|b| b[24..32].copy_from_slice(&1000u64.to_le_bytes()))),
        ("count wraps", with(&|b| b[24..32].copy_from_slice(&u64::MAX.to_le_bytes()))),
    ];
    for (what, bytes) in cases {
        let err = decode(tmp.path(), &bytes).expect_err(what);
        assert!(matches!(err, PackError::Sparse { .. }), "{what}: {err}");
        assert!(err.to_string().contains("disks/0"), "{what}: {err}");
    }
}
