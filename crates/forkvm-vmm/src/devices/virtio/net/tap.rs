//! The tap descriptor behind a virtio-net device.
//!
//! A VMM is given an open tap ([`Tap::from_fd`]): it checks that the descriptor is a tap
//! that carries virtio headers of the size the device uses, and then only reads, writes
//! and sets offloads on it. Opening one by name ([`Tap::open_named`]) is for whoever
//! sets up the sandbox's network namespace (the daemon, tests), never for a jailed VMM.

use super::VNET_HDR_LEN;
use std::ffi::c_int;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// `IFNAMSIZ`: an interface name with its NUL.
const IFNAMSIZ: usize = 16;
/// The flags a tap for this device has.
const TAP_FLAGS: c_int = libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR;

/// `struct ifreq` as the tun ioctls read it: a name and the flags, padded to its size.
#[repr(C)]
#[derive(Clone, Copy)]
struct IfReq {
    name: [u8; IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

impl IfReq {
    fn zeroed() -> IfReq {
        IfReq { name: [0; IFNAMSIZ], flags: 0, _pad: [0; 22] }
    }

    fn name(&self) -> String {
        let end = self.name.iter().position(|&b| b == 0).unwrap_or(IFNAMSIZ);
        String::from_utf8_lossy(&self.name[..end]).into_owned()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TapError {
    #[error("tap name {0:?} is empty, too long (15 bytes at most) or has a NUL")]
    BadName(String),
    #[error("opening /dev/net/tun: {0}")]
    OpenTun(io::Error),
    #[error("creating tap {name:?} (TUNSETIFF): {source}")]
    Create { name: String, source: io::Error },
    #[error("setting the tap's virtio header size to {VNET_HDR_LEN} (TUNSETVNETHDRSZ): {0}")]
    SetHeaderSize(io::Error),
    #[error("the descriptor given as the tap is not a tap (TUNGETIFF: {0})")]
    NotATap(io::Error),
    #[error("tap {name:?} has flags {flags:#x}; it must be a tap without packet info and with virtio headers")]
    WrongFlags { name: String, flags: c_int },
    #[error("tap {name:?} carries {size}-byte virtio headers; the device uses {VNET_HDR_LEN}")]
    WrongHeaderSize { name: String, size: c_int },
    #[error("reading the tap's virtio header size (TUNGETVNETHDRSZ): {0}")]
    GetHeaderSize(io::Error),
    #[error("making the tap non-blocking: {0}")]
    NonBlocking(io::Error),
}

/// An open tap with 12-byte virtio headers, non-blocking.
#[derive(Debug)]
pub struct Tap {
    fd: OwnedFd,
    name: String,
}

/// `ioctl(fd, request, arg)`, as an `io::Result`.
///
/// # Safety
/// `arg` must point to what `request` reads or writes, valid for the call.
unsafe fn ioctl<T>(fd: RawFd, request: libc::Ioctl, arg: *mut T) -> io::Result<()> {
    // SAFETY: the caller's contract.
    if unsafe { libc::ioctl(fd, request, arg) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl Tap {
    /// Creates (or attaches to) tap `name` in the calling thread's network namespace,
    /// set up for the device. Needs `CAP_NET_ADMIN` there.
    pub fn open_named(name: &str) -> Result<Tap, TapError> {
        if name.is_empty() || name.len() >= IFNAMSIZ || name.as_bytes().contains(&0) {
            return Err(TapError::BadName(name.to_string()));
        }
        let path = c"/dev/net/tun";
        // SAFETY: a NUL-terminated path; the descriptor returned is ours.
        let raw = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC) };
        if raw < 0 {
            return Err(TapError::OpenTun(io::Error::last_os_error()));
        }
        // SAFETY: `raw` was just opened and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut req = IfReq::zeroed();
        req.name[..name.len()].copy_from_slice(name.as_bytes());
        req.flags = TAP_FLAGS as libc::c_short;
        // SAFETY: TUNSETIFF reads and writes an ifreq, which `req` is.
        unsafe { ioctl(fd.as_raw_fd(), libc::TUNSETIFF, &mut req) }
            .map_err(|source| TapError::Create { name: name.to_string(), source })?;
        let mut size = VNET_HDR_LEN as c_int;
        // SAFETY: TUNSETVNETHDRSZ reads an int.
        unsafe { ioctl(fd.as_raw_fd(), libc::TUNSETVNETHDRSZ, &mut size) }.map_err(TapError::SetHeaderSize)?;
        Ok(Tap { fd, name: req.name() })
    }

    /// Takes `fd` as the device's tap after checking that it is one, without packet
    /// info and with 12-byte virtio headers; makes it non-blocking.
    pub fn from_fd(fd: OwnedFd) -> Result<Tap, TapError> {
        let mut req = IfReq::zeroed();
        // SAFETY: TUNGETIFF writes an ifreq, which `req` is; on any other kind of
        // descriptor it fails with ENOTTY or EBADFD.
        unsafe { ioctl(fd.as_raw_fd(), libc::TUNGETIFF, &mut req) }.map_err(TapError::NotATap)?;
        let name = req.name();
        let flags = c_int::from(req.flags);
        if flags & TAP_FLAGS != TAP_FLAGS || flags & libc::IFF_TUN != 0 {
            return Err(TapError::WrongFlags { name, flags });
        }
        let mut size: c_int = 0;
        // SAFETY: TUNGETVNETHDRSZ writes an int.
        unsafe { ioctl(fd.as_raw_fd(), libc::TUNGETVNETHDRSZ, &mut size) }.map_err(TapError::GetHeaderSize)?;
        if size != VNET_HDR_LEN as c_int {
            return Err(TapError::WrongHeaderSize { name, size });
        }
        set_nonblocking(fd.as_fd()).map_err(TapError::NonBlocking)?;
        Ok(Tap { fd, name })
    }

    /// The descriptor, for handing the tap on (to a VMM, through a device config).
    pub fn into_fd(self) -> OwnedFd {
        self.fd
    }

    /// The interface's name in its namespace.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Reads one frame (header first) into `buf`; `WouldBlock` when none is queued.
    pub fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: `buf` is a live, exclusively borrowed buffer of `buf.len()` bytes.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n as usize)
    }

    /// Writes one frame (header first).
    pub fn write(&self, frame: &[u8]) -> io::Result<usize> {
        // SAFETY: `frame` is a live buffer of `frame.len()` bytes.
        let n = unsafe { libc::write(self.fd.as_raw_fd(), frame.as_ptr().cast(), frame.len()) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n as usize)
    }

    /// Which offloaded frames (`TUN_F_*`) the tap may hand over.
    pub fn set_offload(&self, flags: u32) -> io::Result<()> {
        // SAFETY: TUNSETOFFLOAD takes its argument by value: no memory is read.
        if unsafe { libc::ioctl(self.fd.as_raw_fd(), libc::TUNSETOFFLOAD, libc::c_ulong::from(flags)) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

impl AsRawFd for Tap {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl AsFd for Tap {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

fn set_nonblocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: F_GETFL/F_SETFL on a descriptor we borrow; no memory is passed.
    unsafe {
        let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}
