//! One builder per artefact at a time, across processes: an exclusive `flock` on a lock
//! file next to the artefact in the cache. Parallel tests and CLI invocations that need
//! the same kernel, image or template snapshot wait for the first builder and then find
//! its result, instead of building the same thing twice into the same staging place.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

/// Held while building; released when dropped (the file is closed). The lock file stays.
#[derive(Debug)]
pub struct CacheLock {
    _file: File,
}

impl CacheLock {
    /// Takes the lock at `path` (creating the file and its directory), calling `waiting`
    /// once if another process holds it.
    pub fn take(path: &Path, waiting: &mut dyn FnMut()) -> io::Result<CacheLock> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let file = OpenOptions::new().create(true).truncate(false).write(true).open(path)?;
        match flock(&file, libc::LOCK_EX | libc::LOCK_NB) {
            Ok(()) => return Ok(CacheLock { _file: file }),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => waiting(),
            Err(e) => return Err(e),
        }
        loop {
            match flock(&file, libc::LOCK_EX) {
                Ok(()) => return Ok(CacheLock { _file: file }),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

fn flock(file: &File, op: libc::c_int) -> io::Result<()> {
    // SAFETY: flock(2) takes a descriptor number and an operation and touches no memory of
    // ours; `file` keeps the descriptor open for the duration of the call.
    let r = unsafe { libc::flock(file.as_raw_fd(), op) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_taker_waits_for_the_first() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("sub/x.lock");
        let first = CacheLock::take(&path, &mut || panic!("nobody holds it yet")).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let p = path.clone();
        let t = std::thread::spawn(move || {
            let mut waited = false;
            let _second = CacheLock::take(&p, &mut || waited = true).unwrap();
            tx.send(waited).unwrap();
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(rx.try_recv().is_err(), "the second taker got the lock while the first held it");
        drop(first);
        assert!(rx.recv().unwrap(), "the second taker did not report waiting");
        t.join().unwrap();
    }
}
