//! One sandbox's egress policy in force: the policy its DNS forwarder decides names by,
//! and the packet filter of its namespace that holds the addresses (`policy_rules`).
//! The forwarder tells it the addresses it hands out for allowed names and finds for
//! denied ones ([`Firewall::learn`]); a new policy replaces the chain and the sets in one
//! transaction, keeping what was learned for names it still rules on, and holds for
//! connections already open too.

use super::enter::run_in;
use super::policy::{EgressPolicy, NameVerdict};
use super::policy_rules::{learn_rules, policy_rules};
use super::rules::{apply, EgressSet, LEARNED_MAX};
use super::NetworkError;
use std::net::Ipv4Addr;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a learned address stays, from its record's TTL: an allowed one at least a
/// minute (a client connects a little after it resolves) and at most an hour; a denied
/// one at least five minutes.
pub fn learned_seconds(set: EgressSet, ttl: u32) -> u32 {
    match set {
        EgressSet::DenyLearned => ttl.clamp(300, 86_400),
        _ => ttl.clamp(60, 3_600) + 30,
    }
}

/// A sandbox's policy and its namespace's filter.
#[derive(Debug)]
pub struct Firewall {
    netns: OwnedFd,
    /// Where the forwarder asks upstream from (`None`: this process's namespace).
    uplink: Option<Arc<OwnedFd>>,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    policy: Arc<EgressPolicy>,
    generation: u32,
    learned: Vec<Learned>,
    /// The namespace's egress chain and sets are as a slot makes them: empty.
    empty: bool,
}

#[derive(Debug, Clone)]
struct Learned {
    name: String,
    addr: Ipv4Addr,
    set: EgressSet,
    until: Instant,
}

impl Firewall {
    /// The firewall of the namespace `netns`, just made (its table as a slot makes it:
    /// no policy yet).
    pub fn new(netns: OwnedFd, uplink: Option<Arc<OwnedFd>>) -> Firewall {
        Firewall::made(netns, uplink, EgressPolicy::default(), true)
    }

    /// The firewall of the namespace `netns`, whose table already holds `in_force`
    /// (another process, or an earlier life of this one, put it there).
    pub fn with_policy(netns: OwnedFd, uplink: Option<Arc<OwnedFd>>, in_force: EgressPolicy) -> Firewall {
        Firewall::made(netns, uplink, in_force, false)
    }

    fn made(netns: OwnedFd, uplink: Option<Arc<OwnedFd>>, in_force: EgressPolicy, empty: bool) -> Firewall {
        let state = State { policy: Arc::new(in_force), generation: 0, learned: Vec::new(), empty };
        Firewall { netns, uplink, state: Mutex::new(state) }
    }

    /// The sandbox's namespace.
    pub fn namespace(&self) -> &OwnedFd {
        &self.netns
    }

    /// Where the forwarder asks upstream from.
    pub fn uplink(&self) -> Option<&Arc<OwnedFd>> {
        self.uplink.as_ref()
    }

    /// The policy in force.
    pub fn policy(&self) -> Arc<EgressPolicy> {
        self.lock().policy.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Puts `policy` in force: the namespace's chain and sets first, then the
    /// forwarder's decisions. On an error the old policy stays, whole.
    pub fn set_policy(&self, policy: EgressPolicy) -> Result<(), NetworkError> {
        let mut state = self.lock();
        let now = Instant::now();
        let kept: Vec<Learned> = state
            .learned
            .iter()
            .filter(|l| l.until > now)
            .filter_map(|l| Some(Learned { set: learned_set(policy.verdict(&l.name))?, ..l.clone() }))
            .collect();
        let generation = next_generation(state.generation);
        let elements: Vec<_> = kept.iter().map(|l| (l.set, l.addr, seconds_left(l.until, now))).collect();
        let rules = policy_rules(&policy, generation, &elements, state.empty);
        run_in(&self.netns, move || apply(&rules, "the sandbox's egress policy"))??;
        *state = State { policy: Arc::new(policy), generation, learned: kept, empty: false };
        Ok(())
    }

    /// Adds the addresses (each with its record's TTL) the forwarder found for `name`,
    /// to the set the policy in force rules for it; returns that ruling, which the
    /// forwarder answers by (the policy may have changed since it asked). Returns once
    /// the filter has them: the guest gets its answer after.
    pub fn learn(&self, name: &str, addrs: &[(Ipv4Addr, u32)]) -> Result<NameVerdict, NetworkError> {
        let mut state = self.lock();
        let verdict = state.policy.verdict(name);
        let Some(set) = learned_set(verdict) else { return Ok(verdict) };
        let now = Instant::now();
        let found: Vec<Learned> = addrs
            .iter()
            .map(|(addr, ttl)| Learned {
                name: name.to_string(),
                addr: *addr,
                set,
                until: now + Duration::from_secs(learned_seconds(set, *ttl).into()),
            })
            .collect();
        self.add_learned(&mut state, found, now)?;
        Ok(verdict)
    }

    /// Takes what `source` learned that this firewall's policy still rules on: a fork's
    /// child, whose guest remembers what its source's resolved.
    pub fn inherit(&self, source: &Firewall) -> Result<(), NetworkError> {
        let now = Instant::now();
        let theirs: Vec<Learned> = source.lock().learned.iter().filter(|l| l.until > now).cloned().collect();
        let mut state = self.lock();
        let kept: Vec<Learned> = theirs
            .into_iter()
            .filter_map(|l| Some(Learned { set: learned_set(state.policy.verdict(&l.name))?, ..l }))
            .collect();
        self.add_learned(&mut state, kept, now)
    }

    /// Puts `found` in the filter's sets (one transaction) and remembers it.
    fn add_learned(&self, state: &mut State, found: Vec<Learned>, now: Instant) -> Result<(), NetworkError> {
        if found.is_empty() {
            return Ok(());
        }
        for set in [EgressSet::AllowLearned, EgressSet::DenyLearned] {
            let timed: Vec<(Ipv4Addr, u32)> =
                found.iter().filter(|l| l.set == set).map(|l| (l.addr, seconds_left(l.until, now))).collect();
            if !timed.is_empty() {
                let rules = learn_rules(set, &timed);
                run_in(&self.netns, move || apply(&rules, "an address the sandbox's DNS learned"))??;
            }
        }
        state.learned.retain(|l| l.until > now && !found.iter().any(|f| f.name == l.name && f.set == l.set));
        let room = (LEARNED_MAX as usize).saturating_sub(state.learned.len());
        state.learned.extend(found.into_iter().take(room));
        Ok(())
    }
}

/// The set a name's addresses go to under `verdict`, if any.
fn learned_set(verdict: NameVerdict) -> Option<EgressSet> {
    match verdict {
        NameVerdict::Allow => Some(EgressSet::AllowLearned),
        NameVerdict::Deny => Some(EgressSet::DenyLearned),
        NameVerdict::Forward | NameVerdict::Refuse => None,
    }
}

fn seconds_left(until: Instant, now: Instant) -> u32 {
    u32::try_from(until.saturating_duration_since(now).as_secs()).unwrap_or(u32::MAX).max(1)
}

/// A generation unlike `previous` and unlike any earlier firewall's of this namespace
/// (another process's, before a restart): the clock's, in tenths of a second.
fn next_generation(previous: u32) -> u32 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let candidate = (now.as_millis() / 100) as u32;
    if candidate == 0 || candidate <= previous {
        previous.wrapping_add(1).max(1)
    } else {
        candidate
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generations_move_on_and_are_never_zero() {
        let a = next_generation(0);
        assert_ne!(a, 0);
        let b = next_generation(a);
        assert!(b > a);
        assert_eq!(next_generation(u32::MAX), 1);
    }

    #[test]
    fn learned_addresses_stay_for_a_bounded_while() {
        assert_eq!(learned_seconds(EgressSet::AllowLearned, 5), 90);
        assert_eq!(learned_seconds(EgressSet::AllowLearned, 86_400), 3_630);
        assert_eq!(learned_seconds(EgressSet::DenyLearned, 0), 300);
    }
}
