//! The lazy cache directory: a layer directory (`data` + `bitmap`) that fills in.
//!
//! Created like any new layer (in `<dir>.partial/`, renamed into place), resumed after
//! checking that its bitmap is this snapshot's, persisted data-first (see [`super`]).

use super::super::fsutil;
use super::super::{io_err, VaultError};
use crate::layered_disk::{
    read_bitmap_file, write_bitmap_file, Bitmap, BitmapHeader, LayerError, LayerId, BITMAP_FILE, DATA_FILE,
};
use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

/// An opened cache directory.
#[derive(Debug)]
pub(super) struct CacheFiles {
    pub(super) data: File,
    /// The persisted bitmap (a subset of the map's blocks).
    pub(super) bits: Bitmap,
    pub(super) sealed: bool,
}

fn layer_err(step: &'static str) -> impl FnOnce(LayerError) -> VaultError {
    move |source| VaultError::Layer { step, source }
}

fn mismatch(dir: &Path, reason: String) -> VaultError {
    VaultError::Invalid { what: "lazy cache", reason: format!("{}: {reason}", dir.display()) }
}

/// Opens the cache at `dir` for a `size`-byte disk whose layer id is `id` and whose map
/// holds `present`, or creates it empty.
pub(super) fn open_or_create(dir: &Path, size: u64, id: LayerId, present: &Bitmap) -> Result<CacheFiles, VaultError> {
    match fs::symlink_metadata(dir) {
        Ok(_) => open(dir, size, id, present),
        Err(e) if e.kind() == io::ErrorKind::NotFound => create(dir, size, id, present.len()),
        Err(e) => Err(io_err("checking the lazy cache", dir)(e)),
    }
}

fn open(dir: &Path, size: u64, id: LayerId, present: &Bitmap) -> Result<CacheFiles, VaultError> {
    let (h, bits) = read_bitmap_file(&dir.join(BITMAP_FILE)).map_err(layer_err("reading the lazy cache's bitmap"))?;
    if h.id != id || h.parent != LayerId::BASE || h.disk_size != size {
        return Err(mismatch(
            dir,
            format!(
                "it is layer {} over {} for a {}-byte disk; this snapshot needs layer {id} over the base, {size} bytes",
                h.id, h.parent, h.disk_size
            ),
        ));
    }
    let mut b = 0;
    while let Some(i) = bits.next_one(b) {
        if !present.get(i) {
            return Err(mismatch(dir, format!("block {i} is marked present but is not in the snapshot's map")));
        }
        b = i + 1;
    }
    if h.sealed && bits.count_ones() != present.count_ones() {
        return Err(mismatch(dir, "sealed but incomplete".to_string()));
    }
    let path = dir.join(DATA_FILE);
    let data = OpenOptions::new().read(true).write(!h.sealed).open(&path).map_err(io_err("opening", &path))?;
    let meta = data.metadata().map_err(io_err("sizing", &path))?;
    if !meta.is_file() || meta.len() != size {
        return Err(mismatch(dir, format!("data is {} bytes (or not a file), expected {size}", meta.len())));
    }
    Ok(CacheFiles { data, bits, sealed: h.sealed })
}

fn create(dir: &Path, size: u64, id: LayerId, blocks: u64) -> Result<CacheFiles, VaultError> {
    let partial = partial_of(dir)?;
    match fs::remove_dir_all(&partial) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err("removing a stale staging directory", &partial)(e)),
    }
    fsutil::create_dir(&partial, 0o700)?;
    let path = partial.join(DATA_FILE);
    let data = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(io_err("creating the lazy cache's data", &path))?;
    data.set_len(size).map_err(io_err("sizing the lazy cache's data", &path))?;
    data.sync_all().map_err(io_err("syncing the lazy cache's data", &path))?;
    let bits = Bitmap::new(blocks);
    let header = BitmapHeader { sealed: false, disk_size: size, id, parent: LayerId::BASE };
    write_bitmap_file(&partial, &header, &bits).map_err(layer_err("writing the lazy cache's bitmap"))?;
    fs::rename(&partial, dir).map_err(io_err("renaming the lazy cache into place", dir))?;
    fsutil::sync_dir(fsutil::parent_of(dir))?;
    Ok(CacheFiles { data, bits, sealed: false })
}

/// `fdatasync(data)`, then replace the bitmap with `bits` (sealed or not) atomically.
pub(super) fn persist(
    dir: &Path,
    data: &File,
    size: u64,
    id: LayerId,
    bits: &Bitmap,
    sealed: bool,
) -> Result<(), VaultError> {
    data.sync_data().map_err(io_err("syncing the lazy cache's data", &dir.join(DATA_FILE)))?;
    let header = BitmapHeader { sealed, disk_size: size, id, parent: LayerId::BASE };
    write_bitmap_file(dir, &header, bits).map_err(layer_err("writing the lazy cache's bitmap"))?;
    Ok(())
}

/// Removes the cache at `dir` and any staging leftover (Ok if absent).
pub(super) fn remove(dir: &Path) -> Result<(), VaultError> {
    for d in [dir.to_path_buf(), partial_of(dir)?] {
        match fs::remove_dir_all(&d) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err("removing the lazy cache", &d)(e)),
        }
    }
    fsutil::sync_dir(fsutil::parent_of(dir))
}

fn partial_of(dir: &Path) -> Result<PathBuf, VaultError> {
    let name = dir.file_name().ok_or_else(|| VaultError::Invalid {
        what: "lazy cache",
        reason: format!("{}: path has no file name", dir.display()),
    })?;
    let mut staging = OsString::from(name);
    staging.push(".partial");
    Ok(dir.with_file_name(staging))
}
