//! Tests of the pack container: shared helpers and hand-built tar streams, writer and round-trip tests here;
//! damaged packs in [`damaged`], malicious packs in [`malicious`].

use super::writer::entry_header;
use super::*;
use std::fs::{self, File};
use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt};

mod damaged;
mod malicious;

const MIB: usize = 1 << 20;

fn accept_all(_: &str) -> bool {
    true
}

/// Small deterministic PRNG (xorshift64*), so tests need no extra crates.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

/// `len` bytes, mostly zeros, with a random-ish 4 KiB block every 64 KiB and a random 100 KiB run.
fn mostly_zeros(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = XorShift(seed);
    let mut data = vec![0u8; len];
    for off in (0..len).step_by(64 << 10) {
        let end = (off + 4096).min(len);
        rng.fill(&mut data[off..end]);
    }
    let start = len / 3;
    let end = (start + (100 << 10)).min(len);
    rng.fill(&mut data[start..end]);
    data
}

fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut data = vec![0u8; len];
    XorShift(seed).fill(&mut data);
    data
}

/// Everything under `root` except what lies inside `root/staging`, sorted, relative to `root`.
fn outside_staging(root: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let rel = path.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            if rel == "staging" {
                out.push(rel);
                continue;
            }
            out.push(rel);
            if fs::symlink_metadata(&path).unwrap().is_dir() {
                walk(root, &path, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out.sort();
    out
}

/// Extracts `pack` into a fresh `root/staging`.
fn extract(root: &Path, pack: &Path, limits: &PackLimits) -> Result<PackManifest, PackError> {
    let staging = root.join("staging");
    if staging.exists() {
        fs::remove_dir_all(&staging).unwrap();
    }
    fs::create_dir(&staging).unwrap();
    extract_pack(pack, &staging, &accept_all, limits)
}

// ---------------------------------------------------------------------------------------------------------
// Hand-built tar streams
// ---------------------------------------------------------------------------------------------------------

/// A raw tar stream built member by member, bypassing every check `tar::Builder` makes.
#[derive(Default)]
struct RawTar {
    bytes: Vec<u8>,
    /// (name, data) of regular members, for building a matching manifest.
    listed: Vec<(String, Vec<u8>)>,
}

impl RawTar {
    /// Appends a member whose name bytes are written straight into the header's 100-byte name field.
    fn member(&mut self, name: &[u8], kind: u8, data: &[u8]) -> &mut Self {
        let mut header = tar::Header::new_ustar();
        header.as_old_mut().name[..name.len()].copy_from_slice(name);
        self.push(header, kind, data)
    }

    /// Appends a member whose name is split between the ustar prefix and name fields.
    fn prefixed(&mut self, prefix: &[u8], name: &[u8], data: &[u8]) -> &mut Self {
        let mut header = tar::Header::new_ustar();
        let ustar = header.as_ustar_mut().unwrap();
        ustar.prefix[..prefix.len()].copy_from_slice(prefix);
        ustar.name[..name.len()].copy_from_slice(name);
        self.push(header, b'0', data)
    }

    fn push(&mut self, mut header: tar::Header, kind: u8, data: &[u8]) -> &mut Self {
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(0);
        header.set_entry_type(tar::EntryType::new(kind));
        if matches!(kind, b'1' | b'2') {
            header.set_link_name_literal(b"/etc/passwd").unwrap();
        }
        header.set_cksum();
        self.raw_member(&header, data)
    }

    fn raw_member(&mut self, header: &tar::Header, data: &[u8]) -> &mut Self {
        self.bytes.extend_from_slice(header.as_bytes());
        self.bytes.extend_from_slice(data);
        self.bytes.resize(self.bytes.len().next_multiple_of(512), 0);
        self
    }

    /// A regular file, remembered for [`RawTar::manifest`].
    fn file(&mut self, name: &str, data: &[u8]) -> &mut Self {
        self.listed.push((name.to_string(), data.to_vec()));
        self.member(name.as_bytes(), b'0', data)
    }

    /// Appends the manifest member listing `entries`.
    fn manifest_of(&mut self, entries: Vec<PackEntry>) -> &mut Self {
        let manifest = PackManifest {
            format: PACK_FORMAT.into(),
            version: PACK_VERSION,
            entries,
            meta: serde_json::json!({"test": true}),
            signature: None,
        };
        let json = serde_json::to_vec(&manifest).unwrap();
        self.member(PACK_MANIFEST.as_bytes(), b'0', &json)
    }

    /// Appends the manifest member listing every [`RawTar::file`] so far.
    fn manifest(&mut self) -> &mut Self {
        let entries = self.listed.iter().map(|(n, d)| entry_for(n, d)).collect();
        self.manifest_of(entries)
    }

    fn end(&mut self) -> &mut Self {
        self.bytes.extend_from_slice(&[0u8; 1024]);
        self
    }
}

fn entry_for(name: &str, data: &[u8]) -> PackEntry {
    PackEntry { name: name.into(), size: data.len() as u64, blake3: blake3::hash(data).to_hex().to_string() }
}

/// zstd-compresses like [`PackWriter`] does: one frame with a content checksum.
fn compress(tar: &[u8]) -> Vec<u8> {
    let mut enc = zstd::Encoder::new(Vec::new(), 3).unwrap();
    enc.include_checksum(true).unwrap();
    enc.write_all(tar).unwrap();
    enc.finish().unwrap()
}

/// Writes `compressed` as a pack, extracts it with `limits` and `accept`, and checks that it fails and that
/// nothing appeared outside the staging directory.
fn refuse_with(
    compressed: &[u8],
    limits: &PackLimits,
    accept: &dyn Fn(&str) -> bool,
    expect: impl Fn(&PackError) -> bool,
) -> PackError {
    let root = tempfile::tempdir().unwrap();
    let pack = root.path().join("pack.tar.zst");
    fs::write(&pack, compressed).unwrap();
    let staging = root.path().join("staging");
    fs::create_dir(&staging).unwrap();
    let err = match extract_pack(&pack, &staging, accept, limits) {
        Ok(m) => panic!("malicious pack accepted: {m:?}"),
        Err(e) => e,
    };
    assert!(expect(&err), "wrong error: {err:?} ({err})");
    assert_eq!(outside_staging(root.path()), ["pack.tar.zst", "staging"], "something written outside staging");
    assert!(!Path::new("/etc/x").exists());
    // The whole pack is checked before anything is written: a refused pack wrote nothing.
    let written: Vec<_> = fs::read_dir(&staging).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(written.is_empty(), "a refused pack wrote {written:?} into staging");
    err
}

fn refuse(tar: &RawTar, expect: impl Fn(&PackError) -> bool) -> PackError {
    refuse_with(&compress(&tar.bytes), &PackLimits::default(), &accept_all, expect)
}

fn unsafe_name(e: &PackError) -> bool {
    matches!(e, PackError::UnsafeName { .. })
}

fn entry_type(e: &PackError) -> bool {
    matches!(e, PackError::EntryType { .. })
}

/// A real pack with enough content to make flips and cuts land in different structures.
fn sample_pack(root: &Path) -> PathBuf {
    let src = root.join("src.img");
    fs::write(&src, mostly_zeros(3 * MIB, 11)).unwrap();
    let pack = root.join("sample.tar.zst");
    let mut w = PackWriter::create(&pack).unwrap();
    w.add_bytes("snapshots/a/snapshot.json", br#"{"tag":"a"}"#).unwrap();
    w.add_bytes("snapshots/a/vmstate.bin", &random_bytes(300_000, 5)).unwrap();
    w.add_file("snapshots/a/memory.img", &src).unwrap();
    w.finish(serde_json::json!({"k": 1})).unwrap();
    fs::remove_file(src).unwrap();
    pack
}

// ---------------------------------------------------------------------------------------------------------
// Writer and round trip
// ---------------------------------------------------------------------------------------------------------

#[test]
fn round_trip_bytes_streamed_file_and_nested_names() {
    let root = tempfile::tempdir().unwrap();
    let mem = mostly_zeros(20 * MIB, 7);
    let mem_path = root.path().join("memory.img");
    fs::write(&mem_path, &mem).unwrap();
    let json = br#"{"tag":"a"}"#.to_vec();
    let vmstate = random_bytes(12345, 3);

    let pack = root.path().join("out.tar.zst");
    let mut w = PackWriter::create(&pack).unwrap();
    w.add_bytes("snapshots/a/snapshot.json", &json).unwrap();
    w.add_bytes("snapshots/a/vmstate.bin", &vmstate).unwrap();
    w.add_file("snapshots/a/memory.img", &mem_path).unwrap();
    w.add_bytes("empty", b"").unwrap();
    let meta = serde_json::json!({"kind": "snapshot", "tags": ["a"]});
    let (bytes, written) = w.finish(meta.clone()).unwrap();
    assert_eq!(bytes, fs::metadata(&pack).unwrap().len());
    assert!(bytes < 4 * MIB as u64, "20 MiB of mostly zeros should compress well, got {bytes}");
    assert_eq!(written.entries.len(), 4);

    let staging = root.path().join("staging");
    fs::create_dir(&staging).unwrap();
    let manifest = extract_pack(&pack, &staging, &accept_all, &PackLimits::default()).unwrap();
    assert_eq!(manifest, written);
    assert_eq!(manifest.meta, meta);
    assert_eq!(manifest.format, PACK_FORMAT);
    assert_eq!(manifest.version, PACK_VERSION);
    let names: Vec<_> = manifest.entries.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["snapshots/a/snapshot.json", "snapshots/a/vmstate.bin", "snapshots/a/memory.img", "empty"]);
    assert_eq!(manifest.entries[2], entry_for("snapshots/a/memory.img", &mem));

    assert_eq!(fs::read(staging.join("snapshots/a/snapshot.json")).unwrap(), json);
    assert_eq!(fs::read(staging.join("snapshots/a/vmstate.bin")).unwrap(), vmstate);
    assert_eq!(fs::read(staging.join("snapshots/a/memory.img")).unwrap(), mem);
    assert_eq!(fs::read(staging.join("empty")).unwrap(), b"");
    // The manifest is returned, not staged.
    assert!(!staging.join(PACK_MANIFEST).exists());
    let mut staged: Vec<_> = fs::read_dir(&staging).unwrap().map(|e| e.unwrap().file_name()).collect();
    staged.sort();
    assert_eq!(staged, ["empty", "snapshots"]);
    // Zero blocks were left as holes.
    let allocated = fs::metadata(staging.join("snapshots/a/memory.img")).unwrap().blocks() * 512;
    assert!(allocated < (mem.len() / 2) as u64, "extracted image not sparse: {allocated} bytes allocated");
}

#[test]
fn streams_a_sparse_file_with_trailing_hole() {
    let root = tempfile::tempdir().unwrap();
    let src = root.path().join("sparse");
    let f = File::create(&src).unwrap();
    f.set_len(64 * MIB as u64).unwrap();
    f.write_all_at(b"middle", 10 * MIB as u64).unwrap();
    drop(f);
    let pack = root.path().join("p.tar.zst");
    let mut w = PackWriter::create(&pack).unwrap();
    w.add_file("img", &src).unwrap();
    w.finish(serde_json::Value::Null).unwrap();
    extract(root.path(), &pack, &PackLimits::default()).unwrap();
    let out = root.path().join("staging/img");
    assert_eq!(fs::metadata(&out).unwrap().len(), 64 * MIB as u64);
    assert_eq!(fs::read(&out).unwrap(), fs::read(&src).unwrap());
}

#[test]
fn pack_appears_only_after_finish() {
    let root = tempfile::tempdir().unwrap();
    let out = root.path().join("x.tar.zst");
    let partial = root.path().join("x.tar.zst.partial");
    let mut w = PackWriter::create(&out).unwrap();
    assert!(partial.exists());
    assert!(!out.exists());
    w.add_bytes("a", b"hello").unwrap();
    assert!(!out.exists());
    w.finish(serde_json::json!({})).unwrap();
    assert!(out.exists());
    assert!(!partial.exists());
    assert_eq!(outside_staging(root.path()), ["x.tar.zst"]);
}

#[test]
fn create_refuses_existing_output_or_partial() {
    let root = tempfile::tempdir().unwrap();
    let out = root.path().join("x.tar.zst");
    fs::write(&out, b"keep me").unwrap();
    assert!(matches!(PackWriter::create(&out), Err(PackError::Exists(p)) if p == out));
    assert_eq!(fs::read(&out).unwrap(), b"keep me");
    assert!(!root.path().join("x.tar.zst.partial").exists());

    let out2 = root.path().join("y.tar.zst");
    let _busy = PackWriter::create(&out2).unwrap();
    let err = PackWriter::create(&out2).unwrap_err();
    assert!(matches!(&err, PackError::Exists(p) if p.ends_with("y.tar.zst.partial")), "{err:?}");
}

#[test]
fn finish_refuses_output_that_appeared_meanwhile() {
    let root = tempfile::tempdir().unwrap();
    let out = root.path().join("x.tar.zst");
    let mut w = PackWriter::create(&out).unwrap();
    w.add_bytes("a", b"1").unwrap();
    fs::write(&out, b"someone else").unwrap();
    assert!(matches!(w.finish(serde_json::Value::Null), Err(PackError::Exists(_))));
    assert_eq!(fs::read(&out).unwrap(), b"someone else");
    assert!(!root.path().join("x.tar.zst.partial").exists());
}

#[test]
fn dropping_unfinished_writer_leaves_nothing() {
    let root = tempfile::tempdir().unwrap();
    let out = root.path().join("x.tar.zst");
    let mut w = PackWriter::create(&out).unwrap();
    w.add_bytes("a", &random_bytes(100_000, 1)).unwrap();
    drop(w);
    assert_eq!(outside_staging(root.path()), Vec::<String>::new());
}

#[test]
fn writer_refuses_bad_names() {
    let root = tempfile::tempdir().unwrap();
    let mut w = PackWriter::create(&root.path().join("x.tar.zst")).unwrap();
    for bad in ["", "/abs", "../x", "a/../b", "a//b", "a/", "./a", "a\\b", "nul\0", PACK_MANIFEST] {
        assert!(matches!(w.add_bytes(bad, b"x"), Err(PackError::UnsafeName { .. })), "{bad:?} accepted");
    }
    let long_component = "x".repeat(150);
    assert!(matches!(w.add_bytes(&long_component, b"x"), Err(PackError::UnsafeName { .. })));
    assert!(matches!(w.add_bytes(&"a/".repeat(128), b"x"), Err(PackError::UnsafeName { .. })));
    w.add_bytes("ok", b"x").unwrap();
    assert!(matches!(w.add_bytes("ok", b"y"), Err(PackError::Duplicate(n)) if n == "ok"));
    let missing = root.path().join("does-not-exist");
    assert!(matches!(w.add_file("f", &missing), Err(PackError::Io { .. })));
    assert!(matches!(w.add_file("d", root.path()), Err(PackError::Io { .. })));
    // Name errors leave the writer usable.
    w.add_bytes("ok2", b"z").unwrap();
    let (_, m) = w.finish(serde_json::Value::Null).unwrap();
    assert_eq!(m.entries.len(), 2);
}

#[test]
fn long_names_round_trip_via_ustar_prefix() {
    let root = tempfile::tempdir().unwrap();
    let name = format!("{}/{}/{}", "d".repeat(90), "e".repeat(60), "f".repeat(48));
    assert_eq!(name.len(), 200);
    let pack = root.path().join("p.tar.zst");
    let mut w = PackWriter::create(&pack).unwrap();
    w.add_bytes(&name, b"deep").unwrap();
    w.finish(serde_json::Value::Null).unwrap();
    let m = extract(root.path(), &pack, &PackLimits::default()).unwrap();
    assert_eq!(m.entries[0].name, name);
    assert_eq!(fs::read(root.path().join("staging").join(&name)).unwrap(), b"deep");
}

#[test]
fn sizes_over_8_gib_use_the_binary_size_field() {
    let header = entry_header("memory.img", 9 << 30).unwrap();
    assert_eq!(header.entry_size().unwrap(), 9 << 30);
}

/// Release-mode throughput of a 200 MiB round trip: `cargo test --release -p forkvm-snapshot --lib
/// pack_archive::tests::throughput -- --ignored --nocapture`.
#[test]
#[ignore]
fn throughput_200_mib_round_trip() {
    let root = tempfile::tempdir().unwrap();
    let src = root.path().join("src.img");
    // Half random (incompressible), half mostly zeros, like a lightly used guest.
    let mut data = random_bytes(100 * MIB, 9);
    data.extend_from_slice(&mostly_zeros(100 * MIB, 10));
    fs::write(&src, &data).unwrap();
    drop(data);
    let pack = root.path().join("p.tar.zst");
    let t = std::time::Instant::now();
    let mut w = PackWriter::create(&pack).unwrap();
    w.add_file("memory.img", &src).unwrap();
    let (bytes, _) = w.finish(serde_json::Value::Null).unwrap();
    let write = t.elapsed();
    let t = std::time::Instant::now();
    extract(root.path(), &pack, &PackLimits::default()).unwrap();
    let read = t.elapsed();
    let mib = 200.0;
    println!(
        "200 MiB -> {:.1} MiB packed; write {:.2}s ({:.0} MiB/s), extract {:.2}s ({:.0} MiB/s)",
        bytes as f64 / MIB as f64,
        write.as_secs_f64(),
        mib / write.as_secs_f64(),
        read.as_secs_f64(),
        mib / read.as_secs_f64()
    );
}
