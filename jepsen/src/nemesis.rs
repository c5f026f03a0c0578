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

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ringraft_client::Client;
use serde_json::{Value, json};

use crate::history::{Event, HistoryWriter, Phase};
use crate::rng::SplitMix64;
use crate::substrate::{Substrate, TailDamage};

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
}

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
                        .find(|f| f.as_str() == name || (name == "truncate" && *f == Fault::Corrupt))
                        .ok_or_else(|| {
                            format!(
                                "unknown nemesis {name:?} (known: partition, kill, pause, corrupt, membership, transfer, all, none)"
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
    pub windows: std::collections::BTreeMap<String, u64>,
    /// Substrate or cluster errors met while injecting (not fatal).
    pub errors: Vec<String>,
}

/// The status of node `endpoint`, or `None` when it does not answer soon.
pub async fn status(endpoint: &str) -> Option<ringraft_client::proto::StatusResponse> {
    let mut client = Client::new(vec![endpoint.to_string()], Duration::from_millis(700))
        .with_deadline(Duration::from_millis(700));
    client.status().await.ok()
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
        self.event("kill", json!({"node": node}), Phase::Start);
        let r = self.blocking(move |s| s.kill(node)).await;
        let err = self.note("kill", r);
        tokio::time::sleep(hold).await;
        let r = self.blocking(move |s| s.start(node)).await;
        let start_err = self.note("restart", r);
        self.event(
            "restart",
            json!({"node": node, "kill_error": err, "error": start_err}),
            Phase::Stop,
        );
    }

    async fn pause(&mut self) {
        let node = self.leader_or_random(70).await;
        let hold = self.rng.millis(1000, 5000);
        self.event("pause", json!({"node": node}), Phase::Start);
        let r = self.blocking(move |s| s.pause(node)).await;
        let err = self.note("pause", r);
        tokio::time::sleep(hold).await;
        let r = self.blocking(move |s| s.resume(node)).await;
        let resume_err = self.note("resume", r);
        self.event(
            "resume",
            json!({"node": node, "pause_error": err, "error": resume_err}),
            Phase::Stop,
        );
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
        .filter(|f| *f != Fault::Partition || substrate.can_partition())
        .collect()
}

/// Faults as their names.
pub fn names(faults: &[Fault]) -> Vec<String> {
    faults.iter().map(|f| f.as_str().to_string()).collect()
}
