//! A sandbox's egress policy, checked and typed: the API's [`NetworkPolicy`] (strings)
//! becomes addresses, networks and name patterns here, or an error naming the entry.
//! The packet filter enforces the networks ([`super::firewall`]); the DNS forwarder
//! enforces the names ([`EgressPolicy::verdict`]) and tells the filter the addresses
//! it handed out for them.

use forkvm_api::NetworkPolicy;
use std::net::Ipv4Addr;

/// Entries a list may hold.
pub const MAX_ENTRIES: usize = 256;

/// An IPv4 network: an address and a prefix length (the host bits zero).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Net {
    pub addr: Ipv4Addr,
    pub prefix: u8,
}

/// A name pattern: one name, or every name under a domain (`*.example.com`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NamePattern {
    Exact(String),
    /// `.example.com` for `*.example.com`: names ending in it.
    Under(String),
}

impl NamePattern {
    /// Whether `name` (lower case, no final dot) is this pattern's.
    pub fn matches(&self, name: &str) -> bool {
        match self {
            NamePattern::Exact(n) => n == name,
            NamePattern::Under(suffix) => name.len() > suffix.len() && name.ends_with(suffix.as_str()),
        }
    }
}

/// One list of a policy, sorted by kind.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rules {
    pub nets: Vec<Ipv4Net>,
    pub names: Vec<NamePattern>,
}

impl Rules {
    fn parse(list: &'static str, entries: &[String]) -> Result<Rules, PolicyError> {
        if entries.len() > MAX_ENTRIES {
            return Err(PolicyError { list, entry: format!("{} entries", entries.len()), why: "at most 256" });
        }
        let mut rules = Rules::default();
        for entry in entries {
            let bad = |why| PolicyError { list, entry: entry.chars().take(80).collect(), why };
            if entry.contains(':') {
                return Err(bad("IPv6 is not supported: sandboxes have IPv4 only"));
            }
            if entry.starts_with(|c: char| c.is_ascii_digit()) && !entry.contains(|c: char| c.is_ascii_alphabetic()) {
                rules.nets.push(parse_net(entry).map_err(bad)?);
            } else {
                rules.names.push(parse_name(entry).map_err(bad)?);
            }
        }
        Ok(rules)
    }

    fn names(&self, name: &str) -> bool {
        self.names.iter().any(|p| p.matches(name))
    }
}

/// A policy entry that is not an address, a network or a name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("network.{list}: {entry:?}: {why}")]
pub struct PolicyError {
    pub list: &'static str,
    pub entry: String,
    pub why: &'static str,
}

/// What the forwarder does with a query for a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameVerdict {
    /// Asked upstream and answered; nothing to remember (what no rule names, with the
    /// internet allowed).
    Forward,
    /// Asked upstream and answered; the answer's addresses become reachable.
    Allow,
    /// Answered NXDOMAIN; the addresses upstream gives for it become unreachable.
    Deny,
    /// Answered NXDOMAIN without asking anyone (the internet is not allowed and no rule
    /// allows it: the question itself does not leave).
    Refuse,
}

/// A policy, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressPolicy {
    pub allow_internet: bool,
    pub allow: Rules,
    pub deny: Rules,
}

impl Default for EgressPolicy {
    fn default() -> Self {
        EgressPolicy { allow_internet: true, allow: Rules::default(), deny: Rules::default() }
    }
}

impl EgressPolicy {
    pub fn parse(policy: &NetworkPolicy) -> Result<EgressPolicy, PolicyError> {
        Ok(EgressPolicy {
            allow_internet: policy.allow_internet,
            allow: Rules::parse("allow", &policy.allow)?,
            deny: Rules::parse("deny", &policy.deny)?,
        })
    }

    /// Whether it changes nothing: everything reachable, no name rule.
    pub fn is_default(&self) -> bool {
        *self == EgressPolicy::default()
    }

    /// Whether any rule is about names (the forwarder then remembers addresses).
    pub fn has_names(&self) -> bool {
        !self.allow.names.is_empty() || !self.deny.names.is_empty()
    }

    /// What to do with a query for `name` (lower case, no final dot): `allow` wins over
    /// `deny`, and what neither names follows `allow_internet`.
    pub fn verdict(&self, name: &str) -> NameVerdict {
        if self.allow.names(name) {
            NameVerdict::Allow
        } else if self.deny.names(name) {
            NameVerdict::Deny
        } else if self.allow_internet {
            NameVerdict::Forward
        } else {
            NameVerdict::Refuse
        }
    }
}

fn parse_net(entry: &str) -> Result<Ipv4Net, &'static str> {
    let (addr, prefix) = match entry.split_once('/') {
        Some((a, p)) => (a, p.parse::<u8>().map_err(|_| "the prefix length is not a number")?),
        None => (entry, 32),
    };
    let addr: Ipv4Addr = addr.parse().map_err(|_| "not an IPv4 address")?;
    if prefix > 32 {
        return Err("the prefix length is over 32");
    }
    let mask = if prefix == 0 { 0 } else { u32::MAX << (32 - prefix) };
    if u32::from(addr) & !mask != 0 {
        return Err("the address has bits set past the prefix length");
    }
    Ok(Ipv4Net { addr, prefix })
}

/// A domain name (RFC 1035 letters, digits and hyphens; labels of 1 to 63; at most
/// 253), with an optional leading `*.`.
fn parse_name(entry: &str) -> Result<NamePattern, &'static str> {
    let lower = entry.trim_end_matches('.').to_ascii_lowercase();
    let (wild, name) = match lower.strip_prefix("*.") {
        Some(rest) => (true, rest.to_string()),
        None => (false, lower),
    };
    if name.is_empty() || name.len() > 253 {
        return Err("a name is 1 to 253 characters");
    }
    for label in name.split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err("a name's labels are 1 to 63 characters");
        }
        if !label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            || label.starts_with('-')
            || label.ends_with('-')
        {
            return Err("a name is letters, digits and inner hyphens, with `*.` only in front");
        }
    }
    Ok(if wild { NamePattern::Under(format!(".{name}")) } else { NamePattern::Exact(name) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(allow_internet: bool, allow: &[&str], deny: &[&str]) -> Result<EgressPolicy, PolicyError> {
        EgressPolicy::parse(&NetworkPolicy {
            allow_internet,
            allow: allow.iter().map(|s| s.to_string()).collect(),
            deny: deny.iter().map(|s| s.to_string()).collect(),
        })
    }

    #[test]
    fn entries_become_networks_and_names() {
        let p = policy(true, &["10.0.0.0/8", "203.0.113.7", "PyPI.org.", "*.pythonhosted.org"], &[]).unwrap();
        assert_eq!(
            p.allow.nets,
            vec![
                Ipv4Net { addr: Ipv4Addr::new(10, 0, 0, 0), prefix: 8 },
                Ipv4Net { addr: Ipv4Addr::new(203, 0, 113, 7), prefix: 32 }
            ]
        );
        assert_eq!(
            p.allow.names,
            vec![NamePattern::Exact("pypi.org".into()), NamePattern::Under(".pythonhosted.org".into())]
        );
        assert!(policy(true, &[], &[]).unwrap().is_default());
        assert!(!p.is_default() && p.has_names());
    }

    #[test]
    fn bad_entries_are_named_with_their_list() {
        for (entry, why) in [
            ("10.0.0.1/8", "bits set past"),
            ("10.0.0.0/33", "over 32"),
            ("300.1.1.1", "not an IPv4"),
            ("::1", "IPv6"),
            ("exa mple.com", "letters, digits"),
            ("foo.*.com", "letters, digits"),
            ("-a.com", "letters, digits"),
            ("a..com", "1 to 63"),
            ("", "1 to 253"),
        ] {
            let e = policy(true, &[], &[entry]).unwrap_err();
            assert_eq!(e.list, "deny");
            assert!(e.to_string().contains(why), "{entry:?}: {e}");
        }
        let many: Vec<String> = (0..257).map(|i| format!("10.0.{}.{}", i / 256, i % 256)).collect();
        let e = EgressPolicy::parse(&NetworkPolicy { allow: many, ..NetworkPolicy::default() }).unwrap_err();
        assert!(e.to_string().contains("at most 256"), "{e}");
    }

    #[test]
    fn allow_wins_over_deny_and_the_rest_follows_allow_internet() {
        let p = policy(true, &["ok.example.com"], &["*.example.com", "bad.test"]).unwrap();
        assert_eq!(p.verdict("ok.example.com"), NameVerdict::Allow);
        assert_eq!(p.verdict("x.example.com"), NameVerdict::Deny);
        assert_eq!(p.verdict("a.b.example.com"), NameVerdict::Deny);
        assert_eq!(p.verdict("example.com"), NameVerdict::Forward, "a wildcard is not its own apex");
        assert_eq!(p.verdict("notexample.com"), NameVerdict::Forward);
        assert_eq!(p.verdict("bad.test"), NameVerdict::Deny);
        let closed = policy(false, &["*.cdn.test"], &[]).unwrap();
        assert_eq!(closed.verdict("img.cdn.test"), NameVerdict::Allow);
        assert_eq!(closed.verdict("cdn.test"), NameVerdict::Refuse);
        assert_eq!(closed.verdict("elsewhere.test"), NameVerdict::Refuse);
    }
}
