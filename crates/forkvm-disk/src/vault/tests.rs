//! Vault tests (unit tier: no KVM, no root): round trips through real layered disks,
//! incremental uploads, no plaintext at rest, crash points, tampering, retention and
//! the key store.

use super::retain::select;
use super::*;
use crate::layered_disk::{LayerStack, BLOCK_SIZE};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};

const BS: usize = BLOCK_SIZE as usize;
/// 101 blocks, the last one partial (1000 bytes).
const SIZE: usize = 100 * BS + 1000;

use crate::test_rng::Rng;

/// A layered disk with an in-memory model of its content.
struct Disk {
    dir: PathBuf,
    base: PathBuf,
    stack: LayerStack,
    model: Vec<u8>,
    sealed: Vec<PathBuf>,
    tops: u32,
}

impl Disk {
    fn new(dir: &Path, size: usize, seed: u64) -> Disk {
        fs::create_dir_all(dir).unwrap();
        let base = dir.join("base.img");
        let model = Rng(seed).bytes(size);
        fs::write(&base, &model).unwrap();
        let stack = LayerStack::create(&base, &[], &dir.join("top0")).unwrap();
        Disk { dir: dir.to_path_buf(), base, stack, model, sealed: Vec::new(), tops: 0 }
    }

    fn write(&mut self, offset: usize, data: &[u8]) {
        self.stack.write_at(data, offset as u64).unwrap();
        self.model[offset..offset + data.len()].copy_from_slice(data);
    }

    fn random_writes(&mut self, rng: &mut Rng, n: usize) {
        for _ in 0..n {
            let offset = rng.below(self.model.len() as u64 - 1) as usize;
            let len = (1 + rng.below(3 * BS as u64) as usize).min(self.model.len() - offset);
            let data = if rng.below(5) == 0 { vec![0; len] } else { rng.bytes(len) };
            self.write(offset, &data);
        }
    }

    fn seal(&mut self) {
        self.tops += 1;
        let sealed = self.stack.seal(&self.dir.join(format!("top{}", self.tops))).unwrap();
        self.sealed.push(sealed.dir);
    }

    fn input(&self, id: &str) -> DiskInput {
        DiskInput { id: id.to_string(), base_key: "base-v1".to_string(), layers: self.sealed.clone() }
    }
}

struct Fixture {
    tmp: tempfile::TempDir,
    keys: KeyStore,
    vault: Vault,
    restores: u32,
}

impl Fixture {
    fn new() -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        let keys = KeyStore::open(&tmp.path().join("keys")).unwrap();
        let vault = Vault::open(&tmp.path().join("vault"), keys.sandbox_key("sb-1").unwrap()).unwrap();
        Fixture { tmp, keys, vault, restores: 0 }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.tmp.path().join(name)
    }

    /// Restores `disk` of `seq` and reads the whole disk through a new stack over it.
    fn restore(&mut self, seq: u64, disk: &str, base: &Path) -> Result<Vec<u8>, VaultError> {
        self.restores += 1;
        let out = self.path(&format!("restore{}", self.restores));
        let restored = self.vault.restore_layer(seq, disk, &out)?;
        assert_eq!(restored.dir, out);
        let stack = LayerStack::create(base, &[out], &self.path(&format!("rtop{}", self.restores))).unwrap();
        let mut buf = vec![0u8; stack.size() as usize];
        stack.read_at(&mut buf, 0).unwrap();
        Ok(buf)
    }

    fn export(&mut self, seq: u64, disk: &str, base: &Path) -> Vec<u8> {
        self.restores += 1;
        let out = self.path(&format!("export{}.raw", self.restores));
        self.vault.export_raw(seq, disk, base, &out).unwrap();
        assert!(!self.path(&format!("export{}.raw.partial", self.restores)).exists());
        fs::read(out).unwrap()
    }
}

/// Every regular file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).unwrap().flatten() {
        let t = entry.file_type().unwrap();
        if t.is_dir() {
            out.extend(files_under(&entry.path()));
        } else if t.is_file() {
            out.push(entry.path());
        }
    }
    out.sort();
    out
}

fn chunk_files(vault: &Vault) -> Vec<PathBuf> {
    files_under(&vault.root().join("chunks"))
}

fn temp_files(root: &Path) -> Vec<PathBuf> {
    files_under(root).into_iter().filter(|p| p.file_name().unwrap().to_str().unwrap().ends_with(".tmp")).collect()
}

fn flip_byte(path: &Path, at: usize) {
    let mut bytes = fs::read(path).unwrap();
    let at = at.min(bytes.len() - 1);
    bytes[at] ^= 0x40;
    fs::write(path, bytes).unwrap();
}

#[test]
fn round_trip_every_snapshot_restores_byte_exact() {
    let mut fx = Fixture::new();
    let mut disk = Disk::new(&fx.path("d0"), SIZE, 1);
    let mut other = Disk::new(&fx.path("d1"), 9 * BS, 2);
    let mut rng = Rng(7);
    let mut models = Vec::new();
    for round in 0..5 {
        disk.random_writes(&mut rng, 12);
        if round == 2 {
            // Zeros over base data must read back as zeros, not fall through.
            disk.write(BS * 3, &[0u8; 2 * BS]);
            disk.write(SIZE - 1000, &[0u8; 1000]);
        }
        disk.seal();
        other.random_writes(&mut rng, 2);
        other.seal();
        let info = fx.vault.snapshot(&[disk.input("root"), other.input("data")]).unwrap();
        assert!(!info.unchanged);
        assert_eq!(info.seq, round + 1);
        assert_eq!(info.disks[0].layer_id, fx.vault.load(info.seq).unwrap().disks[0].layer_id);
        models.push((info.seq, disk.model.clone(), other.model.clone()));
    }
    assert_eq!(fx.vault.latest().unwrap(), Some(5));
    let listed = fx.vault.list().unwrap();
    assert_eq!(listed.iter().map(|s| s.seq).collect::<Vec<_>>(), vec![1, 2, 3, 4, 5]);
    assert!(listed.iter().all(|s| s.stored_bytes > 0 && s.disks.len() == 2));
    let (base0, base1) = (disk.base.clone(), other.base.clone());
    for (seq, m0, m1) in &models {
        assert!(fx.restore(*seq, "root", &base0).unwrap() == *m0, "root disk of snapshot {seq}");
        assert!(fx.restore(*seq, "data", &base1).unwrap() == *m1, "data disk of snapshot {seq}");
        assert!(fx.export(*seq, "root", &base0) == *m0, "raw export of snapshot {seq}");
    }
    let err = fx.vault.restore_layer(9, "root", &fx.path("nope")).unwrap_err();
    assert_eq!(err.kind(), VaultErrorKind::NotFound);
    let err = fx.vault.restore_layer(1, "swap", &fx.path("nope")).unwrap_err();
    assert_eq!(err.kind(), VaultErrorKind::NotFound);
}

#[test]
fn snapshot_of_a_restored_disk_continues_the_lineage() {
    let mut fx = Fixture::new();
    let mut disk = Disk::new(&fx.path("d0"), SIZE, 3);
    let mut rng = Rng(8);
    disk.random_writes(&mut rng, 10);
    disk.seal();
    fx.vault.snapshot(&[disk.input("root")]).unwrap();
    // The runtime restores onto a new stack and carries on writing.
    let restored = fx.path("restored");
    fx.vault.restore_layer(1, "root", &restored).unwrap();
    let mut disk2 = Disk {
        stack: LayerStack::create(&disk.base, std::slice::from_ref(&restored), &fx.path("d0/new-top0")).unwrap(),
        dir: fx.path("d0"),
        base: disk.base.clone(),
        model: disk.model.clone(),
        sealed: vec![restored],
        tops: 100,
    };
    let before = chunk_files(&fx.vault).len();
    disk2.write(5 * BS + 10, b"after restore");
    disk2.seal();
    let info = fx.vault.snapshot(&[disk2.input("root")]).unwrap();
    // A new lineage uploads everything, but unchanged windows dedup to existing chunks.
    assert_eq!(info.written_chunks, 1);
    assert_eq!(chunk_files(&fx.vault).len(), before + 1);
    assert!(fx.restore(2, "root", &disk.base.clone()).unwrap() == disk2.model);
}

#[test]
fn incremental_snapshots_upload_only_new_windows() {
    let mut fx = Fixture::new();
    let mut disk = Disk::new(&fx.path("d0"), SIZE, 4);
    let mut rng = Rng(9);
    // Blocks 0..40: windows 0, 1 (full) and 2 (blocks 32..40).
    disk.write(0, &rng.bytes(40 * BS));
    disk.seal();
    let first = fx.vault.snapshot(&[disk.input("root")]).unwrap();
    assert_eq!(first.written_chunks, 3);
    assert_eq!(first.disks[0].blocks, 40);
    assert_eq!(chunk_files(&fx.vault).len(), 3);

    // One block in a new window (5) and one in window 1: two chunks, window 0 untouched.
    disk.write(85 * BS, &rng.bytes(BS));
    disk.write(20 * BS + 7, b"x");
    disk.seal();
    let second = fx.vault.snapshot(&[disk.input("root")]).unwrap();
    assert_eq!((second.seq, second.written_chunks, second.unchanged), (2, 2, false));
    assert_eq!(second.disks[0].blocks, 41);
    assert_eq!(chunk_files(&fx.vault).len(), 5);

    // Nothing sealed since: unchanged, nothing written.
    let files = files_under(fx.vault.root());
    let third = fx.vault.snapshot(&[disk.input("root")]).unwrap();
    assert!(third.unchanged);
    assert_eq!(third.seq, 2);
    assert_eq!(files_under(fx.vault.root()), files);

    // An empty seal (no new block) is still a new layer: a new snapshot, no new chunk.
    disk.seal();
    let fourth = fx.vault.snapshot(&[disk.input("root")]).unwrap();
    assert_eq!((fourth.seq, fourth.written_chunks, fourth.unchanged), (3, 0, false));
    assert!(fx.restore(3, "root", &disk.base.clone()).unwrap() == disk.model);
}

#[test]
fn vault_and_keys_hold_no_plaintext() {
    let mut fx = Fixture::new();
    let keys_dir = fx.keys.dir().to_path_buf();
    assert!(!keys_dir.starts_with(fx.vault.root()) && !fx.vault.root().starts_with(&keys_dir));
    let pattern = b"FORKVM-CANARY-0123456789";
    let canary: Vec<u8> = pattern.iter().copied().cycle().take(1 << 20).collect();
    let mut disk = Disk::new(&fx.path("d0"), 2 << 20, 5);
    disk.write(4096, &canary);
    disk.seal();
    fx.vault.snapshot(&[disk.input("root")]).unwrap();
    // Also the restore path: it writes outside the vault and must leave none inside.
    assert!(fx.restore(1, "root", &disk.base.clone()).unwrap() == disk.model);
    let windows: Vec<Vec<u8>> = (0..pattern.len()).map(|i| canary[i..i + 16].to_vec()).collect();
    let mut scanned = 0;
    for file in files_under(fx.vault.root()).into_iter().chain(files_under(&keys_dir)) {
        let bytes = fs::read(&file).unwrap();
        for w in &windows {
            assert!(!bytes.windows(16).any(|b| b == w.as_slice()), "{} holds plaintext", file.display());
        }
        scanned += bytes.len();
    }
    assert!(scanned > 1000, "the vault holds the data somewhere ({scanned} bytes scanned)");
}

#[test]
fn interrupted_snapshot_keeps_the_previous_one() {
    for fault in
        [FaultPoint::AfterChunks(0), FaultPoint::AfterChunks(2), FaultPoint::BeforeManifest, FaultPoint::BeforeCommit]
    {
        let mut fx = Fixture::new();
        let mut disk = Disk::new(&fx.path("d0"), SIZE, 6);
        let mut rng = Rng(10);
        disk.random_writes(&mut rng, 8);
        disk.seal();
        fx.vault.snapshot(&[disk.input("root")]).unwrap();
        let model1 = disk.model.clone();

        disk.write(0, &rng.bytes(SIZE));
        disk.seal();
        let err = fx.vault.snapshot_inner(&[disk.input("root")], 0, Some(fault)).unwrap_err();
        assert_eq!(err.kind(), VaultErrorKind::Fault, "{fault:?}");
        assert!(!temp_files(fx.vault.root()).is_empty() || fault == FaultPoint::BeforeManifest, "{fault:?}");
        assert_eq!(fx.vault.latest().unwrap(), Some(1), "{fault:?}");
        assert_eq!(fx.vault.list().unwrap().len(), 1, "{fault:?}: temps are not snapshots");
        assert!(fx.restore(1, "root", &disk.base.clone()).unwrap() == model1, "{fault:?}");

        // The next snapshot cleans up and covers the layer the crashed one missed.
        disk.random_writes(&mut rng, 4);
        disk.seal();
        let info = fx.vault.snapshot(&[disk.input("root")]).unwrap();
        assert_eq!(info.seq, 2, "{fault:?}");
        assert!(temp_files(fx.vault.root()).is_empty(), "{fault:?}");
        assert!(fx.restore(2, "root", &disk.base.clone()).unwrap() == disk.model, "{fault:?}");
        assert!(fx.restore(1, "root", &disk.base.clone()).unwrap() == model1, "{fault:?}");
    }
}

#[test]
fn gc_collects_chunks_of_an_interrupted_snapshot() {
    let mut fx = Fixture::new();
    let mut disk = Disk::new(&fx.path("d0"), SIZE, 11);
    let mut rng = Rng(11);
    disk.write(0, &rng.bytes(BS));
    disk.seal();
    fx.vault.snapshot(&[disk.input("root")]).unwrap();
    disk.write(50 * BS, &rng.bytes(20 * BS));
    disk.seal();
    fx.vault.snapshot_inner(&[disk.input("root")], 0, Some(FaultPoint::BeforeManifest)).unwrap_err();
    assert_eq!(chunk_files(&fx.vault).len(), 3);
    let report = fx.vault.gc().unwrap();
    assert_eq!((report.chunks_removed, report.chunks_kept, report.removed.len()), (2, 1, 0));
    assert!(fx.restore(1, "root", &disk.base.clone()).unwrap()[..BS] == disk.model[..BS]);
}

/// A vault with two snapshots of one disk; returns (fixture, disk, model of seq 2).
fn two_snapshots() -> (Fixture, Disk) {
    let fx = Fixture::new();
    let mut disk = Disk::new(&fx.path("d0"), SIZE, 12);
    let mut rng = Rng(12);
    disk.write(0, &rng.bytes(40 * BS));
    disk.seal();
    fx.vault.snapshot(&[disk.input("root")]).unwrap();
    disk.write(60 * BS, &rng.bytes(BS));
    disk.seal();
    fx.vault.snapshot(&[disk.input("root")]).unwrap();
    (fx, disk)
}

#[test]
fn tampered_chunk_is_refused_naming_it() {
    let (mut fx, disk) = two_snapshots();
    let chunk = chunk_files(&fx.vault)[0].clone();
    let name = chunk.file_name().unwrap().to_str().unwrap().to_string();
    flip_byte(&chunk, 100);
    let err = fx.restore(2, "root", &disk.base).unwrap_err();
    assert_eq!(err.kind(), VaultErrorKind::Corrupt);
    assert!(err.to_string().contains(&name), "{err}");
    assert!(!fx.path(&format!("restore{}", fx.restores)).exists(), "no half-restored layer under the real name");
    let out = fx.path("raw");
    assert_eq!(fx.vault.export_raw(2, "root", &disk.base, &out).unwrap_err().kind(), VaultErrorKind::Corrupt);
    assert!(!out.exists());
}

#[test]
fn swapped_chunk_files_are_refused() {
    let (mut fx, disk) = two_snapshots();
    let chunks = chunk_files(&fx.vault);
    fs::rename(&chunks[0], &chunks[1]).unwrap();
    let err = fx.restore(2, "root", &disk.base).unwrap_err();
    assert_eq!(err.kind(), VaultErrorKind::Corrupt, "{err}");
    assert!(err.to_string().contains("authentication") || err.to_string().contains("missing"), "{err}");
}

#[test]
fn tampered_or_renamed_manifest_is_an_error() {
    let (fx, _disk) = two_snapshots();
    let m1 = fx.vault.manifest_path(1);
    let m2 = fx.vault.manifest_path(2);
    // Passing snapshot 1 off as snapshot 3 fails: the seq is in the AAD.
    fs::copy(&m1, fx.vault.manifest_path(3)).unwrap();
    assert_eq!(fx.vault.list().unwrap_err().kind(), VaultErrorKind::Corrupt);
    fs::remove_file(fx.vault.manifest_path(3)).unwrap();
    assert_eq!(fx.vault.list().unwrap().len(), 2);
    flip_byte(&m2, 50);
    let err = fx.vault.list().unwrap_err();
    assert_eq!(err.kind(), VaultErrorKind::Corrupt);
    assert!(err.to_string().contains(&m2.display().to_string()), "{err}");
    assert_eq!(fx.vault.restore_layer(2, "root", &fx.path("r")).unwrap_err().kind(), VaultErrorKind::Corrupt);
    // Retention refuses to collect anything while a manifest is unreadable.
    let policy = RetentionPolicy { keep_last: 1, keep_hourly: 0, keep_daily: 0 };
    assert_eq!(fx.vault.retain(&policy).unwrap_err().kind(), VaultErrorKind::Corrupt);
    assert!(m1.exists());
}

#[test]
fn wrong_keys_are_key_errors() {
    let (fx, _disk) = two_snapshots();
    // Another sandbox key on this vault.
    let other = fx.keys.sandbox_key("sb-2").unwrap();
    assert_eq!(Vault::open(fx.vault.root(), other).unwrap_err().kind(), VaultErrorKind::Key);
    // Another host key cannot unwrap the sandbox key.
    let host = fx.keys.dir().join("host.key");
    fs::write(&host, [7u8; 32]).unwrap();
    let keys = KeyStore::open(fx.keys.dir()).unwrap();
    let err = keys.sandbox_key("sb-1").unwrap_err();
    assert_eq!(err.kind(), VaultErrorKind::Key);
    assert!(err.to_string().contains("sb-1.key"), "{err}");
    // A tampered wrapped key too.
    let wrapped = fx.keys.dir().join("sandboxes/sb-2.key");
    flip_byte(&wrapped, 40);
    assert_eq!(fx.keys.sandbox_key("sb-2").unwrap_err().kind(), VaultErrorKind::Key);
}

#[test]
fn retention_keeps_the_policy_set_and_collects_the_rest() {
    let mut fx = Fixture::new();
    let mut disk = Disk::new(&fx.path("d0"), SIZE, 13);
    let mut rng = Rng(13);
    // Window 1 is written once and shared by every snapshot.
    disk.write(16 * BS, &rng.bytes(16 * BS));
    const H: u64 = 3_600_000;
    const D: u64 = 24 * H;
    let t0 = 1_000 * D;
    // (day, hour, minute) of each snapshot, seq 1.. in order.
    let times = [
        (0, 1, 0),
        (0, 5, 0),
        (0, 5, 30),
        (1, 2, 0),
        (1, 2, 10),
        (1, 3, 0),
        (2, 7, 0),
        (2, 7, 1),
        (2, 8, 0),
        (2, 8, 1),
    ];
    let mut models = Vec::new();
    for (i, &(d, h, m)) in times.iter().enumerate() {
        // Window 0 is rewritten by every snapshot: its chunk belongs to that one alone.
        disk.write(0, &rng.bytes(BS));
        disk.seal();
        let info = fx.vault.snapshot_at(&[disk.input("root")], t0 + d * D + h * H + m * 60_000).unwrap();
        assert_eq!(info.seq, i as u64 + 1);
        models.push(disk.model.clone());
    }
    assert_eq!(chunk_files(&fx.vault).len(), 11);
    let policy = RetentionPolicy { keep_last: 2, keep_hourly: 3, keep_daily: 2 };
    let report = fx.vault.retain(&policy).unwrap();
    // last 2: 10, 9. Hours newest first: (2,8)→10, (2,7)→8, (1,3)→6. Days: 2→10, 1→6.
    assert_eq!(report.kept, vec![6, 8, 9, 10]);
    assert_eq!(report.removed, vec![1, 2, 3, 4, 5, 7]);
    assert_eq!((report.chunks_removed, report.chunks_kept), (6, 5));
    assert!(report.bytes_freed > 0);
    assert_eq!(chunk_files(&fx.vault).len(), 5);
    for seq in [6u64, 8, 9, 10] {
        assert!(fx.restore(seq, "root", &disk.base.clone()).unwrap() == models[seq as usize - 1], "seq {seq}");
    }
    assert_eq!(fx.vault.restore_layer(1, "root", &fx.path("gone")).unwrap_err().kind(), VaultErrorKind::NotFound);
    // keep_last = 0 still keeps the newest.
    let report = fx.vault.retain(&RetentionPolicy { keep_last: 0, keep_hourly: 0, keep_daily: 0 }).unwrap();
    assert_eq!(report.kept, vec![10]);
    assert!(fx.restore(10, "root", &disk.base.clone()).unwrap() == models[9]);
    // The next snapshot still starts from the newest map.
    disk.write(90 * BS, b"after retention");
    disk.seal();
    let info = fx.vault.snapshot(&[disk.input("root")]).unwrap();
    assert_eq!((info.seq, info.written_chunks), (11, 1));
    assert!(fx.restore(11, "root", &disk.base.clone()).unwrap() == disk.model);
}

#[test]
fn retention_selection_rules() {
    let p = |l, h, d| RetentionPolicy { keep_last: l, keep_hourly: h, keep_daily: d };
    let snaps: Vec<(u64, u64)> = (1..=5).map(|s| (s, s * 1000)).collect();
    assert_eq!(select(&snaps, &p(0, 0, 0)).into_iter().collect::<Vec<_>>(), vec![5]);
    assert_eq!(select(&snaps, &p(3, 0, 0)).into_iter().collect::<Vec<_>>(), vec![3, 4, 5]);
    // All in one hour and one day: hourly/daily add nothing beyond the newest.
    assert_eq!(select(&snaps, &p(1, 5, 5)).into_iter().collect::<Vec<_>>(), vec![5]);
    assert!(select(&[], &p(1, 1, 1)).is_empty());
}

#[test]
fn destroy_removes_the_vault() {
    let (fx, _disk) = two_snapshots();
    let root = fx.vault.root().to_path_buf();
    fx.vault.destroy().unwrap();
    assert!(!root.exists());
}

#[test]
fn snapshot_inputs_are_checked() {
    let (fx, disk) = two_snapshots();
    let mut twice = vec![disk.input("root"), disk.input("root")];
    assert_eq!(fx.vault.snapshot(&twice).unwrap_err().kind(), VaultErrorKind::Invalid);
    twice[1].id = "../x".to_string();
    assert_eq!(fx.vault.snapshot(&twice).unwrap_err().kind(), VaultErrorKind::Invalid);
    let mut reversed = disk.input("root");
    reversed.layers.reverse();
    assert_eq!(fx.vault.snapshot(&[reversed]).unwrap_err().kind(), VaultErrorKind::Invalid);
    let empty = DiskInput { id: "root".into(), base_key: "b".into(), layers: vec![] };
    assert_eq!(fx.vault.snapshot(&[empty]).unwrap_err().kind(), VaultErrorKind::Invalid);
}

#[test]
fn manifest_validation_refuses_bad_maps() {
    let hex = "ab".repeat(32);
    let disk = |extents: Vec<(u64, u64, String)>| DiskMap {
        id: "root".into(),
        base_key: "b".into(),
        size: SIZE as u64,
        layer_id: "base".into(),
        extents,
    };
    let m = |d| Manifest { seq: 1, created_unix_ms: 0, disks: vec![d] };
    assert!(manifest::validate(&m(disk(vec![(0, 16, hex.clone()), (16, 3, hex.clone())])), 1).is_ok());
    assert!(manifest::validate(&m(disk(vec![(0, 16, hex.clone())])), 2).is_err(), "seq mismatch");
    for bad in [
        vec![(8, 16, hex.clone())],                      // crosses a window
        vec![(0, 0, hex.clone())],                       // empty
        vec![(100, 2, hex.clone())],                     // past the end (101 blocks)
        vec![(16, 1, hex.clone()), (0, 1, hex.clone())], // unsorted
        vec![(0, 4, hex.clone()), (3, 1, hex.clone())],  // overlapping
        vec![(0, 1, "AB".repeat(32))],                   // not lowercase hex
        vec![(u64::MAX, 2, hex.clone())],                // overflow
    ] {
        assert!(manifest::validate(&m(disk(bad.clone())), 1).is_err(), "{bad:?}");
    }
    let mut d = disk(vec![]);
    d.layer_id = "zz".into();
    assert!(manifest::validate(&m(d), 1).is_err());
    let json = br#"{"seq":1,"created_unix_ms":0,"disks":[],"extra":1}"#;
    assert!(serde_json::from_slice::<Manifest>(json).is_err(), "unknown fields refused");
}

#[test]
fn key_store_creation_races_agree_on_one_key() {
    for _ in 0..10 {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("keys");
        let barrier = Arc::new(Barrier::new(2));
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let (dir, barrier) = (dir.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    KeyStore::open(&dir).unwrap().sandbox_key("racer").unwrap()
                })
            })
            .collect();
        let keys: Vec<SandboxKey> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(keys[0].bytes(), keys[1].bytes());
        assert!(temp_files(&dir).is_empty());
    }
}

#[test]
fn a_sandbox_key_carried_to_another_host_opens_there_only_under_the_carrying_seal() {
    let tmp = tempfile::tempdir().unwrap();
    let (here, there) =
        (KeyStore::open(&tmp.path().join("a")).unwrap(), KeyStore::open(&tmp.path().join("b")).unwrap());
    let carrier = ChunkSeal::of_key(&SandboxKey::from_bytes([9; 32]));
    let name = crate::chunk_id::ChunkId::of(b"sbx");
    assert!(here.export_sandbox_key("sbx", &carrier, &name).is_err(), "no key is made to be exported");
    let key = here.sandbox_key("sbx").unwrap();
    let carried = here.export_sandbox_key("sbx", &carrier, &name).unwrap();
    assert!(!carried.windows(32).any(|w| w == key.bytes()), "the key travels sealed");
    let wrong = ChunkSeal::of_key(&SandboxKey::from_bytes([8; 32]));
    assert!(there.import_sandbox_key("sbx", &wrong, &name, &carried).is_err(), "another seal");
    assert!(there.import_sandbox_key("sbx", &carrier, &crate::chunk_id::ChunkId::of(b"x"), &carried).is_err());
    assert!(!there.has_sandbox_key("sbx"));
    there.import_sandbox_key("sbx", &carrier, &name, &carried).unwrap();
    assert_eq!(there.sandbox_key("sbx").unwrap().bytes(), key.bytes(), "the same key, wrapped by the other host's");
    there.import_sandbox_key("sbx", &carrier, &name, &carried).unwrap();
    here.sandbox_key("other").unwrap();
    let other = here.export_sandbox_key("other", &carrier, &name).unwrap();
    let err = there.import_sandbox_key("sbx", &carrier, &name, &other).unwrap_err();
    assert!(err.to_string().contains("another key"), "{err}");
}

#[test]
fn key_store_files_are_private_and_checked() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("keys");
    let keys = KeyStore::open(&dir).unwrap();
    let key = keys.sandbox_key("sb.1_x-y").unwrap();
    let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&dir.join("sandboxes")), 0o700);
    assert_eq!(mode(&dir.join("host.key")), 0o600);
    assert_eq!(mode(&dir.join("sandboxes/sb.1_x-y.key")), 0o600);
    assert_eq!(fs::metadata(dir.join("sandboxes/sb.1_x-y.key")).unwrap().len(), 84);
    assert_eq!(format!("{key:?}"), "SandboxKey(<redacted>)");
    assert!(!format!("{keys:?}").contains(&format!("{:?}", &fs::read(dir.join("host.key")).unwrap()[..4])));
    // Stable across opens.
    assert_eq!(KeyStore::open(&dir).unwrap().sandbox_key("sb.1_x-y").unwrap().bytes(), key.bytes());

    for bad in ["", ".hidden", "a/b", "x y", &"a".repeat(65)] {
        assert_eq!(keys.sandbox_key(bad).unwrap_err().kind(), VaultErrorKind::Invalid, "{bad:?}");
    }
    // Crypto-shredding: the key is gone; a new one is different. Missing is Ok.
    keys.remove_sandbox_key("sb.1_x-y").unwrap();
    keys.remove_sandbox_key("sb.1_x-y").unwrap();
    assert_ne!(keys.sandbox_key("sb.1_x-y").unwrap().bytes(), key.bytes());

    let host = dir.join("host.key");
    fs::set_permissions(&host, fs::Permissions::from_mode(0o640)).unwrap();
    assert_eq!(KeyStore::open(&dir).unwrap_err().kind(), VaultErrorKind::Key);
    fs::set_permissions(&host, fs::Permissions::from_mode(0o600)).unwrap();
    fs::write(&host, [1u8; 31]).unwrap();
    let err = KeyStore::open(&dir).unwrap_err();
    assert_eq!(err.kind(), VaultErrorKind::Key);
    assert!(err.to_string().contains("31 bytes"), "{err}");
    fs::write(&host, [1u8; 33]).unwrap();
    assert_eq!(KeyStore::open(&dir).unwrap_err().kind(), VaultErrorKind::Key);
}
