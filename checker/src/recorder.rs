//! Recording a history from a test: a [`Recorder`] that concurrent tasks
//! share, stamping each invocation, completion and nemesis event with one
//! clock under one lock (so the history's order is its time order), then
//! checking it against the nodes' final logs.
//!
//! This module owns the recording API; it must never judge anything itself
//! (it calls [`check_history`]) and never touch files (write
//! [`Recorder::events`] with [`crate::history::write_history`] to keep one).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde_json::Value;

use crate::history::{Consistency, Event, EventType, FinalLogs, Phase, ReadRecord};
use crate::rules::check_history;
use crate::verdict::Verdict;

/// The clock a recorder stamps events with, in ns.
type Clock = Arc<dyn Fn() -> u64 + Send + Sync>;

/// A history being recorded. Cheap to clone; clones share one history.
#[derive(Clone)]
pub struct Recorder {
    events: Arc<Mutex<Vec<Event>>>,
    clock: Clock,
    next_process: Arc<AtomicU64>,
}

/// An append that was invoked and is not complete yet. Completing it
/// ([`Recorder::ok`], [`Recorder::fail`], [`Recorder::info`]) consumes it, so
/// an operation completes at most once.
#[derive(Debug)]
#[must_use = "an operation left without completion counts as unknown (info)"]
pub struct OpHandle {
    process: u64,
    data: String,
}

/// A read that was invoked and is not complete yet.
#[derive(Debug)]
#[must_use = "an operation left without completion counts as unknown (info)"]
pub struct ReadHandle {
    process: u64,
    from: u64,
    to: Option<u64>,
    consistency: Consistency,
}

/// Either kind of outstanding operation, for [`Recorder::fail`] and
/// [`Recorder::info`].
#[derive(Debug)]
pub enum Outstanding {
    /// An append.
    Append(OpHandle),
    /// A read.
    Read(ReadHandle),
}

impl From<OpHandle> for Outstanding {
    fn from(op: OpHandle) -> Outstanding {
        Outstanding::Append(op)
    }
}

impl From<ReadHandle> for Outstanding {
    fn from(op: ReadHandle) -> Outstanding {
        Outstanding::Read(op)
    }
}

impl Default for Recorder {
    fn default() -> Recorder {
        Recorder::new()
    }
}

impl Recorder {
    /// A recorder whose times are ns since its creation (monotonic clock).
    pub fn new() -> Recorder {
        let started = Instant::now();
        Recorder::with_clock(move || {
            u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX)
        })
    }

    /// A recorder with a clock of the caller's (a simulator's virtual time,
    /// in ns); it must not go backwards.
    pub fn with_clock(clock: impl Fn() -> u64 + Send + Sync + 'static) -> Recorder {
        Recorder {
            events: Arc::new(Mutex::new(Vec::new())),
            clock: Arc::new(clock),
            next_process: Arc::new(AtomicU64::new(0)),
        }
    }

    /// A process number no earlier call returned. A process has one
    /// operation outstanding at a time and is never used again after an
    /// `info`: take a fresh one per operation when in doubt.
    pub fn fresh_process(&self) -> u64 {
        self.next_process.fetch_add(1, Ordering::Relaxed)
    }

    fn push(&self, mut event: Event) {
        let mut events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        event.time = (self.clock)();
        events.push(event);
    }

    /// `process` sends an append of `data` (unique in the history).
    pub fn invoke_append(&self, process: u64, data: impl Into<String>) -> OpHandle {
        let data = data.into();
        self.push(Event::append_invoke(0, process, data.clone()));
        OpHandle { process, data }
    }

    /// `process` sends an append of `data` to node `node` (what the
    /// stale-leader rules need to know).
    pub fn invoke_append_via(&self, process: u64, node: u64, data: impl Into<String>) -> OpHandle {
        let data = data.into();
        self.push(Event::append_invoke(0, process, data.clone()).with_node(node));
        OpHandle { process, data }
    }

    /// The append was acknowledged at log index `index`.
    pub fn ok(&self, op: OpHandle, index: u64) {
        self.push(Event::append_completion(
            0,
            op.process,
            EventType::Ok,
            op.data,
            Some(index),
        ));
    }

    /// `process` reads `[from, to]` (`to = None`: up to the commit index).
    pub fn invoke_read(
        &self,
        process: u64,
        from: u64,
        to: Option<u64>,
        consistency: Consistency,
    ) -> ReadHandle {
        self.push(Event::read_invoke(0, process, from, to, consistency));
        ReadHandle {
            process,
            from,
            to,
            consistency,
        }
    }

    /// The read returned `records`.
    pub fn read_ok(&self, op: ReadHandle, records: Vec<ReadRecord>) {
        self.push(Event::read_completion(
            0,
            op.process,
            EventType::Ok,
            op.from,
            op.to,
            op.consistency,
            Some(records),
        ));
    }

    /// The operation definitely did not take effect.
    pub fn fail(&self, op: impl Into<Outstanding>, error: impl Into<String>) {
        self.complete(op.into(), EventType::Fail, error.into());
    }

    /// The operation's outcome is unknown (a timeout, a lost connection).
    pub fn info(&self, op: impl Into<Outstanding>, error: impl Into<String>) {
        self.complete(op.into(), EventType::Info, error.into());
    }

    fn complete(&self, op: Outstanding, kind: EventType, error: String) {
        let event = match op {
            Outstanding::Append(a) => Event::append_completion(0, a.process, kind, a.data, None),
            Outstanding::Read(r) => {
                Event::read_completion(0, r.process, kind, r.from, r.to, r.consistency, None)
            }
        };
        self.push(event.with_error(error));
    }

    /// A fault window opens (`fault` names it; `value` its targets).
    pub fn nemesis_start(&self, fault: &str, value: Value) {
        self.push(Event::nemesis(0, fault, value, Some(Phase::Start)));
    }

    /// A fault window closes.
    pub fn nemesis_stop(&self, fault: &str, value: Value) {
        self.push(Event::nemesis(0, fault, value, Some(Phase::Stop)));
    }

    /// Node `node`, leader of `term`, is now cut off from a majority.
    pub fn leader_isolated(&self, node: u64, term: u64) {
        self.push(Event::leader_isolated(0, node, term));
    }

    /// The isolation of `node` is healed; another node leads a later term.
    pub fn leader_healed(&self, node: u64, term: u64) {
        self.push(Event::leader_healed(0, node, term));
    }

    /// Any other event, stamped with the recorder's clock.
    pub fn record(&self, event: Event) {
        self.push(event);
    }

    /// The history so far, in time order.
    pub fn events(&self) -> Vec<Event> {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Checks the history so far against the nodes' final logs. A history
    /// the recorder's user broke (two outstanding operations in one process,
    /// data appended twice, ...) is an invalid verdict with one
    /// [`crate::AnomalyKind::MalformedHistory`] anomaly.
    pub fn check(&self, finals: &FinalLogs) -> Verdict {
        check_history(&self.events(), finals).unwrap_or_else(Verdict::malformed)
    }
}
