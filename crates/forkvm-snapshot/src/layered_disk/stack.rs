//! The stack: base image, sealed layers and the writable top, read and written as one disk.
//!
//! Every layer's data file mirrors the disk's offsets, so a run of blocks that all come
//! from the same layer is one positional read, and a write is one positional write to
//! the top (plus, on first touch of a partially written block, a copy of that block
//! from below).

use super::layer::{self, Layer, Role};
use super::{blocks_for, inspect, LayerError, LayerId, BLOCK_SIZE, MAX_DISK_BYTES};
use std::fs::{self, File};
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// A layered disk, open for reading and writing.
#[derive(Debug)]
pub struct LayerStack {
    base_path: PathBuf,
    base: File,
    size: u64,
    /// Oldest first.
    sealed: Vec<Layer>,
    top: Layer,
    /// The top's data file has writes not yet fsynced.
    data_dirty: bool,
    /// The top's in-memory bitmap differs from its file.
    bitmap_dirty: bool,
}

/// What [`LayerStack::seal`] produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SealedLayer {
    /// The sealed layer's directory (the former top).
    pub dir: PathBuf,
    /// Its id.
    pub id: LayerId,
    /// Blocks present in it.
    pub blocks: u64,
    /// Bytes the seal wrote: the sealed bitmap plus the new top's bitmap. The data
    /// files are not copied; this is the whole cost besides syncing the top's data.
    pub bytes_written: u64,
}

/// Block counts of a stack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StackStats {
    /// Disk size in bytes.
    pub size: u64,
    /// Disk size in blocks.
    pub blocks: u64,
    /// Blocks present in the top.
    pub top_blocks: u64,
    /// Blocks present in each sealed layer, oldest first.
    pub sealed_blocks: Vec<u64>,
    /// Whether there are writes a [`LayerStack::flush`] has not yet made durable.
    pub unflushed: bool,
}

/// Where a block's current content lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Base,
    Sealed(usize),
    Top,
}

impl LayerStack {
    /// Opens an existing stack: `sealed` oldest first, `top` an unsealed layer over them.
    pub fn open(base: &Path, sealed: &[PathBuf], top: &Path) -> Result<LayerStack, LayerError> {
        let (base_file, size, sealed) = open_lower(base, sealed)?;
        let top = Layer::open(top, Role::Top)?;
        check_layer(&top, size, expected_parent(&sealed))?;
        Ok(LayerStack::assemble(base, base_file, size, sealed, top))
    }

    /// Opens `base` and `sealed` (oldest first) and creates an empty top at `new_top`,
    /// which must not exist. This is how a new sandbox, or a fork, gets its own disk.
    pub fn create(base: &Path, sealed: &[PathBuf], new_top: &Path) -> Result<LayerStack, LayerError> {
        let (base_file, size, sealed) = open_lower(base, sealed)?;
        let (top, _) = Layer::create(new_top, size, expected_parent(&sealed))?;
        Ok(LayerStack::assemble(base, base_file, size, sealed, top))
    }

    /// Opens the stack after a crash (or error) during `seal(new_top)` of a stack whose
    /// top was `old_top`, whichever side of the commit point it stopped on:
    ///
    /// * `old_top` sealed: the seal committed; `new_top` is opened (or created, if a
    ///   failed seal removed it) over `sealed + [old_top]`.
    /// * `old_top` not sealed: the seal did not happen; a `new_top` left behind must be
    ///   an empty layer over `old_top` and is removed; `old_top` is opened as the top.
    pub fn recover_seal(
        base: &Path,
        sealed: &[PathBuf],
        old_top: &Path,
        new_top: &Path,
    ) -> Result<LayerStack, LayerError> {
        let old = inspect(old_top)?;
        let new_exists = fs::symlink_metadata(new_top).is_ok();
        if old.sealed {
            let mut lower = sealed.to_vec();
            lower.push(old_top.to_path_buf());
            return if new_exists {
                LayerStack::open(base, &lower, new_top)
            } else {
                LayerStack::create(base, &lower, new_top)
            };
        }
        if new_exists {
            let new = inspect(new_top)?;
            let refuse = |reason: String| LayerError::RecoverSeal { path: old_top.to_path_buf(), reason };
            if new.sealed || new.parent != old.id || new.blocks != 0 {
                return Err(refuse(format!(
                    "{} is not the empty top an interrupted seal leaves (sealed {}, parent {}, {} blocks); \
                     not removing it",
                    new_top.display(),
                    new.sealed,
                    new.parent,
                    new.blocks
                )));
            }
            fs::remove_dir_all(new_top)
                .map_err(|e| refuse(format!("removing the unused new top {}: {e}", new_top.display())))?;
        }
        LayerStack::open(base, sealed, old_top)
    }

    fn assemble(base: &Path, base_file: File, size: u64, sealed: Vec<Layer>, top: Layer) -> LayerStack {
        LayerStack {
            base_path: base.to_path_buf(),
            base: base_file,
            size,
            sealed,
            top,
            data_dirty: false,
            bitmap_dirty: false,
        }
    }

    /// Disk size in bytes (the base image's size).
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The base image's path.
    pub fn base_path(&self) -> &Path {
        &self.base_path
    }

    /// The sealed layers, oldest first.
    pub fn sealed_layers(&self) -> &[Layer] {
        &self.sealed
    }

    /// The writable top.
    pub fn top(&self) -> &Layer {
        &self.top
    }

    /// Block counts per layer.
    pub fn stats(&self) -> StackStats {
        StackStats {
            size: self.size,
            blocks: blocks_for(self.size),
            top_blocks: self.top.present_count(),
            sealed_blocks: self.sealed.iter().map(Layer::present_count).collect(),
            unflushed: self.data_dirty || self.bitmap_dirty,
        }
    }

    /// Reads `buf.len()` bytes at `offset` (any alignment), block by block from the
    /// newest layer holding each block; consecutive blocks from one layer are one read.
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), LayerError> {
        let end = self.check_range(offset, buf.len())?;
        if buf.is_empty() {
            return Ok(());
        }
        let (first, last) = (offset / BLOCK_SIZE, (end - 1) / BLOCK_SIZE);
        let mut run_start = first;
        let mut run_source = self.source(first);
        for b in first + 1..=last {
            let s = self.source(b);
            if s != run_source {
                self.read_run(run_source, run_start * BLOCK_SIZE, b * BLOCK_SIZE, buf, offset)?;
                run_start = b;
                run_source = s;
            }
        }
        self.read_run(run_source, run_start * BLOCK_SIZE, end, buf, offset)
    }

    /// Writes `buf` at `offset` (any alignment) into the top. A partially written block
    /// not yet in the top first gets its current content copied up, so the rest of it
    /// keeps reading as before. Durable only after [`LayerStack::flush`].
    pub fn write_at(&mut self, buf: &[u8], offset: u64) -> Result<(), LayerError> {
        let end = self.check_range(offset, buf.len())?;
        if buf.is_empty() {
            return Ok(());
        }
        let (first, last) = (offset / BLOCK_SIZE, (end - 1) / BLOCK_SIZE);
        self.copy_up_if_partial(first, offset, end)?;
        if last != first {
            self.copy_up_if_partial(last, offset, end)?;
        }
        self.top.data().write_all_at(buf, offset).map_err(|source| LayerError::Write {
            path: self.top.data_path().to_path_buf(),
            offset,
            source,
        })?;
        self.data_dirty = true;
        if self.top.bits_mut().set_range(first, last + 1) > 0 {
            self.bitmap_dirty = true;
        }
        Ok(())
    }

    /// Makes every write so far durable: fsync the top's data, then (if blocks were
    /// added) replace its bitmap atomically.
    pub fn flush(&mut self) -> Result<(), LayerError> {
        self.sync_data()?;
        if self.bitmap_dirty {
            self.top.persist(false)?;
            self.bitmap_dirty = false;
        }
        Ok(())
    }

    /// Seals the top and starts an empty top at `new_top` (which must not exist).
    ///
    /// Costs one fdatasync of the top plus writing two bitmaps; no data is copied.
    /// Steps: sync the top's data; create the new top completely; commit by replacing
    /// the old top's bitmap with a sealed one. On error before the commit the stack is
    /// unchanged (the new top is removed) and still usable.
    pub fn seal(&mut self, new_top: &Path) -> Result<SealedLayer, LayerError> {
        self.sync_data()?;
        let (new, new_bytes) = Layer::create(new_top, self.size, self.top.id())?;
        let sealed_bytes = match self.top.persist(true) {
            Ok(n) => n,
            Err(e) => {
                // The rename may have happened before a later step failed: make the
                // next flush rewrite the bitmap unsealed. The new top is empty and
                // unreferenced; if removing it fails, recover_seal removes it later.
                self.bitmap_dirty = true;
                let _ = fs::remove_dir_all(new_top);
                return Err(e);
            }
        };
        self.bitmap_dirty = false;
        let mut old = std::mem::replace(&mut self.top, new);
        old.mark_sealed();
        let info = SealedLayer {
            dir: old.dir().to_path_buf(),
            id: old.id(),
            blocks: old.present_count(),
            bytes_written: new_bytes + sealed_bytes,
        };
        self.sealed.push(old);
        Ok(info)
    }

    fn sync_data(&mut self) -> Result<(), LayerError> {
        if self.data_dirty {
            self.top
                .data()
                .sync_data()
                .map_err(|source| LayerError::SyncData { path: self.top.data_path().to_path_buf(), source })?;
            self.data_dirty = false;
        }
        Ok(())
    }

    /// The end of `len` bytes at `offset`, if they fit on the disk.
    fn check_range(&self, offset: u64, len: usize) -> Result<u64, LayerError> {
        let len = len as u64;
        offset.checked_add(len).filter(|&end| end <= self.size).ok_or(LayerError::OutOfRange {
            offset,
            len,
            size: self.size,
        })
    }

    /// The newest layer holding block `b`: one bitmap lookup per layer at most.
    fn source(&self, b: u64) -> Source {
        if self.top.is_present(b) {
            return Source::Top;
        }
        self.sealed.iter().rposition(|l| l.is_present(b)).map_or(Source::Base, Source::Sealed)
    }

    /// Reads disk bytes `lo..hi` (within the request at `offset`) from `source`.
    fn read_run(&self, source: Source, lo: u64, hi: u64, buf: &mut [u8], offset: u64) -> Result<(), LayerError> {
        let lo = lo.max(offset);
        let (file, path) = match source {
            Source::Base => (&self.base, self.base_path.as_path()),
            Source::Sealed(i) => (self.sealed[i].data(), self.sealed[i].data_path()),
            Source::Top => (self.top.data(), self.top.data_path()),
        };
        let dst = &mut buf[(lo - offset) as usize..(hi - offset) as usize];
        file.read_exact_at(dst, lo).map_err(|source| LayerError::Read { path: path.to_path_buf(), offset: lo, source })
    }

    /// Copies block `b` into the top if the write `offset..end` covers only part of it
    /// and the top does not hold it yet.
    fn copy_up_if_partial(&mut self, b: u64, offset: u64, end: u64) -> Result<(), LayerError> {
        let lo = b * BLOCK_SIZE;
        let len = layer::block_len(self.size, b);
        let whole = offset <= lo && end >= lo + len as u64;
        if whole || self.top.is_present(b) {
            return Ok(());
        }
        let mut block = [0u8; BLOCK_SIZE as usize];
        self.read_at(&mut block[..len], lo)?;
        self.top.data().write_all_at(&block[..len], lo).map_err(|source| LayerError::Write {
            path: self.top.data_path().to_path_buf(),
            offset: lo,
            source,
        })
    }
}

/// Opens the base and the sealed layers (oldest first), checking sizes and the id chain.
fn open_lower(base: &Path, sealed: &[PathBuf]) -> Result<(File, u64, Vec<Layer>), LayerError> {
    let err = |source| LayerError::OpenBase { path: base.to_path_buf(), source };
    let mut file = File::open(base).map_err(err)?;
    // Seeking to the end also sizes block devices, whose metadata length is 0.
    let size = file.seek(SeekFrom::End(0)).map_err(err)?;
    if size > MAX_DISK_BYTES {
        return Err(LayerError::BaseTooLarge { path: base.to_path_buf(), size, max: MAX_DISK_BYTES });
    }
    let mut layers: Vec<Layer> = Vec::with_capacity(sealed.len());
    for dir in sealed {
        let layer = Layer::open(dir, Role::Sealed)?;
        check_layer(&layer, size, expected_parent(&layers))?;
        layers.push(layer);
    }
    Ok((file, size, layers))
}

/// The id a layer placed on `below` must name as its parent.
fn expected_parent(below: &[Layer]) -> LayerId {
    below.last().map_or(LayerId::BASE, Layer::id)
}

fn check_layer(layer: &Layer, size: u64, parent: LayerId) -> Result<(), LayerError> {
    if layer.disk_size() != size {
        return Err(LayerError::SizeMismatch { path: layer.dir().to_path_buf(), layer: layer.disk_size(), base: size });
    }
    if layer.parent() != parent {
        return Err(LayerError::ChainBroken {
            path: layer.dir().to_path_buf(),
            expected: parent,
            found: layer.parent(),
        });
    }
    Ok(())
}
