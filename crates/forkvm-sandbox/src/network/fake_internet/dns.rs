//! The fake internet's DNS server: answers A queries for the names it was given (and
//! their subdomains, when given as `*.name`), NXDOMAIN for the rest, until dropped.

use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{Name, RData, Record, RecordType};
use std::net::{Ipv4Addr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A running fake DNS server; stops when dropped.
#[derive(Debug)]
pub struct FakeDns {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for FakeDns {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Serves `names` on `sock` (bound in the fake internet's host) on a thread of its own.
pub(super) fn start(sock: UdpSocket, names: Vec<(String, Ipv4Addr)>) -> std::io::Result<FakeDns> {
    sock.set_read_timeout(Some(Duration::from_millis(100)))?;
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = stop.clone();
    let thread = std::thread::Builder::new().name("fake-dns".into()).spawn(move || {
        let mut buf = [0u8; 4096];
        while !stopping.load(Ordering::Relaxed) {
            let Ok((n, from)) = sock.recv_from(&mut buf) else { continue };
            if let Some(answer) = answer(&buf[..n], &names) {
                let _ = sock.send_to(&answer, from);
            }
        }
    })?;
    Ok(FakeDns { stop, thread: Some(thread) })
}

/// Whether `asked` (lower case, no final dot) is `pattern` or, for `*.x`, under `x`.
fn matches(pattern: &str, asked: &str) -> bool {
    match pattern.strip_prefix("*.") {
        Some(zone) => asked.ends_with(&format!(".{zone}")),
        None => pattern == asked,
    }
}

fn answer(query: &[u8], names: &[(String, Ipv4Addr)]) -> Option<Vec<u8>> {
    let q = Message::from_vec(query).ok()?;
    if q.metadata.message_type != MessageType::Query || q.queries.len() != 1 {
        return None;
    }
    let question = q.queries[0].clone();
    let asked = question.name().to_lowercase().to_ascii();
    let asked = asked.trim_end_matches('.');
    let found = names.iter().find(|(pattern, _)| matches(pattern, asked)).map(|(_, ip)| *ip);
    let mut reply = Message::response(q.metadata.id, q.metadata.op_code);
    reply.metadata.recursion_desired = q.metadata.recursion_desired;
    reply.metadata.recursion_available = true;
    reply.add_query(question.clone());
    match found {
        Some(ip) if question.query_type() == RecordType::A => {
            let name = Name::from_ascii(asked).ok()?;
            reply.add_answer(Record::from_rdata(name, 60, RData::A(A(ip))));
        }
        Some(_) => {} // the name exists, with no record of that type
        None => reply.metadata.response_code = ResponseCode::NXDomain,
    }
    reply.to_vec().ok()
}
