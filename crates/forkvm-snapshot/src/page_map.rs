//! `memory.map`: a guest-memory image described as extents of chunks.
//!
//! Instead of a full `memory.img` per snapshot, a snapshot's memory can be
//! stored as a [`PageMap`] over the content-addressed [`ChunkStore`]: sorted,
//! non-overlapping extents of 4 KiB pages, each either all-zero or one chunk.
//! Extents never cross a 64 KiB-aligned window, so the same memory content
//! always cuts into the same chunks and is stored once across snapshots.
//!
//! A *flat* map describes memory relative to all-zero memory (zero pages are
//! simply absent). A *diff* map describes only the pages that differ from a
//! parent image; a page that became zero is an explicit `Zero` extent.
//! Applying maps base→head in order onto an all-zero sparse file gives the
//! head's memory ([`build_page_map`], [`apply_page_map`]).
//!
//! Binary format (little endian), verified by [`PageMap::decode`] because map
//! files are untrusted input:
//!
//! | size | field                                                        |
//! |------|--------------------------------------------------------------|
//! | 8    | magic `b"FKVMMAP\0"`                                         |
//! | 4    | version (1)                                                  |
//! | 4    | page size (4096)                                             |
//! | 8    | mem_size in bytes                                            |
//! | 8    | extent count n                                               |
//! | 48·n | extents: u64 first_page, u32 pages, u8 kind (0 zero, 1 chunk), 3 zero bytes, 32-byte chunk id (zero for kind 0) |
//! | 32   | BLAKE3 of everything before it                               |

use crate::chunk_store::{ChunkError, ChunkId, ChunkStore, MAX_CHUNK_BYTES};
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Page size the map is expressed in.
pub const PAGE: u64 = 4096;
/// Pages per 64 KiB window; extents never cross a window boundary.
pub const PAGES_PER_CHUNK: u32 = 16;

/// Bytes per window.
const WINDOW: u64 = PAGE * PAGES_PER_CHUNK as u64;
/// Bytes read per pread when building (16 windows).
const BLOCK: u64 = 1 << 20;
/// Largest mem_size a map may describe (1 TiB).
const MAX_MEM_SIZE: u64 = 1 << 40;
/// Largest `memory.map` file read (64 MiB).
const MAX_MAP_FILE: u64 = 64 << 20;
const MAGIC: [u8; 8] = *b"FKVMMAP\0";
const VERSION: u32 = 1;
const HEADER_LEN: usize = 32;
const EXTENT_LEN: usize = 48;
const TRAILER_LEN: usize = 32;
const KIND_ZERO: u8 = 0;
const KIND_CHUNK: u8 = 1;

// A whole window always fits in one chunk.
const _: () = assert!(WINDOW as usize <= MAX_CHUNK_BYTES);

/// Why a page map could not be decoded, read, written, built or applied.
#[derive(Debug, thiserror::Error)]
pub enum PageMapError {
    /// Encoded map bytes failed a check.
    #[error("memory.map: invalid: {reason}")]
    Format {
        /// Which check failed.
        reason: String,
    },
    /// A map file failed a check.
    #[error("memory.map {path}: invalid: {reason}")]
    FileFormat {
        /// The map file.
        path: PathBuf,
        /// Which check failed.
        reason: String,
    },
    /// A file operation failed.
    #[error("memory.map: {step} {file}: {source}")]
    Io {
        /// What was being done.
        step: &'static str,
        /// The file's path, or which image ("memory image", "parent memory image", "target image").
        file: String,
        /// Underlying error.
        source: io::Error,
    },
    /// Storing or loading a chunk failed.
    #[error("memory.map: {0}")]
    Chunk(#[from] ChunkError),
    /// A file's length differs from the map's mem_size.
    #[error("memory.map: {what} is {actual} bytes, expected mem_size {expected}")]
    SizeMismatch {
        /// Which file.
        what: &'static str,
        /// The mem_size.
        expected: u64,
        /// The file's length.
        actual: u64,
    },
    /// A chunk's length differs from its extent's.
    #[error("memory.map: chunk {id} for page {first_page} is {actual} bytes, its extent covers {expected}")]
    ChunkLength {
        /// The chunk.
        id: ChunkId,
        /// The extent's first page.
        first_page: u64,
        /// pages × 4096.
        expected: u64,
        /// Decompressed chunk length.
        actual: u64,
    },
    /// A mem_size that no map can describe.
    #[error("memory.map: mem_size {mem_size} is not a multiple of {PAGE} or is over 1 TiB")]
    BadMemSize {
        /// The refused size.
        mem_size: u64,
    },
}

/// Guest memory as extents of pages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageMap {
    /// Size of the memory described, a multiple of [`PAGE`].
    pub mem_size: u64,
    /// Sorted, non-overlapping extents, none crossing a 64 KiB window.
    pub extents: Vec<Extent>,
}

/// A run of 1..=[`PAGES_PER_CHUNK`] pages inside one 64 KiB window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// Index of the first page.
    pub first_page: u64,
    /// Number of pages.
    pub pages: u32,
    /// What the pages hold.
    pub content: ExtentContent,
}

/// What an extent's pages hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExtentContent {
    /// All zero bytes.
    Zero,
    /// The bytes of this chunk (exactly pages × 4096 long).
    Chunk(ChunkId),
}

impl PageMap {
    /// The binary `memory.map` encoding, trailing hash included.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + self.extents.len() * EXTENT_LEN + TRAILER_LEN);
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&(PAGE as u32).to_le_bytes());
        out.extend_from_slice(&self.mem_size.to_le_bytes());
        out.extend_from_slice(&(self.extents.len() as u64).to_le_bytes());
        for e in &self.extents {
            out.extend_from_slice(&e.first_page.to_le_bytes());
            out.extend_from_slice(&e.pages.to_le_bytes());
            let (kind, id) = match e.content {
                ExtentContent::Zero => (KIND_ZERO, [0u8; 32]),
                ExtentContent::Chunk(id) => (KIND_CHUNK, id.0),
            };
            out.extend_from_slice(&[kind, 0, 0, 0]);
            out.extend_from_slice(&id);
        }
        let hash = blake3::hash(&out);
        out.extend_from_slice(hash.as_bytes());
        out
    }

    /// Decodes and fully validates untrusted `memory.map` bytes.
    pub fn decode(bytes: &[u8]) -> Result<PageMap, PageMapError> {
        decode_inner(bytes).map_err(|m| PageMapError::Format { reason: m.0 })
    }

    /// Writes the encoded map to `path` (created or truncated) and fsyncs it.
    pub fn write_file(&self, path: &Path) -> Result<(), PageMapError> {
        let err = |step| move |source| PageMapError::Io { step, file: path.display().to_string(), source };
        let mut file =
            OpenOptions::new().write(true).create(true).truncate(true).open(path).map_err(err("create map file"))?;
        file.write_all(&self.encode()).map_err(err("write map file"))?;
        file.sync_all().map_err(err("fsync map file"))
    }

    /// Reads (at most 64 MiB) and decodes the map file at `path`.
    pub fn read_file(path: &Path) -> Result<PageMap, PageMapError> {
        let err = |step| move |source| PageMapError::Io { step, file: path.display().to_string(), source };
        let file = File::open(path).map_err(err("open map file"))?;
        let mut bytes = Vec::new();
        file.take(MAX_MAP_FILE + 1).read_to_end(&mut bytes).map_err(err("read map file"))?;
        if bytes.len() as u64 > MAX_MAP_FILE {
            let reason = format!("file is over the {MAX_MAP_FILE}-byte cap");
            return Err(PageMapError::FileFormat { path: path.to_path_buf(), reason });
        }
        decode_inner(&bytes).map_err(|m| PageMapError::FileFormat { path: path.to_path_buf(), reason: m.0 })
    }

    /// Every chunk the map references, in extent order (repeats included).
    pub fn chunks(&self) -> impl Iterator<Item = ChunkId> + '_ {
        self.extents.iter().filter_map(|e| match e.content {
            ExtentContent::Chunk(id) => Some(id),
            ExtentContent::Zero => None,
        })
    }

    /// Pages covered by extents (zero or chunk).
    pub fn present_pages(&self) -> u64 {
        self.extents.iter().map(|e| u64::from(e.pages)).sum()
    }

    /// Pages covered by chunk extents.
    pub fn data_pages(&self) -> u64 {
        self.extents.iter().filter(|e| matches!(e.content, ExtentContent::Chunk(_))).map(|e| u64::from(e.pages)).sum()
    }
}

/// Reads a little-endian u32 at `at` (the caller checked the length).
fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Reads a little-endian u64 at `at` (the caller checked the length).
fn le_u64(b: &[u8], at: usize) -> u64 {
    u64::from(le_u32(b, at)) | (u64::from(le_u32(b, at + 4)) << 32)
}

/// [`PageMap::decode`], with the failed check as a plain message.
fn decode_inner(b: &[u8]) -> Result<PageMap, crate::malformed::Malformed> {
    if b.len() < HEADER_LEN + TRAILER_LEN {
        return Err(
            format!("truncated: {} bytes, header and trailer need {}", b.len(), HEADER_LEN + TRAILER_LEN).into()
        );
    }
    if b[..8] != MAGIC {
        return Err("bad magic: not a memory.map file".into());
    }
    let version = le_u32(b, 8);
    if version != VERSION {
        return Err(format!("unsupported version {version} (this build reads {VERSION})").into());
    }
    let page = le_u32(b, 12);
    if u64::from(page) != PAGE {
        return Err(format!("page size {page}, expected {PAGE}").into());
    }
    let mem_size = le_u64(b, 16);
    if !mem_size.is_multiple_of(PAGE) || mem_size > MAX_MEM_SIZE {
        return Err(format!("mem_size {mem_size} is not a multiple of {PAGE} or is over 1 TiB").into());
    }
    let count = le_u64(b, 24);
    let body = b.len() - HEADER_LEN - TRAILER_LEN;
    // Compare without multiplying the untrusted count.
    if !body.is_multiple_of(EXTENT_LEN) || count != (body / EXTENT_LEN) as u64 {
        return Err(format!("extent count {count} does not match the {}-byte length", b.len()).into());
    }
    let (content, trailer) = b.split_at(b.len() - TRAILER_LEN);
    if blake3::hash(content).as_bytes()[..] != *trailer {
        return Err("trailing BLAKE3 hash does not match the contents".into());
    }
    let mut extents = Vec::with_capacity(body / EXTENT_LEN);
    for (i, rec) in content[HEADER_LEN..].chunks_exact(EXTENT_LEN).enumerate() {
        let first_page = le_u64(rec, 0);
        let pages = le_u32(rec, 8);
        if rec[13..16] != [0, 0, 0] {
            return Err(format!("extent {i}: non-zero padding").into());
        }
        let mut id = [0u8; 32];
        id.copy_from_slice(&rec[16..48]);
        let content = match rec[12] {
            KIND_ZERO if id == [0u8; 32] => ExtentContent::Zero,
            KIND_ZERO => return Err(format!("extent {i}: zero extent with a non-zero chunk id").into()),
            KIND_CHUNK => ExtentContent::Chunk(ChunkId(id)),
            kind => return Err(format!("extent {i}: unknown kind {kind}").into()),
        };
        extents.push(Extent { first_page, pages, content });
    }
    let map = PageMap { mem_size, extents };
    check_extents(&map)?;
    Ok(map)
}

/// Checks that extents are well formed, in bounds, sorted and non-overlapping.
fn check_extents(map: &PageMap) -> Result<(), crate::malformed::Malformed> {
    let total_pages = map.mem_size / PAGE;
    let per = u64::from(PAGES_PER_CHUNK);
    let mut next_free = 0u64;
    for (i, e) in map.extents.iter().enumerate() {
        if e.pages == 0 || e.pages > PAGES_PER_CHUNK {
            return Err(format!("extent {i}: {} pages, must be 1..={PAGES_PER_CHUNK}", e.pages).into());
        }
        let end = e.first_page.checked_add(u64::from(e.pages)).filter(|&end| end <= total_pages).ok_or_else(|| {
            format!("extent {i}: pages {}+{} out of bounds ({total_pages} pages)", e.first_page, e.pages)
        })?;
        if e.first_page / per != (end - 1) / per {
            return Err(format!("extent {i}: pages {}+{} cross a 64 KiB window", e.first_page, e.pages).into());
        }
        if e.first_page < next_free {
            return Err(format!("extent {i}: page {} unsorted or overlapping the previous extent", e.first_page).into());
        }
        next_free = end;
    }
    Ok(())
}

/// What [`build_page_map`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct BuildStats {
    /// Pages read and compared (ranges that are holes are skipped and not counted).
    pub pages_scanned: u64,
    /// Pages in the map: non-zero pages of a flat map, differing pages of a diff.
    pub pages_changed: u64,
    /// Of those, pages that became all-zero (Zero extents; diffs only).
    pub zero_pages_changed: u64,
    /// Chunks written to the store.
    pub chunks_new: u64,
    /// Chunk extents whose chunk was already in the store.
    pub chunks_reused: u64,
    /// Compressed bytes of the new chunks.
    pub bytes_stored: u64,
}

/// Describes `memory` (a file of exactly mem_size bytes) as a map: relative to all-zero memory when `parent` is None
/// (non-zero pages only), or relative to `parent` (a file of the same size) — only pages whose bytes differ, with pages
/// that differ and are all-zero as Zero extents. Chunks go into `store` (caller holds lock_shared and calls
/// store.sync() before publishing the map). Within each 64 KiB-aligned window, each maximal run of selected pages of
/// the same kind (data vs zero) is one extent.
///
/// Ranges that are holes (in `memory`, and in `parent` too when given) are skipped without reading. Moves the files'
/// offsets (`lseek`); reads use `pread`.
pub fn build_page_map(
    memory: &File,
    parent: Option<&File>,
    mem_size: u64,
    store: &ChunkStore,
) -> Result<(PageMap, BuildStats), PageMapError> {
    if !mem_size.is_multiple_of(PAGE) || mem_size > MAX_MEM_SIZE {
        return Err(PageMapError::BadMemSize { mem_size });
    }
    check_len(memory, "memory image", mem_size)?;
    if let Some(p) = parent {
        check_len(p, "parent memory image", mem_size)?;
    }
    let mut builder = Builder { store, extents: Vec::new(), stats: BuildStats::default() };
    let mut buf = vec![0u8; BLOCK as usize];
    let mut pbuf = if parent.is_some() { vec![0u8; BLOCK as usize] } else { Vec::new() };
    // Always window aligned.
    let mut pos = 0u64;
    while pos < mem_size {
        let data = next_data(memory, pos, mem_size);
        let start = match parent {
            Some(p) => data.min(next_data(p, pos, mem_size)),
            None => data,
        };
        if start >= mem_size {
            break;
        }
        let start = align_down(start, WINDOW).max(pos);
        let mut end = (start + BLOCK).min(mem_size);
        if parent.is_none() {
            // Read no further than the window holding the end of this data segment.
            end = end.min(align_up(next_hole(memory, data, mem_size), WINDOW));
        }
        let len = (end - start) as usize;
        read_at(memory, &mut buf[..len], start, "memory image")?;
        let pblock = match parent {
            Some(p) => {
                read_at(p, &mut pbuf[..len], start, "parent memory image")?;
                Some(&pbuf[..len])
            }
            None => None,
        };
        for (w, win) in buf[..len].chunks(WINDOW as usize).enumerate() {
            let off = w * WINDOW as usize;
            let pwin = pblock.map(|p| &p[off..off + win.len()]);
            builder.window(win, pwin, (start + off as u64) / PAGE)?;
        }
        pos = end;
    }
    let map = PageMap { mem_size, extents: builder.extents };
    Ok((map, builder.stats))
}

/// Accumulates extents and stats while scanning windows.
struct Builder<'a> {
    store: &'a ChunkStore,
    extents: Vec<Extent>,
    stats: BuildStats,
}

/// How the scan classified a page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sel {
    /// Not in the map.
    Skip,
    /// A non-zero page in the map.
    Data,
    /// An all-zero page in the map (diffs only).
    Zero,
}

impl Builder<'_> {
    /// Adds the extents of one window (`win`, its parent bytes `pwin`) starting at page `first_page`.
    fn window(&mut self, win: &[u8], pwin: Option<&[u8]>, first_page: u64) -> Result<(), PageMapError> {
        let page = PAGE as usize;
        let mut sel = [Sel::Skip; PAGES_PER_CHUNK as usize];
        let npages = win.len() / page;
        for (i, s) in sel.iter_mut().enumerate().take(npages) {
            let bytes = &win[i * page..(i + 1) * page];
            *s = match pwin {
                Some(p) if p[i * page..(i + 1) * page] == *bytes => Sel::Skip,
                Some(_) if is_zero(bytes) => Sel::Zero,
                None if is_zero(bytes) => Sel::Skip,
                _ => Sel::Data,
            };
        }
        self.stats.pages_scanned += npages as u64;
        let mut i = 0;
        while i < npages {
            let kind = sel[i];
            let mut j = i + 1;
            while j < npages && sel[j] == kind {
                j += 1;
            }
            let pages = (j - i) as u32;
            let content = match kind {
                Sel::Skip => None,
                Sel::Zero => {
                    self.stats.zero_pages_changed += u64::from(pages);
                    Some(ExtentContent::Zero)
                }
                Sel::Data => {
                    let out = self.store.put(&win[i * page..j * page])?;
                    if out.new {
                        self.stats.chunks_new += 1;
                        self.stats.bytes_stored += out.stored_bytes;
                    } else {
                        self.stats.chunks_reused += 1;
                    }
                    Some(ExtentContent::Chunk(out.id))
                }
            };
            if let Some(content) = content {
                self.stats.pages_changed += u64::from(pages);
                self.extents.push(Extent { first_page: first_page + i as u64, pages, content });
            }
            i = j;
        }
        Ok(())
    }
}

/// Whether every byte of `buf` is zero (ORs 128-byte blocks, which vectorizes).
fn is_zero(buf: &[u8]) -> bool {
    let mut blocks = buf.chunks_exact(128);
    for block in &mut blocks {
        if block.iter().fold(0u8, |acc, &b| acc | b) != 0 {
            return false;
        }
    }
    blocks.remainder().iter().all(|&b| b == 0)
}

fn align_down(x: u64, a: u64) -> u64 {
    x - x % a
}

fn align_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a).saturating_mul(a)
}

/// The first offset ≥ `pos` that may hold data (`size` if none). Filesystems
/// that cannot tell are treated as all data.
fn next_data(file: &File, pos: u64, size: u64) -> u64 {
    seek(file, pos, libc::SEEK_DATA)
        .map_or_else(|e| if e.raw_os_error() == Some(libc::ENXIO) { size } else { pos }, |off| off.clamp(pos, size))
}

/// The first hole at or after `pos` (`size` if none or unknown).
fn next_hole(file: &File, pos: u64, size: u64) -> u64 {
    seek(file, pos, libc::SEEK_HOLE).map_or(size, |off| off.clamp(pos, size))
}

/// `lseek(fd, pos, whence)`.
fn seek(file: &File, pos: u64, whence: libc::c_int) -> io::Result<u64> {
    let pos = libc::off_t::try_from(pos).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: lseek only operates on the descriptor, which `file` keeps open.
    let off = unsafe { libc::lseek(file.as_raw_fd(), pos, whence) };
    u64::try_from(off).map_err(|_| io::Error::last_os_error())
}

/// pread of exactly `buf.len()` bytes at `offset`.
fn read_at(file: &File, buf: &mut [u8], offset: u64, what: &'static str) -> Result<(), PageMapError> {
    file.read_exact_at(buf, offset).map_err(|source| PageMapError::Io {
        step: "read",
        file: format!("{what} ({} bytes at {offset:#x})", buf.len()),
        source,
    })
}

/// Fails unless `file` is `expected` bytes long.
fn check_len(file: &File, what: &'static str, expected: u64) -> Result<(), PageMapError> {
    let actual =
        file.metadata().map_err(|source| PageMapError::Io { step: "stat", file: what.to_string(), source })?.len();
    if actual != expected {
        return Err(PageMapError::SizeMismatch { what, expected, actual });
    }
    Ok(())
}

/// What [`apply_page_map`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ApplyStats {
    /// Chunks read from the store.
    pub chunks_read: u64,
    /// Bytes written to the target (chunk data, plus zeros where punching holes is unsupported).
    pub bytes_written: u64,
    /// Pages of Zero extents.
    pub zero_pages: u64,
}

/// Writes the map's extents into `target` (a file of mem_size bytes): chunk extents are read (verified) from `store`
/// and written with pwrite; Zero extents are punched out (fallocate FALLOC_FL_PUNCH_HOLE|FALLOC_FL_KEEP_SIZE, falling
/// back to writing zeros if the filesystem refuses). Fails if target's length != map.mem_size or a chunk's length !=
/// pages*4096.
///
/// Pages outside the extents are left as they are: apply a flat map onto an all-zero (sparse) file, and each diff onto
/// the result of applying its parent. Adjacent Zero extents are punched with one call.
pub fn apply_page_map(map: &PageMap, store: &ChunkStore, target: &File) -> Result<ApplyStats, PageMapError> {
    check_extents(map).map_err(|m| PageMapError::Format { reason: m.0 })?;
    check_len(target, "target image", map.mem_size)?;
    let mut stats = ApplyStats::default();
    let mut zeroer = Zeroer { punch_supported: true, zeros: Vec::new() };
    let mut buf = Vec::with_capacity(MAX_CHUNK_BYTES);
    // Pending byte range of adjacent Zero extents: [start, end).
    let mut zero_run: Option<(u64, u64)> = None;
    for e in &map.extents {
        let (offset, len) = (e.first_page * PAGE, u64::from(e.pages) * PAGE);
        if let Some((start, end)) = zero_run {
            if e.content != ExtentContent::Zero || end != offset {
                stats.bytes_written += zeroer.zero(target, start, end - start)?;
                zero_run = None;
            }
        }
        match e.content {
            ExtentContent::Zero => {
                stats.zero_pages += u64::from(e.pages);
                zero_run = Some((zero_run.map_or(offset, |(start, _)| start), offset + len));
            }
            ExtentContent::Chunk(id) => {
                store.get_into(&id, &mut buf)?;
                if buf.len() as u64 != len {
                    let actual = buf.len() as u64;
                    return Err(PageMapError::ChunkLength { id, first_page: e.first_page, expected: len, actual });
                }
                stats.chunks_read += 1;
                pwrite(target, &buf, offset)?;
                stats.bytes_written += len;
            }
        }
    }
    if let Some((start, end)) = zero_run {
        stats.bytes_written += zeroer.zero(target, start, end - start)?;
    }
    Ok(stats)
}

/// pwrite of all of `data` at `offset` into the target image.
fn pwrite(target: &File, data: &[u8], offset: u64) -> Result<(), PageMapError> {
    target.write_all_at(data, offset).map_err(|source| PageMapError::Io {
        step: "write",
        file: format!("target image ({} bytes at {offset:#x})", data.len()),
        source,
    })
}

/// Zeroes ranges of the target image for [`apply_page_map`].
struct Zeroer {
    /// Cleared once the filesystem refuses to punch holes.
    punch_supported: bool,
    /// A block of zeros for the fallback, allocated on first use.
    zeros: Vec<u8>,
}

impl Zeroer {
    /// Makes `[offset, offset + len)` read as zeros: a hole if possible, else
    /// written zeros. Returns the bytes written.
    fn zero(&mut self, target: &File, offset: u64, len: u64) -> Result<u64, PageMapError> {
        if self.punch_supported {
            match punch_hole(target, offset, len) {
                Ok(()) => return Ok(0),
                Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::ENOSYS)) => {
                    self.punch_supported = false;
                }
                Err(source) => {
                    let file = format!("target image ({len} bytes at {offset:#x})");
                    return Err(PageMapError::Io { step: "punch hole", file, source });
                }
            }
        }
        if self.zeros.is_empty() {
            self.zeros = vec![0u8; BLOCK as usize];
        }
        let mut done = 0;
        while done < len {
            let n = (len - done).min(BLOCK);
            pwrite(target, &self.zeros[..n as usize], offset + done)?;
            done += n;
        }
        Ok(len)
    }
}

/// fallocate(PUNCH_HOLE | KEEP_SIZE) over `[offset, offset + len)`, retrying on EINTR.
fn punch_hole(file: &File, offset: u64, len: u64) -> io::Result<()> {
    let invalid = |_| io::Error::from(io::ErrorKind::InvalidInput);
    let off = libc::off_t::try_from(offset).map_err(invalid)?;
    let len = libc::off_t::try_from(len).map_err(invalid)?;
    loop {
        // SAFETY: fallocate only operates on the descriptor, which `file` keeps open.
        let rc = unsafe {
            libc::fallocate(file.as_raw_fd(), libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, off, len)
        };
        if rc == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

#[cfg(test)]
#[path = "page_map_tests.rs"]
mod tests;
