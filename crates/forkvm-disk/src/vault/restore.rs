//! Reading a snapshot back: as a sealed layer for a new stack, or as a flat raw image.
//!
//! Why this exists: the runtime restores a sandbox's disk by opening
//! `LayerStack::create(base, &[restored], new_top)`; one sealed layer on the base holding
//! the snapshot's full map is the simplest thing that stacks. The raw export is for
//! host-side inspection (`debugfs`, `fsck`) and never used to run a guest.

use super::fsutil;
use super::manifest::DiskMap;
use super::{io_err, Vault, VaultError};
use crate::chunk_id::ChunkId;
use crate::layered_disk::{LayerId, SealedLayerBuilder, BLOCK_SIZE};
use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// What [`Vault::restore_layer`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoredLayer {
    /// The sealed layer directory.
    pub dir: PathBuf,
    /// Its (fresh) id; its parent is [`LayerId::BASE`].
    pub id: LayerId,
    /// Blocks present in it.
    pub blocks: u64,
    /// Disk size in bytes.
    pub disk_size: u64,
    /// The base image name the snapshot was taken over.
    pub base_key: String,
}

impl Vault {
    /// Disk `disk_id` of snapshot `seq`.
    pub(crate) fn disk_map(&self, seq: u64, disk_id: &str) -> Result<DiskMap, VaultError> {
        let m = self.load(seq)?;
        m.disks.into_iter().find(|d| d.id == disk_id).ok_or_else(|| VaultError::NotFound {
            what: format!("disk {disk_id:?} in snapshot {seq}"),
            path: self.manifest_path(seq),
        })
    }

    /// Calls `f(first_block, plaintext)` for every extent of `map`, authenticated.
    fn for_each_extent(
        &self,
        map: &DiskMap,
        mut f: impl FnMut(u64, &[u8]) -> Result<(), VaultError>,
    ) -> Result<(), VaultError> {
        for (first, count, hex) in &map.extents {
            let name =
                ChunkId::from_hex(hex).map_err(|e| VaultError::Invalid { what: "map", reason: e.to_string() })?;
            let plain = self.chunks.get(&name, map.extent_len(*first, *count))?;
            f(*first, &plain)?;
        }
        Ok(())
    }

    /// Writes disk `disk_id` of snapshot `seq` as a sealed layer at `out_dir` (which must
    /// not exist) whose parent is the base, holding every block of the snapshot's map.
    /// Built in `<out_dir>.partial/` and renamed into place.
    pub fn restore_layer(&self, seq: u64, disk_id: &str, out_dir: &Path) -> Result<RestoredLayer, VaultError> {
        let _lock = self.lock(libc::LOCK_SH)?;
        let map = self.disk_map(seq, disk_id)?;
        let layer_err = |step| move |source| VaultError::Layer { step, source };
        let mut builder =
            SealedLayerBuilder::create(out_dir, map.size, LayerId::BASE).map_err(layer_err("creating the layer"))?;
        self.for_each_extent(&map, |first, plain| {
            builder.put_blocks(first, plain).map_err(layer_err("writing restored blocks"))
        })?;
        let layer = builder.finish().map_err(layer_err("sealing the restored layer"))?;
        Ok(RestoredLayer {
            dir: out_dir.to_path_buf(),
            id: layer.id(),
            blocks: layer.present_count(),
            disk_size: map.size,
            base_key: map.base_key,
        })
    }

    /// Writes a flat sparse raw image of disk `disk_id` of snapshot `seq` to `out`:
    /// `base` (which must have the disk's size) overlaid with the snapshot's blocks.
    /// Written as `<out>.partial`, synced, and renamed into place.
    pub fn export_raw(&self, seq: u64, disk_id: &str, base: &Path, out: &Path) -> Result<(), VaultError> {
        let _lock = self.lock(libc::LOCK_SH)?;
        let map = self.disk_map(seq, disk_id)?;
        let mut src = File::open(base).map_err(io_err("opening base image", base))?;
        // Seeking to the end also sizes block devices, whose metadata length is 0.
        let base_size = src.seek(SeekFrom::End(0)).map_err(io_err("sizing base image", base))?;
        src.rewind().map_err(io_err("sizing base image", base))?;
        if base_size != map.size {
            return Err(VaultError::Invalid {
                what: "base image",
                reason: format!("{} is {base_size} bytes, the snapshot's disk is {}", base.display(), map.size),
            });
        }
        let mut name = out.file_name().map(OsString::from).unwrap_or_default();
        name.push(".partial");
        let tmp = out.with_file_name(name);
        let dst = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(io_err("creating raw image", &tmp))?;
        dst.set_len(map.size).map_err(io_err("sizing raw image", &tmp))?;
        let written = copy_sparse(&mut src, &dst, base, &tmp).and_then(|()| {
            self.for_each_extent(&map, |first, plain| {
                dst.write_all_at(plain, first * BLOCK_SIZE).map_err(io_err("writing raw image", &tmp))
            })
        });
        if let Err(e) = written.and_then(|()| dst.sync_all().map_err(io_err("syncing raw image", &tmp))) {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        fsutil::commit(&tmp, out)
    }
}

/// Copies `src` into `dst` (already sized), leaving all-zero 64 KiB runs as holes.
fn copy_sparse(src: &mut File, dst: &File, base: &Path, tmp: &Path) -> Result<(), VaultError> {
    let mut buf = vec![0u8; 64 << 10];
    let mut at = 0u64;
    loop {
        let n = match src.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io_err("reading base image", base)(e)),
        };
        if buf[..n].iter().any(|&b| b != 0) {
            dst.write_all_at(&buf[..n], at).map_err(io_err("writing raw image", tmp))?;
        }
        at += n as u64;
    }
}
