//! The allocation bitmap of a layer: an in-memory bitset and its file format.
//!
//! Reads consult one bitmap per layer per block, so the bitmap lives in memory as a
//! `Vec<u64>`. On disk it is the `bitmap` file described in the module doc of
//! [`super`]; it is read back as untrusted input, so decoding checks every field.

use super::sealed_bitmaps::FileKey;
use super::{blocks_for, LayerError, LayerId, BLOCK_SIZE, MAX_DISK_BYTES};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;
use std::sync::Arc;

/// First bytes of a layer bitmap file.
pub const LAYER_MAGIC: [u8; 8] = *b"FKVMLAYR";
/// Format version of the bitmap file.
///
/// Compatibility rule: a reader accepts exactly the versions it knows (today only 1).
/// Any change to the layout or to the meaning of a field, including a new flag bit,
/// bumps the version; unknown flag bits are refused, never ignored, so an old reader
/// cannot silently misread a newer layer.
pub const LAYER_FORMAT_VERSION: u32 = 1;

/// Header bytes before the bitmap words.
pub(super) const HEADER_LEN: usize = 72;
/// Trailing CRC-32.
pub(super) const CRC_LEN: usize = 4;
/// Flag bit: the layer is sealed (immutable).
pub(super) const FLAG_SEALED: u32 = 1;
/// The bitmap file while it is being replaced.
const TMP_NAME: &str = "bitmap.tmp";

/// What the bitmap file says about its layer, besides the bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) sealed: bool,
    pub(crate) disk_size: u64,
    pub(crate) id: LayerId,
    pub(crate) parent: LayerId,
}

/// One bit per block: set when the block is present in the layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bitmap {
    words: Vec<u64>,
    /// Number of blocks (bits that count).
    len: u64,
    /// Number of set bits, kept up to date so stats cost nothing.
    ones: u64,
}

impl Bitmap {
    /// An empty bitmap for `len` blocks.
    pub fn new(len: u64) -> Bitmap {
        Bitmap { words: vec![0; words_for(len)], len, ones: 0 }
    }

    /// Number of blocks the bitmap covers.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the bitmap covers no blocks at all.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of present blocks.
    pub fn count_ones(&self) -> u64 {
        self.ones
    }

    /// Whether block `i` is present (false past the end).
    pub fn get(&self, i: u64) -> bool {
        i < self.len && (self.words[(i / 64) as usize] >> (i % 64)) & 1 == 1
    }

    /// Marks blocks `from..to` (clamped to the bitmap) present; returns how many were not.
    pub fn set_range(&mut self, from: u64, to: u64) -> u64 {
        let to = to.min(self.len);
        let mut added = 0u64;
        let mut b = from;
        while b < to {
            let lo = b % 64;
            let word_start = b - lo;
            let hi = (to - word_start).min(64);
            let mask = if hi == 64 { u64::MAX << lo } else { ((1u64 << hi) - 1) & (u64::MAX << lo) };
            let word = &mut self.words[(word_start / 64) as usize];
            added += u64::from((mask & !*word).count_ones());
            *word |= mask;
            b = word_start + hi;
        }
        self.ones += added;
        added
    }

    /// The first present block at or after `from`.
    pub fn next_one(&self, from: u64) -> Option<u64> {
        if from >= self.len {
            return None;
        }
        let mut w = (from / 64) as usize;
        let mut word = self.words[w] & (u64::MAX << (from % 64));
        loop {
            if word != 0 {
                let i = w as u64 * 64 + u64::from(word.trailing_zeros());
                return (i < self.len).then_some(i);
            }
            w += 1;
            word = *self.words.get(w)?;
        }
    }
}

fn words_for(blocks: u64) -> usize {
    // At most MAX_DISK_BYTES / 4096 / 64 = 2^22 words: fits any usize.
    blocks.div_ceil(64) as usize
}

/// Length of the bitmap file for `blocks` blocks.
pub(super) fn encoded_len(blocks: u64) -> u64 {
    (HEADER_LEN + CRC_LEN) as u64 + 8 * blocks.div_ceil(64)
}

/// The largest valid bitmap file (a [`MAX_DISK_BYTES`] disk).
pub(super) fn max_encoded_len() -> u64 {
    encoded_len(blocks_for(MAX_DISK_BYTES))
}

/// The bitmap file's bytes.
pub(super) fn encode(header: &Header, bits: &Bitmap) -> Vec<u8> {
    let mut out = Vec::with_capacity(encoded_len(bits.len) as usize);
    out.extend_from_slice(&LAYER_MAGIC);
    out.extend_from_slice(&LAYER_FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&(if header.sealed { FLAG_SEALED } else { 0 }).to_le_bytes());
    out.extend_from_slice(&(BLOCK_SIZE as u32).to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&header.disk_size.to_le_bytes());
    out.extend_from_slice(&bits.len.to_le_bytes());
    out.extend_from_slice(&header.id.0);
    out.extend_from_slice(&header.parent.0);
    for w in &bits.words {
        out.extend_from_slice(&w.to_le_bytes());
    }
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

fn id_at(b: &[u8], at: usize) -> LayerId {
    let mut a = [0u8; 16];
    a.copy_from_slice(&b[at..at + 16]);
    LayerId(a)
}

/// Parses and validates a bitmap file read from `path`.
///
/// Order: magic, version, block-count cap, exact length, checksum, then the fields a
/// checksum cannot vouch for (a buggy or foreign writer computes a valid CRC too).
pub(super) fn decode(path: &Path, bytes: &[u8]) -> Result<(Header, Bitmap), LayerError> {
    let p = || path.to_path_buf();
    let invalid = |reason: String| LayerError::BitmapInvalid { path: p(), reason };
    let min = HEADER_LEN + CRC_LEN;
    if bytes.len() < min {
        return Err(LayerError::BitmapTruncated { path: p(), len: bytes.len(), min });
    }
    let mut magic = [0u8; 8];
    magic.copy_from_slice(&bytes[..8]);
    if magic != LAYER_MAGIC {
        return Err(LayerError::BitmapMagic { path: p(), found: magic });
    }
    let version = le_u32(bytes, 8);
    if version != LAYER_FORMAT_VERSION {
        return Err(LayerError::BitmapVersion { path: p(), found: version, supported: LAYER_FORMAT_VERSION });
    }
    let block_count = le_u64(bytes, 32);
    let max_blocks = blocks_for(MAX_DISK_BYTES);
    if block_count > max_blocks {
        return Err(invalid(format!("block count {block_count} exceeds the cap of {max_blocks}")));
    }
    let expected = encoded_len(block_count);
    if bytes.len() as u64 != expected {
        return Err(LayerError::BitmapLength { path: p(), actual: bytes.len() as u64, expected });
    }
    let body = bytes.len() - CRC_LEN;
    let stored = le_u32(bytes, body);
    let computed = crc32fast::hash(&bytes[..body]);
    if stored != computed {
        return Err(LayerError::BitmapChecksum { path: p(), stored, computed });
    }
    let flags = le_u32(bytes, 12);
    if flags & !FLAG_SEALED != 0 {
        return Err(invalid(format!("unknown flag bits {:#x}", flags & !FLAG_SEALED)));
    }
    let block_size = le_u32(bytes, 16);
    if u64::from(block_size) != BLOCK_SIZE {
        return Err(invalid(format!("block size {block_size}, only {BLOCK_SIZE} is supported")));
    }
    let reserved = le_u32(bytes, 20);
    if reserved != 0 {
        return Err(invalid(format!("reserved field is {reserved:#x}, must be 0")));
    }
    let disk_size = le_u64(bytes, 24);
    if disk_size > MAX_DISK_BYTES {
        return Err(invalid(format!("disk size {disk_size} exceeds the cap of {MAX_DISK_BYTES}")));
    }
    if blocks_for(disk_size) != block_count {
        return Err(invalid(format!("block count {block_count} does not match disk size {disk_size}")));
    }
    let id = id_at(bytes, 40);
    let parent = id_at(bytes, 56);
    if id == LayerId::BASE {
        return Err(invalid("layer id is all zero".to_string()));
    }
    if id == parent {
        return Err(invalid(format!("layer {id} names itself as its parent")));
    }
    let words: Vec<u64> = bytes[HEADER_LEN..body].chunks_exact(8).map(|w| le_u64(w, 0)).collect();
    let tail_bits = block_count % 64;
    if tail_bits != 0 {
        if let Some(&last) = words.last() {
            if last >> tail_bits != 0 {
                return Err(invalid(format!("bits set past the last block ({block_count})")));
            }
        }
    }
    let ones = words.iter().map(|w| u64::from(w.count_ones())).sum();
    let header = Header { sealed: flags & FLAG_SEALED != 0, disk_size, id, parent };
    Ok((header, Bitmap { words, len: block_count, ones }))
}

/// Reads and validates `path`, refusing files over the size cap before reading them.
pub(crate) fn read_file(path: &Path) -> Result<(Header, Bitmap), LayerError> {
    let err = |source| LayerError::ReadBitmap { path: path.to_path_buf(), source };
    let file = crate::preopened::open(path, false).map_err(err)?;
    let len = file.metadata().map_err(err)?.len();
    read_open(path, &file, len)
}

/// [`read_file`], but a sealed bitmap this process preloaded (`sealed_bitmaps`) is
/// shared instead of read again; with the file's identity, for the cache.
pub(super) fn read_file_keyed(path: &Path) -> Result<(FileKey, Header, Arc<Bitmap>), LayerError> {
    let err = |source| LayerError::ReadBitmap { path: path.to_path_buf(), source };
    let file = crate::preopened::open(path, false).map_err(err)?;
    let meta = file.metadata().map_err(err)?;
    let key = FileKey::of(&meta);
    if let Some((header, bits)) = super::sealed_bitmaps::lookup(&key) {
        return Ok((key, header, bits));
    }
    let (header, bits) = read_open(path, &file, meta.len())?;
    Ok((key, header, Arc::new(bits)))
}

/// Reads and validates the open bitmap file `file`, `len` bytes long at its stat
/// (`path` names it in errors).
fn read_open(path: &Path, file: &File, len: u64) -> Result<(Header, Bitmap), LayerError> {
    let err = |source| LayerError::ReadBitmap { path: path.to_path_buf(), source };
    let max = max_encoded_len();
    if len > max {
        return Err(LayerError::BitmapTooLarge { path: path.to_path_buf(), len, max });
    }
    // Read at a position, never through the descriptor's offset: an offered descriptor
    // (`crate::preopened`) is shared with every process that inherited it, the children
    // of a running sandbox restoring at once. The length it had at the stat, no more.
    let mut bytes = vec![0u8; len as usize];
    std::os::unix::fs::FileExt::read_exact_at(file, &mut bytes, 0).map_err(err)?;
    decode(path, &bytes)
}

/// Whether `<dir>/bitmap` starts with this format's magic and version and says sealed:
/// its first 16 bytes only, never through a link at the last step (a quick look for a
/// caller that need not trust the answer, such as retention deciding a pin is moot).
pub fn dir_holds_sealed(dir: &Path) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join(super::BITMAP_FILE);
    let Ok(file) = OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(&path) else { return false };
    let mut head = [0u8; 16];
    if std::io::Read::read_exact(&mut std::io::Read::take(file, 16), &mut head).is_err() {
        return false;
    }
    head[..8] == LAYER_MAGIC && le_u32(&head, 8) == LAYER_FORMAT_VERSION && le_u32(&head, 12) & FLAG_SEALED != 0
}

/// Replaces `<dir>/bitmap` atomically: write `bitmap.tmp`, fsync, rename, fsync `dir`.
/// Returns the bytes written.
pub(crate) fn write_file(dir: &Path, header: &Header, bits: &Bitmap) -> Result<u64, LayerError> {
    let tmp = dir.join(TMP_NAME);
    let dst = dir.join(super::BITMAP_FILE);
    let bytes = encode(header, bits);
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)
        .map_err(err(&tmp, "creating the temporary file"))?;
    f.write_all(&bytes).map_err(err(&tmp, "writing"))?;
    f.sync_all().map_err(err(&tmp, "syncing"))?;
    drop(f);
    fs::rename(&tmp, &dst).map_err(err(&dst, "renaming the temporary file into place"))?;
    sync_dir(dir).map_err(err(dir, "syncing the layer directory"))?;
    Ok(bytes.len() as u64)
}

fn err<'a>(path: &'a Path, step: &'static str) -> impl FnOnce(io::Error) -> LayerError + 'a {
    move |source| LayerError::WriteBitmap { path: path.to_path_buf(), step, source }
}

/// Makes a directory's entries (renames, creations) durable.
pub(super) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Seek, SeekFrom};

    #[test]
    fn an_offered_bitmap_reads_whole_while_another_holder_moves_the_shared_offset() {
        let dir = tempfile::tempdir().unwrap();
        let header = Header { sealed: true, disk_size: 1 << 20, id: LayerId([7; 16]), parent: LayerId::BASE };
        let mut bits = Bitmap::new(blocks_for(1 << 20));
        bits.set_range(3, 9);
        write_file(dir.path(), &header, &bits).unwrap();
        let path = dir.path().join(super::super::BITMAP_FILE);
        crate::preopened::offer(&path, File::open(&path).unwrap(), false);
        // Another process that inherited the descriptor (a sibling restoring at the same
        // time) keeps moving the offset they share.
        let mut sibling = crate::preopened::open(&path, false).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mover = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let _ = sibling.seek(SeekFrom::End(0));
                }
            })
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(300);
        let mut reads = 0;
        while std::time::Instant::now() < deadline && reads < 20_000 {
            let (h, b) = read_file(&path).unwrap();
            assert_eq!((h, b.count_ones()), (header, 6));
            reads += 1;
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        mover.join().unwrap();
        crate::preopened::clear();
    }
}
