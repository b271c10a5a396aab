//! The virtio-blk device: executes parsed requests against a raw image file or a
//! layered disk (base image + sealed layers + writable top, DESIGN §5).
//!
//! Requests run synchronously on the vCPU thread that wrote QueueNotify, with positional
//! I/O (`pread`/`pwrite`) so no file offset is shared. A rate limit (`virtio::throttle`)
//! leaves a request it holds back in the queue, and the device timer thread serves it
//! later (`devices::deferred`). Data moves through a bounded
//! bounce buffer, so a guest cannot make the VMM allocate more than [`IO_CHUNK`] per
//! step whatever lengths its descriptors claim.

use super::metrics::{add, BlockMetrics};
use super::request::{self, total_len, Command, Segment};
use super::{BlockError, BLOCK_ID_BYTES, BLOCK_QUEUE_SIZE, F_FLUSH, F_RO, SECTOR_SIZE, S_IOERR, S_OK, S_UNSUPP};
use crate::devices::virtio::device::{TYPE_BLOCK, VIRTIO_F_VERSION_1};
use crate::devices::virtio::ratelimit::LogLimiter;
use crate::devices::virtio::throttle::{queue_has_pending, RateLimit, Throttle};
use crate::devices::virtio::{ActivateContext, ActivateError, Interrupt, VirtioDevice, VirtioDeviceState};
use forkvm_snapshot::{LayerId, LayerStack, SealedLayer};
use std::fs::File;
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use virtio_queue::{Queue, QueueOwnedT, QueueState, QueueT};
use vm_memory::{Address, Bytes, GuestMemoryMmap};

/// Largest piece of data moved between the image and guest memory at once.
pub const IO_CHUNK: usize = 128 * 1024;

/// What the device holds while the driver has it running.
#[derive(Debug)]
struct Active {
    mem: GuestMemoryMmap,
    notify_used: Arc<dyn Interrupt>,
    queue: Queue,
}

/// Where the disk's bytes live.
#[derive(Debug)]
pub(super) enum Backend {
    /// One image file, read and written in place.
    Raw(File),
    /// A layered disk: reads fall through the layers, writes go to the top.
    Layered(Box<LayerStack>),
}

/// The image and what the guest is told about it.
#[derive(Debug)]
pub(super) struct Disk {
    /// The image (a layered disk's base).
    pub(super) path: PathBuf,
    pub(super) backend: Backend,
    pub(super) read_only: bool,
    /// In 512-byte sectors.
    pub(super) capacity: u64,
    pub(super) id: String,
}

#[derive(Debug)]
pub struct Block {
    pub(super) disk: Disk,
    pub(super) acked_features: u64,
    active: Option<Active>,
    metrics: Arc<BlockMetrics>,
    log_limit: LogLimiter,
    /// The lazily restored lowest layer, until it is settled (`lazy.rs`).
    pub(super) lazy: Option<super::lazy::LazyDisk>,
    throttle: Throttle,
    /// A restore put a disk into this empty slot; the driver is not told yet.
    pub(super) media_changed: bool,
}

impl Block {
    /// Opens the raw image at `path` (read-write unless `read_only`). The capacity is
    /// the file size in whole sectors; a partial last sector is unreachable. `id` is the
    /// serial the guest reads with GET_ID (at most 20 bytes).
    pub fn new(path: &Path, read_only: bool, id: &str) -> Result<Block, BlockError> {
        if id.len() > BLOCK_ID_BYTES {
            return Err(BlockError::IdTooLong(id.to_string()));
        }
        let mut file = forkvm_snapshot::preopened::open(path, !read_only)
            .map_err(|source| BlockError::OpenImage { path: path.to_path_buf(), source })?;
        // Seeking to the end also sizes block devices, whose metadata length is 0.
        let size =
            file.seek(SeekFrom::End(0)).map_err(|source| BlockError::SizeImage { path: path.to_path_buf(), source })?;
        if size & (SECTOR_SIZE - 1) != 0 {
            tracing::warn!(path = %path.display(), size, "disk image size is not a multiple of 512; the tail is unreachable");
        }
        let disk = Disk {
            path: path.to_path_buf(),
            backend: Backend::Raw(file),
            read_only,
            capacity: size / SECTOR_SIZE,
            id: id.to_string(),
        };
        Ok(Block::with_disk(disk))
    }

    /// A writable layered disk: `base` and `sealed` (oldest first) as they are, and a
    /// fresh, empty top at `top` (created on the first write). `id` as in [`Block::new`].
    pub fn layered(base: &Path, sealed: &[PathBuf], top: &Path, id: &str) -> Result<Block, BlockError> {
        if id.len() > BLOCK_ID_BYTES {
            return Err(BlockError::IdTooLong(id.to_string()));
        }
        let stack = LayerStack::create_lazy(base, sealed, top).map_err(BlockError::Layers)?;
        Block::with_stack(base, stack, id)
    }

    /// A writable layered disk over `stack` (whose base is `base`).
    pub(super) fn with_stack(base: &Path, stack: LayerStack, id: &str) -> Result<Block, BlockError> {
        if id.len() > BLOCK_ID_BYTES {
            return Err(BlockError::IdTooLong(id.to_string()));
        }
        let size = stack.size();
        if size & (SECTOR_SIZE - 1) != 0 {
            tracing::warn!(path = %base.display(), size, "disk base size is not a multiple of 512; the tail is unreachable");
        }
        let disk = Disk {
            path: base.to_path_buf(),
            backend: Backend::Layered(Box::new(stack)),
            read_only: false,
            capacity: size / SECTOR_SIZE,
            id: id.to_string(),
        };
        Ok(Block::with_disk(disk))
    }

    fn with_disk(disk: Disk) -> Block {
        Block {
            disk,
            acked_features: 0,
            active: None,
            metrics: Arc::default(),
            log_limit: LogLimiter::default(),
            lazy: None,
            throttle: Throttle::default(),
            media_changed: false,
        }
    }

    /// The same device, refusing the guest's writes when `read_only` (a layered disk
    /// attached read-only: its top is never written). The feature bits are unchanged
    /// for a layered disk, so a slot the driver negotiated writable can hold it.
    pub fn refusing_writes(mut self, read_only: bool) -> Block {
        self.disk.read_only |= read_only;
        self
    }

    /// Whether a restore put a disk into this empty slot and the driver has not been
    /// told; telling it is the caller's (a configuration-change interrupt), once.
    pub fn take_media_change(&mut self) -> bool {
        std::mem::take(&mut self.media_changed)
    }

    /// The same device with its requests capped by `limit`.
    pub fn with_rate_limit(mut self, limit: RateLimit) -> Block {
        self.throttle = Throttle::new(limit);
        self
    }

    /// A layered disk's sealed layers, oldest first (directory and id); `None` for a raw image.
    pub fn sealed_layers(&self) -> Option<Vec<(PathBuf, LayerId)>> {
        match &self.disk.backend {
            Backend::Raw(_) => None,
            Backend::Layered(s) => Some(s.sealed_layers().iter().map(|l| (l.dir().to_path_buf(), l.id())).collect()),
        }
    }

    /// Replaces sealed layers `range` with their merge at `merged`
    /// (`LayerStack::replace_sealed`), under the device's lock: no request is split.
    pub fn replace_sealed(&mut self, range: std::ops::Range<usize>, merged: &Path) -> Result<(), BlockError> {
        match &mut self.disk.backend {
            Backend::Layered(s) => s.replace_sealed(range, merged).map_err(BlockError::Layers),
            Backend::Raw(_) => Err(BlockError::Layers(forkvm_snapshot::LayerError::Merge {
                path: merged.to_path_buf(),
                reason: "the disk is a raw image".into(),
            })),
        }
    }

    /// Seals a layered disk's top and starts an empty one at `new_top`, capturing the
    /// disk as the guest has written it so far (requests run under the device's lock,
    /// so none is half done). `Ok(None)` when there is nothing to seal: a raw image, or a
    /// top the guest has not written (no new layer is made, `new_top` is not used).
    pub fn seal(&mut self, new_top: &Path) -> Result<Option<SealedLayer>, BlockError> {
        match &mut self.disk.backend {
            Backend::Layered(s) if !s.top_is_empty() => s.seal(new_top).map(Some).map_err(BlockError::Layers),
            _ => Ok(None),
        }
    }

    /// The disk size in 512-byte sectors.
    pub fn capacity(&self) -> u64 {
        self.disk.capacity
    }

    /// The device's counters, shared with whoever reports them.
    pub fn metrics(&self) -> Arc<BlockMetrics> {
        self.metrics.clone()
    }

    /// Serves every available chain, then notifies the driver if it wants to be.
    pub fn process_queue(&mut self) -> Result<(), BlockError> {
        let active = self.active.as_mut().ok_or(BlockError::NotActive)?;
        let mem = &active.mem;
        let mut used_any = false;
        while let Some(chain) = active.queue.pop_descriptor_chain(mem) {
            let head = chain.head_index();
            let parsed = request::parse(mem, chain);
            let bytes = match &parsed {
                Ok(request::Request { command: Ok(Command::In { data, .. } | Command::Out { data, .. }), .. }) => {
                    total_len(data)
                }
                _ => 0,
            };
            if !self.throttle.admit(bytes) {
                // Left in the queue for the pass the throttle asked for.
                active.queue.go_to_previous_position();
                break;
            }
            add(&self.metrics.requests, 1);
            let used_len = match parsed {
                Ok(req) => {
                    let (status, written) = match req.command {
                        Ok(cmd) => self.disk.execute(mem, &cmd, &self.metrics),
                        Err(e) => Err(BlockError::Malformed(e)),
                    }
                    .map_or_else(|e| (answer(&e), 0), |written| (S_OK, written));
                    if status != S_OK {
                        add(if status == S_UNSUPP { &self.metrics.unsupported } else { &self.metrics.errors }, 1);
                    }
                    match mem.write_obj(status, req.status) {
                        Ok(()) => written + 1,
                        Err(e) => {
                            log(&mut self.log_limit, head, &BlockError::GuestMemory(e));
                            written
                        }
                    }
                }
                Err(e) => {
                    add(&self.metrics.errors, 1);
                    log(&mut self.log_limit, head, &BlockError::Malformed(e));
                    0
                }
            };
            active.queue.add_used(mem, head, used_len).map_err(BlockError::AddUsed)?;
            used_any = true;
        }
        // Without EVENT_IDX this is always true; with it, it honours used_event.
        if used_any && active.queue.needs_notification(mem).map_err(BlockError::AddUsed)? {
            if let Err(e) = active.notify_used.trigger() {
                if let Some(suppressed) = self.log_limit.allow() {
                    tracing::warn!(error = %e, suppressed, "virtio-blk interrupt failed");
                }
            }
        }
        Ok(())
    }
}

/// The status byte for a failed request.
fn answer(e: &BlockError) -> u8 {
    match e {
        BlockError::Unsupported(_) => S_UNSUPP,
        _ => S_IOERR,
    }
}

fn log(limit: &mut LogLimiter, head: u16, e: &BlockError) {
    if let Some(suppressed) = limit.allow() {
        tracing::warn!(error = %e, head, suppressed, "virtio-blk request failed");
    }
}

impl Disk {
    /// Runs one request; `Ok` is the number of bytes written into guest buffers.
    fn execute(&mut self, mem: &GuestMemoryMmap, cmd: &Command, metrics: &BlockMetrics) -> Result<u32, BlockError> {
        match cmd {
            Command::In { sector, data } => {
                let offset = self.check_range(*sector, data)?;
                self.read_into(mem, offset, data)?;
                let len = total_len(data);
                add(&metrics.read_bytes, len);
                // Chains are at most 32768 descriptors of u32 length; clamp for the used ring.
                Ok(u32::try_from(len).unwrap_or(u32::MAX))
            }
            Command::Out { sector, data } => {
                if self.read_only {
                    return Err(BlockError::ReadOnly);
                }
                let offset = self.check_range(*sector, data)?;
                self.write_from(mem, offset, data)?;
                add(&metrics.write_bytes, total_len(data));
                Ok(0)
            }
            Command::Flush => {
                add(&metrics.flushes, 1);
                if !self.read_only {
                    match &mut self.backend {
                        Backend::Raw(file) => file.sync_data().map_err(BlockError::FlushImage)?,
                        Backend::Layered(stack) => stack.flush().map_err(BlockError::Layers)?,
                    }
                }
                Ok(0)
            }
            Command::GetId { data } => {
                let mut serial = [0u8; BLOCK_ID_BYTES];
                serial[..self.id.len()].copy_from_slice(self.id.as_bytes());
                let mut written = 0usize;
                for seg in data {
                    let n = (seg.len as usize).min(BLOCK_ID_BYTES - written);
                    mem.write_slice(&serial[written..written + n], seg.addr).map_err(BlockError::GuestMemory)?;
                    written += n;
                }
                Ok(written as u32)
            }
            Command::Unsupported { kind } => Err(BlockError::Unsupported(*kind)),
        }
    }

    /// The byte offset of `sector`, if the whole transfer fits on the disk.
    fn check_range(&self, sector: u64, data: &[Segment]) -> Result<u64, BlockError> {
        let sectors = total_len(data) / SECTOR_SIZE;
        let end = sector.checked_add(sectors);
        if end.is_none_or(|end| end > self.capacity) {
            return Err(BlockError::OutOfRange { sector, sectors, capacity: self.capacity });
        }
        Ok(sector * SECTOR_SIZE)
    }

    fn read_into(&self, mem: &GuestMemoryMmap, mut offset: u64, data: &[Segment]) -> Result<(), BlockError> {
        let mut buf = vec![0u8; IO_CHUNK.min(total_len(data) as usize)];
        for seg in data {
            let mut done = 0u64;
            while done < u64::from(seg.len) {
                let n = (u64::from(seg.len) - done).min(buf.len() as u64) as usize;
                match &self.backend {
                    Backend::Raw(file) => file
                        .read_exact_at(&mut buf[..n], offset)
                        .map_err(|source| BlockError::ReadImage { offset, source })?,
                    Backend::Layered(stack) => stack.read_at(&mut buf[..n], offset).map_err(BlockError::Layers)?,
                }
                mem.write_slice(&buf[..n], seg_addr(seg, done)?).map_err(BlockError::GuestMemory)?;
                done += n as u64;
                offset += n as u64;
            }
        }
        Ok(())
    }

    fn write_from(&mut self, mem: &GuestMemoryMmap, mut offset: u64, data: &[Segment]) -> Result<(), BlockError> {
        let mut buf = vec![0u8; IO_CHUNK.min(total_len(data) as usize)];
        for seg in data {
            let mut done = 0u64;
            while done < u64::from(seg.len) {
                let n = (u64::from(seg.len) - done).min(buf.len() as u64) as usize;
                mem.read_slice(&mut buf[..n], seg_addr(seg, done)?).map_err(BlockError::GuestMemory)?;
                match &mut self.backend {
                    Backend::Raw(file) => file
                        .write_all_at(&buf[..n], offset)
                        .map_err(|source| BlockError::WriteImage { offset, source })?,
                    Backend::Layered(stack) => stack.write_at(&buf[..n], offset).map_err(BlockError::Layers)?,
                }
                done += n as u64;
                offset += n as u64;
            }
        }
        Ok(())
    }
}

/// The guest address `done` bytes into `seg`.
fn seg_addr(seg: &Segment, done: u64) -> Result<vm_memory::GuestAddress, BlockError> {
    seg.addr
        .checked_add(done)
        .ok_or(BlockError::GuestMemory(vm_memory::GuestMemoryError::InvalidGuestAddress(seg.addr)))
}

impl VirtioDevice for Block {
    fn device_type(&self) -> u32 {
        TYPE_BLOCK
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[BLOCK_QUEUE_SIZE]
    }

    fn device_features(&self) -> u64 {
        // A layered disk never offers RO: an empty volume slot is negotiated writable
        // and may later hold a read-only volume (its writes are refused instead).
        let layered = matches!(self.disk.backend, Backend::Layered(_));
        let ro = if self.disk.read_only && !layered { F_RO } else { 0 };
        VIRTIO_F_VERSION_1 | F_FLUSH | ro
    }

    fn set_acked_features(&mut self, features: u64) {
        self.acked_features = features & self.device_features();
    }

    /// The configuration space holds only `capacity` (u64 at offset 0): no other
    /// config-field features are offered, so the rest reads as zero.
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        let config = self.disk.capacity.to_le_bytes();
        let start = offset.min(config.len() as u64) as usize;
        let n = (config.len() - start).min(data.len());
        data[..n].copy_from_slice(&config[start..start + n]);
    }

    fn write_config(&mut self, _offset: u64, _data: &[u8]) {
        // `writeback` is the only writable field and needs CONFIG_WCE, not offered.
    }

    fn activate(&mut self, ctx: ActivateContext, queues: Vec<Queue>) -> Result<(), ActivateError> {
        let [queue]: [Queue; 1] = queues.try_into().map_err(|q: Vec<Queue>| ActivateError::QueueCount {
            device: "virtio-blk",
            want: 1,
            got: q.len(),
        })?;
        self.active = Some(Active { mem: ctx.mem, notify_used: ctx.notify_used, queue });
        Ok(())
    }

    fn queue_notify(&mut self, index: u16) {
        if index != 0 {
            return;
        }
        if let Err(e) = self.process_queue() {
            add(&self.metrics.errors, 1);
            log(&mut self.log_limit, 0, &e);
        }
    }

    fn reset(&mut self) {
        self.active = None;
        self.acked_features = 0;
    }

    fn queue_states(&self) -> Vec<QueueState> {
        self.active.iter().map(|a| a.queue.state()).collect()
    }

    fn save(&self) -> VirtioDeviceState {
        VirtioDeviceState::Block(self.state())
    }

    fn throttle(&self) -> Option<&Throttle> {
        Some(&self.throttle)
    }

    fn throttle_mut(&mut self) -> Option<&mut Throttle> {
        Some(&mut self.throttle)
    }

    fn has_pending(&self) -> bool {
        self.active.as_ref().is_some_and(|a| queue_has_pending(&a.queue, &a.mem))
    }

    /// An orderly stop makes a layered disk's writes durable (the guest may not have
    /// flushed); a raw image's writes are in the page cache already.
    fn shutdown(&mut self) {
        // A VM that stops ends its restore's recording, and its lazy layer stops pinning
        // the source's snapshot (the run directory, cache included, goes with the VMM).
        if let Some(layer) = self.lazy.as_ref().map(super::lazy::LazyDisk::layer) {
            let _ = self.lazy_report(true);
            self.lazy = None;
            if let Err(e) = layer.release() {
                tracing::warn!(error = %e, "releasing the lazy disk's snapshot pin failed");
            }
        }
        if let Backend::Layered(stack) = &mut self.disk.backend {
            if let Err(e) = stack.flush() {
                tracing::warn!(error = %e, "flushing the layered disk at shutdown failed");
            }
        }
    }

    fn as_block_mut(&mut self) -> Option<&mut Block> {
        Some(self)
    }

    fn take_config_change(&mut self) -> bool {
        self.take_media_change()
    }
}
