//! The host side of a lazy restore: one memory server process per lazily restored VMM.
//!
//! A VMM restored from a lazily pulled tag ([`crate::source::SpawnSource::lazy_memory`])
//! fills its memory from a socket (`forkvm_vmm::vstate::lazy_memory`). The other end is
//! served by a process forked here: it is outside the VMM's jail (it reaches the remote
//! and holds the remote key, which the VMM must not), reads the chain's page maps and
//! chunks ([`forkvm_remote::lazy::serve_lazy_memory`]), keeps every chunk it fetches in
//! the store, and exits when the VMM hangs up (its memory complete, or the VMM gone).
//! Its errors go into the sandbox's console log, next to the VMM's own.

use forkvm_remote::lazy::LazyMemoryServer;
use forkvm_snapshot::Store;
use forkvm_vmm::host::process::{detach_stdio, fork_and_run};
use std::fs::OpenOptions;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum MemoryServerError {
    #[error("starting the memory server of a lazy restore: {step}: {source}")]
    Start { step: &'static str, source: std::io::Error },
    #[error("a lazy restore needs a tag in a store (this spawn has {0})")]
    NoTag(&'static str),
}

/// The descriptors open in this process (`/proc/self/fd`, without the one reading it).
fn open_fds() -> Vec<std::os::fd::RawFd> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else { return Vec::new() };
    let fds: Vec<_> = dir.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect();
    // The listing's own descriptor is closed by now.
    fds.into_iter().filter(|fd| std::fs::metadata(format!("/proc/self/fd/{fd}")).is_ok()).collect()
}

/// Forks the memory server of one VMM restored lazily from `tag` in the store at
/// `store_root`, logging into `console_log`; returns the VMM's end of its socket. The
/// caller must be single-threaded (it forks).
pub fn start(store_root: &Path, tag: &str, console_log: &Path) -> Result<UnixStream, MemoryServerError> {
    let start = |step| move |source| MemoryServerError::Start { step, source };
    let (vmm_end, host_end) = UnixStream::pair().map_err(start("making its socket"))?;
    let log =
        OpenOptions::new().create(true).append(true).open(console_log).map_err(start("opening the console log"))?;
    let store = Store::open(store_root);
    fork_and_run(true, || {
        let inherited = open_fds();
        // Opened first: the remote's runtime duplicates descriptors the process inherited
        // (tokio's signal pipe, made once per process), which go next.
        let server = LazyMemoryServer::open(&store, tag);
        // Nothing of the caller's (a daemon's locks and sockets) stays open here.
        let keep = [0, 1, 2, host_end.as_raw_fd(), log.as_raw_fd()];
        for fd in inherited.into_iter().filter(|fd| !keep.contains(fd)) {
            // SAFETY: closes a descriptor this process inherited and does not use.
            unsafe { libc::close(fd) };
        }
        detach_stdio(Some(&log));
        match server.and_then(|s| s.serve(host_end)) {
            Ok(report) => {
                let _ = writeln!(&log, "\n[forkvm] memory server of {tag}: {report}");
                0
            }
            Err(e) => {
                let _ = writeln!(&log, "\n[forkvm] memory server of {tag}: {e}");
                1
            }
        }
    })
    .map_err(start("forking it"))?;
    Ok(vmm_end)
}
