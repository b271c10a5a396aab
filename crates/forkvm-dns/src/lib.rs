//! Checks of DNS messages for the sandbox DNS forwarder (forkvm-sandbox's
//! `network::dns`): a query as a guest sends it, and an upstream's answer to it. Guest
//! bytes are untrusted: a query passes only with one question and a standard opcode,
//! and an answer is handed back only if it carries the id the query was sent under and
//! the same question. Apart from the forwarder so that the fuzz target builds it alone.

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};
use std::net::Ipv4Addr;

/// A guest's query, parsed and checked.
#[derive(Debug)]
pub struct Query {
    bytes: Vec<u8>,
    message: Message,
}

/// Why a guest's bytes are not forwarded.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// Not a DNS message at all: no answer.
    Garbage,
    /// A message we answer with this code (FORMERR, NOTIMP).
    Answer(Vec<u8>),
}

impl Query {
    /// Checks `bytes` from a guest: one question, a standard query.
    pub fn parse(bytes: &[u8]) -> Result<Query, Refused> {
        if bytes.len() > u16::MAX as usize {
            return Err(Refused::Garbage);
        }
        let message = Message::from_vec(bytes).map_err(|_| Refused::Garbage)?;
        let meta = &message.metadata;
        let refuse =
            |code| Refused::Answer(Message::error_msg(meta.id, meta.op_code, code).to_vec().unwrap_or_default());
        if meta.message_type != MessageType::Query {
            return Err(Refused::Garbage);
        }
        if meta.op_code != OpCode::Query {
            return Err(refuse(ResponseCode::NotImp));
        }
        if message.queries.len() != 1 {
            return Err(refuse(ResponseCode::FormErr));
        }
        Ok(Query { bytes: bytes.to_vec(), message })
    }

    /// The name asked for, lower case, without the final dot.
    pub fn name(&self) -> String {
        let name = self.message.queries[0].name().to_lowercase().to_ascii();
        name.trim_end_matches('.').to_string()
    }

    /// A standard query for `name`'s IPv4 addresses (the forwarder's own, when it looks
    /// up a denied name); `None` for a name that is not one.
    pub fn for_addresses_of(name: &str) -> Option<Query> {
        let name = Name::from_ascii(name).ok()?;
        let mut message = Message::query();
        message.metadata.recursion_desired = true;
        message.add_query(hickory_proto::op::Query::query(name, RecordType::A));
        Query::parse(&message.to_vec().ok()?).ok()
    }

    /// NXDOMAIN for this query: the name does not exist, as far as the guest learns.
    pub fn nonexistent(&self) -> Vec<u8> {
        let meta = &self.message.metadata;
        let mut reply = Message::error_msg(meta.id, meta.op_code, ResponseCode::NXDomain);
        reply.metadata.recursion_desired = meta.recursion_desired;
        reply.metadata.recursion_available = true;
        reply.add_query(self.message.queries[0].clone());
        reply.to_vec().unwrap_or_default()
    }

    /// SERVFAIL for this query.
    pub fn failure(&self) -> Vec<u8> {
        let meta = &self.message.metadata;
        Message::error_msg(meta.id, meta.op_code, ResponseCode::ServFail).to_vec().unwrap_or_default()
    }

    /// The query as sent upstream: the same bytes under `id`.
    pub fn with_id(&self, id: u16) -> Vec<u8> {
        let mut bytes = self.bytes.clone();
        bytes[..2].copy_from_slice(&id.to_be_bytes());
        bytes
    }

    /// `answer` (from upstream, asked under `id`) if it answers this query: returned
    /// with the guest's id, as the upstream's bytes.
    pub fn check_answer(&self, id: u16, mut answer: Vec<u8>) -> Option<Vec<u8>> {
        let parsed = Message::from_vec(&answer).ok()?;
        let asked = &self.message.queries[0];
        let same = parsed.queries.len() == 1
            && parsed.queries[0].name().to_lowercase() == asked.name().to_lowercase()
            && parsed.queries[0].query_type() == asked.query_type()
            && parsed.queries[0].query_class() == asked.query_class();
        if parsed.metadata.id != id || parsed.metadata.message_type != MessageType::Response || !same {
            return None;
        }
        answer[..2].copy_from_slice(&self.message.metadata.id.to_be_bytes());
        Some(answer)
    }
}

/// The IPv4 addresses in the answer section of `answer` (an answer [`Query::check_answer`]
/// passed), each with its record's TTL: what a guest may connect to after this answer.
/// Garbage yields none. Every A record counts, whatever its owner name: those of a CNAME
/// chain belong to the name asked.
pub fn answer_addresses(answer: &[u8]) -> Vec<(Ipv4Addr, u32)> {
    let Ok(message) = Message::from_vec(answer) else { return Vec::new() };
    message
        .answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some((a.0, r.ttl)),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::rr::rdata::{A, CNAME};
    use hickory_proto::rr::Record;

    #[test]
    fn a_lookup_of_its_own_is_a_query_and_nxdomain_keeps_the_question() {
        let q = Query::for_addresses_of("denied.example.test").unwrap();
        assert_eq!(q.name(), "denied.example.test");
        let nx = Message::from_vec(&q.nonexistent()).unwrap();
        assert_eq!(nx.metadata.response_code, ResponseCode::NXDomain);
        assert_eq!(nx.metadata.id, q.message.metadata.id);
        assert_eq!(nx.queries, q.message.queries);
        assert!(Query::for_addresses_of("not a name\u{0}").is_none());
    }

    #[test]
    fn the_addresses_of_an_answer_include_those_behind_a_cname() {
        let q = Query::for_addresses_of("www.example.test").unwrap();
        let mut answer = Message::response(q.message.metadata.id, OpCode::Query);
        answer.add_query(q.message.queries[0].clone());
        let www = Name::from_ascii("www.example.test").unwrap();
        let cdn = Name::from_ascii("edge.cdn.test").unwrap();
        answer.add_answer(Record::from_rdata(www, 30, RData::CNAME(CNAME(cdn.clone()))));
        answer.add_answer(Record::from_rdata(cdn, 60, RData::A(A(Ipv4Addr::new(203, 0, 113, 9)))));
        let bytes = answer.to_vec().unwrap();
        assert_eq!(answer_addresses(&bytes), vec![(Ipv4Addr::new(203, 0, 113, 9), 60)]);
        assert!(answer_addresses(b"garbage").is_empty());
    }
}
