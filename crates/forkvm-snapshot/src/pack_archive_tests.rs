use super::*;
use std::os::unix::fs::MetadataExt;

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

// ---------------------------------------------------------------------------------------------------------
// Damaged packs
// ---------------------------------------------------------------------------------------------------------

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

#[test]
fn single_byte_flips_are_detected() {
    let root = tempfile::tempdir().unwrap();
    let pack = sample_pack(root.path());
    let good = fs::read(&pack).unwrap();
    extract(root.path(), &pack, &PackLimits::default()).unwrap();
    let damaged = root.path().join("damaged.tar.zst");
    for i in 0..20 {
        let pos = good.len() * (1 + 2 * i) / 40;
        let mut bytes = good.clone();
        bytes[pos] ^= 0x5A;
        fs::write(&damaged, &bytes).unwrap();
        let err = extract(root.path(), &damaged, &PackLimits::default());
        assert!(err.is_err(), "flip at {pos} of {} not detected", good.len());
    }
    // Edge positions too: the frame header and the trailing checksum.
    for pos in [0, 4, good.len() - 1] {
        let mut bytes = good.clone();
        bytes[pos] ^= 0x5A;
        fs::write(&damaged, &bytes).unwrap();
        assert!(extract(root.path(), &damaged, &PackLimits::default()).is_err(), "flip at {pos}");
    }
}

#[test]
fn truncated_packs_are_detected() {
    let root = tempfile::tempdir().unwrap();
    let pack = sample_pack(root.path());
    let good = fs::read(&pack).unwrap();
    let cut = root.path().join("cut.tar.zst");
    let len = good.len();
    for keep in [0, 3, 5, 100, len / 10, len / 3, len / 2, 2 * len / 3, len - 100, len - 4, len - 1] {
        fs::write(&cut, &good[..keep]).unwrap();
        match extract(root.path(), &cut, &PackLimits::default()) {
            Err(PackError::Truncated(_) | PackError::Corrupt(_)) => {}
            other => panic!("cut at {keep} of {len}: {other:?}"),
        }
    }
    // A cut zstd frame specifically reports truncation.
    fs::write(&cut, &good[..len / 2]).unwrap();
    assert!(matches!(extract(root.path(), &cut, &PackLimits::default()), Err(PackError::Truncated(_))));
}

#[test]
fn truncated_tar_inside_a_complete_frame_is_detected() {
    let mut tar = RawTar::default();
    tar.file("a", &random_bytes(3000, 1)).file("b/c", b"hello").manifest().end();
    let full = tar.bytes.clone();
    let manifest_end = full.len() - 1024;
    // No end marker at all, half an end marker, cut inside a header, inside data, at a member boundary.
    for keep in [manifest_end, manifest_end + 512, 100, 512 + 1000, 512 + 3072, 512 + 3072 + 512 + 10, 700] {
        let err = refuse_with(&compress(&full[..keep]), &PackLimits::default(), &accept_all, |_| true);
        assert!(
            matches!(err, PackError::Truncated(_)) || (keep < manifest_end && matches!(err, PackError::Manifest(_))),
            "cut at {keep}: {err:?}"
        );
    }
    let err = refuse_with(&compress(&full[..manifest_end]), &PackLimits::default(), &accept_all, |_| true);
    assert!(matches!(err, PackError::Truncated(m) if m.contains("end-of-archive")));
    // Sanity: the uncut stream is accepted.
    let root = tempfile::tempdir().unwrap();
    let pack = root.path().join("ok.tar.zst");
    fs::write(&pack, compress(&full)).unwrap();
    extract(root.path(), &pack, &PackLimits::default()).unwrap();
}

#[test]
fn trailing_data_is_refused() {
    let mut tar = RawTar::default();
    tar.file("a", b"x").manifest().end();
    let mut with_junk = tar.bytes.clone();
    with_junk.extend_from_slice(b"junk");
    refuse_with(&compress(&with_junk), &PackLimits::default(), &accept_all, |e| matches!(e, PackError::Corrupt(_)));

    let mut after_frame = compress(&tar.bytes);
    after_frame.extend_from_slice(&compress(b"more"));
    refuse_with(&after_frame, &PackLimits::default(), &accept_all, |e| matches!(e, PackError::Corrupt(_)));

    // Extra zero padding (as GNU tar writes) is fine.
    let mut padded = tar.bytes.clone();
    padded.resize(10240, 0);
    let root = tempfile::tempdir().unwrap();
    let pack = root.path().join("ok.tar.zst");
    fs::write(&pack, compress(&padded)).unwrap();
    extract(root.path(), &pack, &PackLimits::default()).unwrap();
}

#[test]
fn frames_without_checksum_and_non_zstd_are_refused() {
    let mut tar = RawTar::default();
    tar.file("a", b"x").manifest().end();
    let no_checksum = zstd::encode_all(&tar.bytes[..], 3).unwrap();
    refuse_with(&no_checksum, &PackLimits::default(), &accept_all, |e| matches!(e, PackError::Corrupt(_)));
    refuse_with(&tar.bytes, &PackLimits::default(), &accept_all, |e| matches!(e, PackError::Corrupt(_)));
    refuse_with(b"", &PackLimits::default(), &accept_all, |e| matches!(e, PackError::Truncated(_)));
}

#[test]
fn bad_tar_header_checksum_is_refused() {
    let mut tar = RawTar::default();
    tar.file("a", b"x").manifest().end();
    tar.bytes[20] ^= 1; // inside the first header's name field
    refuse(&tar, |e| matches!(e, PackError::Corrupt(_)));
}

// ---------------------------------------------------------------------------------------------------------
// Malicious packs
// ---------------------------------------------------------------------------------------------------------

#[test]
fn unsafe_names_are_refused() {
    let root_abs = tempfile::tempdir().unwrap();
    let abs_into_tmp = format!("{}/evil", root_abs.path().display());
    let names: Vec<&[u8]> = vec![
        b"/etc/x",
        abs_into_tmp.as_bytes(),
        b"../x",
        b"a/../../x",
        b"a//b",
        b"./a",
        b"a/.",
        b"a/",
        b"a\\..\\x",
        b"\xff\xfe",
    ];
    for name in names {
        let mut tar = RawTar::default();
        tar.member(name, b'0', b"payload");
        tar.listed.push((String::from_utf8_lossy(name).into_owned(), b"payload".to_vec()));
        tar.manifest().end();
        let err = refuse(&tar, unsafe_name);
        assert!(err.to_string().contains("name refused"), "{err}");
    }
    assert!(!root_abs.path().join("evil").exists());
}

#[test]
fn unsafe_long_names_via_ustar_prefix_are_refused() {
    // A 200-byte name whose prefix climbs out of staging.
    let prefix = format!("../../{}", "p".repeat(100));
    let mut tar = RawTar::default();
    tar.prefixed(prefix.as_bytes(), "n".repeat(93).as_bytes(), b"x").manifest().end();
    refuse(&tar, unsafe_name);
    // Absolute prefix.
    let mut tar = RawTar::default();
    tar.prefixed(b"/tmp", b"x", b"x").manifest().end();
    refuse(&tar, unsafe_name);
}

#[test]
fn gnu_long_name_and_pax_headers_are_refused() {
    // tar::Builder writes a GNU long-name ('L') member for a 200-byte name.
    let long = format!("{}/{}", "a".repeat(100), "b".repeat(99));
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(1);
    header.set_mode(0o644);
    builder.append_data(&mut header, &long, &b"x"[..]).unwrap();
    let mut tar = RawTar { bytes: builder.into_inner().unwrap(), listed: vec![(long.clone(), b"x".to_vec())] };
    assert_eq!(tar.bytes[156], b'L', "expected tar::Builder to emit a GNU long-name header");
    tar.manifest().end();
    let err = refuse(&tar, entry_type);
    assert!(err.to_string().contains("GNULongName"), "{err}");

    // Same with a '..'-laden long name: still refused, never interpreted.
    let evil = format!("{}/../../../../x", "a".repeat(100));
    let mut tar = RawTar::default();
    tar.member(b"././@LongLink", b'L', format!("{evil}\0").as_bytes()).member(b"short", b'0', b"x").manifest().end();
    refuse(&tar, entry_type);

    // PAX extended header overriding the path, and a PAX global header.
    let record = |k: &str, v: &str| {
        let body = format!(" {k}={v}\n");
        let mut len = body.len() + 2;
        if format!("{len}{body}").len() != len {
            len += 1;
        }
        format!("{len}{body}")
    };
    let pax = record("path", "../../etc/x");
    let mut tar = RawTar::default();
    tar.member(b"PaxHeaders/x", b'x', pax.as_bytes()).file("x", b"x").manifest().end();
    refuse(&tar, entry_type);
    let mut tar = RawTar::default();
    tar.member(b"pax_global_header", b'g', pax.as_bytes()).file("x", b"x").manifest().end();
    refuse(&tar, entry_type);
}

#[test]
fn non_regular_entry_types_are_refused() {
    for (kind, what) in [
        (b'2', "Symlink"),
        (b'1', "Link"),
        (b'3', "Char"),
        (b'4', "Block"),
        (b'5', "Directory"),
        (b'6', "Fifo"),
        (b'7', "Continuous"),
        (b'S', "GNUSparse"),
        (b'V', "unknown"),
    ] {
        let mut tar = RawTar::default();
        tar.file("before", b"ok").member(b"node", kind, b"").manifest().end();
        let err = refuse(&tar, entry_type);
        assert!(err.to_string().contains(what), "{err}");
        assert!(err.to_string().contains("\"node\""), "{err}");
    }
}

#[test]
fn old_style_nul_type_regular_file_is_accepted() {
    let mut tar = RawTar::default();
    tar.member(b"old", 0, b"v7 file");
    tar.listed.push(("old".into(), b"v7 file".to_vec()));
    tar.manifest().end();
    let root = tempfile::tempdir().unwrap();
    let pack = root.path().join("p.tar.zst");
    fs::write(&pack, compress(&tar.bytes)).unwrap();
    extract(root.path(), &pack, &PackLimits::default()).unwrap();
    assert_eq!(fs::read(root.path().join("staging/old")).unwrap(), b"v7 file");
}

#[test]
fn duplicates_and_file_directory_conflicts_are_refused() {
    let mut tar = RawTar::default();
    tar.file("a/b", b"1").file("a/b", b"2").manifest().end();
    refuse(&tar, |e| matches!(e, PackError::Duplicate(n) if n == "a/b"));

    let mut tar = RawTar::default();
    tar.file("a", b"1").file("a/b", b"2").manifest().end();
    refuse(&tar, unsafe_name);

    let mut tar = RawTar::default();
    tar.file("a/b", b"1").file("a", b"2").manifest().end();
    refuse(&tar, unsafe_name);
}

#[test]
fn manifest_problems_are_refused() {
    // Entry not in the manifest.
    let mut tar = RawTar::default();
    tar.file("a", b"1").manifest_of(vec![]).end();
    refuse(&tar, |e| matches!(e, PackError::Unlisted(n) if n == "a"));

    // Unlisted entry in the middle: reported as unlisted, not as an ordering problem.
    let mut tar = RawTar::default();
    tar.file("a", b"1").file("x", b"2").file("b", b"3");
    tar.manifest_of(vec![entry_for("a", b"1"), entry_for("b", b"3")]).end();
    refuse(&tar, |e| matches!(e, PackError::Unlisted(n) if n == "x"));

    // No manifest.
    let mut tar = RawTar::default();
    tar.file("a", b"1").end();
    refuse(&tar, |e| matches!(e, PackError::Manifest(_)));

    // Manifest not last.
    let mut tar = RawTar::default();
    tar.file("a", b"1").manifest().file("b", b"2").end();
    refuse(&tar, |e| matches!(e, PackError::Manifest(m) if m.contains("\"b\"")));

    // Manifest twice.
    let mut tar = RawTar::default();
    tar.file("a", b"1").manifest().manifest().end();
    refuse(&tar, |e| matches!(e, PackError::Duplicate(n) if n == PACK_MANIFEST));

    // Hash mismatch.
    let mut tar = RawTar::default();
    tar.file("a", b"1").manifest_of(vec![entry_for("a", b"2")]).end();
    refuse(&tar, |e| matches!(e, PackError::HashMismatch { name, .. } if name == "a"));

    // Size mismatch.
    let mut tar = RawTar::default();
    tar.file("a", b"1").manifest_of(vec![entry_for("a", b"12")]).end();
    refuse(&tar, |e| matches!(e, PackError::SizeMismatch { name, expected: 2, actual: 1 } if name == "a"));

    // Listed but absent.
    let mut tar = RawTar::default();
    tar.file("a", b"1").manifest_of(vec![entry_for("a", b"1"), entry_for("gone", b"")]).end();
    refuse(&tar, |e| matches!(e, PackError::Missing(n) if n == "gone"));

    // Listed twice.
    let mut tar = RawTar::default();
    tar.file("a", b"1").manifest_of(vec![entry_for("a", b"1"), entry_for("a", b"1")]).end();
    refuse(&tar, |e| matches!(e, PackError::Manifest(m) if m.contains("more than once")));

    // Order differs from the archive.
    let mut tar = RawTar::default();
    tar.file("a", b"1").file("b", b"2").manifest_of(vec![entry_for("b", b"2"), entry_for("a", b"1")]).end();
    refuse(&tar, |e| matches!(e, PackError::Manifest(m) if m.contains("position")));

    // Uppercase hex is not the canonical form.
    let mut upper = entry_for("a", b"1");
    upper.blake3 = upper.blake3.to_uppercase();
    let mut tar = RawTar::default();
    tar.file("a", b"1").manifest_of(vec![upper]).end();
    refuse(&tar, |e| matches!(e, PackError::Manifest(_)));
}

#[test]
fn malformed_manifest_json_is_refused() {
    let good = serde_json::json!({
        "format": PACK_FORMAT, "version": PACK_VERSION, "meta": null,
        "entries": [{"name": "a", "size": 1, "blake3": blake3::hash(b"1").to_hex().to_string()}],
    });
    let with = |edit: &dyn Fn(&mut serde_json::Value)| {
        let mut v = good.clone();
        edit(&mut v);
        v
    };
    let variants = [
        with(&|v| v["format"] = "tarball".into()),
        with(&|v| v["version"] = 2.into()),
        with(&|v| v["extra"] = 1.into()),
        with(&|v| v["entries"][0]["mode"] = 0o777.into()),
        serde_json::json!("not an object"),
    ];
    for bad in variants {
        let mut tar = RawTar::default();
        tar.file("a", b"1").member(PACK_MANIFEST.as_bytes(), b'0', &serde_json::to_vec(&bad).unwrap()).end();
        refuse(&tar, |e| matches!(e, PackError::Manifest(_)));
    }
    let mut tar = RawTar::default();
    tar.file("a", b"1").member(PACK_MANIFEST.as_bytes(), b'0', b"{not json").end();
    refuse(&tar, |e| matches!(e, PackError::Manifest(_)));
    // Control: the good one passes.
    let mut tar = RawTar::default();
    tar.file("a", b"1").member(PACK_MANIFEST.as_bytes(), b'0', &serde_json::to_vec(&good).unwrap()).end();
    let root = tempfile::tempdir().unwrap();
    let pack = root.path().join("p.tar.zst");
    fs::write(&pack, compress(&tar.bytes)).unwrap();
    extract(root.path(), &pack, &PackLimits::default()).unwrap();
}

#[test]
fn names_rejected_by_the_caller_are_refused() {
    let mut tar = RawTar::default();
    tar.file("snapshots/a/snapshot.json", b"{}").file("evil.sh", b"#!/bin/sh").manifest().end();
    let accept = |n: &str| n.starts_with("snapshots/");
    let err = refuse_with(&compress(&tar.bytes), &PackLimits::default(), &accept, unsafe_name);
    assert!(err.to_string().contains("\"evil.sh\""), "{err}");
}

#[test]
fn limits_are_enforced_while_reading() {
    let limits = PackLimits { max_entries: 2, max_entry_bytes: 1000, max_total_bytes: 1500, max_manifest_bytes: 4096 };

    let mut tar = RawTar::default();
    tar.file("big", &[1u8; 1001]).manifest().end();
    let err = refuse_with(
        &compress(&tar.bytes),
        &limits,
        &accept_all,
        |e| matches!(e, PackError::Limit { name, what, limit: 1000 } if name == "big" && what.contains("entry size")),
    );
    assert!(err.to_string().contains("\"big\""));

    let mut tar = RawTar::default();
    tar.file("a", b"1").file("b", b"2").file("c", b"3").manifest().end();
    refuse_with(
        &compress(&tar.bytes),
        &limits,
        &accept_all,
        |e| matches!(e, PackError::Limit { name, what: "entry count", limit: 2 } if name == "c"),
    );

    let mut tar = RawTar::default();
    tar.file("a", &[1u8; 800]).file("b", &[2u8; 800]).manifest().end();
    refuse_with(
        &compress(&tar.bytes),
        &limits,
        &accept_all,
        |e| matches!(e, PackError::Limit { name, what, .. } if name == "b" && what.contains("total")),
    );

    let small_manifest = PackLimits { max_manifest_bytes: 10, ..limits };
    let mut tar = RawTar::default();
    tar.file("a", b"1").manifest().end();
    refuse_with(
        &compress(&tar.bytes),
        &small_manifest,
        &accept_all,
        |e| matches!(e, PackError::Limit { name, what, .. } if name == PACK_MANIFEST && what.contains("manifest")),
    );

    // A header claiming a huge size is refused before anything is read or allocated.
    let mut header = tar::Header::new_ustar();
    header.set_path("huge").unwrap();
    header.set_size(1 << 50);
    header.set_entry_type(tar::EntryType::Regular);
    header.set_cksum();
    let mut tar = RawTar::default();
    tar.raw_member(&header, b"tiny").end();
    refuse(&tar, |e| matches!(e, PackError::Limit { name, .. } if name == "huge"));

    // Within the limits the same kind of pack is fine.
    let mut tar = RawTar::default();
    tar.file("a", &[1u8; 600]).file("b", &[2u8; 600]).manifest().end();
    let root = tempfile::tempdir().unwrap();
    let pack = root.path().join("p.tar.zst");
    fs::write(&pack, compress(&tar.bytes)).unwrap();
    extract(root.path(), &pack, &limits).unwrap();
}

#[test]
fn staging_must_be_an_empty_directory() {
    let root = tempfile::tempdir().unwrap();
    let pack = sample_pack(root.path());
    let staging = root.path().join("staging");
    fs::create_dir(&staging).unwrap();
    fs::write(staging.join("stale"), b"x").unwrap();
    let err = extract_pack(&pack, &staging, &accept_all, &PackLimits::default()).unwrap_err();
    assert!(matches!(err, PackError::Io { step: "use staging directory", .. }), "{err:?}");
    let missing = root.path().join("missing");
    assert!(matches!(extract_pack(&pack, &missing, &accept_all, &PackLimits::default()), Err(PackError::Io { .. })));
    let link = root.path().join("link");
    std::os::unix::fs::symlink(root.path().join("empty"), &link).unwrap();
    fs::create_dir(root.path().join("empty")).unwrap();
    assert!(matches!(extract_pack(&pack, &link, &accept_all, &PackLimits::default()), Err(PackError::Io { .. })));
}

#[test]
fn error_messages_name_the_entry() {
    let e = PackError::HashMismatch { name: "m.img".into(), expected: "aa".into(), actual: "bb".into() };
    assert!(e.to_string().contains("\"m.img\""));
    let e = PackError::Missing("x/y".into());
    assert!(e.to_string().contains("\"x/y\"") && e.to_string().contains("absent"));
    // Control characters in hostile names are escaped, long names shortened.
    let e = check_name(b"a\n/../b").unwrap_err();
    assert!(e.to_string().contains("a\\n/../b"), "{e}");
    let e = check_name("é".repeat(200).as_bytes()).unwrap_err();
    assert!(e.to_string().len() < 700, "{e}");
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
