//! The packet filter of sandbox networks, as nftables rule sets applied with `nft -j`
//! (the `nftables` crate): one table in each sandbox's namespace, one static table in the
//! uplink's. Neither names a sandbox from outside its namespace, so nothing here outlives
//! the sandbox: its table goes with its namespace, and the uplink's never changes.
//!
//! In a sandbox's namespace (table `ip forkvm`):
//! * the guest's traffic out of `eth0` leaves as the link's inner address (SNAT), so
//!   clones with one guest address stay apart on the uplink;
//! * forwarded: only what the guest starts from its own address (through the `egress`
//!   chain, which its policy fills: `super::policy_rules`), and the answers;
//! * into the namespace from the uplink: answers only (the namespace's own services,
//!   the DNS forwarder and exposed ports to come, are for the guest and the daemon);
//! * the guest's DNS, to whatever address it asks, goes to the forwarder's sockets at
//!   the gateway (`redirect`): a guest cannot pick another resolver.
//!
//! In the uplink's namespace (table `inet forkvm`, the same for every sandbox):
//! * sandbox links masquerade out of every other interface;
//! * sandboxes never reach each other, the link-local range (cloud metadata) or the
//!   uplink itself (its services, the daemon's API), and nothing outside starts a
//!   connection into a sandbox.

use super::addressing::{LinkIndex, INNER_NAME, LINKS_NET, LINKS_PREFIX, LINK_PREFIX};
use super::{NetworkError, GUEST_IP, TAP_NAME};
use nftables::batch::Batch;
use nftables::expr::{Expression, Meta, MetaKey, NamedExpression, Payload, PayloadField, Prefix, CT};
use nftables::schema::{
    Chain, Element, FlushObject, NfCmd, NfListObject, Nftables, Rule, Set, SetFlag, SetType, SetTypeValue, Table,
};
use nftables::stmt::{Match, Operator, Statement, NAT};
use nftables::types::{NfChainPolicy, NfChainType, NfFamily, NfHook};
use std::borrow::Cow;
use std::net::Ipv4Addr;

/// The table's name, in the sandbox's namespace and in the uplink's.
pub const TABLE: &str = "forkvm";

/// The rule set of a sandbox's namespace whose link is `link`, for a namespace just made
/// (it only adds: a transaction that deletes anything waits for an RCU grace period,
/// ~5–10 ms here).
pub fn sandbox_rules(link: LinkIndex) -> Nftables<'static> {
    let t = TableBuilder::new(NfFamily::IP);
    let mut b = Batch::new();
    b.add(t.table());
    b.add(t.base_chain("prerouting", NfChainType::NAT, NfHook::Prerouting, -100, NfChainPolicy::Accept));
    for proto in ["udp", "tcp"] {
        b.add(t.rule("prerouting", vec![iifname(Operator::EQ, TAP_NAME), dport(proto, 53), Statement::Redirect(None)]));
    }
    b.add(t.base_chain("postrouting", NfChainType::NAT, NfHook::Postrouting, 100, NfChainPolicy::Accept));
    b.add(t.rule(
        "postrouting",
        vec![
            oifname(Operator::EQ, INNER_NAME),
            saddr(Operator::EQ, ip(GUEST_IP)),
            Statement::SNAT(Some(NAT { addr: Some(ip(link.inner_ip())), family: None, port: None, flags: None })),
        ],
    ));
    // Where the guest may go: the egress chain decides, once a policy fills it
    // (`super::policy_rules`, whose chain always ends in a verdict); empty, it returns
    // here and the guest goes anywhere. The first policy then only adds.
    for set in EgressSet::ALL {
        b.add(t.set(set));
    }
    b.add(t.chain(EGRESS_CHAIN));
    b.add(t.base_chain("forward", NfChainType::Filter, NfHook::Forward, 0, NfChainPolicy::Drop));
    b.add(t.rule("forward", vec![iifname(Operator::EQ, INNER_NAME), ct_answers(), accept()]));
    // What the guest starts from its own address: through the egress chain, then out.
    let guest_out =
        || vec![iifname(Operator::EQ, TAP_NAME), oifname(Operator::EQ, INNER_NAME), saddr(Operator::EQ, ip(GUEST_IP))];
    let jump = Statement::Jump(nftables::stmt::JumpTarget { target: EGRESS_CHAIN.into() });
    b.add(t.rule("forward", [guest_out(), vec![jump]].concat()));
    b.add(t.rule("forward", [guest_out(), vec![accept()]].concat()));

    b.add(t.base_chain("input", NfChainType::Filter, NfHook::Input, 0, NfChainPolicy::Accept));
    b.add(t.rule("input", vec![iifname(Operator::EQ, TAP_NAME), saddr(Operator::NEQ, ip(GUEST_IP)), drop()]));
    b.add(t.rule("input", vec![iifname(Operator::EQ, INNER_NAME), ct_answers(), accept()]));
    b.add(t.rule("input", vec![iifname(Operator::EQ, INNER_NAME), drop()]));
    b.to_nftables()
}

/// The chain of a sandbox's table that decides where its guest may connect to.
pub const EGRESS_CHAIN: &str = "egress";
/// Elements a learned set (addresses from DNS answers) holds at most.
pub const LEARNED_MAX: u32 = 4096;

/// The sets of a sandbox's table its egress chain looks addresses up in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EgressSet {
    /// Networks of the policy's `allow` and `deny` lists.
    AllowNets,
    DenyNets,
    /// Addresses the DNS forwarder handed out for allowed names, and found for denied
    /// ones, each for a while.
    AllowLearned,
    DenyLearned,
}

impl EgressSet {
    pub const ALL: [EgressSet; 4] =
        [EgressSet::AllowNets, EgressSet::DenyNets, EgressSet::AllowLearned, EgressSet::DenyLearned];

    pub fn name(self) -> &'static str {
        match self {
            EgressSet::AllowNets => "allow_nets",
            EgressSet::DenyNets => "deny_nets",
            EgressSet::AllowLearned => "allow_learned",
            EgressSet::DenyLearned => "deny_learned",
        }
    }

    fn learned(self) -> bool {
        matches!(self, EgressSet::AllowLearned | EgressSet::DenyLearned)
    }
}

/// The uplink's static rule set: the same for every sandbox, replaced whole (so
/// installing it again, from another process too, changes nothing).
pub fn uplink_rules() -> Nftables<'static> {
    let t = TableBuilder::new(NfFamily::INet);
    let links = format!("{LINK_PREFIX}*");
    let mut b = t.replace();
    b.add(t.base_chain("postrouting", NfChainType::NAT, NfHook::Postrouting, 100, NfChainPolicy::Accept));
    b.add(t.rule(
        "postrouting",
        vec![
            saddr(Operator::EQ, prefix(LINKS_NET, LINKS_PREFIX)),
            oifname(Operator::NEQ, &links),
            Statement::Masquerade(None),
        ],
    ));
    b.add(t.base_chain("forward", NfChainType::Filter, NfHook::Forward, 0, NfChainPolicy::Accept));
    b.add(t.rule("forward", vec![iifname(Operator::EQ, &links), oifname(Operator::EQ, &links), drop()]));
    b.add(t.rule(
        "forward",
        vec![iifname(Operator::EQ, &links), daddr(Operator::EQ, prefix(Ipv4Addr::new(169, 254, 0, 0), 16)), drop()],
    ));
    b.add(t.rule("forward", vec![oifname(Operator::EQ, &links), ct_answers(), accept()]));
    b.add(t.rule("forward", vec![oifname(Operator::EQ, &links), drop()]));
    b.add(t.base_chain("input", NfChainType::Filter, NfHook::Input, 0, NfChainPolicy::Accept));
    b.add(t.rule("input", vec![iifname(Operator::EQ, &links), ct_answers(), accept()]));
    b.add(t.rule("input", vec![iifname(Operator::EQ, &links), drop()]));
    b.to_nftables()
}

/// Applies `rules` in the calling thread's namespace (`nft` runs there: a child
/// process is born in its parent thread's namespaces).
pub fn apply(rules: &Nftables, what: &'static str) -> Result<(), NetworkError> {
    nftables::helper::apply_ruleset(rules).map_err(|e| NetworkError::Rules { what, detail: e.to_string() })
}

/// Objects of the one table [`TABLE`] of a family.
pub(super) struct TableBuilder {
    family: NfFamily,
}

impl TableBuilder {
    pub(super) fn new(family: NfFamily) -> TableBuilder {
        TableBuilder { family }
    }

    /// A regular chain (jumped to).
    pub(super) fn chain(&self, name: &'static str) -> NfListObject<'static> {
        NfListObject::Chain(Chain { family: self.family, table: TABLE.into(), name: name.into(), ..Chain::default() })
    }

    pub(super) fn set(&self, set: EgressSet) -> NfListObject<'static> {
        let mut flags = std::collections::HashSet::new();
        flags.insert(if set.learned() { SetFlag::Timeout } else { SetFlag::Interval });
        NfListObject::Set(Box::new(Set {
            family: self.family,
            table: TABLE.into(),
            name: set.name().into(),
            handle: None,
            set_type: SetTypeValue::Single(SetType::Ipv4Addr),
            policy: None,
            flags: Some(flags),
            elem: None,
            timeout: None,
            gc_interval: None,
            size: set.learned().then_some(LEARNED_MAX),
            comment: None,
        }))
    }

    /// Elements for `set`.
    pub(super) fn elements(&self, set: EgressSet, elem: Vec<Expression<'static>>) -> NfListObject<'static> {
        NfListObject::Element(Element {
            family: self.family,
            table: TABLE.into(),
            name: set.name().into(),
            elem: Cow::Owned(elem),
        })
    }

    /// Empties `set`.
    pub(super) fn flush_set(&self, set: EgressSet) -> NfCmd<'static> {
        NfCmd::Flush(FlushObject::Set(Box::new(match self.set(set) {
            NfListObject::Set(s) => *s,
            _ => unreachable!("set() makes a set"),
        })))
    }

    /// Empties chain `name`.
    pub(super) fn flush_chain(&self, name: &'static str) -> NfCmd<'static> {
        NfCmd::Flush(FlushObject::Chain(Chain {
            family: self.family,
            table: TABLE.into(),
            name: name.into(),
            ..Chain::default()
        }))
    }

    pub(super) fn table(&self) -> NfListObject<'static> {
        NfListObject::Table(Table { family: self.family, name: TABLE.into(), handle: None })
    }

    /// A batch that replaces the table whole in one transaction (add, so that the
    /// delete finds it; delete; add again, empty).
    fn replace(&self) -> Batch<'static> {
        let mut b = Batch::new();
        b.add(self.table());
        b.delete(self.table());
        b.add(self.table());
        b
    }

    fn base_chain(
        &self,
        name: &'static str,
        kind: NfChainType,
        hook: NfHook,
        prio: i32,
        policy: NfChainPolicy,
    ) -> NfListObject<'static> {
        NfListObject::Chain(Chain {
            family: self.family,
            table: TABLE.into(),
            name: name.into(),
            _type: Some(kind),
            hook: Some(hook),
            prio: Some(prio),
            policy: Some(policy),
            ..Chain::default()
        })
    }

    pub(super) fn rule(&self, chain: &'static str, expr: Vec<Statement<'static>>) -> NfListObject<'static> {
        NfListObject::Rule(Rule {
            family: self.family,
            table: TABLE.into(),
            chain: chain.into(),
            expr: Cow::Owned(expr),
            handle: None,
            index: None,
            comment: None,
        })
    }
}

pub(super) fn matches(left: Expression<'static>, op: Operator, right: Expression<'static>) -> Statement<'static> {
    Statement::Match(Match { left, right, op })
}

pub(super) fn meta(key: MetaKey) -> Expression<'static> {
    Expression::Named(NamedExpression::Meta(Meta { key }))
}

/// `iifname`; a name ending in `*` matches every interface it starts.
pub(super) fn iifname(op: Operator, name: &str) -> Statement<'static> {
    matches(meta(MetaKey::Iifname), op, Expression::String(name.to_string().into()))
}

pub(super) fn oifname(op: Operator, name: &str) -> Statement<'static> {
    matches(meta(MetaKey::Oifname), op, Expression::String(name.to_string().into()))
}

pub(super) fn ip_field(field: &'static str) -> Expression<'static> {
    Expression::Named(NamedExpression::Payload(Payload::PayloadField(PayloadField {
        protocol: "ip".into(),
        field: field.into(),
    })))
}

pub(super) fn saddr(op: Operator, right: Expression<'static>) -> Statement<'static> {
    matches(ip_field("saddr"), op, right)
}

pub(super) fn daddr(op: Operator, right: Expression<'static>) -> Statement<'static> {
    matches(ip_field("daddr"), op, right)
}

/// `<proto> dport <port>`.
pub(super) fn dport(proto: &'static str, port: u16) -> Statement<'static> {
    let field = Expression::Named(NamedExpression::Payload(Payload::PayloadField(PayloadField {
        protocol: proto.into(),
        field: "dport".into(),
    })));
    matches(field, Operator::EQ, Expression::Number(port.into()))
}

pub(super) fn ip(addr: Ipv4Addr) -> Expression<'static> {
    Expression::String(addr.to_string().into())
}

pub(super) fn prefix(addr: Ipv4Addr, len: u8) -> Expression<'static> {
    Expression::Named(NamedExpression::Prefix(Prefix { addr: Box::new(ip(addr)), len: len.into() }))
}

/// `ct state established,related`: answers to what was let through.
pub(super) fn ct_answers() -> Statement<'static> {
    let state = Expression::Named(NamedExpression::CT(CT { key: "state".into(), family: None, dir: None }));
    matches(
        state,
        Operator::IN,
        Expression::List(vec![Expression::String("established".into()), Expression::String("related".into())]),
    )
}

pub(super) fn accept() -> Statement<'static> {
    Statement::Accept(None)
}

pub(super) fn drop() -> Statement<'static> {
    Statement::Drop(None)
}
