//! Host side of the hybrid vsock handshake: the VMM exposes the guest's vsock as a Unix
//! socket, and a host connection reaches guest port `P` by sending `CONNECT P\n` and
//! reading `OK <host port>\n` before the stream carries agent frames.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;

/// Longest acknowledgement line accepted from the VMM.
const MAX_ACK_LEN: usize = 64;

/// A failed `CONNECT` handshake, by step.
#[derive(Debug, thiserror::Error)]
pub enum VsockConnectError {
    /// Connecting to the VMM's Unix socket failed.
    #[error("connecting to vsock socket {path}: {source}")]
    Connect { path: String, source: io::Error },
    /// Sending `CONNECT <port>` failed.
    #[error("sending CONNECT {port}: {source}")]
    SendConnect { port: u32, source: io::Error },
    /// Reading the acknowledgement failed or the stream ended early.
    #[error("reading CONNECT acknowledgement for port {port}: {source}")]
    ReadAck { port: u32, source: io::Error },
    /// The VMM answered something other than `OK <n>` (e.g. nothing listens on the port).
    #[error("CONNECT {port} rejected: got {reply:?}, expected \"OK <port>\"")]
    Rejected { port: u32, reply: String },
}

/// Connects to guest vsock `port` through the VMM's Unix socket at `path`.
///
/// The acknowledgement is read one byte at a time so no agent bytes are consumed.
pub fn connect_vsock_uds(path: impl AsRef<Path>, port: u32) -> Result<UnixStream, VsockConnectError> {
    connect_vsock_uds_within(path, port, None)
}

/// [`connect_vsock_uds`] whose stream gives up on any read or write that waits longer
/// than `limit` (the handshake included). A guest that resets its vsock transport (as it
/// does right after a restore) drops its connections without telling the host, so a
/// request on such a connection would otherwise wait forever.
pub fn connect_vsock_uds_within(
    path: impl AsRef<Path>,
    port: u32,
    limit: Option<std::time::Duration>,
) -> Result<UnixStream, VsockConnectError> {
    let path = path.as_ref();
    // As a forkvm client: a jailed VMM serves no one else (`crate::trusted_peer`).
    let mut stream = crate::trusted_peer::connect(path)
        .map_err(|source| VsockConnectError::Connect { path: path.display().to_string(), source })?;
    if limit.is_some() {
        let set = |r: io::Result<()>| r.map_err(|source| VsockConnectError::SendConnect { port, source });
        set(stream.set_read_timeout(limit))?;
        set(stream.set_write_timeout(limit))?;
    }
    stream
        .write_all(format!("CONNECT {port}\n").as_bytes())
        .map_err(|source| VsockConnectError::SendConnect { port, source })?;
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        match stream.read(&mut byte) {
            Ok(0) => {
                let source = io::Error::new(io::ErrorKind::UnexpectedEof, "stream closed before newline");
                return Err(VsockConnectError::ReadAck { port, source });
            }
            Ok(_) if byte[0] == b'\n' => break,
            Ok(_) if line.len() >= MAX_ACK_LEN => {
                return Err(VsockConnectError::Rejected { port, reply: String::from_utf8_lossy(&line).into() });
            }
            Ok(_) => line.push(byte[0]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(source) => return Err(VsockConnectError::ReadAck { port, source }),
        }
    }
    let reply = String::from_utf8_lossy(&line).into_owned();
    let ok = reply.strip_prefix("OK ").is_some_and(|n| n.trim().parse::<u32>().is_ok());
    if !ok {
        return Err(VsockConnectError::Rejected { port, reply });
    }
    Ok(stream)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    fn serve_once(reply: &'static [u8]) -> (tempfile_dir::Dir, std::thread::JoinHandle<Vec<u8>>) {
        let dir = tempfile_dir::Dir::new();
        let listener = UnixListener::bind(dir.path()).unwrap();
        let handle = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut got = vec![0u8; 13];
            s.read_exact(&mut got).unwrap();
            s.write_all(reply).unwrap();
            got
        });
        (dir, handle)
    }

    /// A throwaway socket path (the proto crate has no tempfile dependency).
    mod tempfile_dir {
        pub struct Dir(std::path::PathBuf);
        impl Dir {
            pub fn new() -> Self {
                static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
                let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Self(std::env::temp_dir().join(format!("forkvm-proto-{}-{n}.sock", std::process::id())))
            }
            pub fn path(&self) -> &std::path::Path {
                &self.0
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_file(&self.0);
            }
        }
    }

    #[test]
    fn handshake_ok_leaves_following_bytes_unread() {
        let (dir, handle) = serve_once(b"OK 1073741824\nFV");
        let mut s = connect_vsock_uds(dir.path(), 1024).unwrap();
        assert_eq!(handle.join().unwrap(), b"CONNECT 1024\n");
        let mut rest = [0u8; 2];
        s.read_exact(&mut rest).unwrap();
        assert_eq!(&rest, b"FV");
    }

    #[test]
    fn handshake_rejection_names_reply() {
        let (dir, handle) = serve_once(b"NO\n");
        let err = connect_vsock_uds(dir.path(), 1024).unwrap_err();
        handle.join().unwrap();
        assert!(matches!(err, VsockConnectError::Rejected { ref reply, .. } if reply == "NO"), "{err}");
    }
}
