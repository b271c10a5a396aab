//! Where a sparse file's data is: the extents `SEEK_DATA`/`SEEK_HOLE` report. Sealing
//! an adopted image copies only these; a pack's sparse entries list them.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// The data extents `(offset, len)` of `file` (`size` bytes), sorted, found with
/// `SEEK_DATA`/`SEEK_HOLE`. A filesystem that cannot tell makes the whole file one extent.
pub fn data_extents(file: &File, size: u64) -> io::Result<Vec<(u64, u64)>> {
    let mut out = Vec::new();
    let mut pos = 0u64;
    while pos < size {
        let data = match seek(file, pos, libc::SEEK_DATA) {
            Ok(d) => d,
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => break,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => pos,
            Err(e) => return Err(e),
        };
        if data >= size {
            break;
        }
        let hole = seek(file, data, libc::SEEK_HOLE).map_or(size, |h| h.clamp(data + 1, size));
        out.push((data, hole - data));
        pos = hole;
    }
    Ok(out)
}

fn seek(file: &File, pos: u64, whence: libc::c_int) -> io::Result<u64> {
    let pos = libc::off_t::try_from(pos).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: lseek only moves the offset of the descriptor, which `file` keeps open.
    let off = unsafe { libc::lseek(file.as_raw_fd(), pos, whence) };
    u64::try_from(off).map_err(|_| io::Error::last_os_error())
}
