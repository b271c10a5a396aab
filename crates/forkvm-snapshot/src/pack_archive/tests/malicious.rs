//! Malicious packs: unsafe names, non-regular entries, extension headers, manifest lies, limits.

use super::*;

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
        with(&|v| v["version"] = (PACK_VERSION + 1).into()),
        with(&|v| v["version"] = (PACK_VERSION - 1).into()),
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

#[test]
fn a_manifest_that_lies_is_refused_before_any_byte_is_written() {
    // The first entries are fine; the manifest lies about the last one's content.
    let mut tar = RawTar::default();
    tar.file("a", &[1u8; 100_000]).file("dir/b", &[2u8; 5000]);
    let mut entries: Vec<PackEntry> = tar.listed.iter().map(|(n, d)| entry_for(n, d)).collect();
    entries[1].blake3 = blake3::hash(b"something else").to_hex().to_string();
    tar.manifest_of(entries).end();
    refuse(&tar, |e| matches!(e, PackError::HashMismatch { name, .. } if name == "dir/b"));
    // ... and about a size.
    let mut tar = RawTar::default();
    tar.file("a", &[1u8; 100_000]).file("b", b"x");
    let mut entries: Vec<PackEntry> = tar.listed.iter().map(|(n, d)| entry_for(n, d)).collect();
    entries[1].size = 1 << 40;
    tar.manifest_of(entries).end();
    refuse(&tar, |e| matches!(e, PackError::SizeMismatch { name, .. } if name == "b"));
}

#[test]
fn a_pack_larger_than_the_free_space_is_refused_before_any_byte_is_written() {
    let root = tempfile::tempdir().unwrap();
    let err = super::super::reader::check_free_space(root.path(), u64::MAX / 2).unwrap_err();
    assert!(matches!(err, PackError::NoSpace { .. }), "{err:?}");
    assert!(err.to_string().contains("nothing was written"), "{err}");
    super::super::reader::check_free_space(root.path(), 4096).unwrap();
}
