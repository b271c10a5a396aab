//! Sparse guest memory images (`memory.img`).
//!
//! Guest memory is mostly zero pages, and gigabytes of zeros should cost no
//! disk space or write bandwidth. The image is created at its full logical
//! size as one big hole; writing skips all-zero pages so they stay holes and
//! read back as zeros. Runs of non-zero pages are coalesced into one
//! positional write to keep syscall counts low.

use std::fs::{File, OpenOptions};
use std::io;
use std::ops::{Add, AddAssign};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

/// Granularity of zero detection: a guest page.
pub const PAGE_SIZE: usize = 4096;

/// Why a memory image could not be created, opened or written.
#[derive(Debug, thiserror::Error)]
pub enum MemoryImageError {
    /// Creating or sizing a new image failed.
    #[error("memory.img: cannot create {path} ({size} bytes): {source}")]
    CreateImage {
        /// The image file.
        path: PathBuf,
        /// Requested logical size.
        size: u64,
        /// Underlying error.
        source: io::Error,
    },
    /// The image file does not exist.
    #[error("memory.img missing: {path} does not exist")]
    Missing {
        /// The image file.
        path: PathBuf,
    },
    /// Opening or stat-ing an existing image failed.
    #[error("memory.img: cannot open {path}: {source}")]
    OpenImage {
        /// The image file.
        path: PathBuf,
        /// Underlying error.
        source: io::Error,
    },
    /// The image's size differs from what the snapshot metadata records.
    #[error("memory.img is {actual} bytes, snapshot says {expected}: truncated or not this snapshot's ({path})")]
    SizeMismatch {
        /// The image file.
        path: PathBuf,
        /// Size recorded in the snapshot metadata.
        expected: u64,
        /// Size of the file on disk.
        actual: u64,
    },
    /// A positional write of guest memory failed.
    #[error("memory.img: cannot write {len} bytes at offset {offset:#x}: {source}")]
    WriteData {
        /// File offset of the failed write.
        offset: u64,
        /// Length of the failed write.
        len: usize,
        /// Underlying error.
        source: io::Error,
    },
}

/// What [`write_sparse`] did; sum over regions with `+=`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SparseStats {
    /// Bytes actually written to the file.
    pub bytes_written: u64,
    /// Pages skipped because they were all zero (left as holes).
    pub zero_pages_skipped: u64,
    /// Pages (including a partial tail page) that were written.
    pub data_pages: u64,
}

impl AddAssign for SparseStats {
    fn add_assign(&mut self, rhs: Self) {
        self.bytes_written += rhs.bytes_written;
        self.zero_pages_skipped += rhs.zero_pages_skipped;
        self.data_pages += rhs.data_pages;
    }
}

impl Add for SparseStats {
    type Output = SparseStats;

    fn add(mut self, rhs: Self) -> Self {
        self += rhs;
        self
    }
}

/// Returns true if every byte of `buf` is zero.
///
/// ORs each 128-byte block together in a branch-free loop that the compiler
/// turns into wide vector ORs, and only branches once per block, so a
/// non-zero page exits early while zero pages run at memory bandwidth
/// (tens of GB/s when cached).
fn is_zero(buf: &[u8]) -> bool {
    const BLOCK: usize = 128;
    let mut blocks = buf.chunks_exact(BLOCK);
    for block in &mut blocks {
        if block.iter().fold(0u8, |acc, &b| acc | b) != 0 {
            return false;
        }
    }
    blocks.remainder().iter().all(|&b| b == 0)
}

/// Writes `data` at `offset`, leaving all-zero pages as holes.
///
/// Pages are counted from the start of `data` (the last one may be partial).
/// Consecutive non-zero pages are written with a single positional write.
/// The target range must not hold stale data (use a file from
/// [`create_image`]): skipped pages are not written, so they read back as
/// whatever the file already contains there — zeros for a hole.
pub fn write_sparse(file: &File, offset: u64, data: &[u8]) -> Result<SparseStats, MemoryImageError> {
    let mut stats = SparseStats::default();
    // Start (within `data`) of the current run of non-zero pages.
    let mut run_start: Option<usize> = None;
    let mut pos = 0;
    for page in data.chunks(PAGE_SIZE) {
        if is_zero(page) {
            stats.zero_pages_skipped += 1;
            if let Some(start) = run_start.take() {
                flush(file, offset, &data[start..pos], start, &mut stats)?;
            }
        } else {
            stats.data_pages += 1;
            run_start.get_or_insert(pos);
        }
        pos += page.len();
    }
    if let Some(start) = run_start {
        flush(file, offset, &data[start..], start, &mut stats)?;
    }
    Ok(stats)
}

/// Writes one run of non-zero pages found at `start` within the caller's data.
fn flush(file: &File, base: u64, run: &[u8], start: usize, stats: &mut SparseStats) -> Result<(), MemoryImageError> {
    let at = base + start as u64;
    file.write_all_at(run, at).map_err(|source| MemoryImageError::WriteData { offset: at, len: run.len(), source })?;
    stats.bytes_written += run.len() as u64;
    Ok(())
}

/// Creates (or truncates) `path` as a `size`-byte image that is all holes,
/// opened read+write.
pub fn create_image(path: &Path, size: u64) -> Result<File, MemoryImageError> {
    let err = |source| MemoryImageError::CreateImage { path: path.to_path_buf(), size, source };
    let file = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(path).map_err(err)?;
    file.set_len(size).map_err(err)?;
    Ok(file)
}

/// Opens an existing image read-only and checks it is `expected_size` bytes.
pub fn open_image(path: &Path, expected_size: u64) -> Result<File, MemoryImageError> {
    let err = |source| MemoryImageError::OpenImage { path: path.to_path_buf(), source };
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(MemoryImageError::Missing { path: path.to_path_buf() })
        }
        Err(e) => return Err(err(e)),
    };
    let meta = file.metadata().map_err(err)?;
    if !meta.is_file() {
        return Err(err(io::Error::new(io::ErrorKind::InvalidInput, "not a regular file")));
    }
    if meta.len() != expected_size {
        return Err(MemoryImageError::SizeMismatch {
            path: path.to_path_buf(),
            expected: expected_size,
            actual: meta.len(),
        });
    }
    Ok(file)
}

/// Bytes of disk actually allocated to `file` (holes cost nothing).
pub fn allocated_bytes(file: &File) -> io::Result<u64> {
    Ok(file.metadata()?.blocks() * 512)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    const MIB: u64 = 1 << 20;

    fn read_all(file: &File, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        file.read_exact_at(&mut buf, 0).unwrap();
        buf
    }

    #[test]
    fn is_zero_detects_any_nonzero_byte() {
        let mut page = vec![0u8; PAGE_SIZE + 7];
        assert!(is_zero(&page));
        for i in [0, 15, 16, 255, 256, PAGE_SIZE - 1, PAGE_SIZE + 6] {
            page[i] = 1;
            assert!(!is_zero(&page), "byte {i}");
            page[i] = 0;
        }
        assert!(is_zero(&[]));
    }

    #[test]
    fn zero_memory_stays_a_hole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("memory.img");
        let file = create_image(&path, 8 * MIB).unwrap();
        let data = vec![0u8; 8 * MIB as usize];
        let stats = write_sparse(&file, 0, &data).unwrap();
        assert_eq!(stats.bytes_written, 0);
        assert_eq!(stats.data_pages, 0);
        assert_eq!(stats.zero_pages_skipped, 2048);
        assert_eq!(file.metadata().unwrap().len(), 8 * MIB);
        assert!(allocated_bytes(&file).unwrap() < MIB / 8);
        assert_eq!(read_all(&file, data.len()), data);
    }

    #[test]
    fn data_round_trips_byte_identical() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("memory.img");
        let len = 64 * PAGE_SIZE + 100;
        let mut data = vec![0u8; len];
        // Scatter data: some full pages, single bytes, and the partial tail.
        for i in (0..len).step_by(3 * PAGE_SIZE + 11) {
            data[i] = (i % 251) as u8 | 1;
        }
        data[10 * PAGE_SIZE..12 * PAGE_SIZE].fill(0xab);
        data[len - 1] = 0x5a;
        let file = create_image(&path, len as u64).unwrap();
        let stats = write_sparse(&file, 0, &data).unwrap();
        assert!(stats.zero_pages_skipped > 0);
        assert_eq!(stats.data_pages + stats.zero_pages_skipped, 65);
        drop(file);
        let file = open_image(&path, len as u64).unwrap();
        assert_eq!(read_all(&file, len), data);
    }

    #[test]
    fn writes_at_offset_and_sums_stats() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("memory.img");
        let file = create_image(&path, 4 * PAGE_SIZE as u64).unwrap();
        let a = vec![1u8; PAGE_SIZE];
        let b = vec![2u8; PAGE_SIZE];
        let mut total = write_sparse(&file, 0, &a).unwrap();
        total += write_sparse(&file, 3 * PAGE_SIZE as u64, &b).unwrap();
        assert_eq!(total.data_pages, 2);
        assert_eq!(total.bytes_written, 2 * PAGE_SIZE as u64);
        let all = read_all(&file, 4 * PAGE_SIZE);
        assert!(all[..PAGE_SIZE].iter().all(|&x| x == 1));
        assert!(all[PAGE_SIZE..3 * PAGE_SIZE].iter().all(|&x| x == 0));
        assert!(all[3 * PAGE_SIZE..].iter().all(|&x| x == 2));
    }

    #[test]
    fn consecutive_data_pages_are_coalesced() {
        // Pages: D D D Z D Z Z D D -> three runs.
        let pattern = [1, 1, 1, 0, 1, 0, 0, 1, 1];
        let mut data = Vec::new();
        for &p in &pattern {
            data.extend(std::iter::repeat_n(p as u8, PAGE_SIZE));
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("memory.img");
        let file = create_image(&path, data.len() as u64).unwrap();
        let stats = write_sparse(&file, 0, &data).unwrap();
        assert_eq!(stats.data_pages, 6);
        assert_eq!(stats.zero_pages_skipped, 3);
        assert_eq!(stats.bytes_written, 6 * PAGE_SIZE as u64);
        assert_eq!(read_all(&file, data.len()), data);
    }

    #[test]
    fn size_mismatch_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("memory.img");
        create_image(&path, 4096).unwrap();
        let err = open_image(&path, 8192).unwrap_err();
        assert!(matches!(err, MemoryImageError::SizeMismatch { expected: 8192, actual: 4096, .. }));
        assert!(err
            .to_string()
            .starts_with("memory.img is 4096 bytes, snapshot says 8192: truncated or not this snapshot's"));
    }

    #[test]
    fn missing_image_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("memory.img");
        let err = open_image(&path, 4096).unwrap_err();
        assert!(matches!(&err, MemoryImageError::Missing { path: p } if p == &path));
    }

    #[test]
    fn create_truncates_existing_data() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("memory.img");
        std::fs::write(&path, vec![7u8; 3 * PAGE_SIZE]).unwrap();
        let file = create_image(&path, 2 * PAGE_SIZE as u64).unwrap();
        assert_eq!(read_all(&file, 2 * PAGE_SIZE), vec![0u8; 2 * PAGE_SIZE]);
    }
}
