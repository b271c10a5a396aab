//! One layer of a layered disk: its directory, open data file and in-memory bitmap.
//!
//! A [`LayerStack`](super::LayerStack) owns its layers; a sealed layer can also be
//! opened on its own ([`Layer::open_sealed`]) to stream its blocks into the chunk
//! store while the sandbox keeps running on a newer top.

use super::bitmap::{self, Header};
use super::{blocks_for, Bitmap, LayerError, LayerId, BITMAP_FILE, BLOCK_SIZE, DATA_FILE};
use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Whether a layer is opened to be written (the top) or only read (sealed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    Sealed,
    Top,
}

/// An open layer.
#[derive(Debug)]
pub struct Layer {
    dir: PathBuf,
    data_path: PathBuf,
    data: File,
    header: Header,
    /// Shared with other processes' layers of the same sealed file when preloaded
    /// (`sealed_bitmaps`); a top's is its own (copied on write if it ever were not).
    bits: Arc<Bitmap>,
}

/// What a layer's bitmap file says, read without opening its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerInfo {
    /// The layer's id.
    pub id: LayerId,
    /// The layer below it ([`LayerId::BASE`] when it sits on the base image).
    pub parent: LayerId,
    /// Whether it is sealed (immutable).
    pub sealed: bool,
    /// Size of the disk it belongs to, in bytes.
    pub disk_size: u64,
    /// Blocks present in the layer.
    pub blocks: u64,
}

/// Reads and validates the bitmap of the layer at `dir` (the data file is not opened).
pub fn inspect(dir: &Path) -> Result<LayerInfo, LayerError> {
    let (h, bits) = bitmap::read_file(&dir.join(BITMAP_FILE))?;
    Ok(LayerInfo { id: h.id, parent: h.parent, sealed: h.sealed, disk_size: h.disk_size, blocks: bits.count_ones() })
}

impl Layer {
    /// Creates an empty, unsealed layer at `dir` for a `disk_size`-byte disk, on top of
    /// `parent`. It is built in `<dir>.partial/` and renamed into place, so `dir` either
    /// does not exist or is a complete layer. Returns the layer and the bytes written.
    pub(super) fn create(dir: &Path, disk_size: u64, parent: LayerId) -> Result<(Layer, u64), LayerError> {
        let err = |step| move |source| LayerError::CreateLayer { path: dir.to_path_buf(), step, source };
        let (partial, data) = stage(dir, disk_size)?;
        data.sync_all().map_err(err("syncing the data file"))?;
        let header = Header { sealed: false, disk_size, id: LayerId::generate(dir), parent };
        let bits = Bitmap::new(blocks_for(disk_size));
        let written = bitmap::write_file(&partial, &header, &bits)?;
        fs::rename(&partial, dir).map_err(err("renaming the staging directory into place"))?;
        bitmap::sync_dir(parent_dir(dir)).map_err(err("syncing the parent directory"))?;
        let layer =
            Layer { dir: dir.to_path_buf(), data_path: dir.join(DATA_FILE), data, header, bits: Arc::new(bits) };
        Ok((layer, written))
    }

    /// Opens the layer at `dir`, checking it is sealed (or, for the top, not sealed)
    /// and that its data file has the disk's size.
    pub(super) fn open(dir: &Path, role: Role) -> Result<Layer, LayerError> {
        let (_, header, bits) = bitmap::read_file_keyed(&dir.join(BITMAP_FILE))?;
        match (role, header.sealed) {
            (Role::Sealed, false) => return Err(LayerError::NotSealed { path: dir.to_path_buf() }),
            (Role::Top, true) => return Err(LayerError::TopSealed { path: dir.to_path_buf() }),
            _ => {}
        }
        let data_path = dir.join(DATA_FILE);
        let err = |source| LayerError::OpenData { path: data_path.clone(), source };
        let data = crate::preopened::open(&data_path, role == Role::Top).map_err(err)?;
        let meta = data.metadata().map_err(err)?;
        if !meta.is_file() {
            return Err(err(io::Error::new(io::ErrorKind::InvalidInput, "not a regular file")));
        }
        if meta.len() != header.disk_size {
            return Err(LayerError::DataSize { path: data_path, expected: header.disk_size, actual: meta.len() });
        }
        Ok(Layer { dir: dir.to_path_buf(), data_path, data, header, bits })
    }

    /// Opens a sealed layer on its own, read-only (e.g. to copy its blocks out).
    pub fn open_sealed(dir: &Path) -> Result<Layer, LayerError> {
        Layer::open(dir, Role::Sealed)
    }

    /// The layer's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The layer's id.
    pub fn id(&self) -> LayerId {
        self.header.id
    }

    /// The id of the layer below it ([`LayerId::BASE`] for the base image).
    pub fn parent(&self) -> LayerId {
        self.header.parent
    }

    /// Whether the layer is sealed.
    pub fn is_sealed(&self) -> bool {
        self.header.sealed
    }

    /// Size of the disk the layer belongs to, in bytes.
    pub fn disk_size(&self) -> u64 {
        self.header.disk_size
    }

    /// The layer's allocation bitmap.
    pub fn bitmap(&self) -> &Bitmap {
        &self.bits
    }

    /// Blocks present in the layer.
    pub fn present_count(&self) -> u64 {
        self.bits.count_ones()
    }

    /// Whether block `index` is present in the layer.
    pub fn is_present(&self, index: u64) -> bool {
        self.bits.get(index)
    }

    /// The byte length of block `index` (4096, less for a partial last block).
    pub fn block_len(&self, index: u64) -> usize {
        block_len(self.header.disk_size, index)
    }

    /// Every present block in index order, with its data (4096 bytes, fewer for a
    /// partial last block). Meant for sealed layers: a top may change underneath.
    pub fn present_blocks(&self) -> PresentBlocks<'_> {
        PresentBlocks { layer: self, next: 0 }
    }

    pub(super) fn data(&self) -> &File {
        &self.data
    }

    pub(super) fn data_path(&self) -> &Path {
        &self.data_path
    }

    pub(super) fn bits_mut(&mut self) -> &mut Bitmap {
        Arc::make_mut(&mut self.bits)
    }

    /// Persists the bitmap atomically, with the sealed flag as given. Does not change
    /// the in-memory header: [`Layer::mark_sealed`] does, once the seal has committed.
    pub(super) fn persist(&self, sealed: bool) -> Result<u64, LayerError> {
        bitmap::write_file(&self.dir, &Header { sealed, ..self.header }, &self.bits)
    }

    pub(super) fn mark_sealed(&mut self) {
        self.header.sealed = true;
    }
}

/// Iterator over a layer's present blocks: `(block index, data)`.
#[derive(Debug)]
pub struct PresentBlocks<'a> {
    layer: &'a Layer,
    next: u64,
}

impl Iterator for PresentBlocks<'_> {
    type Item = Result<(u64, Vec<u8>), LayerError>;

    fn next(&mut self) -> Option<Self::Item> {
        let index = self.layer.bits.next_one(self.next)?;
        self.next = index + 1;
        let mut buf = vec![0u8; self.layer.block_len(index)];
        let offset = index * BLOCK_SIZE;
        Some(match self.layer.data.read_exact_at(&mut buf, offset) {
            Ok(()) => Ok((index, buf)),
            Err(source) => Err(LayerError::Read { path: self.layer.data_path.clone(), offset, source }),
        })
    }
}

/// Starts building a layer at `dir` (which must not exist) in `<dir>.partial/`, created
/// afresh (a leftover from a crash while building this very layer is never referenced),
/// with an empty data file of the disk's size; the caller writes the rest and renames
/// the staging directory into place. Its parent directory is created if missing.
pub(super) fn stage(dir: &Path, disk_size: u64) -> Result<(PathBuf, File), LayerError> {
    let err = |step| move |source| LayerError::CreateLayer { path: dir.to_path_buf(), step, source };
    match fs::symlink_metadata(dir) {
        Ok(_) => return Err(LayerError::LayerExists { path: dir.to_path_buf() }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(err("checking that the directory is free")(e)),
    }
    let name = dir.file_name().ok_or_else(|| {
        err("naming the staging directory")(io::Error::new(io::ErrorKind::InvalidInput, "path has no file name"))
    })?;
    let mut staging = OsString::from(name);
    staging.push(".partial");
    let partial = dir.with_file_name(staging);
    match fs::remove_dir_all(&partial) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(err("removing a stale staging directory")(e)),
    }
    fs::create_dir_all(parent_dir(dir)).map_err(err("creating the parent directory"))?;
    fs::create_dir(&partial).map_err(err("creating the staging directory"))?;
    let data = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(partial.join(DATA_FILE))
        .map_err(err("creating the data file"))?;
    data.set_len(disk_size).map_err(err("sizing the data file"))?;
    Ok((partial, data))
}

/// The byte length of block `index` of a `disk_size`-byte disk.
pub(super) fn block_len(disk_size: u64, index: u64) -> usize {
    disk_size.saturating_sub(index * BLOCK_SIZE).min(BLOCK_SIZE) as usize
}

/// The directory holding `path` (`.` for a bare name).
fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}
