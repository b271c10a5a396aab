//! The stack: base image, sealed layers and the writable top, read and written as one disk.
//!
//! Every layer's data file mirrors the disk's offsets, so a run of blocks that all come
//! from the same layer is one positional read, and a write is one positional write to
//! the top (plus, on first touch of a partially written block, a copy of that block
//! from below).
//!
//! # Lazy lower layer
//!
//! A stack may also have one [`LazyLower`] between the base and the sealed layers: a
//! read-only layer whose blocks are produced on demand (the vault's `VaultLayer`, a
//! snapshot's disk map fetched and decrypted block range by block range). Order, oldest
//! first: base → lazy lower → sealed layers → top. The first sealed layer (or the top,
//! when there is none) names the lazy lower's [`LazyLower::id`] as its parent, so
//! sealing works as usual and the chain is checked on open like any other. The lazy
//! lower is not one of [`LayerStack::sealed_layers`]: it has no sealed directory to
//! hard-link until it is complete and turned into one (`VaultLayer::seal_cache`, then
//! [`LayerStack::settle_lower`]),
//! after which the same disk opens with [`LayerStack::open`] and that directory first
//! in `sealed`.

use super::layer::{self, Layer, Role};
use super::{blocks_for, inspect, LayerError, LayerId, BLOCK_SIZE, MAX_DISK_BYTES};
use std::fmt;
use std::fs::{self, File};
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A read-only layer just above the base whose blocks are materialised on demand.
///
/// Implementations are shared (`Arc`) between the stack and whoever drives them (a
/// prefetcher, stats), so every method takes `&self` and must be thread-safe.
pub trait LazyLower: fmt::Debug + Send + Sync {
    /// The layer's id: the first layer above it names it as its parent. Never
    /// [`LayerId::BASE`].
    fn id(&self) -> LayerId;
    /// Size of the disk, in bytes; must equal the base's.
    fn disk_size(&self) -> u64;
    /// Whether block `index` is present in this layer (known without fetching it).
    fn is_present(&self, index: u64) -> bool;
    /// Blocks present in this layer.
    fn present_count(&self) -> u64;
    /// Reads `buf.len()` bytes at disk offset `offset`, fetching what is not local yet.
    /// The stack only asks for runs of blocks that [`LazyLower::is_present`] says are.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), LayerError>;
    /// Makes what was materialised so far durable, so a reopen need not fetch it again
    /// ([`LayerStack::flush`] calls it after flushing the top). Never needed for
    /// correctness: what is not durable is fetched again.
    fn flush(&self) -> Result<(), LayerError> {
        Ok(())
    }
}

/// A layered disk, open for reading and writing.
#[derive(Debug)]
pub struct LayerStack {
    base_path: PathBuf,
    base: File,
    size: u64,
    /// The lazy layer between the base and the sealed layers, if any.
    lower: Option<Arc<dyn LazyLower>>,
    /// Oldest first.
    pub(super) sealed: Vec<Layer>,
    /// `None` until the first write when the top was created lazily
    /// ([`LayerStack::create_lazy`]): an empty top costs no files.
    top: Option<Layer>,
    /// Where the top lives (or will be created) and the id it sits on.
    top_dir: PathBuf,
    top_parent: LayerId,
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
    /// Blocks present in the lazy lower layer (0 without one).
    pub lower_blocks: u64,
    /// Whether there are writes a [`LayerStack::flush`] has not yet made durable.
    pub unflushed: bool,
}

/// Where a block's current content lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Base,
    Lower,
    Sealed(usize),
    Top,
}

impl LayerStack {
    /// Opens an existing stack: `sealed` oldest first, `top` an unsealed layer over them.
    pub fn open(base: &Path, sealed: &[PathBuf], top: &Path) -> Result<LayerStack, LayerError> {
        LayerStack::open_inner(base, None, sealed, top)
    }

    /// [`LayerStack::open`] with a lazy lower layer between the base and `sealed`.
    pub fn open_over(
        base: &Path,
        lower: Arc<dyn LazyLower>,
        sealed: &[PathBuf],
        top: &Path,
    ) -> Result<LayerStack, LayerError> {
        LayerStack::open_inner(base, Some(lower), sealed, top)
    }

    fn open_inner(
        base: &Path,
        lower: Option<Arc<dyn LazyLower>>,
        sealed: &[PathBuf],
        top: &Path,
    ) -> Result<LayerStack, LayerError> {
        let (base_file, size, sealed) = open_lower(base, lower.as_deref(), sealed)?;
        let top = Layer::open(top, Role::Top)?;
        check_layer(&top, size, expected_parent(lower.as_deref(), &sealed))?;
        Ok(LayerStack::assemble(base, base_file, size, lower, sealed, top.dir().to_path_buf(), Some(top)))
    }

    /// Opens `base` and `sealed` (oldest first) and creates an empty top at `new_top`,
    /// which must not exist. This is how a new sandbox, or a fork, gets its own disk.
    pub fn create(base: &Path, sealed: &[PathBuf], new_top: &Path) -> Result<LayerStack, LayerError> {
        LayerStack::create_inner(base, None, sealed, new_top)
    }

    /// [`LayerStack::create`] with a lazy lower layer between the base and `sealed`
    /// (e.g. a disk restored lazily from a vault snapshot, with `sealed` empty).
    pub fn create_over(
        base: &Path,
        lower: Arc<dyn LazyLower>,
        sealed: &[PathBuf],
        new_top: &Path,
    ) -> Result<LayerStack, LayerError> {
        LayerStack::create_inner(base, Some(lower), sealed, new_top)
    }

    fn create_inner(
        base: &Path,
        lower: Option<Arc<dyn LazyLower>>,
        sealed: &[PathBuf],
        new_top: &Path,
    ) -> Result<LayerStack, LayerError> {
        let (base_file, size, sealed) = open_lower(base, lower.as_deref(), sealed)?;
        let (top, _) = Layer::create(new_top, size, expected_parent(lower.as_deref(), &sealed))?;
        Ok(LayerStack::assemble(base, base_file, size, lower, sealed, new_top.to_path_buf(), Some(top)))
    }

    /// Like [`LayerStack::create`], but the top's files are created on the first write
    /// (which then pays the creation's syncs): a fork that never writes its disk costs
    /// no file creation, and sealing an untouched top is not needed. Checks only that
    /// `new_top` does not exist yet.
    pub fn create_lazy(base: &Path, sealed: &[PathBuf], new_top: &Path) -> Result<LayerStack, LayerError> {
        LayerStack::create_lazy_inner(base, None, sealed, new_top)
    }

    /// [`LayerStack::create_lazy`] (top created on the first write) with a lazy lower
    /// layer between the base and `sealed`.
    pub fn create_lazy_over(
        base: &Path,
        lower: Arc<dyn LazyLower>,
        sealed: &[PathBuf],
        new_top: &Path,
    ) -> Result<LayerStack, LayerError> {
        LayerStack::create_lazy_inner(base, Some(lower), sealed, new_top)
    }

    fn create_lazy_inner(
        base: &Path,
        lower: Option<Arc<dyn LazyLower>>,
        sealed: &[PathBuf],
        new_top: &Path,
    ) -> Result<LayerStack, LayerError> {
        if fs::symlink_metadata(new_top).is_ok() {
            return Err(LayerError::LayerExists { path: new_top.to_path_buf() });
        }
        let (base_file, size, sealed) = open_lower(base, lower.as_deref(), sealed)?;
        Ok(LayerStack::assemble(base, base_file, size, lower, sealed, new_top.to_path_buf(), None))
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
        LayerStack::recover_seal_inner(base, None, sealed, old_top, new_top)
    }

    /// [`LayerStack::recover_seal`] of a stack with a lazy lower layer.
    pub fn recover_seal_over(
        base: &Path,
        lower: Arc<dyn LazyLower>,
        sealed: &[PathBuf],
        old_top: &Path,
        new_top: &Path,
    ) -> Result<LayerStack, LayerError> {
        LayerStack::recover_seal_inner(base, Some(lower), sealed, old_top, new_top)
    }

    fn recover_seal_inner(
        base: &Path,
        lower: Option<Arc<dyn LazyLower>>,
        sealed: &[PathBuf],
        old_top: &Path,
        new_top: &Path,
    ) -> Result<LayerStack, LayerError> {
        let old = inspect(old_top)?;
        let new_exists = fs::symlink_metadata(new_top).is_ok();
        if old.sealed {
            let mut sealed_now = sealed.to_vec();
            sealed_now.push(old_top.to_path_buf());
            return if new_exists {
                LayerStack::open_inner(base, lower, &sealed_now, new_top)
            } else {
                LayerStack::create_inner(base, lower, &sealed_now, new_top)
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
        LayerStack::open_inner(base, lower, sealed, old_top)
    }

    fn assemble(
        base: &Path,
        base_file: File,
        size: u64,
        lower: Option<Arc<dyn LazyLower>>,
        sealed: Vec<Layer>,
        top_dir: PathBuf,
        top: Option<Layer>,
    ) -> LayerStack {
        let top_parent = expected_parent(lower.as_deref(), &sealed);
        LayerStack {
            base_path: base.to_path_buf(),
            base: base_file,
            size,
            lower,
            sealed,
            top,
            top_dir,
            top_parent,
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

    /// Replaces the lazy lower layer with `dir`, the sealed layer directory it became
    /// once complete (`VaultLayer::seal_cache`): it must be sealed, have the lower's id
    /// and the base as its parent. Afterwards the stack holds no lazy layer and `dir` is
    /// its first sealed layer, as if opened with [`LayerStack::open`] and `dir` first.
    pub fn settle_lower(&mut self, dir: &Path) -> Result<(), LayerError> {
        let Some(lower) = &self.lower else {
            return Err(LayerError::SettleLower {
                path: dir.to_path_buf(),
                reason: "the stack has no lazy layer".into(),
            });
        };
        let layer = Layer::open(dir, Role::Sealed)?;
        check_layer(&layer, self.size, LayerId::BASE)?;
        if layer.id() != lower.id() {
            return Err(LayerError::SettleLower {
                path: dir.to_path_buf(),
                reason: format!("layer {} is not the lazy layer {} it should replace", layer.id(), lower.id()),
            });
        }
        self.sealed.insert(0, layer);
        self.lower = None;
        Ok(())
    }

    /// The lazy lower layer between the base and the sealed layers, if any.
    pub fn lazy_lower(&self) -> Option<&Arc<dyn LazyLower>> {
        self.lower.as_ref()
    }

    /// The writable top; `None` while a lazily created top has not been written.
    pub fn top(&self) -> Option<&Layer> {
        self.top.as_ref()
    }

    /// Where the top lives (or will be created on the first write).
    pub fn top_dir(&self) -> &Path {
        &self.top_dir
    }

    /// Whether the top holds no block: sealing it would add nothing.
    pub fn top_is_empty(&self) -> bool {
        self.top.as_ref().is_none_or(|t| t.present_count() == 0)
    }

    /// The top, creating its files first if it was created lazily.
    fn top_mut(&mut self) -> Result<&mut Layer, LayerError> {
        if self.top.is_none() {
            let (layer, _) = Layer::create(&self.top_dir, self.size, self.top_parent)?;
            self.top = Some(layer);
        }
        Ok(self.top.as_mut().expect("created above"))
    }

    /// Block counts per layer.
    pub fn stats(&self) -> StackStats {
        StackStats {
            size: self.size,
            blocks: blocks_for(self.size),
            top_blocks: self.top.as_ref().map_or(0, Layer::present_count),
            sealed_blocks: self.sealed.iter().map(Layer::present_count).collect(),
            lower_blocks: self.lower.as_ref().map_or(0, |l| l.present_count()),
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
        self.top_mut()?;
        self.copy_up_if_partial(first, offset, end)?;
        if last != first {
            self.copy_up_if_partial(last, offset, end)?;
        }
        let top = self.top_mut()?;
        top.data().write_all_at(buf, offset).map_err(|source| LayerError::Write {
            path: top.data_path().to_path_buf(),
            offset,
            source,
        })?;
        let added = top.bits_mut().set_range(first, last + 1);
        self.data_dirty = true;
        if added > 0 {
            self.bitmap_dirty = true;
        }
        Ok(())
    }

    /// Makes every write so far durable: fsync the top's data, then (if blocks were
    /// added) replace its bitmap atomically; then lets a lazy lower layer persist what
    /// it fetched ([`LazyLower::flush`]).
    pub fn flush(&mut self) -> Result<(), LayerError> {
        self.sync_data()?;
        if let (true, Some(top)) = (self.bitmap_dirty, &self.top) {
            top.persist(false)?;
            self.bitmap_dirty = false;
        }
        match &self.lower {
            Some(lower) => lower.flush(),
            None => Ok(()),
        }
    }

    /// Seals the top and starts an empty top at `new_top` (which must not exist).
    ///
    /// Costs one fdatasync of the top plus writing two bitmaps; no data is copied.
    /// Steps: sync the top's data; create the new top completely; commit by replacing
    /// the old top's bitmap with a sealed one. On error before the commit the stack is
    /// unchanged (the new top is removed) and still usable.
    pub fn seal(&mut self, new_top: &Path) -> Result<SealedLayer, LayerError> {
        self.top_mut()?;
        self.sync_data()?;
        let top = self.top.as_ref().expect("created above");
        let (new, new_bytes) = Layer::create(new_top, self.size, top.id())?;
        let sealed_bytes = match top.persist(true) {
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
        self.top_dir = new_top.to_path_buf();
        self.top_parent = top.id();
        let mut old = self.top.replace(new).expect("created above");
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
        if let (true, Some(top)) = (self.data_dirty, &self.top) {
            top.data()
                .sync_data()
                .map_err(|source| LayerError::SyncData { path: top.data_path().to_path_buf(), source })?;
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
        if self.top.as_ref().is_some_and(|t| t.is_present(b)) {
            return Source::Top;
        }
        if let Some(i) = self.sealed.iter().rposition(|l| l.is_present(b)) {
            return Source::Sealed(i);
        }
        match &self.lower {
            Some(l) if l.is_present(b) => Source::Lower,
            _ => Source::Base,
        }
    }

    /// Reads disk bytes `lo..hi` (within the request at `offset`) from `source`.
    fn read_run(&self, source: Source, lo: u64, hi: u64, buf: &mut [u8], offset: u64) -> Result<(), LayerError> {
        let lo = lo.max(offset);
        let dst_range = (lo - offset) as usize..(hi - offset) as usize;
        let (file, path) = match (source, &self.lower) {
            (Source::Lower, Some(lower)) => return lower.read_at(&mut buf[dst_range], lo),
            // `source` only answers Lower when there is one.
            (Source::Base | Source::Lower, _) => (&self.base, self.base_path.as_path()),
            (Source::Sealed(i), _) => (self.sealed[i].data(), self.sealed[i].data_path()),
            // `source` only answers Top when the top exists.
            (Source::Top, _) => match &self.top {
                Some(t) => (t.data(), t.data_path()),
                None => (&self.base, self.base_path.as_path()),
            },
        };
        let dst = &mut buf[dst_range];
        file.read_exact_at(dst, lo).map_err(|source| LayerError::Read { path: path.to_path_buf(), offset: lo, source })
    }

    /// Copies block `b` into the top if the write `offset..end` covers only part of it
    /// and the top does not hold it yet.
    fn copy_up_if_partial(&mut self, b: u64, offset: u64, end: u64) -> Result<(), LayerError> {
        let lo = b * BLOCK_SIZE;
        let len = layer::block_len(self.size, b);
        let whole = offset <= lo && end >= lo + len as u64;
        if whole || self.top.as_ref().is_some_and(|t| t.is_present(b)) {
            return Ok(());
        }
        let mut block = [0u8; BLOCK_SIZE as usize];
        self.read_at(&mut block[..len], lo)?;
        let top = self.top_mut()?;
        top.data().write_all_at(&block[..len], lo).map_err(|source| LayerError::Write {
            path: top.data_path().to_path_buf(),
            offset: lo,
            source,
        })
    }
}

/// Opens the base and the sealed layers (oldest first), checking sizes and the id chain.
fn open_lower(
    base: &Path,
    lower: Option<&dyn LazyLower>,
    sealed: &[PathBuf],
) -> Result<(File, u64, Vec<Layer>), LayerError> {
    let err = |source| LayerError::OpenBase { path: base.to_path_buf(), source };
    let mut file = crate::preopened::open(base, false).map_err(err)?;
    // Seeking to the end also sizes block devices, whose metadata length is 0.
    let size = file.seek(SeekFrom::End(0)).map_err(err)?;
    if size > MAX_DISK_BYTES {
        return Err(LayerError::BaseTooLarge { path: base.to_path_buf(), size, max: MAX_DISK_BYTES });
    }
    if let Some(l) = lower {
        if l.disk_size() != size {
            return Err(LayerError::SizeMismatch {
                path: PathBuf::from(format!("<lazy layer {}>", l.id())),
                layer: l.disk_size(),
                base: size,
            });
        }
    }
    let mut layers: Vec<Layer> = Vec::with_capacity(sealed.len());
    for dir in sealed {
        let layer = Layer::open(dir, Role::Sealed)?;
        check_layer(&layer, size, expected_parent(lower, &layers))?;
        layers.push(layer);
    }
    Ok((file, size, layers))
}

/// The id a layer placed on `below` (over `lower`, if any) must name as its parent.
fn expected_parent(lower: Option<&dyn LazyLower>, below: &[Layer]) -> LayerId {
    below.last().map_or_else(|| lower.map_or(LayerId::BASE, |l| l.id()), Layer::id)
}

pub(super) fn check_layer(layer: &Layer, size: u64, parent: LayerId) -> Result<(), LayerError> {
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
