//! Layered disk tests: a random workload against an in-memory model of the whole disk,
//! crash and reopen behaviour, seal cost, and refusal of damaged layer files.

use super::bitmap::{self, encoded_len, HEADER_LEN};
use super::layer::Layer;
use super::*;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

const BS: usize = BLOCK_SIZE as usize;
/// 65 blocks, the last one partial (1000 bytes).
const SIZE: usize = 64 * BS + 1000;

use crate::test_rng::Rng;

/// A temp dir with a base image of `size` non-zero pseudo-random bytes.
fn setup(size: usize, seed: u64) -> (tempfile::TempDir, PathBuf, Vec<u8>) {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base.img");
    let content = Rng(seed).nonzero_bytes(size);
    fs::write(&base, &content).unwrap();
    (tmp, base, content)
}

fn read_all(stack: &LayerStack) -> Vec<u8> {
    let mut buf = vec![0u8; stack.size() as usize];
    stack.read_at(&mut buf, 0).unwrap();
    buf
}

/// Rebuilds the disk from the base plus every layer's present blocks, oldest first.
fn replay_layers(base: &[u8], stack: &LayerStack) -> Vec<u8> {
    let mut disk = base.to_vec();
    for layer in stack.sealed_layers().iter().chain(stack.top()) {
        for item in layer.present_blocks() {
            let (index, data) = item.unwrap();
            let at = index as usize * BS;
            disk[at..at + data.len()].copy_from_slice(&data);
        }
    }
    disk
}

fn write(stack: &mut LayerStack, model: &mut [u8], data: &[u8], offset: usize) {
    stack.write_at(data, offset as u64).unwrap();
    model[offset..offset + data.len()].copy_from_slice(data);
}

#[test]
fn random_workload_matches_model_across_seals_and_reopens() {
    let (tmp, base, mut model) = setup(SIZE, 1);
    let base_content = model.clone();
    let mut rng = Rng(42);
    let mut sealed: Vec<PathBuf> = Vec::new();
    let mut top = tmp.path().join("top0");
    let mut stack = LayerStack::create(&base, &sealed, &top).unwrap();
    for op in 1..=2500 {
        let offset = rng.below(SIZE as u64) as usize;
        let len = (1 + rng.below(3 * BS as u64 + 100) as usize).min(SIZE - offset);
        match rng.below(10) {
            0..=1 => write(&mut stack, &mut model, &vec![0u8; len], offset),
            2 => {
                // Whole aligned blocks.
                let b = offset / BS;
                let len = (BS * (1 + rng.below(3) as usize)).min(SIZE - b * BS);
                let data = rng.nonzero_bytes(len);
                write(&mut stack, &mut model, &data, b * BS);
            }
            3..=5 => {
                let data = rng.nonzero_bytes(len);
                write(&mut stack, &mut model, &data, offset);
            }
            _ => {
                let mut buf = vec![0u8; len];
                stack.read_at(&mut buf, offset as u64).unwrap();
                assert_eq!(buf, model[offset..offset + len], "op {op}: read {len} bytes at {offset}");
            }
        }
        if op % 300 == 0 {
            let next = tmp.path().join(format!("top{}", op / 300));
            let info = stack.seal(&next).unwrap();
            assert_eq!(info.dir, top);
            sealed.push(top);
            top = next;
            assert_eq!(read_all(&stack), model, "after seal at op {op}");
        }
        if op % 200 == 0 {
            stack.flush().unwrap();
            let before = stack.stats();
            drop(stack);
            stack = LayerStack::open(&base, &sealed, &top).unwrap();
            assert_eq!(stack.stats(), before, "reopen at op {op}");
            assert_eq!(read_all(&stack), model, "reopen at op {op}");
        }
    }
    assert_eq!(read_all(&stack), model);
    assert_eq!(stack.stats().sealed_blocks.len(), sealed.len());
    assert!(stack.stats().sealed_blocks.iter().all(|&n| n > 0));
    // The layers' present blocks alone rebuild the disk: nothing relies on holes.
    assert_eq!(replay_layers(&base_content, &stack), model);
    // The base was never written.
    assert_eq!(fs::read(&base).unwrap(), base_content);
}

#[test]
fn zero_writes_are_present_and_do_not_fall_through() {
    let (tmp, base, mut model) = setup(SIZE, 2);
    let mut stack = LayerStack::create(&base, &[], &tmp.path().join("t0")).unwrap();
    write(&mut stack, &mut model, &[7u8; BS], 3 * BS);
    stack.seal(&tmp.path().join("t1")).unwrap();
    write(&mut stack, &mut model, &[0u8; BS], 3 * BS);
    write(&mut stack, &mut model, &[0u8; 10], 5 * BS + 10);
    assert_eq!(model[3 * BS..4 * BS], [0u8; BS]);
    assert_eq!(read_all(&stack), model);
    assert_eq!(stack.stats().top_blocks, 2);
    stack.flush().unwrap();
    drop(stack);
    let sealed = [tmp.path().join("t0")];
    let mut stack = LayerStack::open(&base, &sealed, &tmp.path().join("t1")).unwrap();
    assert_eq!(read_all(&stack), model);
    // Sealed below a new top, the zeros still shadow the 7s and the base.
    stack.seal(&tmp.path().join("t2")).unwrap();
    assert_eq!(read_all(&stack), model);
    let blocks: Vec<(u64, Vec<u8>)> = stack.sealed_layers()[1].present_blocks().map(Result::unwrap).collect();
    assert_eq!(blocks.len(), 2);
    assert_eq!(blocks[0], (3, vec![0u8; BS]));
    assert_eq!(blocks[1].0, 5);
    assert_eq!(blocks[1].1, model[5 * BS..6 * BS]);
}

#[test]
fn partial_write_copies_the_block_up_from_the_right_layer() {
    let (tmp, base, mut model) = setup(SIZE, 3);
    let mut stack = LayerStack::create(&base, &[], &tmp.path().join("t0")).unwrap();
    write(&mut stack, &mut model, &[9u8; BS], 2 * BS);
    stack.seal(&tmp.path().join("t1")).unwrap();
    // Ten bytes across the 2|3 boundary: block 2 comes from the sealed layer, 3 from the base.
    write(&mut stack, &mut model, &[0xAB; 10], 3 * BS - 5);
    assert_eq!(stack.stats().top_blocks, 2);
    let top: Vec<(u64, Vec<u8>)> = stack.top().unwrap().present_blocks().map(Result::unwrap).collect();
    assert_eq!(top, vec![(2, model[2 * BS..3 * BS].to_vec()), (3, model[3 * BS..4 * BS].to_vec())]);
    assert_eq!(top[0].1[..BS - 5], [9u8; BS - 5]);
    assert_eq!(top[1].1[5..], model[3 * BS + 5..4 * BS]);
    // The partial last block (1000 bytes) too.
    write(&mut stack, &mut model, &[1u8; 3], SIZE - 3);
    let last = stack.top().unwrap().present_blocks().map(Result::unwrap).last().unwrap();
    assert_eq!((last.0, last.1.len()), (64, 1000));
    assert_eq!(read_all(&stack), model);
}

#[test]
fn crash_without_flush_returns_to_the_last_flush() {
    let (tmp, base, mut model) = setup(SIZE, 4);
    let top = tmp.path().join("t0");
    let mut stack = LayerStack::create(&base, &[], &top).unwrap();
    let mut rng = Rng(5);
    let flushed_data = rng.nonzero_bytes(4 * BS);
    write(&mut stack, &mut model, &flushed_data, 0);
    stack.flush().unwrap();
    assert!(!stack.stats().unflushed);
    let flushed = model.clone();
    // After the flush: overwrite a present block in place, add new blocks, a partial one.
    let later = rng.nonzero_bytes(2 * BS);
    write(&mut stack, &mut model, &later[..BS], BS);
    write(&mut stack, &mut model, &later, 6 * BS);
    write(&mut stack, &mut model, &[0u8; 100], 9 * BS + 50);
    assert!(stack.stats().unflushed);
    drop(stack); // Crash: no flush.

    let mut stack = LayerStack::open(&base, &[], &top).unwrap();
    assert_eq!(stack.stats().top_blocks, 4, "only the flushed bitmap counts");
    // Blocks added after the flush fall through again: exactly the flushed state.
    let mut expect = flushed.clone();
    // A block present at the flush is overwritten in place; this process's page cache
    // survived the "crash", so it shows the later write (a real crash may show either).
    expect[BS..2 * BS].copy_from_slice(&later[..BS]);
    assert_eq!(read_all(&stack), expect);
    assert_eq!(expect[6 * BS..10 * BS], flushed[6 * BS..10 * BS]);
    // The stale bytes left in the top's data file for block 6 never leak: a partial
    // write copies block 6 up from the base again first.
    let mut model = expect;
    write(&mut stack, &mut model, &[3u8; 8], 6 * BS + 100);
    assert_eq!(model[6 * BS..6 * BS + 100], flushed[6 * BS..6 * BS + 100]);
    assert_eq!(read_all(&stack), model);
}

#[test]
fn seal_cost_is_independent_of_disk_size() {
    const GIB: u64 = 1 << 30;
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base.img");
    fs::File::create(&base).unwrap().set_len(GIB).unwrap();
    let (t0, t1) = (tmp.path().join("t0"), tmp.path().join("t1"));
    let mut stack = LayerStack::create(&base, &[], &t0).unwrap();
    for (i, at) in [0u64, GIB / 2 + 123, GIB - 10].into_iter().enumerate() {
        stack.write_at(&[i as u8 + 1; 10], at).unwrap();
    }
    let info = stack.seal(&t1).unwrap();
    assert_eq!(info.blocks, 3);
    let bitmap_len = encoded_len(GIB / BLOCK_SIZE);
    assert_eq!(bitmap_len, 32 * 1024 + 76);
    assert_eq!(info.bytes_written, 2 * bitmap_len, "a seal writes two bitmaps and no data");
    let allocated = |p: &Path| fs::metadata(p).unwrap().blocks() * 512;
    assert_eq!(allocated(&t1.join(DATA_FILE)), 0, "the new top is all holes");
    assert!(allocated(&t1.join(BITMAP_FILE)) <= 40 * 1024);
    assert!(allocated(&t0.join(BITMAP_FILE)) <= 40 * 1024);
    // The sealed layer holds its 3 blocks, not a copy of the gigabyte.
    assert!(allocated(&t0.join(DATA_FILE)) <= 16 * BLOCK_SIZE, "{}", allocated(&t0.join(DATA_FILE)));
    assert_eq!(fs::metadata(t1.join(DATA_FILE)).unwrap().len(), GIB);
    let mut buf = [0u8; 10];
    stack.read_at(&mut buf, GIB / 2 + 123).unwrap();
    assert_eq!(buf, [2u8; 10]);
    stack.read_at(&mut buf, GIB / 2 + 4096 * 7).unwrap();
    assert_eq!(buf, [0u8; 10]);
}

#[test]
fn recover_seal_opens_either_side_of_the_commit() {
    let (tmp, base, mut model) = setup(SIZE, 6);
    let (t0, t1) = (tmp.path().join("t0"), tmp.path().join("t1"));

    // Crash after the new top was created, before the commit: back to t0 as the top.
    let mut stack = LayerStack::create(&base, &[], &t0).unwrap();
    write(&mut stack, &mut model, &[5u8; 3000], 7000);
    stack.flush().unwrap();
    Layer::create(&t1, SIZE as u64, stack.top().unwrap().id()).unwrap();
    drop(stack);
    let mut stack = LayerStack::recover_seal(&base, &[], &t0, &t1).unwrap();
    assert!(!t1.exists(), "the unused new top is removed");
    assert_eq!(stack.top().unwrap().dir(), t0);
    assert_eq!(read_all(&stack), model);

    // Crash after the commit: t0 is sealed, t1 is the top.
    stack.seal(&t1).unwrap();
    let t0_state = model.clone();
    write(&mut stack, &mut model, &[6u8; 10], 0);
    stack.flush().unwrap();
    drop(stack);
    let stack = LayerStack::recover_seal(&base, &[], &t0, &t1).unwrap();
    assert_eq!(stack.sealed_layers().len(), 1);
    assert_eq!(read_all(&stack), model);
    drop(stack);

    // Committed, but the new top is gone (a failed seal removed it): a fresh one is
    // created over t0, which holds the disk as sealed.
    fs::remove_dir_all(&t1).unwrap();
    let stack = LayerStack::recover_seal(&base, &[], &t0, &t1).unwrap();
    assert_eq!(stack.stats().top_blocks, 0);
    assert_eq!(read_all(&stack), t0_state);
    drop(stack);

    // A "new top" that is not the empty layer a seal leaves is never removed.
    let t2 = tmp.path().join("t2");
    let mut other = LayerStack::create(&base, &[], &t2).unwrap();
    other.write_at(&[1], 0).unwrap();
    other.flush().unwrap();
    let t3 = tmp.path().join("t3");
    LayerStack::create(&base, &[], &t3).unwrap();
    let err = LayerStack::recover_seal(&base, &[], &t2, &t3).unwrap_err();
    assert!(matches!(err, LayerError::RecoverSeal { .. }), "{err}");
    assert!(t3.exists());
}

#[test]
fn stack_structure_is_checked_on_open() {
    let (tmp, base, _) = setup(SIZE, 7);
    let p = |n: &str| tmp.path().join(n);
    let mut stack = LayerStack::create(&base, &[], &p("a")).unwrap();
    stack.write_at(&[1], 0).unwrap();
    stack.seal(&p("b")).unwrap();
    stack.write_at(&[2], 0).unwrap();
    stack.seal(&p("c")).unwrap();
    drop(stack);
    let err = LayerStack::open(&base, &[p("a")], &p("b")).unwrap_err();
    assert!(matches!(err, LayerError::TopSealed { .. }), "{err}");
    let err = LayerStack::open(&base, &[p("a"), p("b"), p("c")], &p("c")).unwrap_err();
    assert!(matches!(err, LayerError::NotSealed { ref path } if *path == p("c")), "{err}");
    let err = LayerStack::open(&base, &[p("b"), p("a")], &p("c")).unwrap_err();
    assert!(matches!(err, LayerError::ChainBroken { ref path, .. } if *path == p("b")), "{err}");
    let err = LayerStack::open(&base, &[p("a")], &p("c")).unwrap_err();
    assert!(matches!(err, LayerError::ChainBroken { ref path, .. } if *path == p("c")), "{err}");
    assert!(err.to_string().contains("wrong order"), "{err}");
    let err = LayerStack::create(&base, &[], &p("c")).unwrap_err();
    assert!(matches!(err, LayerError::LayerExists { .. }), "{err}");
    // Another disk's layer of another size.
    let small = p("small.img");
    fs::write(&small, [0u8; 8192]).unwrap();
    let err = LayerStack::open(&small, &[p("a"), p("b")], &p("c")).unwrap_err();
    assert!(matches!(err, LayerError::SizeMismatch { layer, base: 8192, .. } if layer == SIZE as u64), "{err}");
    // A truncated data file.
    fs::OpenOptions::new().write(true).open(p("b").join(DATA_FILE)).unwrap().set_len(4096).unwrap();
    let err = LayerStack::open(&base, &[p("a"), p("b")], &p("c")).unwrap_err();
    assert!(matches!(err, LayerError::DataSize { actual: 4096, .. }), "{err}");
    assert!(LayerStack::open(&p("missing.img"), &[], &p("c")).is_err());
}

#[test]
fn out_of_range_io_is_refused() {
    let (tmp, base, _) = setup(SIZE, 8);
    let mut stack = LayerStack::create(&base, &[], &tmp.path().join("t")).unwrap();
    let mut buf = [0u8; 2];
    let err = stack.read_at(&mut buf, SIZE as u64 - 1).unwrap_err();
    assert!(matches!(err, LayerError::OutOfRange { len: 2, .. }), "{err}");
    assert!(stack.write_at(&buf, SIZE as u64 - 1).is_err());
    assert!(stack.write_at(&buf, u64::MAX).is_err());
    stack.read_at(&mut [], SIZE as u64).unwrap();
    stack.write_at(&[], SIZE as u64).unwrap();
    assert!(stack.read_at(&mut [], SIZE as u64 + 1).is_err());
    assert_eq!(stack.stats().top_blocks, 0);
}

/// Rewrites the bitmap's CRC so a field change is seen as a checksummed file.
fn with_crc(mut bytes: Vec<u8>) -> Vec<u8> {
    let body = bytes.len() - 4;
    let crc = crc32fast::hash(&bytes[..body]);
    bytes[body..].copy_from_slice(&crc.to_le_bytes());
    bytes
}

#[test]
fn damaged_bitmaps_are_refused_with_clear_errors() {
    let (tmp, base, _) = setup(SIZE, 9);
    let dir = tmp.path().join("t");
    let mut stack = LayerStack::create(&base, &[], &dir).unwrap();
    stack.write_at(&[1u8; 20], 4090).unwrap();
    stack.flush().unwrap();
    drop(stack);
    let path = dir.join(BITMAP_FILE);
    let good = fs::read(&path).unwrap();
    assert_eq!(good.len() as u64, encoded_len(65));
    let set = |at: usize, v: &[u8]| {
        let mut b = good.clone();
        b[at..at + v.len()].copy_from_slice(v);
        b
    };
    let mut stray = good.clone();
    stray[HEADER_LEN + 8] |= 0x80; // Block 71 of 65.
    let cases: Vec<(&str, Vec<u8>, &str, &str)> = vec![
        ("empty", vec![], "BitmapTruncated", "truncated"),
        ("short", good[..40].to_vec(), "BitmapTruncated", "truncated"),
        ("cut", good[..good.len() - 1].to_vec(), "BitmapLength", "truncated"),
        ("trailing", [&good[..], &[0]].concat(), "BitmapLength", "trailing data"),
        ("magic", set(0, b"NOTALAYR"), "BitmapMagic", "not a layer bitmap"),
        ("version", set(8, &2u32.to_le_bytes()), "BitmapVersion", "version 2"),
        ("bit flip", set(HEADER_LEN, &[0xff]), "BitmapChecksum", "corrupt"),
        ("crc", set(good.len() - 1, &[good[good.len() - 1] ^ 1]), "BitmapChecksum", "checksum"),
        ("count cap", set(32, &(1u64 << 40).to_le_bytes()), "BitmapInvalid", "cap"),
        ("count", set(32, &129u64.to_le_bytes()), "BitmapLength", "header says"),
        ("flags", with_crc(set(12, &3u32.to_le_bytes())), "BitmapInvalid", "flag"),
        ("block size", with_crc(set(16, &512u32.to_le_bytes())), "BitmapInvalid", "block size"),
        ("reserved", with_crc(set(20, &[1])), "BitmapInvalid", "reserved"),
        ("size", with_crc(set(24, &(SIZE as u64 + BLOCK_SIZE).to_le_bytes())), "BitmapInvalid", "does not match"),
        ("zero id", with_crc(set(40, &[0; 16])), "BitmapInvalid", "all zero"),
        ("self parent", with_crc(set(56, &good[40..56])), "BitmapInvalid", "itself"),
        ("stray bits", with_crc(stray), "BitmapInvalid", "past the last block"),
    ];
    for (name, bytes, kind, text) in cases {
        fs::write(&path, &bytes).unwrap();
        let err = LayerStack::open(&base, &[], &dir).unwrap_err();
        assert!(format!("{err:?}").starts_with(kind), "{name}: wrong error {err:?}");
        let msg = err.to_string();
        assert!(msg.contains(text) && msg.contains(&path.display().to_string()), "{name}: unclear error: {msg}");
    }
    // Over the size cap: refused from its length, before reading it.
    fs::File::create(&path).unwrap().set_len(bitmap::max_encoded_len() + 1).unwrap();
    let err = inspect(&dir).unwrap_err();
    assert!(matches!(err, LayerError::BitmapTooLarge { .. }), "{err}");
    fs::remove_file(&path).unwrap();
    let err = inspect(&dir).unwrap_err();
    assert!(matches!(err, LayerError::ReadBitmap { .. }), "{err}");
    // Restored, the layer opens again with its block.
    fs::write(&path, &good).unwrap();
    let stack = LayerStack::open(&base, &[], &dir).unwrap();
    assert_eq!(stack.stats().top_blocks, 2);
}

#[test]
fn bitmap_bits_and_encoding_round_trip() {
    let mut bits = Bitmap::new(200);
    assert_eq!(bits.set_range(3, 3), 0);
    assert_eq!(bits.set_range(60, 130), 70);
    assert_eq!(bits.set_range(0, 64), 60);
    assert_eq!(bits.set_range(199, 500), 1);
    assert_eq!(bits.count_ones(), 131);
    assert!(bits.get(0) && bits.get(129) && !bits.get(130) && bits.get(199) && !bits.get(200));
    assert_eq!(bits.next_one(100), Some(100));
    assert_eq!(bits.next_one(130), Some(199));
    assert_eq!(bits.next_one(200), None);
    let header =
        bitmap::Header { sealed: true, disk_size: 200 * BLOCK_SIZE - 1, id: LayerId([1; 16]), parent: LayerId::BASE };
    let bytes = bitmap::encode(&header, &bits);
    assert_eq!(bytes.len() as u64, encoded_len(200));
    let (h, b) = bitmap::decode(Path::new("x"), &bytes).unwrap();
    assert_eq!((h, b), (header, bits));
    assert_eq!(LayerId::BASE.to_string(), "base");
    assert_eq!(LayerId([0xab; 16]).to_string(), "ab".repeat(16));
}

#[test]
fn a_lazy_top_creates_no_files_until_the_first_write() {
    let (tmp, base, content) = setup(SIZE, 41);
    let top = tmp.path().join("top");
    let mut stack = LayerStack::create_lazy(&base, &[], &top).unwrap();
    assert!(stack.top().is_none() && stack.top_is_empty());
    assert_eq!(read_all(&stack), content, "reads fall through to the base");
    stack.flush().unwrap();
    assert!(!top.exists(), "neither reads nor a flush create the top");
    let err = LayerStack::create_lazy(&base, &[], &tmp.path().join("base.img")).unwrap_err();
    assert!(matches!(err, LayerError::LayerExists { .. }), "{err}");

    stack.write_at(&[7u8; 10], 5).unwrap();
    assert!(top.join(DATA_FILE).exists() && !stack.top_is_empty());
    let mut expected = content.clone();
    expected[5..15].fill(7);
    assert_eq!(read_all(&stack), expected, "a partial first write copied its block up");
    stack.flush().unwrap();
    let sealed = stack.seal(&tmp.path().join("top2")).unwrap();
    assert_eq!((sealed.dir.as_path(), sealed.blocks), (top.as_path(), 1));
    let reopened = LayerStack::create_lazy(&base, std::slice::from_ref(&top), &tmp.path().join("top3")).unwrap();
    assert_eq!(read_all(&reopened), expected);
}
