//! The connection table: routes guest packets to streams, opens host sockets for guest
//! requests, and picks the next packet for the guest's rx queue.
//!
//! Each entry pairs a [`Connection`] (pure logic) with its non-blocking host
//! [`UnixStream`]. Packets the guest sends for connections that do not exist are
//! answered with `RST` from a bounded control queue. Rx packets are taken round-robin
//! across connections so one busy stream cannot starve the others.

use super::connection::Connection;
use super::metrics::VsockMetrics;
use super::packet::{Packet, PacketHeader};
use super::{HOST_CID, HOST_PORT_BASE, MAX_CONNECTIONS, OP_REQUEST, OP_RST, TYPE_STREAM};
use crate::devices::virtio::ratelimit::LogLimiter;
use std::collections::{BTreeMap, VecDeque};
use std::ffi::OsString;
use std::io::{ErrorKind, Read, Write};
use std::ops::Bound::{Excluded, Unbounded};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// Most connection-less `RST`s queued for the guest; beyond this they are dropped.
const MAX_CONTROL_QUEUE: usize = 1024;
/// Bytes read from a host socket per readiness event.
const READ_CHUNK: usize = 16 * 1024;

/// (local port, guest port).
pub type ConnKey = (u32, u32);

/// Errors opening streams (logged; the guest or host client sees a reset/close).
#[derive(Debug, thiserror::Error)]
pub enum MuxerError {
    #[error("connecting to host socket {path}: {source}")]
    ConnectHost { path: PathBuf, source: std::io::Error },
    #[error("setting host socket non-blocking: {0}")]
    SetNonBlocking(std::io::Error),
    #[error("connection table full ({MAX_CONNECTIONS} streams)")]
    TooManyConnections,
    #[error("no free local port")]
    NoFreePort,
}

/// A stream and its host socket.
#[derive(Debug)]
pub struct Entry {
    pub conn: Connection,
    pub stream: UnixStream,
}

/// All streams of one device.
#[derive(Debug)]
pub struct Muxer {
    guest_cid: u64,
    uds_path: PathBuf,
    conns: BTreeMap<ConnKey, Entry>,
    control: VecDeque<PacketHeader>,
    cursor: ConnKey,
    next_port: u32,
    log: LogLimiter,
    metrics: Arc<VsockMetrics>,
}

/// Where a backend starts allocating host ports: a random point of our range. A guest
/// restored from a snapshot still knows the connections its source had (closing ones
/// linger in its socket tables); a new backend that counted from the base again would
/// reuse those (host CID, port) pairs and the guest would reset them.
fn random_start_port() -> u32 {
    let mut b = [0u8; 4];
    // SAFETY: getrandom writes at most 4 bytes into `b`.
    let got = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), libc::GRND_NONBLOCK) };
    let r = if got == 4 {
        u32::from_le_bytes(b)
    } else {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0)
    };
    // Leave room to count upwards for a long time before wrapping.
    HOST_PORT_BASE + (r % (1 << 29))
}

impl Muxer {
    pub fn new(guest_cid: u64, uds_path: PathBuf, metrics: Arc<VsockMetrics>) -> Muxer {
        Muxer {
            guest_cid,
            uds_path,
            conns: BTreeMap::new(),
            control: VecDeque::new(),
            cursor: (0, 0),
            next_port: random_start_port(),
            log: LogLimiter::default(),
            metrics,
        }
    }

    /// The host socket a guest connection to host port `port` is forwarded to.
    pub fn host_socket_path(uds_path: &Path, port: u32) -> PathBuf {
        let mut path = OsString::from(uds_path.as_os_str());
        path.push(format!("_{port}"));
        PathBuf::from(path)
    }

    pub fn len(&self) -> usize {
        self.conns.len()
    }

    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }

    /// Drops every stream (device reset): host sockets are closed.
    pub fn clear(&mut self) {
        self.metrics.conns_closed.fetch_add(self.conns.len() as u64, Relaxed);
        self.conns.clear();
        self.control.clear();
    }

    fn warn(&mut self, what: &str, err: &dyn std::fmt::Display) {
        self.metrics.guest_errors.fetch_add(1, Relaxed);
        if let Some(suppressed) = self.log.allow() {
            tracing::warn!(device = "vsock", suppressed, "{what}: {err}");
        }
    }

    /// Queues an `RST` answering `hdr` (never for an `RST`).
    pub fn reset_reply(&mut self, hdr: &PacketHeader) {
        if hdr.op == OP_RST || self.control.len() >= MAX_CONTROL_QUEUE {
            return;
        }
        self.control.push_back(PacketHeader {
            src_cid: HOST_CID,
            dst_cid: self.guest_cid,
            src_port: hdr.dst_port,
            dst_port: hdr.src_port,
            type_: TYPE_STREAM,
            op: OP_RST,
            ..PacketHeader::default()
        });
    }

    /// A host client asked (with `CONNECT <port>`) for guest port `guest_port`; `early`
    /// holds bytes it sent after the line. Returns the allocated local port.
    pub fn add_host_connection(
        &mut self,
        stream: UnixStream,
        guest_port: u32,
        early: &[u8],
    ) -> Result<u32, MuxerError> {
        if self.conns.len() >= MAX_CONNECTIONS {
            return Err(MuxerError::TooManyConnections);
        }
        stream.set_nonblocking(true).map_err(MuxerError::SetNonBlocking)?;
        let mut port = None;
        for _ in 0..=MAX_CONNECTIONS {
            let candidate = self.next_port;
            self.next_port = if candidate == u32::MAX { HOST_PORT_BASE } else { candidate + 1 };
            if self.conns.range((candidate, 0)..=(candidate, u32::MAX)).next().is_none() {
                port = Some(candidate);
                break;
            }
        }
        let port = port.ok_or(MuxerError::NoFreePort)?;
        let mut conn = Connection::host_initiated(port, guest_port, self.guest_cid);
        conn.push_from_host(early);
        self.conns.insert((port, guest_port), Entry { conn, stream });
        self.metrics.conns_opened.fetch_add(1, Relaxed);
        Ok(port)
    }

    /// Routes one packet from the guest's tx queue.
    pub fn handle_guest_packet(&mut self, pkt: Packet) {
        let hdr = pkt.hdr;
        self.metrics.tx_packets.fetch_add(1, Relaxed);
        self.metrics.tx_bytes.fetch_add(pkt.payload.len() as u64, Relaxed);
        if hdr.src_cid != self.guest_cid || hdr.dst_cid != HOST_CID || hdr.type_ != TYPE_STREAM {
            let err = format!("src_cid {} dst_cid {} type {}", hdr.src_cid, hdr.dst_cid, hdr.type_);
            self.warn("dropping misaddressed packet", &err);
            self.reset_reply(&hdr);
            return;
        }
        let key = (hdr.dst_port, hdr.src_port);
        if let Some(entry) = self.conns.get_mut(&key) {
            if let Err(err) = entry.conn.on_guest_packet(&hdr, &pkt.payload) {
                self.warn("resetting stream", &err);
            }
            return;
        }
        match hdr.op {
            OP_REQUEST => self.connect_to_host(&hdr),
            OP_RST => {}
            _ => self.reset_reply(&hdr),
        }
    }

    fn connect_to_host(&mut self, hdr: &PacketHeader) {
        let result = if self.conns.len() >= MAX_CONNECTIONS {
            Err(MuxerError::TooManyConnections)
        } else {
            let path = Muxer::host_socket_path(&self.uds_path, hdr.dst_port);
            UnixStream::connect(&path)
                .map_err(|source| MuxerError::ConnectHost { path, source })
                .and_then(|s| s.set_nonblocking(true).map(|_| s).map_err(MuxerError::SetNonBlocking))
        };
        match result {
            Ok(stream) => {
                let conn = Connection::guest_initiated(hdr, self.guest_cid);
                self.conns.insert((hdr.dst_port, hdr.src_port), Entry { conn, stream });
                self.metrics.conns_opened.fetch_add(1, Relaxed);
            }
            Err(err) => {
                self.metrics.host_connect_failures.fetch_add(1, Relaxed);
                if let Some(suppressed) = self.log.allow() {
                    tracing::debug!(device = "vsock", suppressed, "refusing guest connection: {err}");
                }
                self.reset_reply(hdr);
            }
        }
    }

    /// The next packet for the guest with at most `max_payload` payload bytes.
    pub fn next_rx_packet(&mut self, max_payload: usize) -> Option<(PacketHeader, Vec<u8>)> {
        let packet =
            self.control.pop_front().map(|hdr| (hdr, Vec::new())).or_else(|| self.next_conn_packet(max_payload));
        if let Some((hdr, payload)) = &packet {
            self.metrics.rx_packets.fetch_add(1, Relaxed);
            self.metrics.rx_bytes.fetch_add(payload.len() as u64, Relaxed);
            if hdr.op == OP_RST {
                self.metrics.rst_sent.fetch_add(1, Relaxed);
            }
        }
        packet
    }

    fn next_conn_packet(&mut self, max_payload: usize) -> Option<(PacketHeader, Vec<u8>)> {
        let start = self.cursor;
        let found = self
            .conns
            .range_mut((Excluded(start), Unbounded))
            .find_map(|(k, e)| e.conn.next_packet(max_payload).map(|p| (*k, p)))
            .or_else(|| {
                self.conns.range_mut(..=start).find_map(|(k, e)| e.conn.next_packet(max_payload).map(|p| (*k, p)))
            });
        let (key, packet) = found?;
        self.cursor = key;
        Some(packet)
    }

    /// (key, fd, poll events) for every stream with host I/O to wait for.
    pub fn poll_interest(&self) -> Vec<(ConnKey, i32, i16)> {
        use std::os::fd::AsRawFd;
        self.conns
            .iter()
            .filter_map(|(k, e)| {
                let mut events = 0;
                if e.conn.host_read_budget() > 0 {
                    events |= libc::POLLIN;
                }
                if !e.conn.to_host().is_empty() {
                    events |= libc::POLLOUT;
                }
                (events != 0).then(|| (*k, e.stream.as_raw_fd(), events))
            })
            .collect()
    }

    /// Writes buffered guest bytes to every stream's host socket, without blocking.
    pub fn flush_all(&mut self) {
        for entry in self.conns.values_mut() {
            write_host(entry);
        }
    }

    /// Moves bytes between one stream's buffers and its host socket, without blocking.
    pub fn host_io(&mut self, key: ConnKey) {
        let Some(entry) = self.conns.get_mut(&key) else { return };
        write_host(entry);
        let budget = entry.conn.host_read_budget().min(READ_CHUNK);
        if budget > 0 {
            let mut buf = vec![0u8; budget];
            match entry.stream.read(&mut buf) {
                Ok(0) => entry.conn.on_host_eof(),
                Ok(n) => entry.conn.push_from_host(&buf[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {}
                Err(_) => entry.conn.on_host_error(),
            }
        }
    }

    /// Drops closed streams (closing their host sockets).
    pub fn reap(&mut self) {
        let before = self.conns.len();
        self.conns.retain(|_, e| !e.conn.is_closed());
        self.metrics.conns_closed.fetch_add((before - self.conns.len()) as u64, Relaxed);
    }
}

/// Writes as much of the stream's buffered guest bytes as the host socket takes, and
/// half-closes the socket once the guest has finished sending.
fn write_host(entry: &mut Entry) {
    while !entry.conn.to_host().is_empty() {
        match entry.stream.write(entry.conn.to_host()) {
            Ok(0) => entry.conn.on_host_error(),
            Ok(n) => entry.conn.consume_to_host(n),
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => entry.conn.on_host_error(),
        }
    }
    if entry.conn.take_host_write_shutdown() {
        let _ = entry.stream.shutdown(std::net::Shutdown::Write);
    }
}
