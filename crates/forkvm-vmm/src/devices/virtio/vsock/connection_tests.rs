//! Unit tests of the connection state machine and credit accounting.

use super::*;

const CID: u64 = 3;

fn guest_hdr(op: u16, len: usize, buf_alloc: u32, fwd_cnt: u32) -> PacketHeader {
    PacketHeader {
        src_cid: CID,
        dst_cid: HOST_CID,
        src_port: 1234,
        dst_port: 1 << 30,
        len: len as u32,
        type_: TYPE_STREAM,
        op,
        flags: 0,
        buf_alloc,
        fwd_cnt,
    }
}

fn established() -> Connection {
    let mut conn = Connection::host_initiated(1 << 30, 1234, CID);
    let (req, _) = conn.next_packet(4096).unwrap();
    assert_eq!((req.op, req.src_port, req.dst_port, req.dst_cid), (OP_REQUEST, 1 << 30, 1234, CID));
    assert_eq!(conn.next_packet(4096), None, "nothing until the guest answers");
    conn.on_guest_packet(&guest_hdr(OP_RESPONSE, 0, 1000, 0), &[]).unwrap();
    assert_eq!(conn.state(), ConnState::Established);
    assert_eq!(conn.to_host(), format!("OK {}\n", 1 << 30).as_bytes());
    let n = conn.to_host().len();
    conn.consume_to_host(n);
    conn
}

#[test]
fn host_initiated_handshake_and_ok_line_does_not_count_as_forwarded() {
    let mut conn = established();
    assert_eq!(conn.own_credit(), CONN_BUF_ALLOC);
    conn.on_guest_packet(&guest_hdr(OP_RW, 3, 1000, 0), b"abc").unwrap();
    assert_eq!(conn.to_host(), b"abc");
    assert_eq!(conn.own_credit(), CONN_BUF_ALLOC - 3);
    conn.consume_to_host(3);
    assert_eq!(conn.own_credit(), CONN_BUF_ALLOC);
    conn.push_from_host(b"xyz");
    let (hdr, payload) = conn.next_packet(4096).unwrap();
    assert_eq!((hdr.op, hdr.len, hdr.fwd_cnt, hdr.buf_alloc), (OP_RW, 3, 3, CONN_BUF_ALLOC));
    assert_eq!(payload, b"xyz");
}

#[test]
fn guest_rst_while_connecting_closes() {
    let mut conn = Connection::host_initiated(1 << 30, 9, CID);
    conn.next_packet(4096).unwrap();
    conn.on_guest_packet(&guest_hdr(OP_RST, 0, 0, 0), &[]).unwrap();
    assert!(conn.is_closed());
    assert_eq!(conn.next_packet(4096), None);
}

#[test]
fn never_sends_more_than_peer_credit_and_requests_more() {
    let mut conn = established();
    conn.push_from_host(&[7u8; 2500]);
    let (hdr, payload) = conn.next_packet(4096).unwrap();
    assert_eq!((hdr.op, payload.len()), (OP_RW, 1000), "guest buf_alloc is 1000");
    assert_eq!(conn.peer_credit(), 0);
    let (hdr, _) = conn.next_packet(4096).unwrap();
    assert_eq!(hdr.op, OP_CREDIT_REQUEST);
    assert_eq!(conn.next_packet(4096), None, "credit requested once");
    // The guest consumed 600 bytes.
    conn.on_guest_packet(&guest_hdr(OP_CREDIT_UPDATE, 0, 1000, 600), &[]).unwrap();
    let (_, payload) = conn.next_packet(100).unwrap();
    assert_eq!(payload.len(), 100, "also bounded by the rx buffer");
    let (_, payload) = conn.next_packet(4096).unwrap();
    assert_eq!(payload.len(), 500);
    assert_eq!(conn.peer_credit(), 0);
}

#[test]
fn guest_overrunning_our_credit_is_reset() {
    let mut conn = established();
    let big = vec![0u8; MAX_PKT_PAYLOAD];
    for _ in 0..(CONN_BUF_ALLOC as usize / MAX_PKT_PAYLOAD) {
        conn.on_guest_packet(&guest_hdr(OP_RW, big.len(), 1000, 0), &big).unwrap();
    }
    assert_eq!(conn.own_credit(), 0);
    let err = conn.on_guest_packet(&guest_hdr(OP_RW, 1, 1000, 0), b"x").unwrap_err();
    assert_eq!(err, ConnectionError::CreditExceeded { len: 1, credit: 0 });
    let (hdr, _) = conn.next_packet(4096).unwrap();
    assert_eq!(hdr.op, OP_RST);
    assert!(conn.is_closed());
}

#[test]
fn credit_update_after_forwarding_a_quarter_or_on_request() {
    let mut conn = established();
    conn.on_guest_packet(&guest_hdr(OP_CREDIT_REQUEST, 0, 1000, 0), &[]).unwrap();
    assert_eq!(conn.next_packet(4096).unwrap().0.op, OP_CREDIT_UPDATE);
    assert_eq!(conn.next_packet(4096), None);
    let chunk = vec![1u8; MAX_PKT_PAYLOAD];
    conn.on_guest_packet(&guest_hdr(OP_RW, chunk.len(), 1000, 0), &chunk).unwrap();
    conn.consume_to_host(MAX_PKT_PAYLOAD - 1);
    assert_eq!(conn.next_packet(4096), None, "below a quarter of buf_alloc");
    conn.consume_to_host(1);
    let (hdr, _) = conn.next_packet(4096).unwrap();
    assert_eq!((hdr.op, hdr.fwd_cnt), (OP_CREDIT_UPDATE, MAX_PKT_PAYLOAD as u32));
}

#[test]
fn graceful_close_from_the_guest() {
    let mut conn = established();
    conn.on_guest_packet(&guest_hdr(OP_RW, 2, 1000, 0), b"hi").unwrap();
    let mut shut = guest_hdr(OP_SHUTDOWN, 0, 1000, 0);
    shut.flags = SHUTDOWN_BOTH;
    conn.on_guest_packet(&shut, &[]).unwrap();
    assert!(!conn.take_host_write_shutdown(), "data still buffered");
    assert_eq!(conn.next_packet(4096), None, "no RST before buffered data is written");
    conn.consume_to_host(2);
    assert!(conn.take_host_write_shutdown());
    assert!(!conn.take_host_write_shutdown(), "only once");
    assert_eq!(conn.next_packet(4096).unwrap().0.op, OP_RST);
    assert!(conn.is_closed());
}

#[test]
fn host_eof_sends_shutdown_after_data_then_rst_when_guest_finishes() {
    let mut conn = established();
    conn.push_from_host(b"bye");
    conn.on_host_eof();
    assert_eq!(conn.host_read_budget(), 0);
    assert_eq!(conn.next_packet(4096).unwrap().0.op, OP_RW);
    let (hdr, _) = conn.next_packet(4096).unwrap();
    assert_eq!((hdr.op, hdr.flags), (OP_SHUTDOWN, SHUTDOWN_SEND));
    assert_eq!(conn.next_packet(4096), None);
    let mut shut = guest_hdr(OP_SHUTDOWN, 0, 1000, 3);
    shut.flags = SHUTDOWN_SEND;
    conn.on_guest_packet(&shut, &[]).unwrap();
    assert_eq!(conn.next_packet(4096).unwrap().0.op, OP_RST);
}

#[test]
fn protocol_violations_reset() {
    let mut conn = established();
    assert_eq!(conn.on_guest_packet(&guest_hdr(99, 0, 1000, 0), &[]), Err(ConnectionError::UnknownOp(99)));
    assert_eq!(conn.next_packet(4096).unwrap().0.op, OP_RST);
    let mut conn = Connection::host_initiated(1 << 30, 9, CID);
    conn.next_packet(4096).unwrap();
    let err = conn.on_guest_packet(&guest_hdr(OP_RW, 1, 1000, 0), b"x").unwrap_err();
    assert!(matches!(err, ConnectionError::UnexpectedOp { op: OP_RW, state: ConnState::Connecting }));
    let mut conn = established();
    let mut shut = guest_hdr(OP_SHUTDOWN, 0, 1000, 0);
    shut.flags = SHUTDOWN_SEND;
    conn.on_guest_packet(&shut, &[]).unwrap();
    assert_eq!(conn.on_guest_packet(&guest_hdr(OP_RW, 1, 1000, 0), b"x"), Err(ConnectionError::DataAfterShutdown));
}

#[test]
fn guest_initiated_owes_response_with_its_credit() {
    let mut req = guest_hdr(OP_REQUEST, 0, 5000, 0);
    req.dst_port = 700;
    req.src_port = 40000;
    let mut conn = Connection::guest_initiated(&req, CID);
    let (hdr, _) = conn.next_packet(4096).unwrap();
    assert_eq!((hdr.op, hdr.src_port, hdr.dst_port), (OP_RESPONSE, 700, 40000));
    assert_eq!(conn.peer_credit(), 5000);
}
