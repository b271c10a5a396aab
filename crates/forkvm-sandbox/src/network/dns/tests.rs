//! The forwarder: what it takes from a guest and what it hands back (no root), and a
//! guest's queries answered through its namespace by a fake internet's resolver (root).

use super::relay::{Query, Refused};
use super::upstream;
use super::Lifetime;
use crate::network::fake_internet::{FakeInternet, HOST_IP};
use crate::network::guest_frames::{is_root, send_udp, tap_of, try_recv_udp};
use crate::network::{NetSlot, GATEWAY_IP, GUEST_IP};
use hickory_proto::op::{Message, OpCode, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

fn query(id: u16, name: &str, questions: usize) -> Vec<u8> {
    let mut m = Message::query();
    m.metadata.id = id;
    m.metadata.recursion_desired = true;
    for _ in 0..questions {
        m.add_query(hickory_proto::op::Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
    }
    m.to_vec().unwrap()
}

#[test]
fn only_one_standard_question_goes_upstream() {
    assert_eq!(Query::parse(b"").unwrap_err(), Refused::Garbage);
    assert_eq!(Query::parse(&[0xff; 40]).unwrap_err(), Refused::Garbage);
    let ok = Query::parse(&query(7, "WWW.Example.TEST.", 1)).unwrap();
    assert_eq!(ok.name(), "www.example.test");
    let Refused::Answer(two) = Query::parse(&query(8, "a.test.", 2)).unwrap_err() else { panic!("two questions") };
    let two = Message::from_vec(&two).unwrap();
    assert_eq!((two.metadata.id, two.metadata.response_code), (8, ResponseCode::FormErr));
    let mut update = Message::from_vec(&query(9, "a.test.", 1)).unwrap();
    update.metadata.op_code = OpCode::Update;
    let Refused::Answer(notimp) = Query::parse(&update.to_vec().unwrap()).unwrap_err() else { panic!("an update") };
    assert_eq!(Message::from_vec(&notimp).unwrap().metadata.response_code, ResponseCode::NotImp);
    // A guest's answer is not a question.
    let answer = Message::from_vec(&query(10, "a.test.", 1)).unwrap().into_response();
    assert_eq!(Query::parse(&answer.to_vec().unwrap()).unwrap_err(), Refused::Garbage);
}

#[test]
fn an_upstream_answer_must_carry_the_id_and_question_asked() {
    let q = Query::parse(&query(0x1234, "www.example.test.", 1)).unwrap();
    let sent = q.with_id(0xbeef);
    assert_eq!(&sent[..2], &[0xbe, 0xef]);
    let answer = Message::from_vec(&sent).unwrap().into_response().to_vec().unwrap();
    let back = q.check_answer(0xbeef, answer.clone()).expect("the answer to what was asked");
    assert_eq!(&back[..2], &[0x12, 0x34], "handed back under the guest's id");
    assert!(q.check_answer(0xbeee, answer).is_none(), "another id");
    let other = Message::from_vec(&query(0xbeef, "evil.test.", 1)).unwrap().into_response().to_vec().unwrap();
    assert!(q.check_answer(0xbeef, other).is_none(), "another question");
    assert!(q.check_answer(0xbeef, sent).is_none(), "a question is no answer");
}

#[test]
fn upstreams_come_from_the_setting_or_the_hosts_non_loopback_resolvers() {
    let both = upstream::parse("9.9.9.9, [2620:fe::fe]:5353").unwrap();
    assert_eq!(both, vec!["9.9.9.9:53".parse().unwrap(), "[2620:fe::fe]:5353".parse().unwrap()]);
    assert!(upstream::parse(" , ").is_err());
    assert!(upstream::parse("resolver.example").unwrap_err().contains("not an address"));
    let conf = "# generated\nnameserver 127.0.0.53\nnameserver 10.0.0.2\nnameserver ::1\nsearch lan\n";
    assert_eq!(upstream::from_resolv_conf(conf), vec!["10.0.0.2:53".parse::<SocketAddr>().unwrap()]);
}

/// The A records in a DNS answer, with its id and code.
fn read_answer(bytes: &[u8]) -> (u16, ResponseCode, Vec<Ipv4Addr>) {
    let m = Message::from_vec(bytes).unwrap();
    let ips = m.answers.iter().filter_map(|r| if let RData::A(a) = &r.data { Some(a.0) } else { None }).collect();
    (m.metadata.id, m.metadata.response_code, ips)
}

#[test]
fn a_guest_resolves_through_the_forwarder_whatever_resolver_it_asks() {
    if !is_root() {
        eprintln!("skipped: sandbox networks need root");
        return;
    }
    let internet = FakeInternet::create().unwrap();
    let _server = internet
        .serve_dns(&[("www.example.test", HOST_IP), ("*.cdn.example.test", Ipv4Addr::new(203, 0, 113, 7))])
        .unwrap();
    let resolver = SocketAddr::from((HOST_IP, 53));
    let _ = upstream::configure(vec![resolver]);
    assert_eq!(upstream::current(false).unwrap(), &[resolver], "this binary's upstream is the fake internet's");
    let slot = NetSlot::create_with(&internet.uplink().unwrap()).unwrap();
    let (guard, firewall) = crate::network::dns::serve_slot(&slot, Lifetime::WhileHeld).expect("served");
    let tap = tap_of(&slot);
    let wait = Duration::from_secs(5);

    send_udp(&tap, GUEST_IP, (GATEWAY_IP, 53).into(), &query(0x1111, "www.example.test.", 1));
    let (from, answer) = try_recv_udp(&tap, wait).expect("an answer from the gateway");
    assert_eq!(from, SocketAddr::from((GATEWAY_IP, 53)));
    assert_eq!(read_answer(&answer), (0x1111, ResponseCode::NoError, vec![HOST_IP]));

    // Another resolver's address: redirected to the forwarder, answered as that resolver.
    let elsewhere = SocketAddr::from(([8, 8, 8, 8], 53));
    send_udp(&tap, GUEST_IP, elsewhere, &query(0x2222, "img.cdn.example.test.", 1));
    let (from, answer) = try_recv_udp(&tap, wait).expect("an answer, as from the resolver asked");
    assert_eq!(from, elsewhere);
    assert_eq!(read_answer(&answer), (0x2222, ResponseCode::NoError, vec![Ipv4Addr::new(203, 0, 113, 7)]));

    send_udp(&tap, GUEST_IP, (GATEWAY_IP, 53).into(), &query(0x3333, "missing.test.", 1));
    let (_, answer) = try_recv_udp(&tap, wait).expect("an answer for a missing name");
    assert_eq!(read_answer(&answer), (0x3333, ResponseCode::NXDomain, vec![]));

    // Garbage gets nothing; a query after it is answered as before.
    send_udp(&tap, GUEST_IP, (GATEWAY_IP, 53).into(), &[0xff; 30]);
    send_udp(&tap, GUEST_IP, (GATEWAY_IP, 53).into(), &query(0x4444, "www.example.test.", 1));
    let (_, answer) = try_recv_udp(&tap, wait).expect("the forwarder outlives garbage");
    assert_eq!(read_answer(&answer).0, 0x4444);

    // A policy: closed but for names under the CDN. Another name is NXDOMAIN without
    // asking upstream; an allowed one is answered, its address in the filter first.
    let policy = |allow_internet: bool, allow: &[&str], deny: &[&str]| forkvm_api::NetworkPolicy {
        allow_internet,
        allow: allow.iter().map(|s| s.to_string()).collect(),
        deny: deny.iter().map(|s| s.to_string()).collect(),
    };
    crate::network::set_policy(&firewall, &policy(false, &["*.cdn.example.test"], &[])).unwrap();
    send_udp(&tap, GUEST_IP, (GATEWAY_IP, 53).into(), &query(0x6666, "www.example.test.", 1));
    let (_, answer) = try_recv_udp(&tap, wait).expect("an answer for a refused name");
    assert_eq!(read_answer(&answer), (0x6666, ResponseCode::NXDomain, vec![]));
    send_udp(&tap, GUEST_IP, (GATEWAY_IP, 53).into(), &query(0x7777, "img.cdn.example.test.", 1));
    let (_, answer) = try_recv_udp(&tap, wait).expect("an answer for an allowed name");
    assert_eq!(read_answer(&answer), (0x7777, ResponseCode::NoError, vec![Ipv4Addr::new(203, 0, 113, 7)]));
    assert!(set_of(&slot, "allow_learned").contains("203.0.113.7 timeout"), "{}", set_of(&slot, "allow_learned"));

    // Open but for one name: it is NXDOMAIN, and its address is blocked before the guest
    // asks; what was learned for the CDN goes (no rule names it now).
    crate::network::set_policy(&firewall, &policy(true, &[], &["www.example.test"])).unwrap();
    assert!(set_of(&slot, "deny_learned").contains(&format!("{HOST_IP} timeout")), "{}", set_of(&slot, "deny_learned"));
    assert!(!set_of(&slot, "allow_learned").contains("203.0.113.7"));
    send_udp(&tap, GUEST_IP, (GATEWAY_IP, 53).into(), &query(0x8888, "www.example.test.", 1));
    let (_, answer) = try_recv_udp(&tap, wait).expect("an answer for a denied name");
    assert_eq!(read_answer(&answer), (0x8888, ResponseCode::NXDomain, vec![]));

    // Once the sandbox's service ends, its sockets are closed: no answer.
    drop(guard);
    std::thread::sleep(Duration::from_millis(200));
    send_udp(&tap, GUEST_IP, (GATEWAY_IP, 53).into(), &query(0x5555, "www.example.test.", 1));
    assert!(try_recv_udp(&tap, Duration::from_millis(500)).is_none(), "answered after its service ended");
}

/// `nft list set` of the sandbox table's `set`, in the slot's namespace.
fn set_of(slot: &NetSlot, set: &'static str) -> String {
    let out = slot
        .run_inside(move || std::process::Command::new("nft").args(["list", "set", "ip", "forkvm", set]).output())
        .unwrap()
        .unwrap();
    assert!(out.status.success(), "nft: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}
