//! A sandbox's run directory, `<run root>/sandboxes/<id>/`: the one place its layout is
//! spelled. It holds runtime files only (what a sandbox *is* lives in its registry row):
//! the VMM's sockets and console log, its disks' writable layers, `vmm.start` (which VMM
//! runs here, written right after the fork), and the files of the operations under way
//! (an archive's capture, a restore's rebuilt image, the memory playbook's first-call
//! marker, the link to a restored sandbox's archive). The VMM removes the directory
//! when it stops cleanly; the sweep removes what a crash left.

use std::path::{Path, PathBuf};

/// The run directory at a path (a view: nothing is created or read).
#[derive(Debug, Clone, Copy)]
pub struct RunDir<'a>(&'a Path);

impl<'a> RunDir<'a> {
    pub fn at(path: &'a Path) -> RunDir<'a> {
        RunDir(path)
    }

    pub fn path(&self) -> &'a Path {
        self.0
    }

    /// The VMM's control socket.
    pub fn control_socket(&self) -> PathBuf {
        self.0.join("control.sock")
    }

    /// The host end of the guest's vsock (the agent listens behind it).
    pub fn vsock(&self) -> PathBuf {
        self.0.join("vsock.sock")
    }

    /// The guest's serial console log (bounded by the VMM).
    pub fn console(&self) -> PathBuf {
        self.0.join("console.log")
    }

    /// Where the sandbox's layered disks keep their writable layers (`disk<i>/`).
    pub fn disks(&self) -> PathBuf {
        self.0.join("disks")
    }

    /// `<pid> <unix ms>`: the VMM started here, noted right after it was forked.
    pub fn vmm_start(&self) -> PathBuf {
        self.0.join("vmm.start")
    }

    /// A restored sandbox's link to its archive (which `kill` removes with it).
    pub fn archive_link(&self) -> PathBuf {
        self.0.join("archive")
    }

    /// Where an archive writes its capture before sealing it into the store.
    pub fn archive_capture(&self) -> PathBuf {
        self.0.join("archiving")
    }

    /// A restore's snapshot directory, rebuilt from the archive.
    pub fn restored_image(&self) -> PathBuf {
        self.0.join("archived-image")
    }

    /// The memory playbook the sandbox's first call still has to teach, if armed.
    pub fn first_call_marker(&self) -> PathBuf {
        self.0.join(FIRST_CALL_MARKER)
    }

    /// Where process `pid` moves the first-call marker to claim it.
    pub fn first_call_claim(&self, pid: u32) -> PathBuf {
        self.0.join(format!(".{FIRST_CALL_MARKER}.{pid}"))
    }
}

const FIRST_CALL_MARKER: &str = "memory-playbook.first-call";
