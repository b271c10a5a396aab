//! `untar`: a tar stream from the host unpacked into a guest directory, the way a
//! Dockerfile build's COPY and ADD put files into the build's sandbox (one request for a
//! whole directory, links and modes included, instead of a write per file).
//!
//! The `tar` crate reads the stream; the entries (directories, files, links) are made
//! here with the fewest guest system calls we can, because every one of them runs through
//! the emulated guest kernel on some hosts (a file costs its create, write, mode, owner
//! and mtime on one descriptor). A name that is absolute or has `..` is refused. Links
//! already in the guest are followed as Docker's COPY follows them: the sandbox is the
//! guest's own, nothing here reaches the host. Every entry belongs to the request's
//! owner (root when none is given), as Docker's `--chown` does.
//! The stream is read to its `End` frame even after a failure, so the host's send ends.

use std::io::{self, Read};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Component, Path};

use forkvm_proto::{read_frame, AgentError, FrameKind, Response, UntarRequest};

use crate::guest_user::GuestUser;
use crate::server::ServeError;

/// Unpacks the `Data` frames that follow into `req.dir`.
pub fn run(conn: &mut UnixStream, req: &UntarRequest) -> Result<Response, ServeError> {
    let mut frames = Frames { conn, buf: Vec::new(), pos: 0, ended: false, total: 0, failed: None };
    let result = unpack(&mut frames, req);
    if let Some(e) = frames.failed.take() {
        return Err(e);
    }
    // Whatever happened, take the rest of the stream.
    while !frames.ended {
        frames.next_frame()?;
    }
    Ok(match result {
        Ok(()) => Response::Written { bytes: frames.total },
        Err(e) => Response::Error(e),
    })
}

fn unpack(frames: &mut Frames<'_>, req: &UntarRequest) -> Result<(), AgentError> {
    let dir = Path::new(&req.dir);
    if !dir.is_absolute() {
        return Err(AgentError::new(
            forkvm_proto::ErrorKind::InvalidInput,
            format!("untar into {:?}: not absolute", req.dir),
        ));
    }
    let ids = req.owner.as_deref().map(|o| GuestUser::lookup(Path::new("/"), o).map(|u| (u.uid, u.gid))).transpose()?;
    std::fs::create_dir_all(dir).map_err(|e| AgentError::from_io(&format!("create {}", req.dir), &e))?;
    let umask = current_umask();
    let mut archive = tar::Archive::new(frames);
    let entries = archive.entries().map_err(|e| AgentError::from_io("reading the tar stream", &e))?;
    // Links this stream made: nothing of it goes through them (out of the directory).
    let mut links: std::collections::HashSet<std::path::PathBuf> = Default::default();
    for entry in entries {
        let mut entry = entry.map_err(|e| AgentError::from_io("reading the tar stream", &e))?;
        let name = entry.path().map(|p| p.into_owned()).map_err(|e| AgentError::from_io("an entry's name", &e))?;
        let what = format!("unpack {} into {}", name.display(), req.dir);
        let inside = !name.as_os_str().is_empty()
            && name.components().all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
        if !inside || name.ancestors().skip(1).any(|a| links.contains(a)) {
            return Err(AgentError::new(
                forkvm_proto::ErrorKind::InvalidInput,
                format!("{what}: outside the directory"),
            ));
        }
        let path = dir.join(&name);
        let made = make(&mut entry, &path, ids, umask);
        let made = match made {
            // A stream without its directories' own entries: make them, once.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                path.parent().map_or(Err(e), std::fs::create_dir_all).and_then(|()| make(&mut entry, &path, ids, umask))
            }
            other => other,
        };
        made.map_err(|e| AgentError::from_io(&what, &e))?;
        if entry.header().entry_type() == tar::EntryType::Symlink {
            links.insert(name);
        }
    }
    Ok(())
}

/// Makes one entry at `path` with as few calls as the guest kernel allows (each one is
/// emulated on some hosts): a file is created, written, given its mode, owner and mtime
/// through one descriptor. What is in the way (not a directory where one is wanted) is
/// replaced.
fn make<R: Read>(entry: &mut tar::Entry<'_, R>, path: &Path, ids: Option<(u32, u32)>, umask: u32) -> io::Result<()> {
    let header = entry.header();
    let mode = header.mode()? & 0o7777;
    let mtime = header.mtime().unwrap_or(0);
    // A new entry has its mode from its creation unless the umask took bits away.
    let masked = mode & umask != 0;
    match header.entry_type() {
        tar::EntryType::Directory => {
            let fresh = match std::fs::DirBuilder::new().mode(mode).create(path) {
                Ok(()) => true,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && path.is_dir() => false,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    std::fs::remove_file(path)?;
                    std::fs::DirBuilder::new().mode(mode).create(path)?;
                    true
                }
                Err(e) => return Err(e),
            };
            if !fresh || masked {
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
            }
            if let Some((uid, gid)) = ids {
                std::os::unix::fs::lchown(path, Some(uid), Some(gid))?;
            }
        }
        tar::EntryType::Symlink => {
            let target = entry.link_name()?.ok_or_else(|| io::Error::other("a link without a target"))?.into_owned();
            if let Err(e) = std::os::unix::fs::symlink(&target, path) {
                if e.kind() != io::ErrorKind::AlreadyExists || path.symlink_metadata()?.is_dir() {
                    return Err(e);
                }
                std::fs::remove_file(path)?;
                std::os::unix::fs::symlink(&target, path)?;
            }
            if let Some((uid, gid)) = ids {
                std::os::unix::fs::lchown(path, Some(uid), Some(gid))?;
            }
        }
        tar::EntryType::Regular | tar::EntryType::Continuous => {
            let open = |new: bool| {
                let mut o = std::fs::OpenOptions::new();
                o.write(true).mode(mode).custom_flags(libc::O_NOFOLLOW);
                if new {
                    o.create_new(true);
                } else {
                    o.truncate(true);
                }
                o.open(path)
            };
            let (mut file, fresh) = match open(true) {
                Ok(f) => (f, true),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => match open(false) {
                    Ok(f) => (f, false),
                    // A link or a special file in the way is replaced, as `tar -x` does.
                    Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                        std::fs::remove_file(path)?;
                        (open(true)?, true)
                    }
                    Err(e) => return Err(e),
                },
                Err(e) => return Err(e),
            };
            io::copy(entry, &mut file)?;
            if !fresh || masked {
                file.set_permissions(std::fs::Permissions::from_mode(mode))?;
            }
            if let Some((uid, gid)) = ids {
                std::os::unix::fs::fchown(&file, Some(uid), Some(gid))?;
            }
            let when = std::time::UNIX_EPOCH + std::time::Duration::from_secs(mtime);
            file.set_times(std::fs::FileTimes::new().set_modified(when).set_accessed(when))?;
        }
        other => return Err(io::Error::other(format!("entry type {other:?} is not copied"))),
    }
    Ok(())
}

/// The process's umask, from `/proc/self/status` (`umask(2)` would change it for a moment
/// under the other threads); 0o022 if it cannot be read.
fn current_umask() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("Umask:").and_then(|v| u32::from_str_radix(v.trim(), 8).ok()))
        })
        .unwrap_or(0o022)
}

/// The `Data` frames of the connection as one byte stream, up to `End`.
struct Frames<'a> {
    conn: &'a mut UnixStream,
    buf: Vec<u8>,
    pos: usize,
    ended: bool,
    total: u64,
    /// A connection failure, reported as such rather than as a tar error.
    failed: Option<ServeError>,
}

impl Frames<'_> {
    fn next_frame(&mut self) -> Result<(), ServeError> {
        let frame = read_frame(self.conn).map_err(ServeError::ReceiveInput)?;
        match frame.kind {
            FrameKind::Data => {
                self.total += frame.payload.len() as u64;
                self.buf = frame.payload;
                self.pos = 0;
                Ok(())
            }
            FrameKind::End => {
                self.ended = true;
                Ok(())
            }
            kind => Err(ServeError::UnexpectedFrame { step: "untar data", kind }),
        }
    }
}

impl Read for Frames<'_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.buf.len() {
            if self.ended || self.failed.is_some() {
                return Ok(0);
            }
            if let Err(e) = self.next_frame() {
                self.failed = Some(e);
                return Err(io::Error::other("the host's stream broke off"));
            }
        }
        let n = out.len().min(self.buf.len() - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}
