//! Tests of the chunk store: round trips, dedup, corruption and cap checks, gc and its locking.

use super::*;
use std::fs::FileTimes;
use std::sync::atomic::AtomicBool;
use std::sync::{mpsc, Arc};
use std::time::SystemTime;

fn store() -> (tempfile::TempDir, ChunkStore) {
    let tmp = tempfile::tempdir().unwrap();
    let store = ChunkStore::open(tmp.path());
    (tmp, store)
}

fn data(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// Every regular file under the chunks directory, relative, sorted.
fn files(store: &ChunkStore) -> Vec<String> {
    let mut out = Vec::new();
    for d in fs::read_dir(store.dir()).unwrap().flatten() {
        if d.file_type().unwrap().is_dir() {
            for f in fs::read_dir(d.path()).unwrap().flatten() {
                out.push(format!("{}/{}", d.file_name().to_string_lossy(), f.file_name().to_string_lossy()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn hex_round_trip_and_rejections() {
    let id = ChunkId::of(b"hello");
    let hex = id.to_hex();
    assert_eq!(hex.len(), 64);
    assert_eq!(hex, blake3::hash(b"hello").to_hex().as_str());
    assert_eq!(ChunkId::from_hex(&hex).unwrap(), id);
    assert_eq!(id.to_string(), hex);
    assert!(format!("{id:?}").starts_with(&format!("ChunkId({}", &hex[..16])));
    for bad in [hex.to_uppercase(), hex[..63].to_string(), format!("{hex}0"), format!("{}g", &hex[..63]), String::new()]
    {
        assert!(matches!(ChunkId::from_hex(&bad), Err(crate::chunk_store::BadChunkId(_))), "{bad:?}");
    }
    // Multi-byte characters must not be sliced or accepted.
    let weird = format!("{}é", &hex[..62]);
    assert!(ChunkId::from_hex(&weird).is_err());
}

#[test]
fn put_get_round_trip() {
    let (_tmp, store) = store();
    for (i, len) in [0usize, 1, 4096, 65536, MAX_CHUNK_BYTES].into_iter().enumerate() {
        let d = data(i as u8, len);
        let out = store.put(&d).unwrap();
        assert!(out.new);
        assert_eq!(out.id, ChunkId::of(&d));
        assert!(store.contains(&out.id));
        assert_eq!(store.stored_size(&out.id).unwrap(), out.stored_bytes);
        assert_eq!(fs::metadata(store.path_of(&out.id)).unwrap().len(), out.stored_bytes);
        assert_eq!(store.get(&out.id).unwrap(), d);
        let mut buf = vec![9u8; 7];
        store.get_into(&out.id, &mut buf).unwrap();
        assert_eq!(buf, d);
    }
    let hex = ChunkId::of(b"x").to_hex();
    assert_eq!(store.path_of(&ChunkId::of(b"x")), store.dir().join(&hex[..2]).join(&hex));
    // Compressible data is stored compressed.
    let zeros = store.put(&vec![0u8; 65536]).unwrap();
    assert!(zeros.stored_bytes < 1024, "{}", zeros.stored_bytes);
    store.sync().unwrap();
    assert_eq!(store.list().unwrap().len(), 6);
    // No temp files are left behind.
    assert!(files(&store).iter().all(|f| !f.contains(".tmp")));
}

#[test]
fn missing_chunk_is_reported() {
    let (_tmp, store) = store();
    let id = ChunkId::of(b"absent");
    let err = store.get(&id).unwrap_err();
    assert!(err.is_missing(), "{err}");
    assert!(store.stored_size(&id).unwrap_err().is_missing());
    assert!(!store.contains(&id));
    // sync and listing on a store that does not exist yet.
    store.sync().unwrap();
    assert!(store.list().unwrap().is_empty());
    assert_eq!(store.usage().unwrap(), (0, 0));
}

#[test]
fn identical_content_is_stored_once() {
    let (_tmp, store) = store();
    let d = data(7, 10_000);
    let a = store.put(&d).unwrap();
    let b = store.put(&d).unwrap();
    assert!(a.new);
    assert!(!b.new);
    assert_eq!(a.id, b.id);
    assert_eq!(a.stored_bytes, b.stored_bytes);
    assert_eq!(files(&store).len(), 1);
    let (count, bytes) = store.usage().unwrap();
    assert_eq!(count, 1);
    assert!(bytes > 0);
}

#[test]
fn flipped_byte_is_corrupt() {
    let (_tmp, store) = store();
    let id = store.put(&data(1, 50_000)).unwrap().id;
    let path = store.path_of(&id);
    let mut bytes = fs::read(&path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    fs::write(&path, &bytes).unwrap();
    let err = store.get(&id).unwrap_err();
    assert!(matches!(&err, ChunkError::Corrupt { path: p, .. } if *p == path), "{err}");
    assert!(err.to_string().contains(&path.display().to_string()), "{err}");
}

#[test]
fn valid_frame_of_other_content_is_corrupt() {
    let (_tmp, store) = store();
    let id = store.put(b"the real content").unwrap().id;
    let path = store.path_of(&id);
    fs::write(&path, zstd::bulk::compress(b"other content", 3).unwrap()).unwrap();
    let err = store.get(&id).unwrap_err();
    match &err {
        ChunkError::Corrupt { path: p, reason } => {
            assert_eq!(*p, path);
            assert!(reason.contains("hashes to"), "{reason}");
        }
        other => panic!("expected Corrupt, got {other}"),
    }
    // Garbage that is not zstd at all.
    fs::write(&path, b"not zstd").unwrap();
    assert!(matches!(store.get(&id), Err(ChunkError::Corrupt { .. })));
}

#[test]
fn oversized_data_is_refused() {
    let (_tmp, store) = store();
    let err = store.put(&vec![1u8; MAX_CHUNK_BYTES + 1]).unwrap_err();
    assert!(matches!(err, ChunkError::TooLarge { len } if len == MAX_CHUNK_BYTES + 1));
    assert!(store.list().unwrap().is_empty());
}

#[test]
fn decompression_bomb_is_capped() {
    let (_tmp, store) = store();
    // 64 MiB of zeros compresses to a few KiB; stored under the name of its own
    // content, only the output cap stops it.
    let big = vec![0u8; 64 << 20];
    let id = ChunkId::of(&big);
    let frame = zstd::bulk::compress(&big, 3).unwrap();
    assert!(frame.len() < 64 << 10);
    let path = store.path_of(&id);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(&path, &frame).unwrap();
    let mut out = Vec::new();
    let err = store.get_into(&id, &mut out).unwrap_err();
    assert!(matches!(&err, ChunkError::Corrupt { path: p, .. } if *p == path), "{err}");
    assert!(out.capacity() < 4 * MAX_CHUNK_BYTES, "{}", out.capacity());

    // A streamed frame without a declared content size is capped too.
    let mut enc = zstd::stream::Encoder::new(Vec::new(), 3).unwrap();
    enc.include_contentsize(false).unwrap();
    enc.write_all(&vec![0u8; 2 * MAX_CHUNK_BYTES]).unwrap();
    fs::write(&path, enc.finish().unwrap()).unwrap();
    assert!(matches!(store.get(&id), Err(ChunkError::Corrupt { .. })));

    // A compressed file bigger than any real chunk is refused before decompressing.
    fs::write(&path, vec![0u8; 2 * MAX_CHUNK_BYTES]).unwrap();
    let err = store.get(&id).unwrap_err();
    assert!(err.to_string().contains("compressed size exceeds"), "{err}");
}

fn set_mtime(path: &Path, age: Duration) {
    let f = File::options().write(true).open(path).unwrap();
    f.set_times(FileTimes::new().set_modified(SystemTime::now() - age)).unwrap();
}

#[test]
fn gc_keeps_live_removes_dead_and_stale_temps() {
    let (_tmp, store) = store();
    let live_ids: Vec<_> = (0..5).map(|i| store.put(&data(i, 3000)).unwrap().id).collect();
    let dead_ids: Vec<_> = (10..17).map(|i| store.put(&data(i, 3000)).unwrap().id).collect();
    let me = std::process::id();
    let fanout = store.path_of(&live_ids[0]).parent().unwrap().to_path_buf();
    let hex = live_ids[0].to_hex();
    let old_temp = fanout.join(format!(".{hex}.{me}.1.tmp"));
    let fresh_temp = fanout.join(format!(".{hex}.{me}.2.tmp"));
    let dead_pid_temp = fanout.join(format!(".{hex}.{}.3.tmp", u32::MAX - 1));
    let unknown = [fanout.join("README"), fanout.join(".other.tmp"), fanout.join(&hex[..60])];
    for p in [&old_temp, &fresh_temp, &dead_pid_temp].into_iter().chain(&unknown) {
        fs::write(p, b"partial").unwrap();
    }
    set_mtime(&old_temp, Duration::from_secs(120));
    // A chunk-named file in the wrong fan-out directory is not ours either.
    let misplaced_dir = store.dir().join(if &hex[..2] == "00" { "01" } else { "00" });
    fs::create_dir_all(&misplaced_dir).unwrap();
    let misplaced = misplaced_dir.join(&hex);
    fs::write(&misplaced, b"x").unwrap();
    // Non-fan-out entries at the top level are ignored.
    fs::write(store.dir().join("notes.txt"), b"x").unwrap();

    let (_, bytes_before) = store.usage().unwrap();
    let live: HashSet<_> = live_ids.iter().copied().collect();
    let report = store.gc(|| Ok(live.clone())).unwrap();
    assert_eq!(report.kept, 5);
    assert_eq!(report.removed, 7);
    assert_eq!(report.temp_files_removed, 2);
    let (count, bytes_after) = store.usage().unwrap();
    assert_eq!(count, 5);
    assert_eq!(bytes_before - bytes_after, report.removed_bytes);
    assert!(report.removed_bytes > 0);
    assert_eq!(store.list().unwrap(), {
        let mut v = live_ids.clone();
        v.sort();
        v
    });
    for id in &live_ids {
        assert_eq!(store.get(id).unwrap().len(), 3000);
    }
    for id in &dead_ids {
        assert!(store.get(id).unwrap_err().is_missing());
    }
    assert!(!old_temp.exists());
    assert!(!dead_pid_temp.exists());
    assert!(fresh_temp.exists());
    for p in unknown.iter().chain([&misplaced, &store.dir().join("notes.txt")]) {
        assert!(p.exists(), "{}", p.display());
    }
    // Fan-out directories left empty are removed.
    for id in &dead_ids {
        let dir = store.path_of(id).parent().unwrap().to_path_buf();
        let has_live = live_ids.iter().any(|l| store.path_of(l).parent() == Some(dir.as_path()));
        if !has_live && dir != fanout && dir != misplaced_dir {
            assert!(!dir.exists(), "{}", dir.display());
        }
    }
    // A second gc with everything dead removes the rest (but not unknown files).
    let report = store.gc(|| Ok(HashSet::new())).unwrap();
    assert_eq!((report.kept, report.removed), (0, 5));
    assert!(store.list().unwrap().is_empty());
    assert!(fanout.join("README").exists());
}

#[test]
fn gc_live_set_error_is_passed_through() {
    let (_tmp, store) = store();
    let id = store.put(b"keep me").unwrap().id;
    let err = store.gc(|| Err(ChunkError::LiveSet("manifest unreadable".into()))).unwrap_err();
    assert!(matches!(err, ChunkError::LiveSet(ref m) if m == "manifest unreadable"), "{err}");
    assert!(store.contains(&id));
}

#[test]
fn gc_waits_for_writers_before_computing_live_set() {
    let (_tmp, store) = store();
    let writer_lock = store.lock_shared().unwrap();
    // Shared locks do not exclude each other.
    let second = store.lock_shared().unwrap();
    drop(second);
    let id = store.put(b"being written").unwrap().id;

    let live_called = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel();
    let gc_store = store.clone();
    let flag = live_called.clone();
    let handle = std::thread::spawn(move || {
        let report = gc_store
            .gc(|| {
                flag.store(true, Ordering::SeqCst);
                // The writer has published by now: its chunk is live.
                Ok(HashSet::from([id]))
            })
            .unwrap();
        tx.send(report).unwrap();
    });
    assert!(rx.recv_timeout(Duration::from_millis(400)).is_err(), "gc ran while a writer held the shared lock");
    assert!(!live_called.load(Ordering::SeqCst), "live() called before the exclusive lock was taken");
    drop(writer_lock);
    let report = rx.recv_timeout(Duration::from_secs(10)).expect("gc did not finish after the writer unlocked");
    assert!(live_called.load(Ordering::SeqCst));
    assert_eq!((report.kept, report.removed), (1, 0));
    handle.join().unwrap();
    assert!(store.contains(&id));
}

#[test]
fn classify_names() {
    let id = ChunkId::of(b"a");
    let hex = id.to_hex();
    let fanout = PathBuf::from("/x/chunks").join(&hex[..2]);
    let c = |n: &str| classify(&fanout, std::ffi::OsStr::new(n));
    assert_eq!(c(&hex), Entry::Chunk(id));
    assert_eq!(c(&format!(".{hex}.42.7.tmp")), Entry::Temp { pid: 42 });
    assert_eq!(c(&format!(".{hex}.x.7.tmp")), Entry::Other);
    assert_eq!(c(&format!(".{hex}.42.tmp")), Entry::Other);
    assert_eq!(c(".lock"), Entry::Other);
    assert_eq!(c(&hex.to_uppercase()), Entry::Other);
}

#[test]
fn a_sealed_handle_stores_ciphertext_shares_within_its_key_and_reads_its_own_only() {
    use forkvm_disk::vault::SandboxKey;
    let (_tmp, plain) = store();
    let seal = |b: u8| ChunkSeal::of_key(&SandboxKey::from_bytes([b; 32]));
    let (a, b) = (plain.clone().with_seal(seal(1)), plain.clone().with_seal(seal(2)));
    // Compressible, so a plain chunk's file would be readable zstd of it.
    let d = b"a secret the sandbox computed ".repeat(2000);
    let sealed = a.put(&d).unwrap();
    assert!(sealed.new);
    assert_eq!(a.put(&d).unwrap(), PutOutcome { new: false, ..sealed }, "convergent within the key");
    let other = b.put(&d).unwrap();
    assert!(other.new && other.id != sealed.id, "another key: another name");
    let open = plain.put(&d).unwrap();
    assert!(open.new && open.id == ChunkId::of(&d), "the plain chunk is another one");
    let bytes = fs::read(a.path_of(&sealed.id)).unwrap();
    assert!(bytes.starts_with(&forkvm_disk::vault::SEALED_CHUNK_MAGIC));
    assert!(zstd::decode_all(&bytes[..]).is_err(), "not a zstd frame");
    assert!(!bytes.windows(8).any(|w| w == b"a secret"), "no plaintext");
    assert_eq!(a.get(&sealed.id).unwrap(), d);
    assert_eq!(b.get(&other.id).unwrap(), d);
    for (handle, id) in [(&b, sealed.id), (&plain, sealed.id), (&a, open.id)] {
        let e = handle.get(&id).unwrap_err();
        assert!(matches!(e, ChunkError::Corrupt { .. }), "{e}");
    }
    // A sealed chunk copied under another name of the same key does not open.
    let moved = a.put(b"another chunk").unwrap();
    fs::copy(a.path_of(&sealed.id), a.path_of(&moved.id)).unwrap();
    assert!(a.get(&moved.id).unwrap_err().to_string().contains("does not open"));
}
