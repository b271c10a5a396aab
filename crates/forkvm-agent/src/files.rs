//! File requests: streamed read, streamed atomic write (temp file + rename in the same
//! directory), list, stat, mkdir and remove. Failures become `Response::Error` with an
//! errno-like kind; only connection-level problems are `ServeError`s. A write or mkdir
//! may name a guest user as owner of what it creates (the agent itself runs as root).

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use forkvm_proto::{
    read_frame, write_frame, AgentError, FileInfo, FileType, FrameKind, MkdirRequest, Response, WriteFileRequest,
    DATA_CHUNK,
};

use crate::guest_user::{GuestUser, IdNames};
use crate::server::ServeError;

/// The uid and gid of `owner`, when one is named.
fn owner_ids(owner: Option<&str>) -> Result<Option<(u32, u32)>, AgentError> {
    owner.map(|name| GuestUser::lookup(Path::new("/"), name).map(|u| (u.uid, u.gid))).transpose()
}

/// Creates `dir` and its missing parents; those it created are chowned to `ids`.
fn create_dirs(dir: &Path, mode: u32, ids: Option<(u32, u32)>, what: &str) -> Result<(), AgentError> {
    let missing: Vec<&Path> = dir.ancestors().take_while(|a| !a.as_os_str().is_empty() && !a.exists()).collect();
    fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(dir)
        .map_err(|e| AgentError::from_io(&format!("create {what}"), &e))?;
    if let Some((uid, gid)) = ids {
        for d in missing {
            std::os::unix::fs::lchown(d, Some(uid), Some(gid))
                .map_err(|e| AgentError::from_io(&format!("chown {}", d.display()), &e))?;
        }
    }
    Ok(())
}

/// Streams a file as `Data` frames, then `ReadDone`.
pub fn read_file(conn: &mut UnixStream, path: &str) -> Result<Response, ServeError> {
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(e) => return Ok(Response::Error(AgentError::from_io(&format!("open {path}"), &e))),
    };
    match file.metadata() {
        Ok(m) if m.is_dir() => {
            let err = std::io::Error::from_raw_os_error(libc::EISDIR);
            return Ok(Response::Error(AgentError::from_io(&format!("read {path}"), &err)));
        }
        Ok(_) => {}
        Err(e) => return Ok(Response::Error(AgentError::from_io(&format!("fstat {path}"), &e))),
    }
    let mut buf = vec![0u8; DATA_CHUNK];
    let mut total = 0u64;
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) => return Ok(Response::ReadDone { bytes: total }),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Ok(Response::Error(AgentError::from_io(&format!("read {path}"), &e))),
        };
        write_frame(conn, FrameKind::Data, &buf[..n]).map_err(ServeError::SendOutput)?;
        total += n as u64;
    }
}

/// A temp file that is removed unless it was renamed into place.
struct TempFile {
    path: PathBuf,
    file: File,
    done: bool,
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.done {
            let _ = fs::remove_file(&self.path);
        }
    }
}

fn create_temp(req: &WriteFileRequest) -> Result<TempFile, AgentError> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let path = Path::new(&req.path);
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(AgentError::new(
            forkvm_proto::ErrorKind::InvalidInput,
            format!("write {}: not a file path", req.path),
        ));
    };
    let parent = if parent.as_os_str().is_empty() { Path::new(".") } else { parent };
    let ids = owner_ids(req.owner.as_deref())?;
    if req.create_parents {
        create_dirs(parent, 0o755, ids, &format!("parents of {}", req.path))?;
    }
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let tmp = parent.join(format!(".{}.forkvm-{}-{n}.tmp", name.to_string_lossy(), std::process::id()));
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| AgentError::from_io(&format!("create temp file for {}", req.path), &e))?;
    let tmp = TempFile { path: tmp, file, done: false };
    if let Some((uid, gid)) = ids {
        std::os::unix::fs::fchown(&tmp.file, Some(uid), Some(gid))
            .map_err(|e| AgentError::from_io(&format!("chown {}", req.path), &e))?;
    }
    Ok(tmp)
}

/// Receives `Data` frames until `End` into a temp file, then renames it over the target.
/// The input is always read to `End`, even after a failure, so the host's writes finish.
pub fn write_file(conn: &mut UnixStream, req: &WriteFileRequest) -> Result<Response, ServeError> {
    let mut state = create_temp(req);
    let mut total = 0u64;
    loop {
        let frame = read_frame(conn).map_err(ServeError::ReceiveInput)?;
        match frame.kind {
            FrameKind::Data => {
                if let Ok(tmp) = state.as_mut() {
                    if let Err(e) = tmp.file.write_all(&frame.payload) {
                        state = Err(AgentError::from_io(&format!("write {}", req.path), &e));
                    }
                }
                total += frame.payload.len() as u64;
            }
            FrameKind::End => break,
            kind => return Err(ServeError::UnexpectedFrame { step: "write_file data", kind }),
        }
    }
    let mut tmp = match state {
        Ok(tmp) => tmp,
        Err(e) => return Ok(Response::Error(e)),
    };
    let mode = req.mode.unwrap_or(0o644);
    if let Err(e) = tmp.file.set_permissions(fs::Permissions::from_mode(mode)) {
        return Ok(Response::Error(AgentError::from_io(&format!("chmod {:o} {}", mode, req.path), &e)));
    }
    if let Err(e) = fs::rename(&tmp.path, &req.path) {
        return Ok(Response::Error(AgentError::from_io(&format!("rename into {}", req.path), &e)));
    }
    tmp.done = true;
    Ok(Response::Written { bytes: total })
}

/// `meta` of the file at `path`, named `name`, its owner and group by their names.
fn info(name: String, path: &Path, meta: &fs::Metadata, names: &IdNames) -> FileInfo {
    let ft = meta.file_type();
    let file_type = if ft.is_symlink() {
        FileType::Symlink
    } else if ft.is_dir() {
        FileType::Dir
    } else if ft.is_file() {
        FileType::File
    } else {
        FileType::Other
    };
    FileInfo {
        name,
        file_type,
        size: meta.size(),
        mode: meta.mode() & 0o7777,
        mtime_unix_ns: meta.mtime().saturating_mul(1_000_000_000).saturating_add(meta.mtime_nsec()),
        owner: Some(names.user(meta.uid())),
        group: Some(names.group(meta.gid())),
        symlink_target: match file_type {
            FileType::Symlink => fs::read_link(path).ok().map(|t| t.to_string_lossy().into_owned()),
            _ => None,
        },
    }
}

/// Lists a directory, sorted by name; entries are not followed if they are symlinks.
pub fn list(path: &str) -> Response {
    let dir = match fs::read_dir(path) {
        Ok(d) => d,
        Err(e) => return Response::Error(AgentError::from_io(&format!("list {path}"), &e)),
    };
    let mut entries = Vec::new();
    let names = IdNames::read(Path::new("/"));
    for entry in dir {
        let entry = match entry {
            Ok(e) => e,
            Err(e) => return Response::Error(AgentError::from_io(&format!("list {path}"), &e)),
        };
        // An entry can vanish between readdir and lstat; skip it rather than fail.
        if let Ok(meta) = entry.path().symlink_metadata() {
            entries.push(info(entry.file_name().to_string_lossy().into_owned(), &entry.path(), &meta, &names));
        }
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Response::Entries { entries }
}

/// Describes one path, following a final symlink.
pub fn stat(path: &str) -> Response {
    match fs::metadata(path) {
        Ok(meta) => {
            let name = Path::new(path).file_name().map_or_else(|| path.to_string(), |n| n.to_string_lossy().into());
            Response::Stat(info(name, Path::new(path), &meta, &IdNames::read(Path::new("/"))))
        }
        Err(e) => Response::Error(AgentError::from_io(&format!("stat {path}"), &e)),
    }
}

/// Creates a directory (and parents, if asked).
pub fn mkdir(req: &MkdirRequest) -> Response {
    let ids = match owner_ids(req.owner.as_deref()) {
        Ok(ids) => ids,
        Err(e) => return Response::Error(e),
    };
    let mode = req.mode.unwrap_or(0o755);
    let made = if req.parents {
        create_dirs(Path::new(&req.path), mode, ids, &req.path)
    } else {
        fs::DirBuilder::new()
            .mode(mode)
            .create(&req.path)
            .map_err(|e| AgentError::from_io(&format!("mkdir {}", req.path), &e))
            .and_then(|()| match ids {
                Some((uid, gid)) => std::os::unix::fs::lchown(&req.path, Some(uid), Some(gid))
                    .map_err(|e| AgentError::from_io(&format!("chown {}", req.path), &e)),
                None => Ok(()),
            })
    };
    match made {
        Ok(()) => Response::Done,
        Err(e) => Response::Error(e),
    }
}

/// Renames `from` to `to`.
pub fn rename(from: &str, to: &str) -> Response {
    match fs::rename(from, to) {
        Ok(()) => Response::Done,
        Err(e) => Response::Error(AgentError::from_io(&format!("rename {from} to {to}"), &e)),
    }
}

/// Removes a file or symlink, or a directory (its contents too when `recursive`).
pub fn remove(path: &str, recursive: bool) -> Response {
    let result = match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() && recursive => fs::remove_dir_all(path),
        Ok(m) if m.is_dir() => fs::remove_dir(path),
        Ok(_) => fs::remove_file(path),
        Err(e) => Err(e),
    };
    match result {
        Ok(()) => Response::Done,
        Err(e) => Response::Error(AgentError::from_io(&format!("remove {path}"), &e)),
    }
}
