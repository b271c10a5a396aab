//! Memory playbooks on the spawn path: which one a spawn replays, and recording into it
//! once a spawned sandbox answers (the VMM side is `forkvm_vmm::vstate::memory_playbook`).
//!
//! A playbook belongs to one memory image. Tags, their spawn sources and chunked
//! snapshots' assembled images share `memory.img` by hard link, so the image is named by
//! its file identity (device, inode, size, modification time): every spawn from the same
//! image reads and improves the same playbook, and an image rewritten in place gets a
//! new one. Playbooks live in the cache (`$FORKVM_CACHE/playbooks/memory-<key>.playbook`):
//! deleting them only loses the head start, and the next spawns learn it again.

use crate::lifecycle::{call_as, LifecycleError};
use crate::registry::SandboxRecord;
use forkvm_snapshot::vault::Playbook;
use forkvm_vmm::control::Request;
use forkvm_vmm::vstate::memory_playbook::{MemoryPrefetch, MemoryRecording};
use forkvm_vmm::zygote::Zygote;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The playbook of the memory image at `memory` (`None` if the image cannot be read).
pub fn playbook_path(memory: &Path) -> Option<PathBuf> {
    let m = std::fs::metadata(memory).ok()?;
    let mut h = blake3::Hasher::new_derive_key("forkvm memory playbook key v1");
    for v in [m.dev(), m.ino(), m.size(), m.mtime() as u64, m.mtime_nsec() as u64] {
        h.update(&v.to_le_bytes());
    }
    let key = &h.finalize().to_hex()[..32];
    Some(forkvm_image::kernel::cache_dir().join("playbooks").join(format!("memory-{key}.playbook")))
}

/// Whether spawns replay memory playbooks: yes unless `FORKVM_MEMORY_PREFETCH=0` (they
/// still record into them).
pub fn replay_enabled() -> bool {
    std::env::var("FORKVM_MEMORY_PREFETCH").map_or(true, |v| v != "0")
}

/// Makes `zygote` replay the playbook at `path`, if there is one; returns its pages.
/// An unreadable playbook is ignored (a spawn never fails for want of a prefetch).
pub fn replay(zygote: &mut Zygote, path: &Path) -> u64 {
    let Ok(book) = Playbook::load(path) else { return 0 };
    let prefetch = MemoryPrefetch::from_playbook(&book);
    let pages = prefetch.pages();
    zygote.prefetch_memory(prefetch);
    pages
}

/// Merges what sandbox `record` touched since its restore into the playbook at `path`.
pub fn record(record: &SandboxRecord, path: &Path) -> Result<MemoryRecording, LifecycleError> {
    call_as(record, &Request::RecordMemoryPlaybook { path: path.to_path_buf() })
}
