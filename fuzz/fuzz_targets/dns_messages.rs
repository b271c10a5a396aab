//! The DNS forwarder's checks of guest bytes (`forkvm-dns`): a query as a guest
//! sends it (`Query::parse`), and an upstream's answer to it (`Query::check_answer`,
//! and `answer_addresses`, which the egress policy's filter learns addresses from).
//!
//! The input is split at its first byte: that many bytes (mod the length) are the
//! guest's query, the rest an upstream's answer. Checked: nothing panics; a query that
//! passes has one question and a name; an answer is handed back only under the
//! guest's id, to the question asked.

#![no_main]

use forkvm_dns::{answer_addresses, Query, Refused};
use hickory_proto::op::Message;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&split, rest)) = data.split_first() else { return };
    let cut = if rest.is_empty() { 0 } else { split as usize % (rest.len() + 1) };
    let (guest, upstream) = rest.split_at(cut);
    let _ = answer_addresses(upstream);
    match Query::parse(guest) {
        Ok(query) => {
            let _ = query.name();
            let sent = query.with_id(0xbeef);
            assert_eq!(&sent[..2], &[0xbe, 0xef]);
            assert!(Message::from_vec(&query.failure()).is_ok(), "SERVFAIL is a message");
            assert!(Message::from_vec(&query.nonexistent()).is_ok(), "NXDOMAIN is a message");
            if let Some(back) = query.check_answer(0xbeef, upstream.to_vec()) {
                assert_eq!(&back[..2], &guest[..2], "handed back under the guest's id");
                assert_eq!(&back[2..], &upstream[2..], "the upstream's bytes otherwise");
                // At most one address per record a message of this size can hold.
                assert!(answer_addresses(&back).len() <= back.len() / 11);
            }
            // The question itself never passes as its answer.
            assert!(query.check_answer(0xbeef, sent).is_none());
        }
        Err(Refused::Answer(bytes)) => {
            let m = Message::from_vec(&bytes).expect("a refusal is a message");
            assert_eq!(m.metadata.id.to_be_bytes(), [guest[0], guest[1]]);
        }
        Err(Refused::Garbage) => {}
    }
});
