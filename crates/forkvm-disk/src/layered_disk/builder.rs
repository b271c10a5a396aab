//! Building a sealed layer from blocks that come from elsewhere (e.g. a vault restore).
//!
//! Why this exists: a stack only makes sealed layers by sealing its top, which takes a
//! writable top and a copy-up path. A restore has the blocks in hand and wants a sealed
//! layer straight away, crash-safely: the layer is built in `<dir>.partial/` (data
//! written, bitmap persisted with the sealed flag, both synced) and renamed to `dir`
//! only once complete, so `dir` either does not exist or is a whole sealed layer.
//!
//! [`SealedLayerBuilder::adopt`] makes a layer of a flat image that already mirrors
//! block offsets (a VM's memory image): the file is moved in as the data file and its
//! non-zero blocks marked present, so the vault can store memory like a disk.

use super::bitmap::{self, Header};
use super::layer::block_len;
use super::{blocks_for, Bitmap, Layer, LayerError, LayerId, BLOCK_SIZE, DATA_FILE, MAX_DISK_BYTES};
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// A sealed layer under construction in `<dir>.partial/`. Dropping it without
/// [`SealedLayerBuilder::finish`] leaves the staging directory, which the next
/// [`SealedLayerBuilder::create`] for the same `dir` removes.
#[derive(Debug)]
pub struct SealedLayerBuilder {
    dir: PathBuf,
    partial: PathBuf,
    data: File,
    disk_size: u64,
    parent: LayerId,
    bits: Bitmap,
    /// The id to give the layer; a fresh one when `None`.
    id: Option<LayerId>,
}

impl SealedLayerBuilder {
    /// Starts a sealed layer for a `disk_size`-byte disk on top of `parent`; `dir` must
    /// not exist.
    pub fn create(dir: &Path, disk_size: u64, parent: LayerId) -> Result<SealedLayerBuilder, LayerError> {
        if disk_size > MAX_DISK_BYTES {
            return Err(LayerError::BaseTooLarge { path: dir.to_path_buf(), size: disk_size, max: MAX_DISK_BYTES });
        }
        let (partial, data) = super::layer::stage(dir, disk_size)?;
        let bits = Bitmap::new(blocks_for(disk_size));
        Ok(SealedLayerBuilder { dir: dir.to_path_buf(), partial, data, disk_size, parent, bits, id: None })
    }

    /// Stores `data` as blocks `first..`: its length must be exactly the byte length of
    /// those blocks (4096 each, less for a partial last block of the disk). All-zero
    /// blocks are marked present but left as holes.
    pub fn put_blocks(&mut self, first: u64, data: &[u8]) -> Result<(), LayerError> {
        let offset = first.saturating_mul(BLOCK_SIZE);
        let len = data.len() as u64;
        let end = offset.checked_add(len).filter(|&e| e <= self.disk_size && offset < e);
        let Some(end) = end else {
            return Err(LayerError::OutOfRange { offset, len, size: self.disk_size });
        };
        let last = blocks_for(end) - 1;
        if end % BLOCK_SIZE != 0 && end != self.disk_size {
            let e = io::Error::new(io::ErrorKind::InvalidInput, format!("{len} bytes at block {first} end mid-block"));
            return Err(LayerError::CreateLayer {
                path: self.dir.clone(),
                step: "checking the block length",
                source: e,
            });
        }
        for (i, block) in data.chunks(BLOCK_SIZE as usize).enumerate() {
            let index = first + i as u64;
            debug_assert_eq!(block.len(), block_len(self.disk_size, index));
            if block.iter().any(|&b| b != 0) {
                let at = index * BLOCK_SIZE;
                self.data.write_all_at(block, at).map_err(|source| LayerError::Write {
                    path: self.partial.join(DATA_FILE),
                    offset: at,
                    source,
                })?;
            }
        }
        self.bits.set_range(first, last + 1);
        Ok(())
    }

    /// Gives the layer `id` instead of a fresh one: a merge of layers `a..=b` is
    /// "the disk as of `b`", so it keeps `b`'s id (see [`super::merge_layers`]).
    pub(super) fn with_id(mut self, id: LayerId) -> SealedLayerBuilder {
        self.id = Some(id);
        self
    }

    /// Stores block `index` (see [`SealedLayerBuilder::put_blocks`]).
    pub fn put_block(&mut self, index: u64, data: &[u8]) -> Result<(), LayerError> {
        self.put_blocks(index, data)
    }

    /// Makes the flat image `image` (moved in by `rename`, so on the same filesystem as
    /// `dir`) the data file of a sealed layer at `dir` on top of `parent`. Every block
    /// that is not all zeros is present; holes and zero blocks are absent, so they read
    /// through to what is below (for a memory image: the all-zero base). Once moved,
    /// `image` is the layer's (or, after a later failure, its staging directory's).
    pub fn adopt(dir: &Path, image: &Path, parent: LayerId) -> Result<Layer, LayerError> {
        let err = |step| move |source| LayerError::CreateLayer { path: dir.to_path_buf(), step, source };
        let size = fs::metadata(image).map_err(err("sizing the image"))?.len();
        let mut builder = SealedLayerBuilder::create(dir, size, parent)?;
        let data_path = builder.partial.join(DATA_FILE);
        fs::rename(image, &data_path).map_err(err("moving the image in"))?;
        builder.data = File::open(&data_path).map_err(err("opening the image"))?;
        let extents =
            crate::data_extents::data_extents(&builder.data, size).map_err(err("finding the image's data extents"))?;
        let mut buf = vec![0u8; 1 << 20];
        for &(offset, len) in &extents {
            let (mut at, end) = (offset / BLOCK_SIZE * BLOCK_SIZE, offset + len);
            while at < end {
                let n = ((end - at) as usize).min(buf.len());
                let n = n.div_ceil(BLOCK_SIZE as usize) * BLOCK_SIZE as usize;
                let n = n.min((size - at) as usize);
                builder.data.read_exact_at(&mut buf[..n], at).map_err(err("reading the image"))?;
                for (i, block) in buf[..n].chunks(BLOCK_SIZE as usize).enumerate() {
                    if block.iter().any(|&b| b != 0) {
                        let index = at / BLOCK_SIZE + i as u64;
                        builder.bits.set_range(index, index + 1);
                    }
                }
                at += n as u64;
            }
        }
        builder.finish()
    }

    /// Syncs the data, persists the sealed bitmap, renames the layer into place and
    /// opens it.
    pub fn finish(self) -> Result<Layer, LayerError> {
        let dir = self.dir.as_path();
        let err = |step| move |source| LayerError::CreateLayer { path: dir.to_path_buf(), step, source };
        self.data.sync_all().map_err(err("syncing the data file"))?;
        drop(self.data);
        let header = Header {
            sealed: true,
            disk_size: self.disk_size,
            id: self.id.unwrap_or_else(|| LayerId::generate(dir)),
            parent: self.parent,
        };
        bitmap::write_file(&self.partial, &header, &self.bits)?;
        fs::rename(&self.partial, dir).map_err(err("renaming the staging directory into place"))?;
        let parent = match dir.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        bitmap::sync_dir(parent).map_err(err("syncing the parent directory"))?;
        Layer::open_sealed(dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layered_disk::LayerStack;

    #[test]
    fn built_layer_stacks_on_the_base_and_reads_back() {
        let tmp = tempfile::tempdir().unwrap();
        let size = 5 * BLOCK_SIZE + 100;
        let base = tmp.path().join("base");
        fs::write(&base, vec![0xaa; size as usize]).unwrap();
        let dir = tmp.path().join("built");
        let mut b = SealedLayerBuilder::create(&dir, size, LayerId::BASE).unwrap();
        assert!(tmp.path().join("built.partial").exists() && !dir.exists());
        b.put_blocks(1, &[1u8; 2 * BLOCK_SIZE as usize]).unwrap();
        b.put_block(3, &[0u8; BLOCK_SIZE as usize]).unwrap();
        b.put_block(5, &[5u8; 100]).unwrap();
        assert!(matches!(b.put_block(6, &[0u8; 1]), Err(LayerError::OutOfRange { .. })));
        assert!(matches!(b.put_block(0, &[]), Err(LayerError::OutOfRange { .. })));
        assert!(matches!(b.put_block(0, &[0u8; 10]), Err(LayerError::CreateLayer { .. })));
        let layer = b.finish().unwrap();
        assert!(layer.is_sealed() && layer.parent() == LayerId::BASE && layer.present_count() == 4);
        assert!(!tmp.path().join("built.partial").exists());
        let stack = LayerStack::create(&base, std::slice::from_ref(&dir), &tmp.path().join("top")).unwrap();
        let mut disk = vec![0u8; size as usize];
        stack.read_at(&mut disk, 0).unwrap();
        let bs = BLOCK_SIZE as usize;
        let mut want = vec![0xaa; size as usize];
        want[bs..3 * bs].fill(1);
        want[3 * bs..4 * bs].fill(0);
        want[5 * bs..].fill(5);
        assert!(disk == want);
        assert!(matches!(SealedLayerBuilder::create(&dir, size, LayerId::BASE), Err(LayerError::LayerExists { .. })));
    }

    #[test]
    fn an_adopted_image_keeps_its_non_zero_blocks_and_reads_back_whole() {
        let tmp = tempfile::tempdir().unwrap();
        let bs = BLOCK_SIZE as usize;
        let size = 300 * BLOCK_SIZE;
        let image = tmp.path().join("memory.img");
        let f = File::create(&image).unwrap();
        f.set_len(size).unwrap();
        let mut want = vec![0u8; size as usize];
        // A block at the start, a run crossing the 1 MiB read buffer, one zero block
        // written (allocated but all zeros), and the last block.
        for (block, byte) in [(0, 1u8), (255, 2), (256, 3), (257, 4), (299, 5)] {
            want[block * bs..(block + 1) * bs].fill(byte);
            f.write_all_at(&want[block * bs..(block + 1) * bs], (block * bs) as u64).unwrap();
        }
        f.write_all_at(&vec![0u8; bs], (100 * bs) as u64).unwrap();
        drop(f);
        let dir = tmp.path().join("mem-layer");
        let layer = SealedLayerBuilder::adopt(&dir, &image, LayerId::BASE).unwrap();
        assert!(!image.exists(), "the image is moved, not copied");
        assert!(layer.is_sealed() && layer.parent() == LayerId::BASE && layer.disk_size() == size);
        let present: Vec<u64> = (0..300).filter(|&b| layer.is_present(b)).collect();
        assert_eq!(present, vec![0, 255, 256, 257, 299], "zero and hole blocks are absent");
        let zeros = tmp.path().join("zeros");
        File::create(&zeros).unwrap().set_len(size).unwrap();
        let stack = LayerStack::create(&zeros, std::slice::from_ref(&dir), &tmp.path().join("top")).unwrap();
        let mut got = vec![0u8; size as usize];
        stack.read_at(&mut got, 0).unwrap();
        assert!(got == want);
        // A missing image is an error naming the layer; nothing is left behind.
        let gone = SealedLayerBuilder::adopt(&tmp.path().join("other"), &image, LayerId::BASE);
        assert!(matches!(gone, Err(LayerError::CreateLayer { step: "sizing the image", .. })), "{gone:?}");
        assert!(!tmp.path().join("other").exists());
    }
}
