//! Damaged packs: flipped bytes, truncation, trailing data, bad checksums.

use super::*;

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
