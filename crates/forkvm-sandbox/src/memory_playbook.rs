//! Memory playbooks on the spawn path: which one a spawn replays, and recording into it
//! once a spawned sandbox answers (the VMM side is `forkvm_vmm::vstate::memory_playbook`).
//!
//! A playbook belongs to one memory image. Tags, their spawn sources and chunked
//! snapshots' assembled images share `memory.img` by hard link, so the image is named by
//! its file identity (device, inode, size, modification time): every spawn from the same
//! image reads and improves the same playbook, and an image rewritten in place gets a
//! new one. Playbooks live in the cache (`$FORKVM_CACHE/playbooks/memory-<key>.playbook`):
//! deleting them only loses the head start, and the next spawns learn it again.
//!
//! A spawn's first ready sandbox records twice: when it answers, and again after its
//! first call (exec or eval, CLI or daemon), so the pages a typical first request
//! touches are in the playbook too. The second recording is armed by a marker in the
//! sandbox's run directory ([`arm_first_call`]) that the first call claims.

use crate::registry::SandboxRecord;
use crate::verbs::{call, LifecycleError};
use forkvm_snapshot::vault::Playbook;
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
/// Under a memory limit, a playbook larger than a quarter of it is not replayed: the
/// pages a child maps ahead are charged to its cgroup, and must never be what pushes a
/// small sandbox over its limit.
pub fn replay(zygote: &mut Zygote, path: &Path, memory_limit_bytes: Option<u64>) -> u64 {
    let Ok(book) = Playbook::load(path) else { return 0 };
    let prefetch = MemoryPrefetch::from_playbook(&book);
    let pages = prefetch.pages();
    if memory_limit_bytes.is_some_and(|limit| pages.saturating_mul(PAGE_BYTES) > limit / 4) {
        return 0;
    }
    zygote.prefetch_memory(prefetch);
    pages
}

/// Bytes of a guest page, the unit of a memory playbook.
const PAGE_BYTES: u64 = 4096;

/// Arms the recording after sandbox `record`'s first call (see the module doc).
pub fn arm_first_call(record: &SandboxRecord, path: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    std::fs::write(record.dir().first_call_marker(), path.as_os_str().as_bytes())
}

/// Sandbox `id`'s record if it still waits for its first call's recording: a `stat`
/// first (cheap enough for every call), the record only then.
pub fn pending_first_call(registry: &crate::registry::Registry, id: &str) -> Option<SandboxRecord> {
    let dir = registry.run_dir(id)?;
    if !crate::run_dir::RunDir::at(&dir).first_call_marker().exists() {
        return None;
    }
    registry.get(id).ok()
}

/// After a call to sandbox `record`: if it is the first one and its spawn's playbook
/// waits for it, merges what the sandbox has touched by now. Claimed by one caller
/// (a rename); best effort (a failure is logged).
pub fn learn_after_first_call(record: &SandboxRecord) {
    use std::os::unix::ffi::OsStrExt;
    let marker = record.dir().first_call_marker();
    let claimed = record.dir().first_call_claim(std::process::id());
    if std::fs::rename(&marker, &claimed).is_err() {
        return;
    }
    let path = std::fs::read(&claimed).map(|b| PathBuf::from(std::ffi::OsStr::from_bytes(&b)));
    let _ = std::fs::remove_file(&claimed);
    let Ok(path) = path else { return };
    if let Err(e) = self::record(record, &path) {
        tracing::warn!(sandbox = %record.id, error = %e, "recording the memory playbook after the first call failed");
    }
}

/// Merges what sandbox `record` touched since its restore (its VMM reports the pages;
/// it may not write the cache) into the playbook at `path`.
pub fn record(record: &SandboxRecord, path: &Path) -> Result<MemoryRecording, LifecycleError> {
    let touched = call(record, |c| c.touched_memory())?;
    touched.merge_into(path).map_err(|e| LifecycleError::Playbook(e.to_string()))
}
