//! The nemesis: faults injected on a schedule drawn from the run's seed,
//! each recorded as a `start`/`stop` window in the history. Every fault
//! undoes itself before the next step (heal, resume, restart), so the
//! cluster is whole whenever the nemesis is between steps; the runner heals
//! and restarts everything again at the end in case a step was cut short.
//! Faults: partitions (random majority/minority, isolated leader, bridge,
//! one-way where the substrate can), kill -9 + restart, SIGSTOP/SIGCONT
//! (the leader most of the time: the stale-leader case), damage to a stopped
//! node's ring tail (corrupt or truncate, then restart), membership changes
//! (remove a node, re-add it as a learner, promote it) and leader-transfer
//! storms. With two or more faults enabled, some steps run a membership
//! change or a transfer storm *during* another fault.
//!
//! `freeze` (not part of `all`: the Soft-RoCE lab's stale-leader scenario)
//! arms a watcher next to the leader ([`Substrate::arm_freeze`]), cuts the
//! leader off, sends it [`FREEZE_PROPOSALS`] appends at once and has it
//! SIGSTOPped [`FREEZE_DELAY`] after they arrived (by the watcher, or by
//! the nemesis where the substrate has none), so its one-sided WRITEs are
//! still in flight when it stops;
//! the others elect a leader, which fences it out; the network heals while
//! it is still stopped; where the substrate can count them
//! ([`Substrate::nic_refusals`]) the nemesis waits, bounded, until the
//! others' NICs refused the WRITEs the old leader's NIC resends, and
//! records how many; then the old leader resumes and must be refused. The window is
//! recorded as an `isolated-leader` window, and its appends with their
//! `node`, for the checker's stale-leader rules. The nemesis never judges
//! the outcome: it only records.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ringraft_client::Client;
use serde_json::{Value, json};

use crate::history::{Event, EventType, HistoryWriter, Phase};
use crate::rng::SplitMix64;
use crate::substrate::{Substrate, SubstrateError, TailDamage};

/// A substrate call on one node (kill, start, pause, resume).
type NodeOp = fn(&dyn Substrate, u64) -> crate::substrate::Result<()>;

/// A kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fault {
    /// Network partitions (and one-way drops where possible).
    Partition,
    /// kill -9, then restart.
    Kill,
    /// SIGSTOP, then SIGCONT.
    Pause,
    /// Corrupt or truncate a stopped node's ring tail, then restart.
    Corrupt,
    /// Remove a node, re-add it as a learner, promote it.
    Membership,
    /// Leader-transfer storms.
    Transfer,
    /// Cut the leader off, SIGSTOP it with proposals in flight, heal,
    /// resume (see the module docs). Not part of [`Fault::ALL`].
    Freeze,
}

/// Appends a freeze sends to the leader it stops, all at once.
pub const FREEZE_PROPOSALS: u64 = 8;
/// From the appends' arrival to the SIGSTOP: shorter than the leader's own
/// reply timeout (one heartbeat), which would tear its connections down.
pub const FREEZE_DELAY: Duration = Duration::from_millis(100);
/// How long a freeze watcher waits for the appends.
const FREEZE_ARM_BOUND: Duration = Duration::from_secs(20);
/// How long the others get to elect a leader of a later term.
const FREEZE_ELECTION_BOUND: Duration = Duration::from_secs(90);
/// How long after the heal a freeze waits for the others' NICs to refuse
/// the frozen leader's resent WRITEs (where the substrate can tell), before
/// it resumes the leader. The WRITEs are resent only while the leader's
/// queue pairs retry: their retry window (`--rdma-retry-count`,
/// `--rdma-ack-timeout-exp`) must outlast the cut.
const FREEZE_REFUSAL_BOUND: Duration = Duration::from_secs(30);
/// One attempt, and in all, of an append to the frozen leader.
const FREEZE_APPEND_DEADLINE: Duration = Duration::from_secs(90);
/// Process numbers of the freeze's appends start here (the workload's
/// start at 0).
const FREEZE_PROCESS_BASE: u64 = 1 << 40;

impl Fault {
    /// Every fault.
    pub const ALL: [Fault; 6] = [
        Fault::Partition,
        Fault::Kill,
        Fault::Pause,
        Fault::Corrupt,
        Fault::Membership,
        Fault::Transfer,
    ];

    /// Its command-line name.
    pub fn as_str(self) -> &'static str {
        match self {
            Fault::Freeze => "freeze",
            Fault::Partition => "partition",
            Fault::Kill => "kill",
            Fault::Pause => "pause",
            Fault::Corrupt => "corrupt",
            Fault::Membership => "membership",
            Fault::Transfer => "transfer",
        }
    }

    /// Parses `kill,pause,...` (`all` for every fault, `none` for none).
    pub fn parse_list(s: &str) -> Result<Vec<Fault>, String> {
        let mut out = Vec::new();
        for name in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            match name {
                "all" => out.extend(Fault::ALL),
                "none" => {}
                _ => out.push(
                    Fault::ALL
                        .into_iter()
                        .chain([Fault::Freeze])
                        .find(|f| f.as_str() == name || (name == "truncate" && *f == Fault::Corrupt))
                        .ok_or_else(|| {
                            format!(
                                "unknown nemesis {name:?} (known: partition, kill, pause, corrupt, membership, transfer, freeze, all, none)"
                            )
                        })?,
                ),
            }
        }
        out.sort_by_key(|f| f.as_str());
        out.dedup();
        Ok(out)
    }

    fn is_background(self) -> bool {
        matches!(self, Fault::Membership | Fault::Transfer)
    }
}

/// How many of each fault ran.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct NemesisStats {
    /// Fault name → windows opened.
    pub windows: BTreeMap<String, u64>,
    /// Substrate or cluster errors met while injecting (not fatal).
    pub errors: Vec<String>,
    /// What each freeze saw, in order.
    pub freezes: Vec<FreezeOutcome>,
}

/// What one freeze saw (also in its `stop` event).
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct FreezeOutcome {
    /// The leader it froze.
    pub node: u64,
    /// Its term.
    pub term: u64,
    /// Whether its process was seen stopped.
    pub frozen: bool,
    /// The leader the others elected, if any.
    pub new_leader: Option<u64>,
    /// Per other node, the queue pairs from the frozen leader its NIC put in
    /// the error state between the cut and the resume (a refused request);
    /// `None` where the substrate cannot tell.
    pub refused: Option<BTreeMap<u64, u64>>,
}

/// The status of node `endpoint`, or `None` when it does not answer soon.
pub async fn status(endpoint: &str) -> Option<ringraft_client::proto::StatusResponse> {
    let mut client = Client::new(vec![endpoint.to_string()], Duration::from_millis(700))
        .with_deadline(Duration::from_millis(700));
    client.status().await.ok()
}

/// The node that says it leads, with its term (the highest such term).
pub async fn find_leader_term(substrate: &dyn Substrate, among: &[u64]) -> Option<(u64, u64)> {
    let mut best: Option<(u64, u64)> = None;
    for &id in among {
        if let Some(s) = status(&substrate.client_endpoint(id)).await
            && s.leader_id == id
            && best.is_none_or(|(_, term)| s.term > term)
        {
            best = Some((id, s.term));
        }
    }
    best
}

/// The leader that the highest-term answering node names, if any.
pub async fn find_leader(substrate: &dyn Substrate) -> Option<u64> {
    let mut best: Option<(u64, u64)> = None;
    for id in substrate.nodes() {
        if let Some(s) = status(&substrate.client_endpoint(id)).await
            && s.leader_id != 0
            && best.is_none_or(|(term, _)| s.term > term)
        {
            best = Some((s.term, s.leader_id));
        }
    }
    best.map(|(_, leader)| leader)
}

/// The fault injector. See the module docs.
pub struct Nemesis {
    substrate: Arc<dyn Substrate>,
    history: Arc<HistoryWriter>,
    faults: Vec<Fault>,
    rng: SplitMix64,
    stats: NemesisStats,
    /// The next process number of a freeze's appends.
    next_process: u64,
}

impl Nemesis {
    /// A nemesis over `substrate` drawing its schedule from `seed`; faults
    /// the substrate cannot inject are left out.
    pub fn new(
        substrate: Arc<dyn Substrate>,
        history: Arc<HistoryWriter>,
        faults: &[Fault],
        seed: u64,
    ) -> Nemesis {
        let faults = supported(&*substrate, faults);
        Nemesis {
            substrate,
            history,
            faults,
            rng: SplitMix64::new(seed ^ 0x6E65_6D65_7369_7300),
            stats: NemesisStats::default(),
            next_process: FREEZE_PROCESS_BASE,
        }
    }

    /// The faults it will inject.
    pub fn faults(&self) -> &[Fault] {
        &self.faults
    }

    fn event(&mut self, fault: &str, value: Value, phase: Phase) {
        if phase == Phase::Start {
            *self.stats.windows.entry(fault.to_string()).or_default() += 1;
        }
        if let Err(e) = self
            .history
            .record(Event::nemesis(0, fault, value, Some(phase)))
        {
            self.stats.errors.push(format!("history: {e}"));
        }
    }

    fn note(&mut self, what: &str, result: crate::substrate::Result<()>) -> Value {
        match result {
            Ok(()) => Value::Null,
            Err(e) => {
                let text = format!("{what}: {e}");
                self.stats.errors.push(text.clone());
                Value::String(text)
            }
        }
    }

    /// Runs a blocking substrate call off the async threads.
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&dyn Substrate) -> T + Send + 'static,
    ) -> T {
        let substrate = self.substrate.clone();
        match tokio::task::spawn_blocking(move || f(&*substrate)).await {
            Ok(v) => v,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }

    /// Injects faults until `stop` is set; returns the counts.
    pub async fn run(mut self, stop: Arc<AtomicBool>) -> NemesisStats {
        if self.faults.is_empty() {
            return self.stats;
        }
        // Let the workload get going first.
        tokio::time::sleep(self.rng.millis(1000, 2000)).await;
        while !stop.load(Ordering::SeqCst) {
            let primary = *self.rng.pick(&self.faults).expect("faults is not empty");
            let foreground: Vec<Fault> = self
                .faults
                .iter()
                .copied()
                .filter(|f| !f.is_background())
                .collect();
            let background: Vec<Fault> = self
                .faults
                .iter()
                .copied()
                .filter(|f| f.is_background())
                .collect();
            if !foreground.is_empty() && !background.is_empty() && self.rng.below(3) == 0 {
                // A membership change or a transfer storm during a fault.
                let fg = *self.rng.pick(&foreground).expect("not empty");
                let bg = *self.rng.pick(&background).expect("not empty");
                let mut other = Nemesis {
                    substrate: self.substrate.clone(),
                    history: self.history.clone(),
                    faults: Vec::new(),
                    rng: SplitMix64::new(self.rng.next_u64()),
                    stats: NemesisStats::default(),
                    next_process: FREEZE_PROCESS_BASE,
                };
                let (_, ()) = tokio::join!(self.inject(fg), async {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    other.inject(bg).await;
                });
                for (k, v) in other.stats.windows {
                    *self.stats.windows.entry(k).or_default() += v;
                }
                self.stats.errors.extend(other.stats.errors);
            } else {
                self.inject(primary).await;
            }
            let gap = self.rng.millis(1500, 3500);
            tokio::time::sleep(gap).await;
        }
        self.stats
    }

    async fn inject(&mut self, fault: Fault) {
        match fault {
            Fault::Partition => self.partition().await,
            Fault::Kill => self.kill().await,
            Fault::Pause => self.pause().await,
            Fault::Corrupt => self.corrupt().await,
            Fault::Membership => self.membership().await,
            Fault::Transfer => self.transfer().await,
            Fault::Freeze => self.freeze().await,
        }
    }

    fn nodes(&self) -> Vec<u64> {
        self.substrate.nodes()
    }

    async fn leader_or_random(&mut self, leader_odds_percent: u64) -> u64 {
        let nodes = self.nodes();
        let random = *self.rng.pick(&nodes).expect("a cluster has nodes");
        if self.rng.below(100) < leader_odds_percent {
            find_leader(&*self.substrate).await.unwrap_or(random)
        } else {
            random
        }
    }

    async fn partition(&mut self) {
        let nodes = self.nodes();
        let leader = find_leader(&*self.substrate).await;
        let mut kinds = vec!["halves", "isolate-leader", "bridge"];
        if self.substrate.can_drop_one_way() {
            kinds.push("one-way");
        }
        let kind = *self.rng.pick(&kinds).expect("not empty");
        let hold = self.rng.millis(2500, 6000);
        if kind == "one-way" {
            let from = leader.unwrap_or(nodes[0]);
            let others: Vec<u64> = nodes.iter().copied().filter(|n| *n != from).collect();
            let to = *self.rng.pick(&others).unwrap_or(&from);
            let value = json!({"from": from, "to": to});
            self.event("partition-one-way", value.clone(), Phase::Start);
            let r = self.blocking(move |s| s.drop_one_way(from, to)).await;
            let err = self.note("drop one way", r);
            tokio::time::sleep(hold).await;
            let r = self.blocking(|s| s.heal()).await;
            let heal_err = self.note("heal", r);
            self.event(
                "partition-one-way",
                json!({"from": from, "to": to, "error": err, "heal_error": heal_err}),
                Phase::Stop,
            );
            return;
        }
        let mut shuffled = nodes.clone();
        for i in (1..shuffled.len()).rev() {
            let j = self.rng.below(i as u64 + 1) as usize;
            shuffled.swap(i, j);
        }
        let groups: Vec<Vec<u64>> = match kind {
            "isolate-leader" => {
                let l = leader.unwrap_or(shuffled[0]);
                vec![vec![l], nodes.iter().copied().filter(|n| *n != l).collect()]
            }
            "bridge" if nodes.len() >= 3 => {
                // The middle node is in no group: it talks to both sides,
                // which cannot talk to each other.
                let half = (nodes.len() - 1) / 2;
                vec![shuffled[..half].to_vec(), shuffled[half + 1..].to_vec()]
            }
            _ => {
                let minority = (nodes.len() - 1) / 2;
                vec![
                    shuffled[..minority.max(1)].to_vec(),
                    shuffled[minority.max(1)..].to_vec(),
                ]
            }
        };
        let value = json!({"kind": kind, "groups": groups});
        self.event("partition", value, Phase::Start);
        let g = groups.clone();
        let r = self.blocking(move |s| s.partition(&g)).await;
        let err = self.note("partition", r);
        tokio::time::sleep(hold).await;
        let r = self.blocking(|s| s.heal()).await;
        let heal_err = self.note("heal", r);
        self.event(
            "partition",
            json!({"kind": kind, "groups": groups, "error": err, "heal_error": heal_err}),
            Phase::Stop,
        );
    }

    async fn kill(&mut self) {
        let node = self.leader_or_random(50).await;
        let hold = self.rng.millis(1000, 4000);
        self.held(
            node,
            hold,
            ("kill", |s, n| s.kill(n)),
            ("restart", |s, n| s.start(n)),
        )
        .await;
    }

    async fn pause(&mut self) {
        let node = self.leader_or_random(70).await;
        let hold = self.rng.millis(1000, 5000);
        self.held(
            node,
            hold,
            ("pause", |s, n| s.pause(n)),
            ("resume", |s, n| s.resume(n)),
        )
        .await;
    }

    /// Applies `fault` to `node`, holds it for `hold`, then applies `undo`.
    /// The history gets the fault's start event and the undo's stop event,
    /// which carries the fault's error as `<fault>_error` and the undo's as
    /// `error`.
    async fn held(
        &mut self,
        node: u64,
        hold: Duration,
        (fault, apply): (&'static str, NodeOp),
        (undo, revert): (&'static str, NodeOp),
    ) {
        self.event(fault, json!({"node": node}), Phase::Start);
        let r = self.blocking(move |s| apply(s, node)).await;
        let fault_err = self.note(fault, r);
        tokio::time::sleep(hold).await;
        let r = self.blocking(move |s| revert(s, node)).await;
        let undo_err = self.note(undo, r);
        let mut stop = serde_json::Map::new();
        stop.insert("node".into(), node.into());
        stop.insert(format!("{fault}_error"), fault_err);
        stop.insert("error".into(), undo_err);
        self.event(undo, Value::Object(stop), Phase::Stop);
    }

    async fn corrupt(&mut self) {
        let nodes = self.nodes();
        let node = *self.rng.pick(&nodes).expect("a cluster has nodes");
        let damage = if self.rng.below(2) == 0 {
            TailDamage::Corrupt
        } else {
            TailDamage::Truncate
        };
        let seed = self.rng.next_u64();
        self.event("kill", json!({"node": node}), Phase::Start);
        let r = self.blocking(move |s| s.kill(node)).await;
        let kill_err = self.note("kill", r);
        let done = self
            .blocking(move |s| s.damage_tail(node, damage, seed))
            .await;
        let what = match done {
            Ok(text) => json!({"node": node, "damage": text}),
            Err(e) => {
                let text = format!("damage tail: {e}");
                self.stats.errors.push(text.clone());
                json!({"node": node, "error": text})
            }
        };
        self.event(damage.as_str(), what.clone(), Phase::Start);
        tokio::time::sleep(self.rng.millis(500, 1500)).await;
        let r = self.blocking(move |s| s.start(node)).await;
        let start_err = self.note("restart", r);
        self.event(
            "restart",
            json!({"node": node, "kill_error": kill_err, "error": start_err}),
            Phase::Stop,
        );
        // Give it time to be repaired before the window closes.
        tokio::time::sleep(self.rng.millis(2000, 4000)).await;
        self.event(damage.as_str(), what, Phase::Stop);
    }

    fn cluster_client(&self) -> Client {
        let endpoints = self
            .nodes()
            .iter()
            .map(|id| self.substrate.client_endpoint(*id))
            .collect();
        Client::new(endpoints, Duration::from_millis(1000)).with_deadline(Duration::from_secs(8))
    }

    async fn membership(&mut self) {
        let leader = find_leader(&*self.substrate).await;
        let nodes = self.nodes();
        let candidates: Vec<u64> = nodes
            .iter()
            .copied()
            .filter(|n| Some(*n) != leader)
            .collect();
        let Some(&node) = self.rng.pick(&candidates) else {
            return;
        };
        let addr = self.substrate.listen_addr(node);
        let mut client = self.cluster_client();
        self.event("membership", json!({"remove": node}), Phase::Start);
        let removed = client.remove(vec![node]).await.map_err(|e| e.to_string());
        tokio::time::sleep(self.rng.millis(1000, 3000)).await;
        let learner = client
            .add_learner(node, addr.clone())
            .await
            .map_err(|e| e.to_string());
        tokio::time::sleep(self.rng.millis(500, 1500)).await;
        let promoted = client.promote(vec![node]).await.map_err(|e| e.to_string());
        let outcome = |r: &Result<Vec<ringraft_client::proto::Member>, String>| match r {
            Ok(members) => {
                json!({"ok": members.iter().map(|m| json!({"id": m.id, "voter": m.voter})).collect::<Vec<_>>()})
            }
            Err(e) => json!({"error": e}),
        };
        for (what, r) in [
            ("remove", &removed),
            ("add learner", &learner),
            ("promote", &promoted),
        ] {
            if let Err(e) = r {
                self.stats
                    .errors
                    .push(format!("membership {what} {node}: {e}"));
            }
        }
        self.event(
            "membership",
            json!({"node": node, "remove": outcome(&removed), "add_learner": outcome(&learner), "promote": outcome(&promoted)}),
            Phase::Stop,
        );
    }

    async fn freeze(&mut self) {
        let nodes = self.nodes();
        let Some((node, term)) = find_leader_term(&*self.substrate, &nodes).await else {
            self.stats.errors.push("freeze: no leader".into());
            return;
        };
        let others: Vec<u64> = nodes.iter().copied().filter(|n| *n != node).collect();
        self.event("freeze", json!({"node": node, "term": term}), Phase::Start);
        let refused_before = self.refusals(node, &others).await;
        // The watcher before the cut: arming it takes seconds on a lab
        // guest, and a leader cut off that long closes its queue pairs at
        // its reply timeout, so no WRITE would be in flight when it stops.
        // The workload alone keeps fewer appends in flight than the
        // watcher waits for.
        let armed = self
            .blocking(move |s| s.arm_freeze(node, FREEZE_PROPOSALS, FREEZE_DELAY, FREEZE_ARM_BOUND))
            .await;
        let groups = vec![vec![node], others.clone()];
        let r = self.blocking(move |s| s.partition(&groups)).await;
        let cut_err = self.note("partition", r);
        self.leader_window(node, term, Phase::Start);
        let stale = self.send_stale(node);
        let frozen = match armed {
            Ok(()) => self.wait_stopped(node).await,
            Err(_) => {
                tokio::time::sleep(FREEZE_DELAY).await;
                let r = self.blocking(move |s| s.pause(node)).await;
                self.note("pause", r).is_null()
            }
        };
        let new_leader = self.wait_new_leader(&others, term).await;
        // The new leader takes writes; then the network heals while the old
        // one is still stopped (its NIC resends what was in flight).
        tokio::time::sleep(self.rng.millis(2000, 4000)).await;
        let r = self.blocking(|s| s.heal()).await;
        let heal_err = self.note("heal", r);
        let refused = match refused_before {
            // The old leader's NIC resends its WRITEs at its next
            // retransmission timeout; the others' NICs must refuse them.
            Some(before) => Some(self.wait_refused(node, before).await),
            None => {
                tokio::time::sleep(self.rng.millis(2000, 4000)).await;
                None
            }
        };
        // Closed before the resume: nothing the old leader answers after it
        // can come from inside the window.
        self.leader_window(node, term, Phase::Stop);
        let r = self.blocking(move |s| s.resume(node)).await;
        let resume_err = self.note("resume", r);
        let mut outcomes = Vec::new();
        for task in stale {
            outcomes.push(task.await.unwrap_or_else(|e| format!("task: {e}")));
        }
        self.event(
            "freeze",
            json!({"node": node, "term": term, "frozen": frozen, "new_leader": new_leader,
                   "refused": refused, "appends": outcomes, "partition_error": cut_err,
                   "heal_error": heal_err, "resume_error": resume_err}),
            Phase::Stop,
        );
        self.stats.freezes.push(FreezeOutcome {
            node,
            term,
            frozen,
            new_leader,
            refused,
        });
    }

    /// Each of `others`' NIC refusals of connections from `node` so far, or
    /// `None` when the substrate cannot count them.
    async fn refusals(&mut self, node: u64, others: &[u64]) -> Option<BTreeMap<u64, u64>> {
        let mut counts = BTreeMap::new();
        for &id in others {
            match self.blocking(move |s| s.nic_refusals(id, node)).await {
                Ok(n) => {
                    counts.insert(id, n);
                }
                Err(SubstrateError::Unsupported { .. }) => return None,
                Err(e) => {
                    self.stats.errors.push(format!("freeze: {e}"));
                    return None;
                }
            }
        }
        Some(counts)
    }

    /// Polls the others' refusals of `node`'s connections until each grew
    /// since `before`, or [`FREEZE_REFUSAL_BOUND`]; returns the growth.
    async fn wait_refused(&mut self, node: u64, before: BTreeMap<u64, u64>) -> BTreeMap<u64, u64> {
        let others: Vec<u64> = before.keys().copied().collect();
        let deadline = Instant::now() + FREEZE_REFUSAL_BOUND;
        let mut grown: BTreeMap<u64, u64> = others.iter().map(|id| (*id, 0)).collect();
        loop {
            if let Some(now) = self.refusals(node, &others).await {
                for (id, n) in now {
                    grown.insert(id, n.saturating_sub(before[&id]));
                }
            }
            if grown.values().all(|n| *n > 0) || Instant::now() >= deadline {
                return grown;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Records the `isolated-leader` window of `node`, leader of `term`.
    fn leader_window(&mut self, node: u64, term: u64, phase: Phase) {
        let event = match phase {
            Phase::Start => Event::leader_isolated(0, node, term),
            Phase::Stop => Event::leader_healed(0, node, term),
        };
        if let Err(e) = self.history.record(event) {
            self.stats.errors.push(format!("history: {e}"));
        }
    }

    /// Sends [`FREEZE_PROPOSALS`] appends to `node` alone, at once, each
    /// recorded with its node; each task returns how it ended.
    fn send_stale(&mut self, node: u64) -> Vec<tokio::task::JoinHandle<String>> {
        let endpoint = self.substrate.client_endpoint(node);
        (0..FREEZE_PROPOSALS)
            .map(|_| {
                let process = self.next_process;
                self.next_process += 1;
                let data = format!("freeze-n{node}-p{process}");
                let (history, endpoint) = (self.history.clone(), endpoint.clone());
                tokio::spawn(async move {
                    let invoke = Event::append_invoke(0, process, data.clone()).with_node(node);
                    if let Err(e) = history.record(invoke) {
                        return format!("history: {e}");
                    }
                    let mut client = Client::new(vec![endpoint], FREEZE_APPEND_DEADLINE)
                        .with_deadline(FREEZE_APPEND_DEADLINE);
                    let (done, outcome) = match client.append(vec![data.clone().into_bytes()]).await
                    {
                        Ok(indexes) if indexes.len() == 1 => (
                            Event::append_completion(
                                0,
                                process,
                                EventType::Ok,
                                data,
                                Some(indexes[0]),
                            ),
                            format!("ok {}", indexes[0]),
                        ),
                        other => {
                            let why = match other {
                                Ok(indexes) => format!("{} indexes answered", indexes.len()),
                                Err(e) => e.to_string(),
                            };
                            let info =
                                Event::append_completion(0, process, EventType::Info, data, None);
                            (info.with_error(why.clone()), why)
                        }
                    };
                    match history.record(done.with_node(node)) {
                        Ok(_) => outcome,
                        Err(e) => format!("history: {e}"),
                    }
                })
            })
            .collect()
    }

    /// Polls until `node`'s process is stopped (bounded); whether it was.
    async fn wait_stopped(&mut self, node: u64) -> bool {
        let deadline = Instant::now() + FREEZE_ARM_BOUND + Duration::from_secs(5);
        loop {
            match self.blocking(move |s| s.is_stopped(node)).await {
                Ok(true) => return true,
                Ok(false) if Instant::now() < deadline => {}
                Ok(false) => {
                    self.stats
                        .errors
                        .push(format!("freeze: node {node} was not stopped"));
                    return false;
                }
                Err(e) => {
                    self.stats.errors.push(format!("freeze: {e}"));
                    return false;
                }
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    /// Polls until one of `among` leads a term after `term` (bounded).
    async fn wait_new_leader(&mut self, among: &[u64], term: u64) -> Option<u64> {
        let deadline = Instant::now() + FREEZE_ELECTION_BOUND;
        while Instant::now() < deadline {
            if let Some((leader, t)) = find_leader_term(&*self.substrate, among).await
                && t > term
            {
                return Some(leader);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        self.stats.errors.push(format!(
            "freeze: no leader after term {term} among {among:?}"
        ));
        None
    }

    async fn transfer(&mut self) {
        let nodes = self.nodes();
        let count = 3 + self.rng.below(4);
        let targets: Vec<u64> = (0..count)
            .map(|_| *self.rng.pick(&nodes).expect("a cluster has nodes"))
            .collect();
        self.event("transfer", json!({"targets": targets}), Phase::Start);
        let mut client = self.cluster_client();
        let mut results = Vec::new();
        for &to in &targets {
            let r = client.transfer_leader(to).await;
            results.push(match r {
                Ok(()) => json!({"to": to, "ok": true}),
                Err(e) => json!({"to": to, "error": e.to_string()}),
            });
            tokio::time::sleep(self.rng.millis(200, 800)).await;
        }
        self.event(
            "transfer",
            json!({"targets": targets, "results": results}),
            Phase::Stop,
        );
    }
}

/// The faults of `faults` that `substrate` can inject.
pub fn supported(substrate: &dyn Substrate, faults: &[Fault]) -> Vec<Fault> {
    faults
        .iter()
        .copied()
        .filter(|f| !matches!(f, Fault::Partition | Fault::Freeze) || substrate.can_partition())
        .collect()
}

/// Faults as their names.
pub fn names(faults: &[Fault]) -> Vec<String> {
    faults.iter().map(|f| f.as_str().to_string()).collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::{Fault, supported};
    use crate::substrate::local::Local;
    use crate::substrate::{ClusterSpec, Substrate, SubstrateError};

    #[test]
    fn freeze_is_named_but_not_part_of_all() {
        assert_eq!(Fault::parse_list("freeze").unwrap(), vec![Fault::Freeze]);
        assert_eq!(
            Fault::parse_list("freeze,kill").unwrap(),
            vec![Fault::Freeze, Fault::Kill]
        );
        let all = Fault::parse_list("all").unwrap();
        assert_eq!(all.len(), Fault::ALL.len());
        assert!(!all.contains(&Fault::Freeze), "{all:?}");
        let err = Fault::parse_list("freez").unwrap_err();
        assert!(err.contains("freeze"), "{err}");
    }

    #[test]
    fn freeze_needs_partitions_and_local_has_no_watcher() {
        let dir = tempfile::tempdir().unwrap();
        let spec = ClusterSpec {
            nodes: vec![1, 2, 3],
            ringraft_bin: "ringraft".into(),
            jepsen_bin: "ringraft-jepsen".into(),
            run_dir: dir.path().to_path_buf(),
            planted_bug: None,
            extra_serve_args: Vec::new(),
            node_log: None,
            data_fs: Default::default(),
        };
        let local: Arc<dyn Substrate> = Arc::new(Local::new(spec).unwrap());
        assert_eq!(
            supported(&*local, &[Fault::Freeze, Fault::Kill]),
            vec![Fault::Kill]
        );
        let armed = local.arm_freeze(
            1,
            8,
            std::time::Duration::from_millis(100),
            std::time::Duration::from_secs(1),
        );
        assert!(
            matches!(armed, Err(SubstrateError::Unsupported { .. })),
            "{armed:?}"
        );
        assert!(matches!(
            local.is_stopped(1),
            Err(SubstrateError::Unsupported { .. })
        ));
    }
}
