//! Descriptors over the control socket (`SCM_RIGHTS`): how a VMM that forks its running
//! VM is given its children's taps, which it may not open itself.
//!
//! The sender attaches them to the bytes of the request line, at most
//! [`MAX_FDS_PER_MESSAGE`] per `sendmsg` (the kernel's `SCM_MAX_FD`), the line split so
//! that each batch rides on a byte of its own. The reader ([`FdReader`]) is the byte
//! stream the server reads lines from; every `recvmsg` it makes keeps the descriptors
//! that came with it (close-on-exec) in arrival order, so when a line is complete, the
//! descriptors sent with it have all arrived. The server takes as many as the request
//! says and closes the rest before the next request.

use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer, SendAncillaryMessage,
    SendFlags,
};
use std::collections::VecDeque;
use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

/// Most descriptors in one message (`SCM_MAX_FD`).
pub const MAX_FDS_PER_MESSAGE: usize = 253;
/// Most descriptors the reader holds for requests not yet handled; more are closed.
pub const MAX_QUEUED_FDS: usize = 4096;

/// Writes `bytes` to `stream` with `fds` attached.
pub fn send_with_fds(stream: &UnixStream, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let batches: Vec<&[BorrowedFd<'_>]> = fds.chunks(MAX_FDS_PER_MESSAGE).collect();
    if batches.len() > bytes.len() {
        return Err(io::Error::other(format!("{} descriptors need a longer message", fds.len())));
    }
    let mut rest = bytes;
    for (i, batch) in batches.iter().enumerate() {
        // One byte per batch but the last, which carries the rest of the line.
        let piece = if i + 1 < batches.len() { 1 } else { rest.len() };
        let mut space = vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS_PER_MESSAGE))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !control.push(SendAncillaryMessage::ScmRights(batch)) {
            return Err(io::Error::other("the descriptors do not fit one message"));
        }
        let sent = sendmsg(stream, &[IoSlice::new(&rest[..piece])], &mut control, SendFlags::NOSIGNAL)?;
        rest = &rest[sent..];
    }
    (&*stream).write_all(rest)
}

/// The control connection as a byte stream that keeps the descriptors sent along,
/// reading at most `limit` bytes until the limit is set again (as `Read::take`).
#[derive(Debug)]
pub struct FdReader {
    stream: UnixStream,
    limit: u64,
    fds: VecDeque<OwnedFd>,
}

impl FdReader {
    pub fn new(stream: UnixStream) -> FdReader {
        FdReader { stream, limit: u64::MAX, fds: VecDeque::new() }
    }

    pub fn set_limit(&mut self, limit: u64) {
        self.limit = limit;
    }

    /// The first `n` descriptors received, or `None` (and none taken) if fewer came.
    pub fn take_fds(&mut self, n: usize) -> Option<Vec<OwnedFd>> {
        (self.fds.len() >= n).then(|| self.fds.drain(..n).collect())
    }

    /// Closes every descriptor received and not taken.
    pub fn drop_fds(&mut self) {
        self.fds.clear();
    }
}

impl Read for FdReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.limit == 0 {
            return Ok(0);
        }
        let max = buf.len().min(usize::try_from(self.limit).unwrap_or(usize::MAX));
        let mut space = vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS_PER_MESSAGE))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let got =
            recvmsg(&self.stream, &mut [IoSliceMut::new(&mut buf[..max])], &mut control, RecvFlags::CMSG_CLOEXEC)?;
        for msg in control.drain() {
            if let RecvAncillaryMessage::ScmRights(fds) = msg {
                for fd in fds {
                    // Past the cap the descriptor is closed here (dropped).
                    if self.fds.len() < MAX_QUEUED_FDS {
                        self.fds.push_back(fd);
                    }
                }
            }
        }
        self.limit -= got.bytes as u64;
        Ok(got.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::BufRead;
    use std::os::fd::AsFd;

    #[test]
    fn descriptors_arrive_with_their_line_in_order_past_one_message() {
        let (a, b) = UnixStream::pair().unwrap();
        let files: Vec<std::fs::File> = (0..300).map(|_| std::fs::File::open("/dev/null").unwrap()).collect();
        let fds: Vec<BorrowedFd<'_>> = files.iter().map(|f| f.as_fd()).collect();
        let line = format!("{{\"op\":\"fork\",\"pad\":\"{}\"}}\n", "x".repeat(100));
        send_with_fds(&a, line.as_bytes(), &fds).unwrap();
        let mut reader = std::io::BufReader::new(FdReader::new(b));
        let mut got = String::new();
        reader.read_line(&mut got).unwrap();
        assert_eq!(got, line);
        let r = reader.get_mut();
        assert!(r.take_fds(301).is_none(), "only 300 came");
        let taken = r.take_fds(300).unwrap();
        assert_eq!(taken.len(), 300);
        for fd in &taken {
            let path = std::fs::read_link(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(fd))).unwrap();
            assert_eq!(path, std::path::Path::new("/dev/null"));
        }
        assert!(r.take_fds(1).is_none());
    }

    #[test]
    fn too_many_descriptors_for_a_short_message_are_refused() {
        let (a, _b) = UnixStream::pair().unwrap();
        let files: Vec<std::fs::File> = (0..600).map(|_| std::fs::File::open("/dev/null").unwrap()).collect();
        let fds: Vec<BorrowedFd<'_>> = files.iter().map(|f| f.as_fd()).collect();
        assert!(send_with_fds(&a, b"{}", &fds).is_err());
    }
}
