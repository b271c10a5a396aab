//! The packet filter of sandbox networks, as nftables rule sets applied with `nft -j`
//! (the `nftables` crate): one table in each sandbox's namespace, one static table in the
//! uplink's. Neither names a sandbox from outside its namespace, so nothing here outlives
//! the sandbox: its table goes with its namespace, and the uplink's never changes.
//!
//! In a sandbox's namespace (table `ip forkvm`):
//! * the guest's traffic out of `eth0` leaves as the link's inner address (SNAT), so
//!   clones with one guest address stay apart on the uplink;
//! * forwarded: only what the guest starts from its own address, and the answers;
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
use nftables::schema::{Chain, NfListObject, Nftables, Rule, Table};
use nftables::stmt::{Match, Operator, Statement, NAT};
use nftables::types::{NfChainPolicy, NfChainType, NfFamily, NfHook};
use std::borrow::Cow;
use std::net::Ipv4Addr;

/// The table's name, in the sandbox's namespace and in the uplink's.
pub const TABLE: &str = "forkvm";

/// The rule set of a sandbox's namespace whose link is `link`.
pub fn sandbox_rules(link: LinkIndex) -> Nftables<'static> {
    let t = TableBuilder::new(NfFamily::IP);
    let mut b = t.replace();
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
    b.add(t.base_chain("forward", NfChainType::Filter, NfHook::Forward, 0, NfChainPolicy::Drop));
    b.add(t.rule("forward", vec![ct_answers(), accept()]));
    b.add(t.rule(
        "forward",
        vec![
            iifname(Operator::EQ, TAP_NAME),
            oifname(Operator::EQ, INNER_NAME),
            saddr(Operator::EQ, ip(GUEST_IP)),
            accept(),
        ],
    ));
    b.add(t.base_chain("input", NfChainType::Filter, NfHook::Input, 0, NfChainPolicy::Accept));
    b.add(t.rule("input", vec![iifname(Operator::EQ, TAP_NAME), saddr(Operator::NEQ, ip(GUEST_IP)), drop()]));
    b.add(t.rule("input", vec![iifname(Operator::EQ, INNER_NAME), ct_answers(), accept()]));
    b.add(t.rule("input", vec![iifname(Operator::EQ, INNER_NAME), drop()]));
    b.to_nftables()
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
struct TableBuilder {
    family: NfFamily,
}

impl TableBuilder {
    fn new(family: NfFamily) -> TableBuilder {
        TableBuilder { family }
    }

    fn table(&self) -> NfListObject<'static> {
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

    fn rule(&self, chain: &'static str, expr: Vec<Statement<'static>>) -> NfListObject<'static> {
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

fn matches(left: Expression<'static>, op: Operator, right: Expression<'static>) -> Statement<'static> {
    Statement::Match(Match { left, right, op })
}

fn meta(key: MetaKey) -> Expression<'static> {
    Expression::Named(NamedExpression::Meta(Meta { key }))
}

/// `iifname`; a name ending in `*` matches every interface it starts.
fn iifname(op: Operator, name: &str) -> Statement<'static> {
    matches(meta(MetaKey::Iifname), op, Expression::String(name.to_string().into()))
}

fn oifname(op: Operator, name: &str) -> Statement<'static> {
    matches(meta(MetaKey::Oifname), op, Expression::String(name.to_string().into()))
}

fn ip_field(field: &'static str) -> Expression<'static> {
    Expression::Named(NamedExpression::Payload(Payload::PayloadField(PayloadField {
        protocol: "ip".into(),
        field: field.into(),
    })))
}

fn saddr(op: Operator, right: Expression<'static>) -> Statement<'static> {
    matches(ip_field("saddr"), op, right)
}

fn daddr(op: Operator, right: Expression<'static>) -> Statement<'static> {
    matches(ip_field("daddr"), op, right)
}

/// `<proto> dport <port>`.
fn dport(proto: &'static str, port: u16) -> Statement<'static> {
    let field = Expression::Named(NamedExpression::Payload(Payload::PayloadField(PayloadField {
        protocol: proto.into(),
        field: "dport".into(),
    })));
    matches(field, Operator::EQ, Expression::Number(port.into()))
}

fn ip(addr: Ipv4Addr) -> Expression<'static> {
    Expression::String(addr.to_string().into())
}

fn prefix(addr: Ipv4Addr, len: u8) -> Expression<'static> {
    Expression::Named(NamedExpression::Prefix(Prefix { addr: Box::new(ip(addr)), len: len.into() }))
}

/// `ct state established,related`: answers to what was let through.
fn ct_answers() -> Statement<'static> {
    let state = Expression::Named(NamedExpression::CT(CT { key: "state".into(), family: None, dir: None }));
    matches(
        state,
        Operator::IN,
        Expression::List(vec![Expression::String("established".into()), Expression::String("related".into())]),
    )
}

fn accept() -> Statement<'static> {
    Statement::Accept(None)
}

fn drop() -> Statement<'static> {
    Statement::Drop(None)
}
