//! A sandbox's egress policy as nftables commands for its table's `egress` chain and
//! sets ([`super::rules`]), replaced in one transaction when the policy changes.
//!
//! Every connection the chain lets out is marked with the policy's generation
//! (`ct mark`); a packet of a connection marked by an earlier policy is checked again,
//! so a new policy holds for connections already open too (`ct mark` is 0 before any).
//!
//! The chain, in order: connections of this generation; allowed networks and learned
//! allowed addresses (marked, accepted); denied networks and learned denied addresses
//! (rejected); DNS over TLS (port 853, rejected when the policy names domains: a guest's
//! only resolver is the forwarder, which enforces them); then `allow_internet`.

use super::policy::{EgressPolicy, Ipv4Net};
use super::rules::{daddr, dport, ip, prefix, EgressSet, TableBuilder, EGRESS_CHAIN};
use nftables::batch::Batch;
use nftables::expr::{Elem, Expression, NamedExpression, CT};
use nftables::schema::Nftables;
use nftables::stmt::{Mangle, Match, Operator, Reject, Statement};
use nftables::types::NfFamily;
use std::net::Ipv4Addr;

/// The batch that installs `policy` as generation `generation` (not 0), keeping the
/// learned addresses in `learned` (set, address, seconds left). `empty`: the chain and
/// sets hold nothing yet (a namespace just made), so nothing is flushed (a flush waits
/// for an RCU grace period).
pub fn policy_rules(
    policy: &EgressPolicy,
    generation: u32,
    learned: &[(EgressSet, Ipv4Addr, u32)],
    empty: bool,
) -> Nftables<'static> {
    let t = TableBuilder::new(NfFamily::IP);
    let mut b = Batch::new();
    if !empty {
        b.add_cmd(t.flush_chain(EGRESS_CHAIN));
        for set in EgressSet::ALL {
            b.add_cmd(t.flush_set(set));
        }
    }
    for (set, nets) in [(EgressSet::AllowNets, &policy.allow.nets), (EgressSet::DenyNets, &policy.deny.nets)] {
        if !nets.is_empty() {
            b.add(t.elements(set, nets.iter().map(net).collect()));
        }
    }
    for set in [EgressSet::AllowLearned, EgressSet::DenyLearned] {
        let elems: Vec<_> = learned.iter().filter(|(s, ..)| *s == set).map(|(_, a, secs)| timed(*a, *secs)).collect();
        if !elems.is_empty() {
            b.add(t.elements(set, elems));
        }
    }
    let rule = |b: &mut Batch<'static>, expr| b.add(t.rule(EGRESS_CHAIN, expr));
    rule(&mut b, vec![mark_is(generation), Statement::Accept(None)]);
    for set in [EgressSet::AllowNets, EgressSet::AllowLearned] {
        rule(&mut b, vec![daddr(Operator::EQ, in_set(set)), mark_set(generation), Statement::Accept(None)]);
    }
    for set in [EgressSet::DenyNets, EgressSet::DenyLearned] {
        rule(&mut b, vec![daddr(Operator::EQ, in_set(set)), reject()]);
    }
    if policy.has_names() {
        for proto in ["tcp", "udp"] {
            rule(&mut b, vec![dport(proto, 853), reject()]);
        }
    }
    if policy.allow_internet {
        rule(&mut b, vec![mark_set(generation), Statement::Accept(None)]);
    } else {
        rule(&mut b, vec![reject()]);
    }
    b.to_nftables()
}

/// The batch that adds `addrs` to a learned set, each for its seconds.
pub fn learn_rules(set: EgressSet, addrs: &[(Ipv4Addr, u32)]) -> Nftables<'static> {
    let t = TableBuilder::new(NfFamily::IP);
    let mut b = Batch::new();
    b.add(t.elements(set, addrs.iter().map(|(a, secs)| timed(*a, *secs)).collect()));
    b.to_nftables()
}

fn net(n: &Ipv4Net) -> Expression<'static> {
    if n.prefix == 32 {
        ip(n.addr)
    } else {
        prefix(n.addr, n.prefix)
    }
}

fn timed(addr: Ipv4Addr, seconds: u32) -> Expression<'static> {
    Expression::Named(NamedExpression::Elem(Elem {
        val: Box::new(ip(addr)),
        timeout: Some(seconds.max(1)),
        expires: None,
        comment: None,
        counter: None,
    }))
}

fn in_set(set: EgressSet) -> Expression<'static> {
    Expression::String(format!("@{}", set.name()).into())
}

fn ct_mark() -> Expression<'static> {
    Expression::Named(NamedExpression::CT(CT { key: "mark".into(), family: None, dir: None }))
}

fn mark_is(generation: u32) -> Statement<'static> {
    Statement::Match(Match { left: ct_mark(), right: Expression::Number(generation), op: Operator::EQ })
}

fn mark_set(generation: u32) -> Statement<'static> {
    Statement::Mangle(Mangle { key: ct_mark(), value: Expression::Number(generation) })
}

/// ICMP port unreachable: the guest's connect fails at once, not after a timeout.
fn reject() -> Statement<'static> {
    Statement::Reject(Some(Reject::new(None, None)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use forkvm_api::NetworkPolicy;

    #[test]
    fn a_closed_policy_rejects_what_it_does_not_allow_and_keeps_learned_addresses() {
        let policy = EgressPolicy::parse(&NetworkPolicy {
            allow_internet: false,
            allow: vec!["10.1.0.0/16".into(), "*.cdn.test".into()],
            deny: vec!["10.1.2.3".into()],
        })
        .unwrap();
        let learned = [(EgressSet::AllowLearned, Ipv4Addr::new(203, 0, 113, 7), 90)];
        let json = serde_json::to_string(&policy_rules(&policy, 7, &learned, false)).unwrap();
        for needle in [
            r#""flush":{"chain""#,
            r#""flush":{"set""#,
            r#"{"prefix":{"addr":"10.1.0.0","len":16}}"#,
            r#""elem":["10.1.2.3"]"#,
            r#"{"elem":{"val":"203.0.113.7","timeout":90"#,
            r#""right":"@allow_learned""#,
            r#"{"mangle":{"key":{"ct":{"key":"mark"}},"value":7}}"#,
            r#""right":853"#,
        ] {
            assert!(json.contains(needle), "{needle} missing from {json}");
        }
        assert!(json.ends_with(r#"[{"reject":{}}]}}}]}"#), "the chain ends in a reject: {json}");
    }

    #[test]
    fn an_open_policy_without_names_ends_in_accept_and_leaves_dns_over_tls_alone() {
        let policy =
            EgressPolicy::parse(&NetworkPolicy { deny: vec!["192.0.2.0/24".into()], ..NetworkPolicy::default() })
                .unwrap();
        let json = serde_json::to_string(&policy_rules(&policy, 1, &[], true)).unwrap();
        assert!(!json.contains("853"), "{json}");
        assert!(!json.contains("flush"), "a namespace just made has nothing to flush: {json}");
        assert!(json.ends_with(r#""value":1}},{"accept":null}]}}}]}"#), "{json}");
    }
}
