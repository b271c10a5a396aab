//! Pseudo-terminals for background processes: a new pair from `/dev/ptmx` (devpts is
//! mounted at `/dev/pts` the first time one is needed, when the agent is the guest's
//! init), and its window size.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;

use forkvm_proto::PtySize;

/// A new terminal: the agent keeps `master`; the process opens `slave_path` as its
/// controlling terminal.
#[derive(Debug)]
pub struct Pty {
    pub master: File,
    pub slave_path: PathBuf,
}

/// Opens a new terminal pair of `size`.
pub fn open(size: PtySize) -> io::Result<Pty> {
    ensure_devpts();
    let step = |what: &str, e: io::Error| io::Error::new(e.kind(), format!("{what}: {e}"));
    // SAFETY: open(2) of a constant NUL-terminated path; the descriptor is owned below.
    let fd = unsafe { libc::open(c"/dev/ptmx".as_ptr(), libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(step("opening /dev/ptmx", io::Error::last_os_error()));
    }
    // SAFETY: just opened, owned by nothing else.
    let master = unsafe { OwnedFd::from_raw_fd(fd) };
    let unlock: libc::c_int = 0;
    // SAFETY: TIOCSPTLCK reads an int from a valid pointer.
    if unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSPTLCK, &unlock) } != 0 {
        return Err(step("unlocking the terminal", io::Error::last_os_error()));
    }
    let mut number: libc::c_uint = 0;
    // SAFETY: TIOCGPTN writes an unsigned int to a valid pointer.
    if unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCGPTN, &mut number) } != 0 {
        return Err(step("numbering the terminal", io::Error::last_os_error()));
    }
    let master = File::from(master);
    resize(&master, size).map_err(|e| step("sizing the terminal", e))?;
    Ok(Pty { master, slave_path: PathBuf::from(format!("/dev/pts/{number}")) })
}

/// Sets the terminal's window size (its foreground process group gets SIGWINCH).
pub fn resize(master: &File, size: PtySize) -> io::Result<()> {
    let ws = libc::winsize { ws_row: size.rows, ws_col: size.cols, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: TIOCSWINSZ reads a winsize from a valid pointer.
    if unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &ws) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Mounts devpts at `/dev/pts` if nothing provides `/dev/pts/ptmx` yet (a guest whose
/// init is the agent mounts only devtmpfs at boot). Best effort: opening `/dev/ptmx`
/// reports what is missing.
fn ensure_devpts() {
    if std::path::Path::new("/dev/pts/ptmx").exists() {
        return;
    }
    let _ = std::fs::create_dir_all("/dev/pts");
    let (source, target, fstype) = (c"devpts", c"/dev/pts", c"devpts");
    let Ok(data) = CString::new("mode=0620,ptmxmode=0666") else { return };
    // SAFETY: mount(2) with NUL-terminated strings that outlive the call.
    let rc = unsafe { libc::mount(source.as_ptr(), target.as_ptr(), fstype.as_ptr(), 0, data.as_ptr().cast()) };
    if rc != 0 {
        tracing::warn!(error = %io::Error::last_os_error(), "mounting devpts at /dev/pts");
    }
}
