//! One stream's state machine and credit accounting, as pure logic (no sockets).
//!
//! A [`Connection`] is keyed by (local port, guest port). It buffers bytes in both
//! directions and knows which control packets it owes the guest; the I/O glue feeds it
//! guest packets ([`Connection::on_guest_packet`]) and host bytes
//! ([`Connection::push_from_host`]), drains [`Connection::to_host`], and asks it for the
//! next packet to put on the rx queue ([`Connection::next_packet`]).
//!
//! Credit (virtio 1.2 §5.10.6.3): the device never sends more payload than
//! `peer_buf_alloc - (tx_cnt - peer_fwd_cnt)`; it advertises [`CONN_BUF_ALLOC`] and its
//! `fwd_cnt` (bytes written to the host socket) in every header, and a guest that sends
//! beyond that credit is reset. A `CREDIT_UPDATE` is sent when a quarter of the buffer
//! has been forwarded since the last advertised `fwd_cnt`, or when the guest asks.
//!
//! Teardown: the guest's `SHUTDOWN(SEND)` half-closes the host socket once buffered
//! bytes are written; host EOF becomes `SHUTDOWN(SEND)` once buffered bytes reached the
//! guest. When both directions are finished (or the guest shut down both) the device
//! sends `RST` and the connection is [`Closed`](ConnState::Closed).

use super::packet::PacketHeader;
use super::{
    CONN_BUF_ALLOC, HOST_CID, MAX_PKT_PAYLOAD, OP_CREDIT_REQUEST, OP_CREDIT_UPDATE, OP_REQUEST, OP_RESPONSE, OP_RST,
    OP_RW, OP_SHUTDOWN, SHUTDOWN_BOTH, SHUTDOWN_RCV, SHUTDOWN_SEND, TO_GUEST_CAP, TYPE_STREAM,
};
use std::collections::VecDeque;

/// Guest protocol violations on an existing connection (each answered with `RST`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnectionError {
    #[error("guest sent {len} bytes with only {credit} bytes of credit")]
    CreditExceeded { len: usize, credit: u32 },
    #[error("guest sent op {op} while the connection is {state:?}")]
    UnexpectedOp { op: u16, state: ConnState },
    #[error("guest sent data after shutting down its send side")]
    DataAfterShutdown,
    #[error("unknown op {0}")]
    UnknownOp(u16),
}

/// Where a connection is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnState {
    /// Host-initiated: `REQUEST` owed or sent, waiting for `RESPONSE`.
    Connecting,
    /// Data may flow.
    Established,
    /// `RST` sent or received: the connection can be dropped.
    Closed,
}

/// One vsock stream.
#[derive(Debug)]
pub struct Connection {
    pub local_port: u32,
    pub peer_port: u32,
    guest_cid: u64,
    state: ConnState,
    // Control packets owed to the guest.
    owe_request: bool,
    owe_response: bool,
    owe_rst: bool,
    owe_credit_update: bool,
    credit_requested: bool,
    shutdown_sent: u32,
    peer_shutdown: u32,
    host_eof: bool,
    host_write_shut: bool,
    // Guest's receive side, as it last told us.
    peer_buf_alloc: u32,
    peer_fwd_cnt: u32,
    tx_cnt: u32,
    // Our receive side.
    rx_cnt: u32,
    fwd_cnt: u32,
    last_fwd_cnt_sent: u32,
    to_host: VecDeque<u8>,
    /// Leading bytes of `to_host` that are the device's own (the `OK` line), not guest
    /// payload, so they do not count towards `fwd_cnt`.
    uncounted: usize,
    to_guest: VecDeque<u8>,
}

impl Connection {
    fn new(local_port: u32, peer_port: u32, guest_cid: u64, state: ConnState) -> Connection {
        Connection {
            local_port,
            peer_port,
            guest_cid,
            state,
            owe_request: false,
            owe_response: false,
            owe_rst: false,
            owe_credit_update: false,
            credit_requested: false,
            shutdown_sent: 0,
            peer_shutdown: 0,
            host_eof: false,
            host_write_shut: false,
            peer_buf_alloc: 0,
            peer_fwd_cnt: 0,
            tx_cnt: 0,
            rx_cnt: 0,
            fwd_cnt: 0,
            last_fwd_cnt_sent: 0,
            to_host: VecDeque::new(),
            uncounted: 0,
            to_guest: VecDeque::new(),
        }
    }

    /// A host client asked for guest port `peer_port`; a `REQUEST` is owed.
    pub fn host_initiated(local_port: u32, peer_port: u32, guest_cid: u64) -> Connection {
        let mut conn = Connection::new(local_port, peer_port, guest_cid, ConnState::Connecting);
        conn.owe_request = true;
        conn
    }

    /// The guest's `REQUEST` reached a host listener; a `RESPONSE` is owed.
    pub fn guest_initiated(request: &PacketHeader, guest_cid: u64) -> Connection {
        let mut conn = Connection::new(request.dst_port, request.src_port, guest_cid, ConnState::Established);
        conn.owe_response = true;
        conn.update_peer_credit(request);
        conn
    }

    pub fn state(&self) -> ConnState {
        self.state
    }

    pub fn is_closed(&self) -> bool {
        self.state == ConnState::Closed
    }

    /// Bytes the device may still send to the guest.
    pub fn peer_credit(&self) -> u32 {
        self.peer_buf_alloc.saturating_sub(self.tx_cnt.wrapping_sub(self.peer_fwd_cnt))
    }

    /// Bytes the guest may still send to the device.
    pub fn own_credit(&self) -> u32 {
        CONN_BUF_ALLOC.saturating_sub(self.rx_cnt.wrapping_sub(self.fwd_cnt))
    }

    fn update_peer_credit(&mut self, hdr: &PacketHeader) {
        self.peer_buf_alloc = hdr.buf_alloc;
        self.peer_fwd_cnt = hdr.fwd_cnt;
        if self.peer_credit() > 0 {
            self.credit_requested = false;
        }
    }

    /// Ends the connection from our side: drop buffers, owe the guest an `RST`.
    pub fn reset(&mut self) {
        if self.state != ConnState::Closed {
            self.owe_rst = true;
        }
        self.to_host.clear();
        self.to_guest.clear();
    }

    /// Handles a packet the guest sent on this connection.
    pub fn on_guest_packet(&mut self, hdr: &PacketHeader, payload: &[u8]) -> Result<(), ConnectionError> {
        if hdr.op == OP_RST {
            self.state = ConnState::Closed;
            self.owe_rst = false;
            self.to_host.clear();
            return Ok(());
        }
        if self.owe_rst || self.state == ConnState::Closed {
            return Ok(()); // already being torn down
        }
        self.update_peer_credit(hdr);
        let result = self.dispatch(hdr, payload);
        if result.is_err() {
            self.reset();
        }
        self.check_finished();
        result
    }

    fn dispatch(&mut self, hdr: &PacketHeader, payload: &[u8]) -> Result<(), ConnectionError> {
        let unexpected = ConnectionError::UnexpectedOp { op: hdr.op, state: self.state };
        match (hdr.op, self.state) {
            (OP_RESPONSE, ConnState::Connecting) if !self.owe_request => {
                self.state = ConnState::Established;
                let line = format!("OK {}\n", self.local_port);
                self.uncounted = line.len();
                let guest_bytes: Vec<u8> = self.to_host.drain(..).collect();
                self.to_host.extend(line.bytes());
                self.to_host.extend(guest_bytes);
                Ok(())
            }
            (OP_RW, ConnState::Established) => {
                if self.peer_shutdown & SHUTDOWN_SEND != 0 {
                    return Err(ConnectionError::DataAfterShutdown);
                }
                let credit = self.own_credit();
                if payload.len() > credit as usize {
                    return Err(ConnectionError::CreditExceeded { len: payload.len(), credit });
                }
                self.rx_cnt = self.rx_cnt.wrapping_add(payload.len() as u32);
                self.to_host.extend(payload);
                Ok(())
            }
            (OP_SHUTDOWN, ConnState::Established) => {
                self.peer_shutdown |= hdr.flags & SHUTDOWN_BOTH;
                if self.peer_shutdown & SHUTDOWN_RCV != 0 {
                    self.to_guest.clear();
                }
                Ok(())
            }
            (OP_CREDIT_UPDATE, ConnState::Established) => Ok(()),
            (OP_CREDIT_REQUEST, ConnState::Established) => {
                self.owe_credit_update = true;
                Ok(())
            }
            (OP_REQUEST | OP_RESPONSE | OP_RW | OP_SHUTDOWN | OP_CREDIT_UPDATE | OP_CREDIT_REQUEST, _) => {
                Err(unexpected)
            }
            (op, _) => Err(ConnectionError::UnknownOp(op)),
        }
    }

    /// Both directions are done: owe the final `RST`.
    fn check_finished(&mut self) {
        if self.state != ConnState::Established || self.owe_rst || !self.to_host.is_empty() {
            return;
        }
        let guest_done_sending = self.peer_shutdown & SHUTDOWN_SEND != 0;
        let host_done_sending = self.shutdown_sent & SHUTDOWN_SEND != 0 || self.peer_shutdown & SHUTDOWN_RCV != 0;
        if guest_done_sending && host_done_sending {
            self.owe_rst = true;
        }
    }

    /// How many bytes the I/O glue may read from the host socket now.
    pub fn host_read_budget(&self) -> usize {
        let open = matches!(self.state, ConnState::Connecting | ConnState::Established)
            && !self.owe_rst
            && !self.host_eof
            && self.peer_shutdown & SHUTDOWN_RCV == 0;
        if open {
            TO_GUEST_CAP.saturating_sub(self.to_guest.len())
        } else {
            0
        }
    }

    /// Bytes read from the host socket (at most [`Connection::host_read_budget`]).
    pub fn push_from_host(&mut self, data: &[u8]) {
        self.to_guest.extend(data);
    }

    /// The host socket reached end of file.
    pub fn on_host_eof(&mut self) {
        self.host_eof = true;
    }

    /// The host socket failed: reset the stream.
    pub fn on_host_error(&mut self) {
        self.reset();
    }

    /// Buffered bytes for the host socket (the first contiguous part).
    pub fn to_host(&self) -> &[u8] {
        self.to_host.as_slices().0
    }

    /// `n` bytes of [`Connection::to_host`] were written to the host socket.
    pub fn consume_to_host(&mut self, n: usize) {
        let n = n.min(self.to_host.len());
        self.to_host.drain(..n);
        let own = n.min(self.uncounted);
        self.uncounted -= own;
        self.fwd_cnt = self.fwd_cnt.wrapping_add((n - own) as u32);
        self.check_finished();
    }

    /// Returns true once, when the guest has shut its send side and every byte it sent
    /// reached the host: the glue should then shut the host socket's write side.
    pub fn take_host_write_shutdown(&mut self) -> bool {
        let due = self.peer_shutdown & SHUTDOWN_SEND != 0 && self.to_host.is_empty() && !self.host_write_shut;
        if due {
            self.host_write_shut = true;
        }
        due
    }

    fn header(&mut self, op: u16, flags: u32, len: usize) -> PacketHeader {
        self.last_fwd_cnt_sent = self.fwd_cnt;
        self.owe_credit_update = false;
        PacketHeader {
            src_cid: HOST_CID,
            dst_cid: self.guest_cid,
            src_port: self.local_port,
            dst_port: self.peer_port,
            len: len as u32,
            type_: TYPE_STREAM,
            op,
            flags,
            buf_alloc: CONN_BUF_ALLOC,
            fwd_cnt: self.fwd_cnt,
        }
    }

    /// The next packet owed to the guest, with at most `max_payload` payload bytes.
    pub fn next_packet(&mut self, max_payload: usize) -> Option<(PacketHeader, Vec<u8>)> {
        if self.owe_rst {
            self.owe_rst = false;
            self.state = ConnState::Closed;
            return Some((self.header(OP_RST, 0, 0), Vec::new()));
        }
        if self.owe_request {
            self.owe_request = false;
            return Some((self.header(OP_REQUEST, 0, 0), Vec::new()));
        }
        if self.owe_response {
            self.owe_response = false;
            return Some((self.header(OP_RESPONSE, 0, 0), Vec::new()));
        }
        if self.state != ConnState::Established {
            return None;
        }
        if !self.to_guest.is_empty() {
            let credit = self.peer_credit() as usize;
            let n = self.to_guest.len().min(credit).min(max_payload).min(MAX_PKT_PAYLOAD);
            if n > 0 {
                let payload: Vec<u8> = self.to_guest.drain(..n).collect();
                self.tx_cnt = self.tx_cnt.wrapping_add(n as u32);
                return Some((self.header(OP_RW, 0, n), payload));
            }
            if credit == 0 && !self.credit_requested {
                self.credit_requested = true;
                return Some((self.header(OP_CREDIT_REQUEST, 0, 0), Vec::new()));
            }
        }
        if self.host_eof && self.to_guest.is_empty() && self.shutdown_sent & SHUTDOWN_SEND == 0 {
            self.shutdown_sent |= SHUTDOWN_SEND;
            let hdr = self.header(OP_SHUTDOWN, SHUTDOWN_SEND, 0);
            self.check_finished();
            return Some((hdr, Vec::new()));
        }
        let forwarded = self.fwd_cnt.wrapping_sub(self.last_fwd_cnt_sent);
        if self.owe_credit_update || forwarded >= CONN_BUF_ALLOC / 4 {
            return Some((self.header(OP_CREDIT_UPDATE, 0, 0), Vec::new()));
        }
        None
    }
}

#[cfg(test)]
#[path = "connection_tests.rs"]
mod tests;
