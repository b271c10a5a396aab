//! Serves a VMM's control socket until the VM stops.
//!
//! The main thread of a VMM process calls [`serve_until_exit`]: it binds the socket,
//! answers requests on a listener thread (one thread per connection; requests on the
//! `Vmm` are serialized by its mutex) and returns when the guest exits or a `shutdown`
//! request arrives, after stopping the vCPUs and removing the socket.

use super::fd_passing::FdReader;
use super::protocol::{hex_decode, Request, Response, MAX_REQUEST_BYTES};
use crate::devices::attach::TapSource;
use crate::vmm::fault::{FaultPlan, FAULT_INJECTION_ENV};
use crate::vmm::{ExitLatch, Vmm};
use crate::vstate::vcpu::VcpuExitReason;
use forkvm_api::ErrorCode;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("control socket {path} is in use by a running VMM")]
    InUse { path: PathBuf },
    #[error("binding the control socket {path}: {source}")]
    Bind { path: PathBuf, source: std::io::Error },
    #[error("starting the control thread: {0}")]
    Thread(std::io::Error),
}

/// Binds `path`, replacing a stale socket nobody listens on.
///
/// The socket is bound and listening under a temporary name first and then renamed into
/// place, so whoever sees `path` appear can connect at once (a socket file exists from
/// `bind()`, before `listen()`: a connect in between is refused).
fn bind(path: &Path) -> Result<UnixListener, ServeError> {
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            return Err(ServeError::InUse { path: path.into() });
        }
        let _ = std::fs::remove_file(path);
    }
    let err = |source| ServeError::Bind { path: path.into(), source };
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".{}.tmp", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let _ = std::fs::remove_file(&tmp);
    let listener = match UnixListener::bind(&tmp) {
        Ok(l) => l,
        // The longer temporary name does not fit in a socket address: bind in place.
        Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => return UnixListener::bind(path).map_err(err),
        Err(e) => return Err(err(e)),
    };
    if let Err(e) = std::fs::rename(&tmp, path) {
        let _ = std::fs::remove_file(&tmp);
        return Err(err(e));
    }
    Ok(listener)
}

/// (device, inode) of the socket file at `path`.
fn socket_identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Runs until the VM stops; returns why it stopped.
pub fn serve_until_exit(vmm: Vmm, socket: Option<&Path>) -> Result<VcpuExitReason, ServeError> {
    let latch = vmm.exit_latch();
    let vmm = Arc::new(Mutex::new(vmm));
    let mut bound = None;
    if let Some(path) = socket {
        let listener = bind(path)?;
        bound = socket_identity(path);
        let (vmm, latch) = (vmm.clone(), latch.clone());
        std::thread::Builder::new()
            .name("control".into())
            .stack_size(256 << 10)
            .spawn(move || accept_loop(listener, vmm, latch))
            .map_err(ServeError::Thread)?;
    }
    let reason = latch.wait(None).unwrap_or(VcpuExitReason::Stopped);
    vmm.lock().unwrap_or_else(|p| p.into_inner()).stop();
    // Remove the socket only if it is still ours: a newer VMM may have replaced it.
    if let (Some(path), Some(id)) = (socket, bound) {
        if socket_identity(path) == Some(id) {
            let _ = std::fs::remove_file(path);
        }
    }
    Ok(reason)
}

fn accept_loop(listener: UnixListener, vmm: Arc<Mutex<Vmm>>, latch: Arc<ExitLatch>) {
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        if !crate::host::peer_guard::admits(&conn, "control") {
            continue;
        }
        let (vmm, latch) = (vmm.clone(), latch.clone());
        let spawned = std::thread::Builder::new()
            .name("control-conn".into())
            .stack_size(256 << 10)
            .spawn(move || serve_connection(conn, vmm, latch));
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start a control connection thread");
        }
    }
}

fn serve_connection(conn: UnixStream, vmm: Arc<Mutex<Vmm>>, latch: Arc<ExitLatch>) {
    let Ok(mut writer) = conn.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(FdReader::new(conn));
    loop {
        let mut line = String::new();
        let mut shutdown = false;
        reader.get_mut().set_limit(MAX_REQUEST_BYTES as u64 + 1);
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let response = if line.len() > MAX_REQUEST_BYTES {
            // Not a line we can resynchronize on: answer and hang up.
            let r = Response::err(format!("bad request: longer than {MAX_REQUEST_BYTES} bytes"), ErrorCode::BadRequest);
            let _ = writeln!(writer, "{}", serde_json::to_string(&r).unwrap_or_default());
            return;
        } else {
            match serde_json::from_str::<Request>(line.trim_end()) {
                Ok(req) => {
                    shutdown = matches!(req, Request::Shutdown {});
                    match with_taps(req, reader.get_mut()) {
                        Ok(req) => handle(req, &vmm),
                        Err(r) => r,
                    }
                }
                Err(e) => Response::err(format!("bad request: {e}"), ErrorCode::BadRequest),
            }
        };
        // Descriptors no request took are closed, not kept for the next one.
        reader.get_mut().drop_fds();
        let text = serde_json::to_string(&response).unwrap_or_else(|e| format!(r#"{{"ok":false,"error":"{e}"}}"#));
        let written = writeln!(writer, "{text}").and_then(|_| writer.flush());
        if shutdown {
            // Say who asked, on stderr (a detached VMM's console log): a sandbox that
            // stopped can then be told from one that was stopped.
            let peer = peer_pid(&writer);
            eprintln!("[forkvm] shutdown requested over the control socket by pid {peer}");
            // Answer first: once the latch is set the process may exit at any moment.
            latch.set(VcpuExitReason::Stopped);
            return;
        }
        if written.is_err() {
            return;
        }
    }
}

/// The pid of the process on the other end of a Unix stream (0 if unknown).
fn peer_pid(s: &UnixStream) -> i32 {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED fills a ucred of `len` bytes at a valid pointer.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc == 0 {
        cred.pid
    } else {
        0
    }
}

/// A fork request with the taps that came with it given to its children, in order.
fn with_taps(req: Request, reader: &mut FdReader) -> Result<Request, Response> {
    let Request::Fork { mut children, taps } = req else { return Ok(req) };
    if taps > children.len() {
        let msg = format!("bad request: {taps} taps for {} children", children.len());
        return Err(Response::err(msg, ErrorCode::BadRequest));
    }
    let Some(fds) = reader.take_fds(taps) else {
        let msg = format!("bad request: the request names {taps} taps, but fewer descriptors came with it");
        return Err(Response::err(msg, ErrorCode::BadRequest));
    };
    for (child, fd) in children.iter_mut().zip(fds) {
        child.tap = Some(TapSource::Fd(std::sync::Arc::new(fd)));
    }
    Ok(Request::Fork { children, taps })
}

fn handle(req: Request, vmm: &Mutex<Vmm>) -> Response {
    // Anything the VMM fails at is internal unless its error says otherwise.
    fn answer<T: serde::Serialize, E: std::fmt::Display>(r: Result<T, E>) -> Response {
        match r {
            Ok(v) => Response::ok_as(&v),
            Err(e) => Response::err(e.to_string(), ErrorCode::Internal),
        }
    }
    // Compaction copies data: it takes the VMM's lock only to plan and to swap.
    if let Request::CompactDisks { covered, min_layers } = &req {
        return answer(crate::vmm::compact::compact_disks(vmm, covered, *min_layers));
    }
    let mut vmm = vmm.lock().unwrap_or_else(|p| p.into_inner());
    match req {
        Request::Status {} => Response::ok_as(&vmm.status()),
        Request::Pause {} => answer(vmm.pause().map(|_| vmm.status())),
        Request::Resume {} => answer(vmm.resume().map(|_| vmm.status())),
        Request::Snapshot { dir } => answer(vmm.snapshot(&dir)),
        Request::SendInput { hex } => match hex_decode(&hex) {
            Ok(bytes) => answer(vmm.send_serial_input(&bytes)),
            Err(e) => Response::err(e.to_string(), ErrorCode::BadRequest),
        },
        Request::Branch(req) => {
            let started = vmm.start_branch(&req);
            // A waited live branch is written without holding the VMM: other requests
            // (status, another branch, shutdown) are served meanwhile.
            drop(vmm);
            let done = started.and_then(|(report, pending)| match pending {
                Some(p) => p.finish(report),
                None => Ok(report),
            });
            match done {
                Ok(r) => Response::ok_as(&r),
                Err(e) => Response::err(e.to_string(), e.code()),
            }
        }
        Request::Fork { children, .. } => answer(vmm.fork_running(&children)),
        Request::SealDisks {} => answer(vmm.seal_disks()),
        Request::LazyDisks { finish_recording } => answer(vmm.lazy_disks(finish_recording)),
        Request::TouchedMemory {} => answer(crate::vstate::memory_playbook::TouchedMemory::of(vmm.memory())),
        Request::Label(labels) => {
            vmm.set_labels(labels);
            Response::ok_as(&vmm.status())
        }
        Request::CompactDisks { .. } => unreachable!("handled before the VMM's lock is taken"),
        Request::InjectFault { point } => {
            if FaultPlan::allowed_by_env() {
                vmm.arm_fault(point);
                Response::ok(serde_json::Value::Null)
            } else {
                Response::err(
                    format!("fault injection is disabled (set {FAULT_INJECTION_ENV}=1)"),
                    ErrorCode::Forbidden,
                )
            }
        }
        // The caller sets the exit latch once this answer is on its way.
        Request::Shutdown {} => Response::ok(serde_json::Value::Null),
    }
}
