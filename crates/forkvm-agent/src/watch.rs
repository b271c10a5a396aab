//! The `watch` request: inotify on a directory (and, when recursive, on every directory
//! below it, including ones created while it is watched), each change sent to the host
//! as a `Watch` frame as soon as the kernel reports it, until the host sends `End`, the
//! connection goes away, or the watched directory itself does.
//!
//! The host learns the watch is in place from the first frame (`armed`), so a change it
//! makes after that is never missed. While nothing changes a keepalive goes out every
//! [`KEEPALIVE`], which lets the host notice a vanished reader without a frame from us.
//! A host that reads slowly makes our writes block; the kernel's queue then overflows
//! and the host gets an `overflow` message instead of unbounded memory here.
//!
//! Not reported: changes inside a directory created under a recursive watch before its
//! own watch is added (the window between its `create` and the `inotify_add_watch`).

use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use forkvm_proto::{
    read_frame, write_json, AgentError, ChangeKind, ErrorKind, FrameKind, Response, WatchMessage, WatchRequest,
};
use inotify::{EventMask, Inotify, WatchMask};

use crate::server::ServeError;

/// How long the watch stays silent before it sends a keepalive.
pub const KEEPALIVE: Duration = Duration::from_secs(5);

/// Most directories one watch covers (each costs the guest kernel an inotify watch).
pub const MAX_DIRECTORIES: usize = 8192;

/// Runs one watch conversation on `conn` and returns its final response.
pub fn run(conn: &mut UnixStream, req: &WatchRequest) -> Result<Response, ServeError> {
    let mut watch = match Watch::start(req) {
        Ok(w) => w,
        Err(e) => return Ok(Response::Error(e)),
    };
    let directories = watch.dirs.len() as u32;
    send(conn, &WatchMessage::Armed { directories })?;
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match wait(conn, &watch.inotify)? {
            Ready::Host => {
                let frame = match read_frame(conn) {
                    Ok(f) => f,
                    Err(forkvm_proto::FrameError::Closed) => return Err(ServeError::HostLeft),
                    Err(e) => return Err(ServeError::ReceiveInput(e)),
                };
                if frame.kind != FrameKind::End {
                    return Err(ServeError::UnexpectedFrame { step: "watch", kind: frame.kind });
                }
                return Ok(Response::Done);
            }
            Ready::Quiet => send(conn, &WatchMessage::Keepalive)?,
            Ready::Changes => {
                let messages = match watch.read(&mut buf) {
                    Ok(m) => m,
                    Err(e) => return Ok(Response::Error(e)),
                };
                for m in &messages {
                    send(conn, m)?;
                }
                if watch.dirs.is_empty() {
                    // The watched directory itself is gone.
                    return Ok(Response::Done);
                }
            }
        }
    }
}

fn send(conn: &mut UnixStream, m: &WatchMessage) -> Result<(), ServeError> {
    write_json(conn, FrameKind::Watch, m).map_err(ServeError::SendOutput)
}

enum Ready {
    Host,
    Changes,
    Quiet,
}

/// Waits for the host (a frame or a hang-up), a change, or [`KEEPALIVE`].
fn wait(conn: &UnixStream, inotify: &Inotify) -> Result<Ready, ServeError> {
    let mut fds = [
        libc::pollfd { fd: conn.as_raw_fd(), events: libc::POLLIN | libc::POLLRDHUP, revents: 0 },
        libc::pollfd { fd: inotify.as_raw_fd(), events: libc::POLLIN, revents: 0 },
    ];
    loop {
        // SAFETY: `fds` is a valid array of two pollfds that outlives the call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, KEEPALIVE.as_millis() as libc::c_int) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(ServeError::ReceiveInput(forkvm_proto::FrameError::ReadHeader(e)));
        }
        return Ok(if fds[0].revents != 0 {
            Ready::Host
        } else if fds[1].revents != 0 {
            Ready::Changes
        } else {
            Ready::Quiet
        });
    }
}

/// The inotify instance and the directories it watches, by watch descriptor, as paths
/// relative to the watched one.
struct Watch {
    inotify: Inotify,
    root: PathBuf,
    recursive: bool,
    dirs: HashMap<i32, PathBuf>,
}

const MASK: WatchMask = WatchMask::CREATE
    .union(WatchMask::MODIFY)
    .union(WatchMask::DELETE)
    .union(WatchMask::MOVED_FROM)
    .union(WatchMask::MOVED_TO)
    .union(WatchMask::ATTRIB)
    .union(WatchMask::DELETE_SELF)
    .union(WatchMask::MOVE_SELF)
    .union(WatchMask::ONLYDIR)
    .union(WatchMask::DONT_FOLLOW);

impl Watch {
    fn start(req: &WatchRequest) -> Result<Self, AgentError> {
        let root = PathBuf::from(&req.path);
        let meta = std::fs::metadata(&root).map_err(|e| AgentError::from_io(&format!("watch {}", req.path), &e))?;
        if !meta.is_dir() {
            return Err(AgentError::new(ErrorKind::NotADirectory, format!("watch {}: not a directory", req.path)));
        }
        let inotify = Inotify::init().map_err(|e| match e.raw_os_error() {
            Some(libc::ENOSYS) => AgentError::new(
                ErrorKind::Unsupported,
                "watch: this guest kernel has no inotify (CONFIG_INOTIFY_USER): use forkvm's guest kernel",
            ),
            _ => AgentError::from_io("watch: inotify_init1", &e),
        })?;
        let mut watch = Self { inotify, root, recursive: req.recursive, dirs: HashMap::new() };
        watch.add_tree(Path::new(""))?;
        Ok(watch)
    }

    /// Watches `rel` (relative to the root) and, when recursive, every directory below it.
    fn add_tree(&mut self, rel: &Path) -> Result<(), AgentError> {
        let mut pending = vec![rel.to_path_buf()];
        while let Some(rel) = pending.pop() {
            if self.dirs.len() >= MAX_DIRECTORIES {
                return Err(AgentError::new(
                    ErrorKind::InvalidInput,
                    format!("watch {}: more than {MAX_DIRECTORIES} directories", self.root.display()),
                ));
            }
            let path = self.root.join(&rel);
            let wd = match self.inotify.watches().add(&path, MASK) {
                Ok(wd) => wd,
                // Gone or replaced by a file since it was listed: its removal is reported.
                Err(e)
                    if !rel.as_os_str().is_empty()
                        && matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) =>
                {
                    continue
                }
                Err(e) => return Err(AgentError::from_io(&format!("watch {}: inotify_add_watch", path.display()), &e)),
            };
            self.dirs.insert(wd.get_watch_descriptor_id(), rel.clone());
            if !self.recursive {
                continue;
            }
            let Ok(entries) = std::fs::read_dir(&path) else { continue };
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    pending.push(rel.join(entry.file_name()));
                }
            }
        }
        Ok(())
    }

    /// Reads what the kernel has queued and turns it into messages.
    fn read(&mut self, buf: &mut [u8]) -> Result<Vec<WatchMessage>, AgentError> {
        let mut out = Vec::new();
        let mut new_dirs = Vec::new();
        let events = match self.inotify.read_events(buf) {
            Ok(events) => events,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(out),
            Err(e) => return Err(AgentError::from_io("watch: reading inotify events", &e)),
        };
        for event in events {
            let id = event.wd.get_watch_descriptor_id();
            if event.mask.contains(EventMask::Q_OVERFLOW) {
                out.push(WatchMessage::Overflow);
                continue;
            }
            if event.mask.contains(EventMask::IGNORED) {
                if self.dirs.get(&id).is_some_and(|rel| rel.as_os_str().is_empty()) {
                    self.dirs.clear();
                } else {
                    self.dirs.remove(&id);
                }
                continue;
            }
            let (Some(dir), Some(name)) = (self.dirs.get(&id), event.name) else {
                // Events about a watched directory itself (DELETE_SELF, MOVE_SELF): its
                // parent reports them by name, or, for the root, IGNORED ends the watch.
                continue;
            };
            let rel = dir.join(name);
            let Some(kind) = change_kind(event.mask) else { continue };
            if self.recursive && kind == ChangeKind::Create && event.mask.contains(EventMask::ISDIR) {
                new_dirs.push(rel.clone());
            }
            out.push(WatchMessage::Change { kind, path: rel.to_string_lossy().into_owned() });
        }
        for rel in new_dirs {
            self.add_tree(&rel)?;
        }
        Ok(out)
    }
}

/// The change an inotify event reports, as E2B's envd names them.
fn change_kind(mask: EventMask) -> Option<ChangeKind> {
    Some(if mask.intersects(EventMask::CREATE | EventMask::MOVED_TO) {
        ChangeKind::Create
    } else if mask.contains(EventMask::MODIFY) {
        ChangeKind::Write
    } else if mask.contains(EventMask::DELETE) {
        ChangeKind::Remove
    } else if mask.contains(EventMask::MOVED_FROM) {
        ChangeKind::Rename
    } else if mask.contains(EventMask::ATTRIB) {
        ChangeKind::Chmod
    } else {
        return None;
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inotify_events_map_to_envd_kinds() {
        assert_eq!(change_kind(EventMask::CREATE | EventMask::ISDIR), Some(ChangeKind::Create));
        assert_eq!(change_kind(EventMask::MOVED_TO), Some(ChangeKind::Create));
        assert_eq!(change_kind(EventMask::MODIFY), Some(ChangeKind::Write));
        assert_eq!(change_kind(EventMask::DELETE), Some(ChangeKind::Remove));
        assert_eq!(change_kind(EventMask::MOVED_FROM), Some(ChangeKind::Rename));
        assert_eq!(change_kind(EventMask::ATTRIB), Some(ChangeKind::Chmod));
        assert_eq!(change_kind(EventMask::DELETE_SELF), None);
    }
}
