//! Sparse entries: a large, mostly-hole file (a disk image, a layer's data) as the bytes
//! it actually holds.
//!
//! A blank 4 GiB ext4 image has a few MiB allocated; packing it byte for byte costs
//! reading and compressing 4 GiB of zeros, and the unpacked copy must be made sparse
//! again. A sparse entry instead holds a header, the list of data extents and their
//! bytes. Layout (little-endian):
//!
//! | offset | size  | field |
//! |--------|-------|-------|
//! | 0      | 8     | magic `FKVMSPRS` |
//! | 8      | 4     | version ([`SPARSE_VERSION`]) |
//! | 12     | 4     | reserved, 0 |
//! | 16     | 8     | logical size of the file (at most [`MAX_SPARSE_SIZE`]) |
//! | 24     | 8     | extent count `n` (at most [`MAX_SPARSE_EXTENTS`]) |
//! | 32     | 16·n  | extents `(offset u64, length u64)`: length > 0, sorted, separated by a hole, within the size |
//! | …      | Σlen  | the extents' bytes, in extent order |
//!
//! The entry's length is exactly what the header implies; nothing may follow. Bytes
//! outside every extent read as zeros. Read as untrusted input: every field is checked
//! before use and nothing is allocated from a count ([`decode_sparse`] streams).

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use super::{io_err, PackError, CHUNK};

/// First bytes of a sparse entry.
pub const SPARSE_MAGIC: [u8; 8] = *b"FKVMSPRS";
/// Version of the sparse entry layout. Compatibility rule: readers accept exactly the
/// versions they know (today 1); any change to the layout bumps it (and the pack version).
pub const SPARSE_VERSION: u32 = 1;
/// Largest logical size of a sparse entry (1 TiB, the largest layered disk).
pub const MAX_SPARSE_SIZE: u64 = 1 << 40;
/// Most extents in one sparse entry (a 64 MiB extent table). Writers merge extents
/// across small holes to stay under it.
pub const MAX_SPARSE_EXTENTS: u64 = 1 << 22;
/// Header bytes before the extent table.
const HEADER_LEN: u64 = 32;
/// Bytes per extent in the table.
const EXTENT_LEN: u64 = 16;
/// Extents read per table batch while decoding.
const TABLE_BATCH: usize = 4096;

/// The data extents of a file, as a sparse entry lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SparseExtents {
    size: u64,
    extents: Vec<(u64, u64)>,
    /// Holes up to this long are merged into the surrounding extents.
    gap: u64,
    cap: usize,
}

impl SparseExtents {
    /// An empty list for a `size`-byte file.
    pub fn new(size: u64) -> SparseExtents {
        SparseExtents::with_cap(size, MAX_SPARSE_EXTENTS as usize)
    }

    /// An empty list holding at most `cap` extents (≥ 1).
    pub fn with_cap(size: u64, cap: usize) -> SparseExtents {
        SparseExtents { size, extents: Vec::new(), gap: 0, cap: cap.max(1) }
    }

    /// The extents of `file` (`size` bytes) found with `SEEK_DATA`/`SEEK_HOLE`. A
    /// filesystem that cannot tell makes the whole file one extent.
    pub fn of_file(file: &File, size: u64) -> io::Result<SparseExtents> {
        let mut out = SparseExtents::new(size);
        for (offset, len) in forkvm_disk::data_extents::data_extents(file, size)? {
            out.push(offset, len);
        }
        Ok(out)
    }

    /// Adds the extent `offset..offset + len` (clamped to the size; sorted input
    /// expected), merging it with the previous one when they touch or the hole between
    /// them is short enough to keep the count under the cap.
    pub fn push(&mut self, offset: u64, len: u64) {
        let end = offset.saturating_add(len).min(self.size);
        if end <= offset {
            return;
        }
        match self.extents.last_mut() {
            Some((o, l)) if offset <= (*o + *l).saturating_add(self.gap) => *l = end.max(*o + *l) - *o,
            _ => self.extents.push((offset, end - offset)),
        }
        while self.extents.len() > self.cap {
            self.gap = (self.gap * 2).max(64 << 10);
            let gap = self.gap;
            let mut merged: Vec<(u64, u64)> = Vec::with_capacity(self.extents.len());
            for &(o, l) in &self.extents {
                match merged.last_mut() {
                    Some((mo, ml)) if o <= *mo + *ml + gap => *ml = (o + l).max(*mo + *ml) - *mo,
                    _ => merged.push((o, l)),
                }
            }
            self.extents = merged;
        }
    }

    /// The logical size.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The extents, sorted.
    pub fn extents(&self) -> &[(u64, u64)] {
        &self.extents
    }

    /// Bytes of data the entry carries.
    pub fn data_bytes(&self) -> u64 {
        self.extents.iter().map(|e| e.1).sum()
    }

    /// Length of the encoded entry.
    pub fn encoded_len(&self) -> u64 {
        HEADER_LEN + EXTENT_LEN * self.extents.len() as u64 + self.data_bytes()
    }

    /// Header and extent table.
    fn head(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity((HEADER_LEN + EXTENT_LEN * self.extents.len() as u64) as usize);
        out.extend_from_slice(&SPARSE_MAGIC);
        out.extend_from_slice(&SPARSE_VERSION.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&self.size.to_le_bytes());
        out.extend_from_slice(&(self.extents.len() as u64).to_le_bytes());
        for &(o, l) in &self.extents {
            out.extend_from_slice(&o.to_le_bytes());
            out.extend_from_slice(&l.to_le_bytes());
        }
        out
    }
}

/// Streams the sparse entry of `file` with `extents` (see the module doc).
pub(super) struct SparseEncoder<'a> {
    head: Vec<u8>,
    head_pos: usize,
    file: &'a File,
    extents: &'a [(u64, u64)],
    /// Current extent and bytes of it already produced.
    index: usize,
    done: u64,
}

impl<'a> SparseEncoder<'a> {
    pub(super) fn new(file: &'a File, extents: &'a SparseExtents) -> SparseEncoder<'a> {
        SparseEncoder { head: extents.head(), head_pos: 0, file, extents: &extents.extents, index: 0, done: 0 }
    }
}

impl Read for SparseEncoder<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.head_pos < self.head.len() {
            let n = buf.len().min(self.head.len() - self.head_pos);
            buf[..n].copy_from_slice(&self.head[self.head_pos..self.head_pos + n]);
            self.head_pos += n;
            return Ok(n);
        }
        let Some(&(offset, len)) = self.extents.get(self.index) else { return Ok(0) };
        let want = usize::try_from(len - self.done).unwrap_or(usize::MAX).min(buf.len());
        let n = self.file.read_at(&mut buf[..want], offset + self.done)?;
        if n == 0 && want > 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "file shrank while being packed"));
        }
        self.done += n as u64;
        if self.done == len {
            self.index += 1;
            self.done = 0;
        }
        Ok(n)
    }
}

/// Decodes the sparse entry `name` staged at `src` into a new file `dst` (which must not
/// exist): the extents written at their offsets, holes left as holes, the file sized to
/// the logical size and synced. Returns the logical size. Refuses any malformed entry
/// with [`PackError::Sparse`]; on error `dst` may exist partially (the caller's staging
/// directory is removed anyway).
pub fn decode_sparse(name: &str, src: &Path, dst: &Path) -> Result<u64, PackError> {
    let bad = |reason: String| PackError::Sparse { name: super::shown(name), reason };
    let input = File::open(src).map_err(io_err("open sparse entry", src))?;
    let len = input.metadata().map_err(io_err("stat sparse entry", src))?.len();
    if len < HEADER_LEN {
        return Err(bad(format!("{len} bytes, shorter than the {HEADER_LEN}-byte header")));
    }
    let mut head = [0u8; HEADER_LEN as usize];
    input.read_exact_at(&mut head, 0).map_err(io_err("read sparse entry", src))?;
    let u32_at = |at: usize| u32::from_le_bytes(head[at..at + 4].try_into().expect("4 bytes"));
    let u64_at = |at: usize| u64::from_le_bytes(head[at..at + 8].try_into().expect("8 bytes"));
    if head[..8] != SPARSE_MAGIC {
        return Err(bad(format!("not a sparse entry (magic {:02x?})", &head[..8])));
    }
    if u32_at(8) != SPARSE_VERSION {
        return Err(bad(format!("version {} (this build reads {SPARSE_VERSION})", u32_at(8))));
    }
    if u32_at(12) != 0 {
        return Err(bad("reserved header field is not 0".into()));
    }
    let (size, count) = (u64_at(16), u64_at(24));
    if size > MAX_SPARSE_SIZE {
        return Err(bad(format!("logical size {size} exceeds the {MAX_SPARSE_SIZE}-byte cap")));
    }
    if count > MAX_SPARSE_EXTENTS {
        return Err(bad(format!("{count} extents exceed the cap of {MAX_SPARSE_EXTENTS}")));
    }
    let table_end = HEADER_LEN + EXTENT_LEN * count;
    if table_end > len {
        return Err(bad(format!("{count} extents do not fit in {len} bytes")));
    }
    let output = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(dst)
        .map_err(io_err("create decoded sparse file", dst))?;
    let mut table = vec![0u8; TABLE_BATCH * EXTENT_LEN as usize];
    let mut buf = vec![0u8; CHUNK];
    let (mut data_pos, mut prev_end) = (table_end, None::<u64>);
    let mut i = 0u64;
    while i < count {
        let batch = (count - i).min(TABLE_BATCH as u64) as usize;
        let bytes = &mut table[..batch * EXTENT_LEN as usize];
        input.read_exact_at(bytes, HEADER_LEN + EXTENT_LEN * i).map_err(io_err("read sparse entry", src))?;
        for e in bytes.chunks_exact(EXTENT_LEN as usize) {
            let offset = u64::from_le_bytes(e[..8].try_into().expect("8 bytes"));
            let ext_len = u64::from_le_bytes(e[8..].try_into().expect("8 bytes"));
            let at = format!("extent {i} ({ext_len} bytes at {offset})");
            let end = offset.checked_add(ext_len).filter(|&end| ext_len > 0 && end <= size);
            let Some(end) = end else { return Err(bad(format!("{at} is empty or reaches past the size {size}"))) };
            if prev_end.is_some_and(|p| offset <= p) {
                return Err(bad(format!("{at} is not after the previous extent and a hole")));
            }
            let data_end = data_pos.checked_add(ext_len).filter(|&d| d <= len);
            let Some(data_end) = data_end else { return Err(bad(format!("{at}: the entry ends before its data"))) };
            copy_range(&input, src, data_pos, &output, dst, offset, ext_len, &mut buf)?;
            (data_pos, prev_end) = (data_end, Some(end));
            i += 1;
        }
    }
    if data_pos != len {
        return Err(bad(format!("{} bytes follow the last extent's data", len - data_pos)));
    }
    output.set_len(size).map_err(io_err("size decoded sparse file", dst))?;
    output.sync_all().map_err(io_err("sync decoded sparse file", dst))?;
    Ok(size)
}

#[allow(clippy::too_many_arguments)]
fn copy_range(
    input: &File,
    src: &Path,
    from: u64,
    output: &File,
    dst: &Path,
    to: u64,
    len: u64,
    buf: &mut [u8],
) -> Result<(), PackError> {
    let mut done = 0u64;
    while done < len {
        let n = usize::try_from(len - done).unwrap_or(usize::MAX).min(buf.len());
        input.read_exact_at(&mut buf[..n], from + done).map_err(io_err("read sparse entry", src))?;
        output.write_all_at(&buf[..n], to + done).map_err(io_err("write decoded sparse file", dst))?;
        done += n as u64;
    }
    Ok(())
}

#[cfg(test)]
#[path = "sparse_tests.rs"]
mod tests;
