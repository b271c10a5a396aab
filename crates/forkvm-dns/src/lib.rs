//! Checks of DNS messages for the sandbox DNS forwarder (forkvm-sandbox's
//! `network::dns`): a query as a guest sends it, and an upstream's answer to it. Guest
//! bytes are untrusted: a query passes only with one question and a standard opcode,
//! and an answer is handed back only if it carries the id the query was sent under and
//! the same question. Apart from the forwarder so that the fuzz target builds it alone.

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};

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
