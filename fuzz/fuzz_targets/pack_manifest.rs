//! The two formats inside a pack that are parsed after its hashes check out: the manifest
//! (`forkvm-pack.json`, a `PackManifest`) and sparse entries (`decode_sparse`, which
//! turns `disks/<n>` and `layers/<n>/data` back into sparse files at unpack).
//!
//! The first input byte picks the format (`% 3`); the rest is the file:
//! * 0 — manifest JSON: an accepted manifest must serialise and parse back equal
//!   (its opaque `meta` aside), and its signature is checked (`PackTrust::check`, what
//!   `extract_pack` does). Then the harness signs it (`signature::sign`, as
//!   `PackWriter::finish_signed` does) and writes it as the writer does: what an unpack
//!   parses back from that must verify against the signer's key.
//! * 2 — a pack key file (`read_public_key`, `read_secret_key`; `--trust`, `--sign`).
//! * 1 — a sparse entry, decoded from a scratch file into a new one. An accepted entry
//!   must decode to a file of the logical size holding each extent's bytes at its offset
//!   and zeros elsewhere (checked byte for byte up to 4 MiB, extent by extent beyond).

#![no_main]

use forkvm_snapshot::pack_archive::signature::{generate_key, read_public_key, read_secret_key, sign};
use forkvm_snapshot::pack_archive::{decode_sparse, PackTrust};
use forkvm_snapshot::PackManifest;
use libfuzzer_sys::fuzz_target;
use std::os::unix::fs::FileExt;
use std::sync::OnceLock;

/// Largest decoded file compared byte for byte.
const FULL_COMPARE: u64 = 4 << 20;

fn le_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn check_sparse(entry: &[u8]) {
    let dir = forkvm_fuzz::fresh_dir("sparse");
    let (src, dst) = (dir.join("entry"), dir.join("decoded"));
    std::fs::write(&src, entry).expect("harness: writing the entry");
    let Ok(size) = decode_sparse("disks/0", &src, &dst) else { return };

    // Accepted, so the layout is what the format says: header, table, data in order.
    assert_eq!(le_u64(entry, 16), size, "decoded size is not the header's");
    let count = le_u64(entry, 24) as usize;
    let mut data_at = 32 + 16 * count;
    let mut extents = Vec::with_capacity(count);
    for i in 0..count {
        let (offset, len) = (le_u64(entry, 32 + 16 * i), le_u64(entry, 40 + 16 * i));
        extents.push((offset, &entry[data_at..data_at + len as usize]));
        data_at += len as usize;
    }
    assert_eq!(data_at, entry.len(), "accepted entry has bytes after its data");
    let file = std::fs::File::open(&dst).expect("the decoded file exists");
    assert_eq!(file.metadata().expect("stat").len(), size, "decoded file has the wrong length");
    if size <= FULL_COMPARE {
        let mut expected = vec![0u8; size as usize];
        for &(offset, bytes) in &extents {
            expected[offset as usize..offset as usize + bytes.len()].copy_from_slice(bytes);
        }
        assert!(std::fs::read(&dst).expect("read") == expected, "decoded file differs from its entry");
    } else {
        for &(offset, bytes) in &extents {
            let mut got = vec![0u8; bytes.len()];
            file.read_exact_at(&mut got, offset).expect("read extent");
            assert!(got == bytes, "extent at {offset} decoded wrongly");
        }
    }
}

type Signer = Box<dyn Fn(&mut PackManifest) + Send + Sync>;

/// Signs as `PackWriter::finish_signed` does with the harness's key (a key file written
/// once, as `pack-keygen` does), and the trust in that key only.
fn signer() -> &'static (Signer, PackTrust) {
    static SIGNER: OnceLock<(Signer, PackTrust)> = OnceLock::new();
    SIGNER.get_or_init(|| {
        let secret = forkvm_fuzz::scratch().join("pack.key");
        let public = generate_key(&secret).expect("harness: generating a pack key");
        let key = read_secret_key(&secret).expect("harness: reading the pack key");
        let trust = PackTrust::keys(vec![read_public_key(&public).expect("harness: reading the public key")]);
        (Box::new(move |m: &mut PackManifest| sign(m, &key)), trust)
    })
}

fn check_manifest(json: &[u8]) {
    let Ok(m) = serde_json::from_slice::<PackManifest>(json) else { return };
    let text = serde_json::to_vec(&m).expect("an accepted manifest serialises");
    let back: PackManifest = serde_json::from_slice(&text).expect("a serialised manifest parses");
    // `meta` is opaque JSON whose floats serde_json does not promise to round-trip to
    // the last bit; everything the reader checks must.
    let plain = |m: PackManifest| PackManifest { meta: serde_json::Value::Null, ..m };
    assert_eq!(plain(back), plain(m.clone()), "manifest round trip");
    let _ = PackTrust::any().check(&m);

    let (sign, trust) = signer();
    let mut signed = m;
    sign(&mut signed);
    let written = serde_json::to_vec_pretty(&signed).expect("a signed manifest serialises");
    let read: PackManifest = serde_json::from_slice(&written).expect("a written manifest parses");
    if let Err(e) = trust.check(&read) {
        panic!("a manifest signed and written as PackWriter does fails its own check: {e}");
    }
}

fn check_key_file(text: &[u8]) {
    let path = forkvm_fuzz::fresh_dir("pack-key").join("key");
    std::fs::write(&path, text).expect("harness: key file");
    let _ = read_public_key(&path);
    let _ = read_secret_key(&path);
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    match mode % 3 {
        0 => check_manifest(rest),
        1 => check_sparse(rest),
        _ => check_key_file(rest),
    }
});
