//! A directory out as a tar stream (`tar`), and a file's SHA-256 (`hash_file`): what the
//! host needs to take a tree out of a sandbox in one request and to check a large
//! download against the file it came from without a second copy crossing the vsock.
//!
//! The archive is written as it is read (no whole-archive buffer): `Data` frames of at
//! most [`DATA_CHUNK`] bytes, then `ReadDone` with the count. Entries are named relative
//! to the directory; symbolic links stay links (never followed, so nothing outside the
//! directory is read through one), and sockets and devices are left out. A failure after
//! the first frame ends the stream with an `Error` in place of `ReadDone`.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixStream;
use std::path::Path;

use forkvm_proto::{write_frame, AgentError, FrameKind, Response, DATA_CHUNK};
use sha2::{Digest, Sha256};

use crate::server::ServeError;

/// Writes what it is given as `Data` frames, counting them; a send failure is kept (the
/// host went away: a `ServeError`, not an answer).
struct Frames<'a> {
    conn: &'a mut UnixStream,
    buf: Vec<u8>,
    total: u64,
    failed: Option<io::Error>,
}

impl Frames<'_> {
    fn send(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        if let Err(e) = write_frame(self.conn, FrameKind::Data, &self.buf) {
            let kept = io::Error::new(io::ErrorKind::BrokenPipe, e.to_string());
            self.failed = Some(io::Error::new(io::ErrorKind::BrokenPipe, e.to_string()));
            return Err(kept);
        }
        self.total += self.buf.len() as u64;
        self.buf.clear();
        Ok(())
    }
}

impl Write for Frames<'_> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let n = data.len().min(DATA_CHUNK - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == DATA_CHUNK {
            self.send()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.send()
    }
}

/// Streams a tar archive of directory `path`.
pub fn tar(conn: &mut UnixStream, path: &str) -> Result<Response, ServeError> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            let err = io::Error::from_raw_os_error(libc::ENOTDIR);
            return Ok(Response::Error(AgentError::from_io(&format!("tar {path}"), &err)));
        }
        Err(e) => return Ok(Response::Error(AgentError::from_io(&format!("tar {path}"), &e))),
    }
    let mut frames = Frames { conn, buf: Vec::with_capacity(DATA_CHUNK), total: 0, failed: None };
    let written = {
        let mut builder = tar::Builder::new(&mut frames);
        builder.follow_symlinks(false);
        let added = add_tree(&mut builder, Path::new(path), Path::new(""));
        added.and_then(|()| builder.finish())
    };
    if let Some(e) = frames.failed.take() {
        return Err(ServeError::SendOutput(forkvm_proto::FrameError::Write { kind: FrameKind::Data, source: e }));
    }
    let flushed = written.and_then(|()| frames.flush());
    Ok(match flushed {
        Ok(()) => Response::ReadDone { bytes: frames.total },
        Err(e) => Response::Error(AgentError::from_io(&format!("tar {path}"), &e)),
    })
}

/// Adds the entries of `dir` under `name`, depth first, in name order (the same tree
/// gives the same archive, but for times).
fn add_tree<W: Write>(builder: &mut tar::Builder<W>, dir: &Path, name: &Path) -> io::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        let entry_name = name.join(entry.file_name());
        let kind = entry.file_type()?;
        if kind.is_dir() {
            builder.append_dir(&entry_name, &path)?;
            add_tree(builder, &path, &entry_name)?;
        } else if kind.is_file() || kind.is_symlink() || kind.is_fifo() {
            builder.append_path_with_name(&path, &entry_name)?;
        }
        // Sockets and devices: left out (the guest's /dev is its own).
    }
    Ok(())
}

/// A file's size and SHA-256.
pub fn hash_file(path: &str) -> Response {
    let hashed = File::open(path).and_then(|mut f| {
        if f.metadata()?.is_dir() {
            return Err(io::Error::from_raw_os_error(libc::EISDIR));
        }
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut size = 0u64;
        loop {
            match f.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    hasher.update(&buf[..n]);
                    size += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok((size, hasher.finalize()))
    });
    match hashed {
        Ok((size, digest)) => Response::FileHash { size, sha256: digest.iter().map(|b| format!("{b:02x}")).collect() },
        Err(e) => Response::Error(AgentError::from_io(&format!("hash {path}"), &e)),
    }
}
