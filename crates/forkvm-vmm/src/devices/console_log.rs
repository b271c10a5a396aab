//! The console log file, bounded: a guest can print without end, and the log lives in
//! the sandbox's run directory (often tmpfs, so memory), so it is a ring of two
//! segments. `console.log` takes writes until it holds half the limit, then becomes
//! `console.log.1` (replacing the older one) and a new `console.log` starts. Together
//! they hold the last half-to-whole limit of output, in order
//! (`cat console.log.1 console.log`); [`read_tail`] reads the newest bytes by range
//! without loading either file whole.
//!
//! The limit is `$FORKVM_CONSOLE_LOG_BYTES` (default [`DEFAULT_LIMIT`]), read by the
//! process that opens the log.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// Environment variable with the console log limit in bytes (both segments).
pub const LIMIT_ENV: &str = "FORKVM_CONSOLE_LOG_BYTES";
/// The default limit: 2 MiB (two 1 MiB segments).
pub const DEFAULT_LIMIT: u64 = 2 << 20;
/// The smallest limit accepted (smaller settings are raised to it).
pub const MIN_LIMIT: u64 = 8 << 10;

/// The configured limit.
pub fn configured_limit() -> u64 {
    std::env::var(LIMIT_ENV).ok().and_then(|v| v.trim().parse::<u64>().ok()).unwrap_or(DEFAULT_LIMIT).max(MIN_LIMIT)
}

/// The older segment's path: `<path>.1`.
pub fn older_segment(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".1");
    PathBuf::from(p)
}

/// Where console output is written: a bounded log file, or an unbounded stream (the
/// standard output of `forkvm vm`).
#[derive(Debug)]
pub struct ConsoleLog {
    file: File,
    rotation: Option<Rotation>,
}

#[derive(Debug)]
struct Rotation {
    path: PathBuf,
    segment_bytes: u64,
    written: u64,
}

impl ConsoleLog {
    /// Opens (appending) the log at `path` with the configured limit.
    pub fn open(path: &Path) -> std::io::Result<ConsoleLog> {
        ConsoleLog::open_with_limit(path, configured_limit())
    }

    /// Opens (appending) the log at `path`, bounded to `limit` bytes over both segments.
    pub fn open_with_limit(path: &Path, limit: u64) -> std::io::Result<ConsoleLog> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        let written = file.metadata()?.len();
        let segment_bytes = limit.max(MIN_LIMIT) / 2;
        Ok(ConsoleLog { file, rotation: Some(Rotation { path: path.to_path_buf(), segment_bytes, written }) })
    }

    /// An unbounded sink (a terminal or pipe the caller reads).
    pub fn unbounded(file: File) -> ConsoleLog {
        ConsoleLog { file, rotation: None }
    }

    /// The current segment's file (for the VMM's own stderr, before it serves).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Appends `buf`, starting a new segment first when it would overflow this one. A
    /// single write larger than a segment keeps only its tail.
    pub fn append(&mut self, mut buf: &[u8]) -> std::io::Result<()> {
        let Some(r) = self.rotation.as_mut() else {
            return self.file.write_all(buf);
        };
        while !buf.is_empty() {
            if r.written >= r.segment_bytes {
                std::fs::rename(&r.path, older_segment(&r.path))?;
                self.file = OpenOptions::new().create(true).append(true).open(&r.path)?;
                r.written = 0;
            }
            let room = (r.segment_bytes - r.written) as usize;
            let n = buf.len().min(room);
            self.file.write_all(&buf[..n])?;
            r.written += n as u64;
            buf = &buf[n..];
        }
        Ok(())
    }
}

/// The newest at most `max` bytes of the log at `path` (its older segment first), read
/// by range: the daemon never loads a whole log.
pub fn read_tail(path: &Path, max: u64) -> Vec<u8> {
    let tail_of = |p: &Path, want: u64| -> Vec<u8> {
        let Ok(mut f) = File::open(p) else { return Vec::new() };
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let start = len.saturating_sub(want);
        let mut out = Vec::new();
        if f.seek(SeekFrom::Start(start)).is_ok() {
            let _ = f.take(want).read_to_end(&mut out);
        }
        out
    };
    let newest = tail_of(path, max);
    let want_older = max.saturating_sub(newest.len() as u64);
    if want_older == 0 {
        return newest;
    }
    let mut out = tail_of(&older_segment(path), want_older);
    out.extend_from_slice(&newest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_stays_within_its_limit_and_keeps_the_newest_output() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("console.log");
        let mut log = ConsoleLog::open_with_limit(&path, 64 << 10).unwrap();
        let mut all = Vec::new();
        for i in 0..200_000u32 {
            let line = format!("line {i}\n");
            log.append(line.as_bytes()).unwrap();
            all.extend_from_slice(line.as_bytes());
        }
        let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
        assert!(size(&path) + size(&older_segment(&path)) <= 64 << 10);
        let tail = read_tail(&path, 40 << 10);
        assert_eq!(tail.len(), 40 << 10);
        assert!(all.ends_with(&tail), "the tail is not the newest output in order");
        // More than the log holds: all of it, older segment first.
        let whole = read_tail(&path, 1 << 30);
        assert!(whole.len() as u64 >= 32 << 10 && all.ends_with(&whole));
        // One write larger than a segment keeps its tail.
        log.append(&vec![b'z'; 100 << 10]).unwrap();
        assert!(size(&path) <= 32 << 10);
        assert!(read_tail(&path, 16).iter().all(|b| *b == b'z'));
    }

    #[test]
    fn a_reopened_log_counts_what_is_there() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("console.log");
        std::fs::write(&path, vec![b'a'; 40 << 10]).unwrap();
        let mut log = ConsoleLog::open_with_limit(&path, 64 << 10).unwrap();
        log.append(b"b").unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 1);
        assert_eq!(std::fs::metadata(older_segment(&path)).unwrap().len(), 40 << 10);
    }
}
