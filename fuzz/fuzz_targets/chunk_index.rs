//! The indexes of stored chunks: the snapshot chunk store (`chunks/<2 hex>/<64 hex>`) and
//! the vault (encrypted manifests, pins, prefetch playbooks), all read from directories
//! that may have been copied from elsewhere or tampered with.
//!
//! The first input byte picks the mode (`% 6`); the rest is:
//! * 0 — a chunk name (`ChunkId::from_hex`): an accepted name prints back as itself.
//! * 1 — a chunk file (zstd), stored under the name of its decompressed content when it
//!   has one (else a fixed name) and read with `ChunkStore::get`: what it returns must
//!   hash to the name and respect the 1 MiB cap.
//! * 2 — directory entries, as records `(dir u8, name len u8, name, content len u8,
//!   content)` with `dir % 4`: a chunk fan-out directory, the `chunks/` directory, the
//!   vault's `pins/`, the vault's `snapshots/`. Then the chunk store is listed and
//!   garbage-collected (keeping every other chunk: exactly those must remain), and the
//!   vault's pins (`Vault::pins`, `live_holders`) and snapshots (`Vault::list`) are read.
//! * 3 — a vault manifest file as is (`snapshots/0000000000000001.snap`, `Vault::list`).
//! * 4 — manifest JSON, which the harness seals with the vault's key first (the file
//!   format of `vault/mod.rs`), so the JSON and its validation are reached.
//! * 5 — a prefetch playbook file (`Playbook::decode`): an accepted one re-encodes to
//!   the same bytes.

#![no_main]

use forkvm_fuzz::vault_seal::{seal_manifest, KEY};
use forkvm_fuzz::Bytes;
use forkvm_snapshot::vault::pins::live_holders;
use forkvm_snapshot::vault::{validate_name, Playbook, SandboxKey, Vault};
use forkvm_snapshot::{ChunkId, ChunkStore, MAX_CHUNK_BYTES};
use libfuzzer_sys::fuzz_target;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

const FIRST_SNAP: &str = "0000000000000001.snap";

fn vault() -> &'static Vault {
    static VAULT: OnceLock<Vault> = OnceLock::new();
    VAULT.get_or_init(|| {
        let v =
            Vault::open(&forkvm_fuzz::scratch().join("vault"), SandboxKey::from_bytes(KEY)).expect("harness: vault");
        // The harness's sealing must still match the vault's format, or modes 3-4 would
        // silently stop reaching the JSON.
        let path = v.root().join("snapshots").join(FIRST_SNAP);
        std::fs::write(&path, seal_manifest(br#"{"seq":1,"created_unix_ms":0,"disks":[]}"#, 1)).expect("harness");
        let listed = v.list().expect("harness: the vault refuses the harness's manifest: update seal_manifest");
        assert_eq!(listed.len(), 1);
        std::fs::remove_file(&path).expect("harness");
        v
    })
}

/// Empties the vault's `snapshots/` and `pins/` directories.
fn clear_vault(v: &Vault) {
    for d in ["snapshots", "pins"] {
        let dir = v.root().join(d);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("harness");
    }
}

fn list_vault(v: &Vault) {
    if let Ok(snaps) = v.list() {
        for s in snaps {
            for d in &s.disks {
                assert!(validate_name("disk id", &d.id).is_ok(), "a listed disk id is not a valid name");
            }
        }
    }
}

fn check_chunk_file(bytes: &[u8]) {
    let root = forkvm_fuzz::fresh_dir("chunk-store");
    let store = ChunkStore::open(&root);
    let id = zstd::bulk::decompress(bytes, MAX_CHUNK_BYTES).map_or(ChunkId([0x5a; 32]), |plain| ChunkId::of(&plain));
    let path = store.path_of(&id);
    std::fs::create_dir_all(path.parent().expect("fan-out")).expect("harness");
    std::fs::write(&path, bytes).expect("harness");
    if let Ok(data) = store.get(&id) {
        assert!(data.len() <= MAX_CHUNK_BYTES, "get returned {} bytes", data.len());
        assert_eq!(ChunkId::of(&data), id, "get returned bytes that do not hash to the chunk's name");
    }
}

/// A name the filesystem can hold in one directory.
fn plain(name: &[u8]) -> Option<&str> {
    let name = std::str::from_utf8(name).ok()?;
    let ok = !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\0']);
    ok.then_some(name)
}

fn check_entries(data: &[u8]) {
    let root = forkvm_fuzz::fresh_dir("chunk-store");
    let store = ChunkStore::open(&root);
    let v = vault();
    clear_vault(v);
    let fanout = store.dir().join("ab");
    std::fs::create_dir_all(&fanout).expect("harness");
    let dirs: [PathBuf; 4] = [fanout, store.dir().to_path_buf(), v.root().join("pins"), v.root().join("snapshots")];
    let mut b = Bytes::new(data);
    while !b.is_empty() {
        let dir = &dirs[usize::from(b.u8() % 4)];
        let len = usize::from(b.u8());
        let name = b.take(len);
        let content_len = usize::from(b.u8());
        let content = b.take(content_len);
        let Some(name) = plain(name) else { continue };
        let path = dir.join(name);
        if !path.exists() {
            std::fs::write(&path, content).expect("harness: creating an entry");
        }
    }

    if let Ok(before) = store.list() {
        let live: BTreeSet<ChunkId> = before.iter().step_by(2).copied().collect();
        let _ = store.usage();
        if store.gc(|| Ok(live.iter().copied().collect())).is_ok() {
            let after: BTreeSet<ChunkId> = store.list().expect("list after gc").into_iter().collect();
            assert_eq!(after, live, "gc kept something else than the live set");
        }
    }
    if let Ok(pins) = v.pins() {
        for (_, holder) in pins {
            assert!(validate_name("pin holder", &holder).is_ok(), "listed pin holder {holder:?} is not a valid name");
        }
    }
    if let Ok(holders) = live_holders(v.root()) {
        assert!(holders.iter().all(|h| validate_name("", h).is_ok()));
    }
    list_vault(v);
}

fn check_manifest_file(file: &[u8]) {
    let v = vault();
    clear_vault(v);
    std::fs::write(Path::new(v.root()).join("snapshots").join(FIRST_SNAP), file).expect("harness");
    list_vault(v);
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    match mode % 6 {
        0 => {
            if let Ok(s) = std::str::from_utf8(rest) {
                if let Ok(id) = ChunkId::from_hex(s) {
                    assert_eq!(id.to_hex(), s, "chunk name does not print back as itself");
                }
            }
        }
        1 => check_chunk_file(rest),
        2 => check_entries(rest),
        3 => check_manifest_file(rest),
        4 => check_manifest_file(&seal_manifest(rest, 1)),
        _ => {
            if let Ok(p) = Playbook::decode(rest) {
                assert!(p.encode() == rest, "an accepted playbook does not re-encode to its bytes");
            }
        }
    }
});
