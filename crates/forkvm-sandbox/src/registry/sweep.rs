//! The clean-up pass, the only one that removes anything (reads never do). The daemon
//! runs it on a timer, the CLI as `forkvm sweep`, and [`Registry::recover`] starts with
//! it. For each row:
//!
//! - `running`/`paused` whose VMM died: its disk writes are salvaged into its vault
//!   (when the registry knows the store), its run directory and row removed; one
//!   restored from an archive goes back to `archived` (reason `recovered`), as does one
//!   whose archiver died after sealing its new archive (which is moved into place).
//! - `starting`/`restoring` whose owner (the process that began the start) died: the
//!   start was interrupted. A start's VMMs are stopped and its rows removed (a spawn
//!   gives all of its sandboxes or none); a restore whose VMM runs with its archive
//!   linked is `running`, any other goes back to `archived`.
//! - `archived` with a run directory: the archive was complete when the row moved, so a
//!   VMM still there (a kill between the two) is stopped.
//!
//! Run directories without a row are left alone for a minute (their starter may be
//! writing it), then removed; forkvm cgroups no sandbox uses go too.

use super::{disks_inside, noted_pid, record_alive, Registry, SandboxRecord, SandboxRow};
use crate::state::{SandboxState, StateReason};
use forkvm_vmm::host::cgroup::CgroupRoot;
use serde::Serialize;

/// What one pass did, by sandbox id.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct Swept {
    /// Sandboxes whose VMM had died: salvaged and removed.
    pub stopped: Vec<String>,
    /// Starts whose starter died: their VMMs stopped, their rows removed.
    pub interrupted: Vec<String>,
    /// Sandboxes back in their archive (a restored one that died, or an interrupted
    /// restore).
    pub archived: Vec<String>,
    /// Interrupted restores that had finished: running.
    pub restored: Vec<String>,
    /// Run directories that never got a row, removed.
    pub orphans: Vec<String>,
    /// Archives whose removal was interrupted (no longer committed), removed.
    pub uncommitted_archives: Vec<String>,
    /// Of the stopped and archived sandboxes, those whose VMM a seccomp filter stopped
    /// (its console log says which call: `host::seccomp`).
    pub seccomp_denied: Vec<String>,
}

impl Swept {
    pub fn is_empty(&self) -> bool {
        *self == Swept::default()
    }
}

/// Whether the console log of `r`'s dead VMM ends with a seccomp filter stopping it.
fn stopped_by_seccomp(r: &SandboxRecord) -> bool {
    let tail = forkvm_vmm::devices::console_log::read_tail(&r.console(), 4 << 10);
    String::from_utf8_lossy(&tail).contains(forkvm_vmm::host::seccomp::DENIED_MARKER)
}

impl Registry {
    /// One clean-up pass (see the module doc).
    pub fn sweep(&self) -> Swept {
        let mut out = Swept::default();
        let mut live: Vec<String> = Vec::new();
        let mut known: Vec<String> = Vec::new();
        let mut rows = std::collections::HashSet::new();
        for row in self.all_rows() {
            rows.insert(row.record.id.clone());
            let group = row.record.cgroup.clone().unwrap_or_else(|| format!("sb-{}", row.record.id));
            if self.sweep_row(&row, &mut out) {
                live.push(group.clone());
            }
            known.push(group);
        }
        for e in std::fs::read_dir(self.sandboxes_dir()).into_iter().flatten().flatten() {
            let id = e.file_name().to_string_lossy().into_owned();
            if rows.contains(&id) {
                continue;
            }
            // No row yet: its starter may still be writing it; left alone for a minute.
            let old = e.metadata().and_then(|m| m.modified()).ok().and_then(|t| t.elapsed().ok());
            if old.is_some_and(|age| age.as_secs() > 60) && std::fs::remove_dir_all(e.path()).is_ok() {
                out.orphans.push(id);
            } else {
                live.push(format!("sb-{id}"));
            }
        }
        if let Ok(root) = CgroupRoot::detect() {
            // Groups are shared by every run root on the host: one no row here names may
            // be another's, made a moment ago for a VMM that has not joined it yet. Such a
            // group goes only once it is a minute old and still empty.
            let others_recent =
                |name: &str| !known.iter().any(|k| k == name) && root.age_of(name).is_none_or(|age| age.as_secs() < 60);
            root.sweep(&|name| live.iter().any(|l| l == name) || others_recent(name));
        }
        if let Some(store) = &self.store {
            out.uncommitted_archives = crate::archive::format::remove_uncommitted(&forkvm_snapshot::Store::open(store));
        }
        let lists = [&mut out.stopped, &mut out.interrupted, &mut out.archived, &mut out.restored, &mut out.orphans];
        for ids in lists {
            ids.sort();
        }
        out
    }

    /// Sweeps one row; whether the sandbox is still there with a VMM (its cgroup stays).
    fn sweep_row(&self, row: &SandboxRow, out: &mut Swept) -> bool {
        let mut record = row.record.clone();
        if record.pid <= 0 && (row.state.is_starting() || row.state == SandboxState::Archived) {
            // Started and not yet written, or archived before its VMM stopped: the pid
            // noted beside it when it was forked.
            record.pid = noted_pid(&record.run_dir).unwrap_or(0);
        }
        let r = &record;
        let id = r.id.clone();
        if !disks_inside(r, self.store.as_deref()) {
            // Disks outside its run directory: never salvaged from, never used.
            if record_alive(r) {
                return true;
            }
            self.clean_up(r);
            let _ = self.records.delete(&id, None);
            out.stopped.push(id);
            return false;
        }
        match row.state {
            SandboxState::Starting | SandboxState::Restoring if !row.start_abandoned() => true,
            SandboxState::Starting => {
                let _ = crate::verbs::kill_record(self, r);
                let _ = self.records.delete(&id, None);
                out.interrupted.push(id);
                false
            }
            SandboxState::Restoring => self.settle_restore(r, out),
            SandboxState::Archived => {
                if r.run_dir.is_dir() {
                    // Not the archive's: the link goes before the VMM is stopped.
                    let _ = std::fs::remove_file(r.dir().archive_link());
                    let _ = crate::verbs::kill_record(self, r);
                }
                false
            }
            SandboxState::Running | SandboxState::Paused => {
                if r.pid > 0 && record_alive(r) {
                    return true;
                }
                if stopped_by_seccomp(r) {
                    out.seccomp_denied.push(id.clone());
                }
                // Back in its archive: the one it was restored from, or one its archiver
                // sealed before dying between unlinking the old and renaming the new.
                let archived = crate::archive::linked_archive(&r.run_dir)
                    .is_some_and(|a| crate::archive::format::is_complete(&a))
                    || self.finish_partial_archive(&id);
                // Salvaged and removed first: a failed salvage keeps everything for a retry.
                if r.run_dir.is_dir() && !self.salvage_and_remove(r) {
                    return false;
                }
                if archived {
                    let _ = self.transition(&id, &[row.state], SandboxState::Archived, Some(StateReason::Recovered));
                    out.archived.push(id);
                } else {
                    self.forget(r);
                    out.stopped.push(id);
                }
                false
            }
        }
    }

    /// A restore whose restorer died: running if its VMM runs with its archive linked
    /// (all that was left was the row), else back to its archive (or gone, without one).
    fn settle_restore(&self, r: &SandboxRecord, out: &mut Swept) -> bool {
        let id = r.id.clone();
        let linked = crate::archive::linked_archive(&r.run_dir).is_some();
        if r.pid > 0 && record_alive(r) && linked {
            if self.transition(&id, &[SandboxState::Restoring], SandboxState::Running, None).unwrap_or(false) {
                out.restored.push(id);
            }
            return true;
        }
        // Unlinked first: stopping the VMM must not take the archive with it.
        let _ = std::fs::remove_file(r.dir().archive_link());
        let has_archive =
            self.store.as_ref().is_none_or(|s| crate::archive::has_archive(&forkvm_snapshot::Store::open(s), &id));
        if has_archive {
            let _ =
                self.transition(&id, &[SandboxState::Restoring], SandboxState::Archived, Some(StateReason::Recovered));
            let _ = crate::verbs::kill_record(self, r);
            out.archived.push(id);
        } else {
            let _ = crate::verbs::kill_record(self, r);
            let _ = self.records.delete(&id, None);
            out.interrupted.push(id);
        }
        false
    }

    /// Finishes an archive of `id` its archiver sealed and did not move into place
    /// (`archive::format::finish_partial`); whether it did.
    fn finish_partial_archive(&self, id: &str) -> bool {
        let Some(store) = &self.store else { return false };
        match crate::archive::format::finish_partial(&forkvm_snapshot::Store::open(store), id) {
            Ok(done) => done,
            Err(e) => {
                tracing::warn!(sandbox = %id, error = %e, "finishing an interrupted archive failed");
                false
            }
        }
    }

    /// Salvages the disk writes of sandbox `r`, whose VMM died without being stopped,
    /// when this registry knows the store (`salvage`), then removes its run directory. A
    /// run directory whose salvage failed is kept (with `salvage-failed` saying why) and
    /// retried later; one another process is salvaging is left to it. Returns whether it
    /// is gone.
    fn salvage_and_remove(&self, r: &SandboxRecord) -> bool {
        if let Some(store) = self.store.as_ref().filter(|_| r.disks.iter().any(|d| d.dir.is_dir())) {
            if crate::salvage::failed_recently(&r.run_dir) || !crate::salvage::claim(&r.run_dir) {
                return false;
            }
            match crate::salvage::salvage(&forkvm_snapshot::Store::open(store), r) {
                Ok(Some(info)) => tracing::info!(sandbox = %r.id, seq = info.seq, written_bytes = info.written_bytes,
                    "salvaged the disk writes of a sandbox whose VMM died"),
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(sandbox = %r.id, error = %e, "salvaging a dead sandbox's disks failed; its run directory is kept");
                    crate::salvage::mark_failed(&r.run_dir, &e.to_string());
                    return false;
                }
            }
        }
        let _ = std::fs::remove_dir_all(&r.run_dir);
        true
    }
}
