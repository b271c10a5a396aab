//! Mounting a volume the host put into a volume slot after a restore.
//!
//! The slot is a virtio disk of capacity 0 from boot; the host filled it while the VM
//! was not running and raised a configuration-change interrupt, on which the kernel's
//! driver reads the new capacity. So the agent waits (bounded) for the disk to have a
//! size, makes a read-only volume's block device read-only, and mounts its ext4.

use crate::init::{disk_by_serial, mount_with};
use forkvm_proto::{AgentError, ErrorKind, MountVolumeRequest, Response};
use std::time::{Duration, Instant};

/// How long the disk may take to show its size (the guest kernel may be emulated).
const SIZE_WAIT: Duration = Duration::from_secs(60);
/// `BLKROSET`: `_IO(0x12, 93)`.
const BLKROSET: libc::c_ulong = 0x125d;

pub fn mount(req: &MountVolumeRequest) -> Response {
    match mount_inner(req) {
        Ok(()) => Response::Done,
        Err((kind, message)) => Response::Error(AgentError::new(kind, message)),
    }
}

fn mount_inner(req: &MountVolumeRequest) -> Result<(), (ErrorKind, String)> {
    if !req.path.starts_with('/') || req.path.split('/').any(|c| c == "..") {
        return Err((ErrorKind::InvalidInput, format!("mount point {:?} is not a plain absolute path", req.path)));
    }
    if !req.serial.starts_with("forkvm-vol") {
        return Err((ErrorKind::InvalidInput, format!("{:?} is not a volume slot", req.serial)));
    }
    let dev = disk_by_serial(&req.serial)
        .ok_or_else(|| (ErrorKind::NotFound, format!("no disk with serial {}", req.serial)))?;
    let size_path = format!("/sys/block/{dev}/size");
    let started = Instant::now();
    loop {
        let sectors = std::fs::read_to_string(&size_path).ok().and_then(|s| s.trim().parse::<u64>().ok());
        if sectors.is_some_and(|s| s > 0) {
            break;
        }
        if started.elapsed() > SIZE_WAIT {
            return Err((ErrorKind::Io, format!("/dev/{dev} ({}) still has no size after {SIZE_WAIT:?}", req.serial)));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let node = format!("/dev/{dev}");
    if req.read_only {
        set_read_only(&node).map_err(|e| (ErrorKind::Io, format!("making {node} read-only: {e}")))?;
    }
    std::fs::create_dir_all(&req.path).map_err(|e| (ErrorKind::Io, format!("creating {}: {e}", req.path)))?;
    // A read-only mount does not replay the journal (it could not write it back);
    // inode tables are left unzeroed by mkfs on a sparse disk, as on the data disk.
    let (flags, data) = if req.read_only {
        (libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV, "noload")
    } else {
        (libc::MS_NOSUID | libc::MS_NODEV, "noinit_itable")
    };
    mount_with(&node, &req.path, "ext4", Some(data), flags)
        .map_err(|e| (ErrorKind::Io, format!("mounting {node} (ext4) at {}: {e}", req.path)))
}

fn set_read_only(node: &str) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(node)?;
    let on: libc::c_int = 1;
    // SAFETY: BLKROSET reads one int from the pointer, which outlives the call.
    if unsafe { libc::ioctl(f.as_raw_fd(), BLKROSET as _, &on) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `sync(2)`: the guest's dirty pages to its disks.
pub fn sync() -> Response {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
    Response::Done
}
