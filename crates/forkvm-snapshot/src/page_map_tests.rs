//! Tests of `memory.map`: format checks, and build/apply round trips over flat maps, diffs and chains.

use super::*;
use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;

const P: usize = PAGE as usize;

/// Small deterministic PRNG (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn page(&mut self) -> Vec<u8> {
        let mut v = vec![0u8; P];
        for c in v.chunks_mut(8) {
            c.copy_from_slice(&self.next().to_le_bytes());
        }
        v
    }
}

struct Env {
    tmp: tempfile::TempDir,
    store: ChunkStore,
    n: u32,
}

impl Env {
    fn new() -> Env {
        let tmp = tempfile::tempdir().unwrap();
        let store = ChunkStore::open(tmp.path());
        Env { tmp, store, n: 0 }
    }

    /// A new sparse file of `size` bytes (all holes).
    fn sparse(&mut self, size: u64) -> File {
        self.n += 1;
        let path = self.tmp.path().join(format!("img{}", self.n));
        let f = OpenOptions::new().read(true).write(true).create_new(true).open(path).unwrap();
        f.set_len(size).unwrap();
        f
    }

    /// A sparse file holding `mem`, zero pages left as holes.
    fn image(&mut self, mem: &[u8]) -> File {
        let f = self.sparse(mem.len() as u64);
        for (i, page) in mem.chunks(P).enumerate() {
            if page.iter().any(|&b| b != 0) {
                f.write_all_at(page, (i * P) as u64).unwrap();
            }
        }
        f
    }

    /// A fully written (no holes) file holding `mem`, zero pages included.
    fn dense(&mut self, mem: &[u8]) -> File {
        let f = self.sparse(mem.len() as u64);
        f.write_all_at(mem, 0).unwrap();
        f
    }
}

fn contents(f: &File) -> Vec<u8> {
    let mut v = vec![0u8; f.metadata().unwrap().len() as usize];
    f.read_exact_at(&mut v, 0).unwrap();
    v
}

fn page_of(mem: &mut [u8], page: usize) -> &mut [u8] {
    &mut mem[page * P..(page + 1) * P]
}

fn chunk(i: u8) -> ExtentContent {
    ExtentContent::Chunk(ChunkId([i; 32]))
}

fn ext(first_page: u64, pages: u32, content: ExtentContent) -> Extent {
    Extent { first_page, pages, content }
}

fn sample_map() -> PageMap {
    PageMap {
        mem_size: 64 * PAGE,
        extents: vec![
            ext(0, 16, chunk(1)),
            ext(16, 2, ExtentContent::Zero),
            ext(18, 3, chunk(2)),
            ext(33, 15, chunk(1)),
            ext(63, 1, ExtentContent::Zero),
        ],
    }
}

fn rehash(mut b: Vec<u8>) -> Vec<u8> {
    let n = b.len() - 32;
    let h = blake3::hash(&b[..n]);
    b[n..].copy_from_slice(h.as_bytes());
    b
}

fn reason(r: Result<PageMap, PageMapError>) -> String {
    match r {
        Err(PageMapError::Format { reason }) => reason,
        other => panic!("expected a format error, got {other:?}"),
    }
}

#[test]
fn encode_decode_round_trip() {
    let map = sample_map();
    let bytes = map.encode();
    assert_eq!(bytes.len(), 32 + 5 * 48 + 32);
    assert_eq!(&bytes[..8], b"FKVMMAP\0");
    assert_eq!(PageMap::decode(&bytes).unwrap(), map);
    assert_eq!(map.present_pages(), 16 + 2 + 3 + 15 + 1);
    assert_eq!(map.data_pages(), 16 + 3 + 15);
    assert_eq!(map.chunks().collect::<Vec<_>>(), vec![ChunkId([1; 32]), ChunkId([2; 32]), ChunkId([1; 32])]);
    let empty = PageMap { mem_size: 0, extents: vec![] };
    assert_eq!(PageMap::decode(&empty.encode()).unwrap(), empty);
}

#[test]
fn decode_rejects_bad_header_and_trailer() {
    let good = sample_map().encode();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("truncated", good[..40].to_vec()),
        ("count", good[..good.len() - 1].to_vec()),
        ("count", rehash(good[..good.len() - 48].to_vec())),
        ("bad magic", rehash([b"FKVMMAQ\0".as_slice(), &good[8..]].concat())),
        ("version", rehash([&good[..8], &2u32.to_le_bytes(), &good[12..]].concat())),
        ("page size", rehash([&good[..12], &8192u32.to_le_bytes(), &good[16..]].concat())),
        ("mem_size", rehash([&good[..16], &(64 * PAGE + 1).to_le_bytes(), &good[24..]].concat())),
        ("mem_size", rehash([&good[..16], &(2u64 << 40).to_le_bytes(), &good[24..]].concat())),
        ("count", rehash([&good[..24], &u64::MAX.to_le_bytes(), &good[32..]].concat())),
        ("count", rehash([&good[..24], &(u64::MAX / 48 + 2).to_le_bytes(), &good[32..]].concat())),
        ("hash", {
            let mut b = good.clone();
            b[40] ^= 1;
            b
        }),
        ("hash", {
            let mut b = good.clone();
            let n = b.len();
            b[n - 1] ^= 1;
            b
        }),
        ("unknown kind", {
            let mut b = good.clone();
            b[32 + 12] = 2;
            rehash(b)
        }),
        ("padding", {
            let mut b = good.clone();
            b[32 + 14] = 1;
            rehash(b)
        }),
        ("non-zero chunk id", {
            let mut b = good.clone();
            b[32 + 48 + 16] = 7; // extent 1 is Zero
            rehash(b)
        }),
    ];
    for (want, bytes) in cases {
        let r = reason(PageMap::decode(&bytes));
        assert!(r.contains(want), "expected {want:?} in {r:?}");
    }
}

#[test]
fn decode_rejects_bad_extents() {
    let m = |extents: Vec<Extent>| PageMap { mem_size: 64 * PAGE, extents };
    let cases = [
        ("overlapping", m(vec![ext(0, 4, chunk(1)), ext(3, 2, chunk(2))])),
        ("unsorted", m(vec![ext(20, 4, chunk(1)), ext(3, 2, chunk(2))])),
        ("unsorted", m(vec![ext(3, 2, chunk(1)), ext(3, 2, chunk(2))])),
        ("cross a 64 KiB window", m(vec![ext(15, 2, chunk(1))])),
        ("cross a 64 KiB window", m(vec![ext(8, 16, ExtentContent::Zero)])),
        ("out of bounds", m(vec![ext(63, 2, chunk(1))])),
        ("out of bounds", m(vec![ext(64, 1, chunk(1))])),
        ("out of bounds", m(vec![ext(u64::MAX, 1, chunk(1))])),
        ("1..=16", m(vec![ext(0, 0, chunk(1))])),
        ("1..=16", m(vec![ext(0, 17, chunk(1))])),
    ];
    for (want, map) in cases {
        let r = reason(PageMap::decode(&map.encode()));
        assert!(r.contains(want), "expected {want:?} in {r:?}");
    }
    // Adjacent extents are fine.
    let ok = m(vec![ext(0, 4, chunk(1)), ext(4, 12, ExtentContent::Zero), ext(16, 16, chunk(2))]);
    assert_eq!(PageMap::decode(&ok.encode()).unwrap(), ok);
}

#[test]
fn map_file_round_trip_and_errors_name_the_path() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("memory.map");
    let map = sample_map();
    map.write_file(&path).unwrap();
    assert_eq!(PageMap::read_file(&path).unwrap(), map);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[20] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    let err = PageMap::read_file(&path).unwrap_err();
    assert!(matches!(&err, PageMapError::FileFormat { path: p, .. } if *p == path), "{err}");
    assert!(err.to_string().contains(&path.display().to_string()), "{err}");
    let missing = PageMap::read_file(&tmp.path().join("nope")).unwrap_err();
    assert!(matches!(missing, PageMapError::Io { step: "open map file", .. }), "{missing}");
    let big = OpenOptions::new().write(true).truncate(true).open(&path).unwrap();
    big.set_len(MAX_MAP_FILE + 10).unwrap();
    let err = PageMap::read_file(&path).unwrap_err();
    assert!(err.to_string().contains("cap"), "{err}");
}

#[test]
fn flat_map_of_sparse_file_round_trips() {
    let mut env = Env::new();
    let size = 64 << 20; // 16384 pages, mostly holes
    let pages = (size / PAGE) as usize;
    let mut mem = vec![0u8; size as usize];
    let mut rng = Rng(42);
    let mut nonzero = HashSet::new();
    for _ in 0..100 {
        let p = rng.below(pages as u64) as usize;
        page_of(&mut mem, p).copy_from_slice(&rng.page());
        nonzero.insert(p);
    }
    // A fully populated window, a partial one, the first and last pages, a single non-zero byte.
    for p in (32..48).chain(50..53).chain([0, pages - 1]) {
        page_of(&mut mem, p).copy_from_slice(&rng.page());
        nonzero.insert(p);
    }
    page_of(&mut mem, 1000)[P - 1] = 1;
    nonzero.insert(1000);
    let src = env.image(&mem);
    let (map, stats) = build_page_map(&src, None, size, &env.store).unwrap();
    assert_eq!(map.mem_size, size);
    assert_eq!(map.data_pages(), nonzero.len() as u64);
    assert_eq!(map.present_pages(), nonzero.len() as u64);
    assert_eq!(stats.pages_changed, nonzero.len() as u64);
    assert_eq!(stats.zero_pages_changed, 0);
    // Holes were skipped: only windows holding data were read (on filesystems
    // that report holes at page granularity; allow slack for coarser ones).
    let windows: HashSet<_> = nonzero.iter().map(|p| p / 16).collect();
    assert!(stats.pages_scanned >= windows.len() as u64 * 16 - 16);
    assert!(stats.pages_scanned <= windows.len() as u64 * 16 * 2, "scanned {}", stats.pages_scanned);
    assert!(stats.pages_scanned < pages as u64 / 4, "scanned {}", stats.pages_scanned);
    assert!(map.extents.iter().any(|e| e.first_page == 32 && e.pages == 16));
    assert!(map.extents.iter().any(|e| e.first_page == 50 && e.pages == 3));
    assert_eq!(stats.chunks_new + stats.chunks_reused, map.chunks().count() as u64);
    assert!(stats.bytes_stored > 0);
    // The built map passes the decoder's checks.
    assert_eq!(PageMap::decode(&map.encode()).unwrap(), map);

    let out = env.sparse(size);
    let applied = apply_page_map(&map, &env.store, &out).unwrap();
    assert_eq!(applied.chunks_read, map.chunks().count() as u64);
    assert_eq!(applied.bytes_written, nonzero.len() as u64 * PAGE);
    assert_eq!(applied.zero_pages, 0);
    assert!(contents(&out) == mem, "applied image differs");
    // The result stays sparse.
    assert!(out.metadata().unwrap().blocks() * 512 < size / 4);

    // A dense file (no holes) of the same contents gives the same map.
    let dense = env.dense(&mem);
    let (map2, stats2) = build_page_map(&dense, None, size, &env.store).unwrap();
    assert_eq!(map2, map);
    assert_eq!(stats2.chunks_new, 0);
    assert_eq!(stats2.pages_scanned, pages as u64);
}

#[test]
fn diff_holds_exactly_the_changed_pages() {
    let mut env = Env::new();
    let pages = 80; // 5 windows
    let size = pages as u64 * PAGE;
    let mut rng = Rng(7);
    let mut parent = vec![0u8; size as usize];
    for p in 0..60 {
        page_of(&mut parent, p).copy_from_slice(&rng.page());
    }
    let mut child = parent.clone();
    let changed = [1usize, 2, 3, 17, 40, 70, 79];
    let zeroed = [5usize, 6, 16, 33];
    for &p in &changed {
        page_of(&mut child, p).copy_from_slice(&rng.page());
    }
    for &p in &zeroed {
        page_of(&mut child, p).fill(0);
    }
    // Page 4 gets one different byte; page 55 stays the same.
    page_of(&mut child, 4)[100] ^= 0xff;

    let parent_file = env.image(&parent);
    // The child is rewritten in full: unchanged pages have identical bytes but are not holes.
    let child_file = env.dense(&child);
    let (base, _) = build_page_map(&parent_file, None, size, &env.store).unwrap();
    let (diff, stats) = build_page_map(&child_file, Some(&parent_file), size, &env.store).unwrap();
    let data_changed = changed.len() as u64 + 1;
    assert_eq!(stats.pages_changed, data_changed + zeroed.len() as u64);
    assert_eq!(stats.zero_pages_changed, zeroed.len() as u64);
    assert_eq!(diff.data_pages(), data_changed);
    assert_eq!(diff.present_pages(), data_changed + zeroed.len() as u64);
    assert_eq!(stats.pages_scanned, pages as u64);
    // Exactly these extents: runs split by kind and by window.
    let kinds: Vec<(u64, u32, bool)> =
        diff.extents.iter().map(|e| (e.first_page, e.pages, e.content == ExtentContent::Zero)).collect();
    assert_eq!(
        kinds,
        vec![
            (1, 4, false),
            (5, 2, true),
            (16, 1, true),
            (17, 1, false),
            (33, 1, true),
            (40, 1, false),
            (70, 1, false),
            (79, 1, false)
        ]
    );
    assert_eq!(PageMap::decode(&diff.encode()).unwrap(), diff);

    let out = env.sparse(size);
    apply_page_map(&base, &env.store, &out).unwrap();
    assert!(contents(&out) == parent);
    let applied = apply_page_map(&diff, &env.store, &out).unwrap();
    assert_eq!(applied.zero_pages, zeroed.len() as u64);
    assert_eq!(applied.chunks_read, 5);
    assert!(contents(&out) == child, "parent + diff differs from the child");

    // No change at all: an empty diff.
    let (same, stats) = build_page_map(&child_file, Some(&child_file), size, &env.store).unwrap();
    assert!(same.extents.is_empty());
    assert_eq!(stats.pages_changed, 0);
}

#[test]
fn identical_windows_share_chunks() {
    let mut env = Env::new();
    let size = 8 * WINDOW;
    let mut rng = Rng(99);
    let mut a = vec![0u8; size as usize];
    for p in 0..(size / PAGE) as usize {
        page_of(&mut a, p).copy_from_slice(&rng.page());
    }
    let mut b = a.clone();
    // Change one page in window 2 only.
    page_of(&mut b, 2 * 16 + 5).copy_from_slice(&rng.page());
    let (ma, sa) = build_page_map(&env.image(&a), None, size, &env.store).unwrap();
    assert_eq!((sa.chunks_new, sa.chunks_reused), (8, 0));
    let (mb, sb) = build_page_map(&env.image(&b), None, size, &env.store).unwrap();
    assert_eq!((sb.chunks_new, sb.chunks_reused), (1, 7));
    let shared = ma.chunks().collect::<HashSet<_>>().intersection(&mb.chunks().collect()).count();
    assert_eq!(shared, 7);
    assert_eq!(env.store.list().unwrap().len(), 9);
}

#[test]
fn chain_of_random_diffs_applies_to_head() {
    let mut env = Env::new();
    let pages = 16 * 12 + 5; // a partial last window
    let size = pages as u64 * PAGE;
    let mut rng = Rng(0x5eed);
    let mut mem = vec![0u8; size as usize];
    for _ in 0..60 {
        let p = rng.below(pages as u64) as usize;
        page_of(&mut mem, p).copy_from_slice(&rng.page());
    }
    let mut prev = env.image(&mem);
    let (base, _) = build_page_map(&prev, None, size, &env.store).unwrap();
    let mut maps = vec![base];
    let mut head = mem.clone();
    for _ in 0..3 {
        for _ in 0..40 {
            let p = rng.below(pages as u64) as usize;
            match rng.below(4) {
                0 => page_of(&mut head, p).fill(0),
                1 => page_of(&mut head, p)[rng.below(P as u64) as usize] ^= 0x5a,
                _ => page_of(&mut head, p).copy_from_slice(&rng.page()),
            }
        }
        let next = env.image(&head);
        let (diff, _) = build_page_map(&next, Some(&prev), size, &env.store).unwrap();
        maps.push(PageMap::decode(&diff.encode()).unwrap());
        prev = next;
    }
    let out = env.sparse(size);
    for map in &maps {
        apply_page_map(map, &env.store, &out).unwrap();
    }
    assert!(contents(&out) == head, "base + 3 diffs differs from the head");
}

#[test]
fn apply_checks_sizes() {
    let mut env = Env::new();
    let mut mem = vec![0u8; 2 * WINDOW as usize];
    mem[0] = 1;
    let (map, _) = build_page_map(&env.image(&mem), None, mem.len() as u64, &env.store).unwrap();
    let wrong = env.sparse(WINDOW);
    let err = apply_page_map(&map, &env.store, &wrong).unwrap_err();
    assert!(
        matches!(err, PageMapError::SizeMismatch { expected, actual, .. } if expected == 2 * WINDOW && actual == WINDOW)
    );
    // A chunk of the wrong length for its extent.
    let short = env.store.put(&[1u8; 100]).unwrap().id;
    let bad = PageMap { mem_size: 2 * WINDOW, extents: vec![ext(0, 1, ExtentContent::Chunk(short))] };
    let out = env.sparse(2 * WINDOW);
    let err = apply_page_map(&bad, &env.store, &out).unwrap_err();
    assert!(matches!(err, PageMapError::ChunkLength { expected: 4096, actual: 100, .. }), "{err}");
    // A missing chunk.
    let gone = PageMap { mem_size: 2 * WINDOW, extents: vec![ext(0, 1, chunk(9))] };
    let err = apply_page_map(&gone, &env.store, &out).unwrap_err();
    assert!(matches!(&err, PageMapError::Chunk(c) if c.is_missing()), "{err}");
    // Build refuses a file of the wrong size and an unaligned mem_size.
    let f = env.sparse(WINDOW);
    assert!(matches!(build_page_map(&f, None, 2 * WINDOW, &env.store), Err(PageMapError::SizeMismatch { .. })));
    assert!(matches!(build_page_map(&f, None, 100, &env.store), Err(PageMapError::BadMemSize { .. })));
}

#[test]
fn zero_extents_punch_holes() {
    let mut env = Env::new();
    let size = 4 * WINDOW;
    let out = env.dense(&vec![0xeeu8; size as usize]);
    let map = PageMap {
        mem_size: size,
        extents: vec![
            ext(0, 16, ExtentContent::Zero),
            ext(16, 16, ExtentContent::Zero),
            ext(40, 3, ExtentContent::Zero),
        ],
    };
    let stats = apply_page_map(&map, &env.store, &out).unwrap();
    assert_eq!(stats.zero_pages, 35);
    let got = contents(&out);
    let zero_page = |p: usize| got[p * P..(p + 1) * P].iter().all(|&b| b == 0);
    assert!((0..32).chain(40..43).all(zero_page));
    assert!((32..40).chain(43..64).all(|p| got[p * P..(p + 1) * P].iter().all(|&b| b == 0xee)));
}
