//! Sealed layers' bitmaps, decoded once per process and shared by the processes it forks.
//!
//! Why: every VMM a spawn forks opens the same sealed layers of its disks, and each read
//! and decoded every one of their bitmaps on its own: most of a restore's disk opening
//! (~0.4 ms of each child's host CPU here, `docs/benchmarks.md`) and a private copy of the
//! words in each child (128 KiB a layer of a 4 GiB disk). A process that forks VMMs (the
//! zygote) calls [`preload`] for their sealed layers first; a layer opened afterwards, in
//! it or in a child it forked, takes the decoded bitmap from here, its pages shared
//! copy-on-write.
//!
//! An entry is found by the identity of the file the layer's bitmap is read from (device,
//! inode, size, modification and change times, from `fstat` of the descriptor opened):
//! a sealed layer never changes, and a replaced or rewritten file is a miss, read as
//! before. Only sealed bitmaps are kept, at most [`MAX_ENTRIES`], the oldest dropped
//! first.

use super::bitmap::{Bitmap, Header};
use super::{LayerError, BITMAP_FILE};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// Most bitmaps kept (a spawner serves many templates over its life).
pub const MAX_ENTRIES: usize = 64;

/// Which file a bitmap was read from, as `fstat` tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FileKey {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl FileKey {
    pub(super) fn of(meta: &std::fs::Metadata) -> FileKey {
        FileKey {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }
}

static ENTRIES: Mutex<Vec<(FileKey, Header, Arc<Bitmap>)>> = Mutex::new(Vec::new());

/// The decoded bitmap of the file `key` names, if [`preload`] kept it.
pub(super) fn lookup(key: &FileKey) -> Option<(Header, Arc<Bitmap>)> {
    let entries = ENTRIES.lock().unwrap_or_else(|e| e.into_inner());
    entries.iter().find(|(k, _, _)| k == key).map(|(_, h, b)| (*h, b.clone()))
}

fn keep(key: FileKey, header: Header, bits: Arc<Bitmap>) {
    let mut entries = ENTRIES.lock().unwrap_or_else(|e| e.into_inner());
    if entries.iter().any(|(k, _, _)| *k == key) {
        return;
    }
    if entries.len() >= MAX_ENTRIES {
        entries.remove(0);
    }
    entries.push((key, header, bits));
}

/// Reads and decodes the bitmap of the layer at `dir` (a miss) and keeps it if the layer
/// is sealed; returns whether it is kept. For a process about to fork VMMs that open
/// `dir`.
pub fn preload(dir: &Path) -> Result<bool, LayerError> {
    let (key, header, bits) = super::bitmap::read_file_keyed(&dir.join(BITMAP_FILE))?;
    if header.sealed {
        keep(key, header, bits);
    }
    Ok(header.sealed)
}

/// How many bitmaps are kept (for tests and reports).
pub fn kept() -> usize {
    ENTRIES.lock().unwrap_or_else(|e| e.into_inner()).len()
}

#[cfg(test)]
mod tests {
    use super::super::layer::Layer;
    use super::super::{LayerStack, BLOCK_SIZE};
    use super::*;

    /// A base and one sealed layer `t0` holding blocks 1 and 5, with `t1` the top.
    fn sealed_layer() -> (tempfile::TempDir, std::path::PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().join("base.img");
        std::fs::write(&base, vec![7u8; 16 * BLOCK_SIZE as usize]).unwrap();
        let t0 = tmp.path().join("t0");
        let mut stack = LayerStack::create(&base, &[], &t0).unwrap();
        stack.write_at(&[1u8; 10], BLOCK_SIZE).unwrap();
        stack.write_at(&[5u8; 10], 5 * BLOCK_SIZE).unwrap();
        stack.seal(&tmp.path().join("t1")).unwrap();
        (tmp, t0)
    }

    #[test]
    fn a_preloaded_sealed_bitmap_is_shared_by_every_open_until_its_file_changes() {
        let (tmp, t0) = sealed_layer();
        // Not preloaded: each open decodes its own.
        let (a, b) = (Layer::open_sealed(&t0).unwrap(), Layer::open_sealed(&t0).unwrap());
        assert!(!std::ptr::eq(a.bitmap(), b.bitmap()));
        assert!(preload(&t0).unwrap());
        let (c, d) = (Layer::open_sealed(&t0).unwrap(), Layer::open_sealed(&t0).unwrap());
        assert!(std::ptr::eq(c.bitmap(), d.bitmap()), "both share the preloaded bitmap");
        assert_eq!(c.bitmap(), a.bitmap(), "and it says what the file says");
        assert!((0..16).filter(|i| c.is_present(*i)).eq([1, 5]));

        // The same bytes written again make another file as far as the cache knows (its
        // change time moves): read afresh, not taken from the cache.
        let path = t0.join(BITMAP_FILE);
        let bytes = std::fs::read(&path).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&path, &bytes).unwrap();
        let e = Layer::open_sealed(&t0).unwrap();
        assert!(!std::ptr::eq(e.bitmap(), c.bitmap()));
        assert_eq!(e.bitmap(), a.bitmap());
        drop(tmp);
    }

    #[test]
    fn a_top_is_never_kept_and_a_missing_layer_is_an_error() {
        let (tmp, _) = sealed_layer();
        assert!(!preload(&tmp.path().join("t1")).unwrap(), "the top is not sealed");
        assert!(preload(&tmp.path().join("nothing")).is_err());
    }

    #[test]
    fn at_most_max_entries_are_kept() {
        let (_tmp, t0) = sealed_layer();
        let layers: Vec<_> = (0..MAX_ENTRIES + 3).map(|_| sealed_layer()).collect();
        preload(&t0).unwrap();
        for (_, dir) in &layers {
            preload(dir).unwrap();
        }
        assert!(kept() <= MAX_ENTRIES);
        // The oldest went first: t0's bitmap is read afresh, the newest is shared.
        let newest = &layers.last().unwrap().1;
        let (a, b) = (Layer::open_sealed(newest).unwrap(), Layer::open_sealed(newest).unwrap());
        assert!(std::ptr::eq(a.bitmap(), b.bitmap()));
        let (c, d) = (Layer::open_sealed(&t0).unwrap(), Layer::open_sealed(&t0).unwrap());
        assert!(!std::ptr::eq(c.bitmap(), d.bitmap()));
    }
}
