//! The door of a device's listeners: how many connections whose peer has
//! not yet proven the cluster secret may be open at once, per source
//! address and in all, and which sources are members.
//!
//! A connection is *unproven* from `accept` until its handshake checked
//! the peer's proof. The accept loop asks the gate before it spends
//! anything on a new connection; past either cap the connection is
//! closed at once, so that no number of idle or slow peers ever makes the
//! loop wait. A source that proved the secret once (in a connection this
//! device accepted or dialled) is a *member source*: the total cap does not
//! apply to it, so a member's reconnects get through while strangers hold
//! every other slot. The per-source cap still does: a stranger sharing a
//! member's address can hold that address's slots (the README's threat
//! model says so).
//!
//! Sources are counted as [`Source`]s: an IPv4 address, or an IPv6 /64.
//!
//! Owns the counts and the set of member sources (bounded: the oldest is
//! forgotten first). Never: wait, read a stream, or log (the accept loop
//! logs through a [`crate::Throttle`]).

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use crate::source::Source;
use crate::types::DeviceLimits;

/// Member sources remembered, at most; the oldest is forgotten first.
const MEMBER_SOURCES: usize = 1024;

/// The counts and member sources of one device.
pub(crate) struct Gate {
    max_total: u32,
    max_per_source: u32,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Unproven connections per source address.
    per_source: HashMap<Source, u32>,
    /// Unproven connections from sources that are not members (the ones
    /// the total cap counts).
    strangers: u32,
    members: HashSet<Source>,
    /// `members` in the order they were learnt.
    member_order: VecDeque<Source>,
}

/// Why the gate turned a connection away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Its source already holds the per-source cap of unproven connections.
    PerSource(u32),
    /// Strangers already hold the total cap of unproven connections.
    Total(u32),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::PerSource(cap) => write!(
                f,
                "{cap} connections from this address have not authenticated yet"
            ),
            Refusal::Total(cap) => write!(
                f,
                "{cap} connections from non-members have not authenticated yet"
            ),
        }
    }
}

/// One unproven connection's place in the gate, given back when dropped
/// (the handshake failed, timed out, or the peer proved the secret).
pub(crate) struct Unproven {
    gate: Arc<Gate>,
    source: Source,
    stranger: bool,
}

impl Gate {
    /// A gate with `limits`' caps.
    pub(crate) fn new(limits: &DeviceLimits) -> Arc<Gate> {
        Arc::new(Gate {
            max_total: limits.max_unauthenticated,
            max_per_source: limits.max_unauthenticated_per_source,
            state: Mutex::new(State::default()),
        })
    }

    /// Lets a new connection from `source` in, unproven, or says why not.
    pub(crate) fn enter(self: &Arc<Gate>, ip: IpAddr) -> Result<Unproven, Refusal> {
        let source = Source::of(ip);
        let mut state = self.state.lock().expect("gate lock");
        let stranger = !state.members.contains(&source);
        let from_source = state.per_source.get(&source).copied().unwrap_or(0);
        if from_source >= self.max_per_source {
            return Err(Refusal::PerSource(self.max_per_source));
        }
        if stranger && state.strangers >= self.max_total {
            return Err(Refusal::Total(self.max_total));
        }
        *state.per_source.entry(source).or_insert(0) += 1;
        if stranger {
            state.strangers += 1;
        }
        Ok(Unproven {
            gate: self.clone(),
            source,
            stranger,
        })
    }

    /// Remembers `source` as a member's: a peer there proved the secret.
    pub(crate) fn learn(&self, ip: IpAddr) {
        self.remember(Source::of(ip));
    }

    fn remember(&self, source: Source) {
        let mut state = self.state.lock().expect("gate lock");
        if !state.members.insert(source) {
            return;
        }
        state.member_order.push_back(source);
        if state.member_order.len() > MEMBER_SOURCES
            && let Some(oldest) = state.member_order.pop_front()
        {
            state.members.remove(&oldest);
        }
    }

    /// Unproven connections open now: (from `source`, from strangers).
    #[cfg(test)]
    fn open(&self, ip: IpAddr) -> (u32, u32) {
        let state = self.state.lock().expect("gate lock");
        (
            state.per_source.get(&Source::of(ip)).copied().unwrap_or(0),
            state.strangers,
        )
    }
}

impl Unproven {
    /// The peer proved the secret: its source becomes a member's, and its
    /// place is given back.
    pub(crate) fn proven(self) {
        self.gate.remember(self.source);
    }
}

impl Drop for Unproven {
    fn drop(&mut self) {
        let mut state = self.gate.state.lock().expect("gate lock");
        let count = state
            .per_source
            .get_mut(&self.source)
            .expect("an unproven connection is counted under its source");
        *count -= 1;
        if *count == 0 {
            state.per_source.remove(&self.source);
        }
        if self.stranger {
            state.strangers -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(total: u32, per_source: u32) -> Arc<Gate> {
        Gate::new(&DeviceLimits {
            max_unauthenticated: total,
            max_unauthenticated_per_source: per_source,
            ..DeviceLimits::default()
        })
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    #[test]
    fn a_source_past_its_cap_is_refused_and_its_places_come_back() {
        let gate = gate(100, 2);
        let a = gate.enter(ip(1)).unwrap();
        let b = gate.enter(ip(1)).unwrap();
        assert_eq!(gate.enter(ip(1)).err(), Some(Refusal::PerSource(2)));
        // Another source is not held back by this one.
        let c = gate.enter(ip(2)).unwrap();
        assert_eq!(gate.open(ip(1)), (2, 3));
        drop(a);
        let d = gate.enter(ip(1)).unwrap();
        drop((b, c, d));
        assert_eq!(gate.open(ip(1)), (0, 0));
    }

    #[test]
    fn strangers_past_the_total_are_refused_but_members_get_in() {
        let gate = gate(3, 2);
        let member = ip(9);
        // A member proves the secret once: its source is known from then on.
        gate.enter(member).unwrap().proven();
        assert_eq!(gate.open(member), (0, 0));
        let held: Vec<_> = (1..=3).map(|i| gate.enter(ip(i)).unwrap()).collect();
        assert_eq!(gate.enter(ip(4)).err(), Some(Refusal::Total(3)));
        let m1 = gate.enter(member).unwrap();
        let m2 = gate.enter(member).unwrap();
        // The per-source cap holds for members too.
        assert_eq!(gate.enter(member).err(), Some(Refusal::PerSource(2)));
        assert_eq!(gate.open(member), (2, 3));
        drop((m1, m2));
        drop(held);
        assert_eq!(gate.open(member), (0, 0));
        assert!(gate.enter(ip(4)).is_ok());
    }

    #[test]
    fn a_source_dialled_counts_as_a_member() {
        let gate = gate(1, 4);
        let _stranger = gate.enter(ip(1)).unwrap();
        assert_eq!(gate.enter(ip(2)).err(), Some(Refusal::Total(1)));
        gate.learn(ip(2));
        assert!(gate.enter(ip(2)).is_ok());
    }

    #[test]
    fn an_ipv6_host_is_one_source_whatever_address_of_its_64_it_uses() {
        let gate = gate(100, 2);
        let a = |last: u16| IpAddr::from([0x2001, 0xdb8, 1, 2, 0, 0, 0, last]);
        let _held = [gate.enter(a(1)).unwrap(), gate.enter(a(2)).unwrap()];
        assert_eq!(gate.enter(a(3)).err(), Some(Refusal::PerSource(2)));
        assert!(
            gate.enter(IpAddr::from([0x2001, 0xdb8, 1, 3, 0, 0, 0, 1]))
                .is_ok()
        );
    }

    #[test]
    fn the_oldest_member_source_is_forgotten_first() {
        let gate = gate(0, 4);
        for i in 0..=MEMBER_SOURCES as u32 {
            gate.learn(IpAddr::from(i.to_be_bytes()));
        }
        assert!(gate.enter(IpAddr::from(0u32.to_be_bytes())).is_err());
        assert!(gate.enter(IpAddr::from(1u32.to_be_bytes())).is_ok());
    }
}
