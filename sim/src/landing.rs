//! The landing check: every remote WRITE that lands in a node's ring is
//! looked at the moment it lands (the in-process fabric's landing
//! observer, `Fabric::observe_landings`), and no record in it may carry an
//! epoch whose term is below the term of the vote that node saved.
//!
//! That is DESIGN.md's fencing invariant, which no client can see: once a
//! node's term advances it revokes remote write access, and until a leader
//! of the new term fences in nobody writes into its ring; a leader of an
//! older term never again. A deposed leader's records would be refused at
//! adoption (openraft sees the higher vote) and leave no trace in any
//! history, so the check looks at the NIC.
//!
//! Why the clean code never trips it: a WRITE lands only under the data
//! area's current rkey. That rkey is rotated whenever the node's term
//! advances, before the vote is saved (and again after), and handed out
//! only by a grant, which checks that the fence holds the asker's epoch and
//! that the epoch's term is not below the saved vote's (`refuse_grant`).
//! A granted leader writes records of its own epoch only; once the vote
//! rises above that epoch's term the rkey it holds no longer works. So at
//! every landing the records' epoch term is at least the saved vote's. In
//! the simulator nothing runs between the NIC's copy and the observer
//! (one thread; the vote is saved inline), so "at that moment" is exact.
//!
//! A WRITE the fabric admitted and copies later ([`Moment::Admitted`], then
//! [`Moment::LandedLate`]: the late-landing fault, `late_landing.rs`) is
//! judged against the vote when it was admitted, where the rkey was
//! checked; its copy may land after the node's term advanced, which
//! DESIGN.md allows: "old in-flight WRITEs ... land as records the follower
//! rejects". That it is rejected is the third rule: a record that lands
//! with an epoch below the node's fence at that moment is remembered, and
//! the node must never adopt it (`adopted_stale`). Adoption checks a record
//! against the fence after the record landed, and the fence only rises, so
//! the clean code never adopts one.
//!
//! It owns the observer and what it found; it never changes the world.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use ringraft_transport::inproc::{Landing, Moment};
use ringraft_wal::Epoch;
use ringraft_wal::record::{RECORD_HEADER_BYTES, RecordHeader, record_crc};

use crate::world::Nodes;

/// A record that landed in a node's ring with an epoch below its vote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StaleRecord {
    /// Where in the landed bytes its header starts.
    pub offset: usize,
    /// Its header.
    pub header: RecordHeader,
}

/// The records in `bytes` (a WRITE's payload, records 64-byte aligned from
/// its start) whose epoch's term is below `vote_term`, and how many records
/// were read. Bytes that do not decode as a record header are skipped a
/// line at a time; a record whose payload is inside `bytes` counts only if
/// its CRC holds (a payload that happens to look like a header is not a
/// record).
pub fn stale_records(bytes: &[u8], vote_term: u64) -> (Vec<StaleRecord>, u64) {
    let mut stale = Vec::new();
    let mut records = 0;
    let mut offset = 0usize;
    while let Some(line) = offset
        .checked_add(RECORD_HEADER_BYTES)
        .and_then(|end| bytes.get(offset..end))
    {
        let line: &[u8; RECORD_HEADER_BYTES] = line.try_into().expect("a header's length");
        let Some(header) = RecordHeader::decode(line)
            .ok()
            .filter(|h| crc_holds(h, line, bytes, offset))
        else {
            offset += RECORD_HEADER_BYTES;
            continue;
        };
        records += 1;
        if header.epoch.term() < vote_term {
            stale.push(StaleRecord { offset, header });
        }
        let len = usize::try_from(header.record_len()).unwrap_or(usize::MAX);
        offset = offset.saturating_add(len.max(RECORD_HEADER_BYTES));
    }
    (stale, records)
}

/// The record's CRC holds, or its payload is not all in `bytes`.
fn crc_holds(
    header: &RecordHeader,
    line: &[u8; RECORD_HEADER_BYTES],
    bytes: &[u8],
    offset: usize,
) -> bool {
    let start = offset + RECORD_HEADER_BYTES;
    let Some(end) = start.checked_add(header.payload_len as usize) else {
        return false;
    };
    match bytes.get(start..end) {
        Some(payload) => record_crc(line, payload) == header.crc,
        None => true,
    }
}

#[derive(Default)]
struct Found {
    /// The first violation, as the run's failure line.
    violation: Option<String>,
    /// Records checked.
    records: u64,
    /// WRITEs that landed in a node the registry did not list (starting
    /// or stopping): not checked.
    unchecked: u64,
    /// Records that landed below their node's fence, which it must never
    /// adopt (the oldest dropped beyond [`MAX_BELOW_FENCE`]).
    below_fence: Vec<BelowFence>,
    /// The highest epoch of a record that landed in each node.
    latest: BTreeMap<u64, Epoch>,
}

/// How many records landed below the fence are remembered.
const MAX_BELOW_FENCE: usize = 4096;

/// A record that landed in node `node`'s ring with an epoch below the
/// node's fence at that moment.
#[derive(Clone, Debug, PartialEq, Eq)]
struct BelowFence {
    node: u64,
    index: u64,
    lsn: u64,
    epoch: Epoch,
    fence: Epoch,
}

/// The check of one run: install it on the run's fabric, ask it after
/// every step.
#[derive(Clone, Default)]
pub struct LandingCheck {
    found: Arc<Mutex<Found>>,
}

impl LandingCheck {
    /// Watches every WRITE landing on `fabric`, judging it against the vote
    /// of the node `names` maps its fabric name to, as `nodes` has it.
    ///
    /// # Errors
    /// The fabric has an observer already.
    pub fn install(
        fabric: &ringraft_transport::inproc::Fabric,
        names: BTreeMap<String, u64>,
        nodes: Nodes,
    ) -> Result<LandingCheck, String> {
        let check = LandingCheck::default();
        let found = check.found.clone();
        fabric
            .observe_landings(move |landing| {
                let node = names
                    .get(landing.node)
                    .and_then(|id| Some((*id, nodes.get(*id)?)));
                let mut found = found.lock().unwrap_or_else(|p| p.into_inner());
                let Some((id, node)) = node else {
                    found.unchecked += 1;
                    return;
                };
                let store = node.log_store();
                if landing.moment != Moment::LandedLate {
                    let vote_term = store.vote().map_or(0, |v| v.term);
                    judge(&mut found, id, vote_term, landing);
                }
                if landing.moment != Moment::Admitted {
                    judge_tail(&mut found, id, store.tail().next_lsn, landing);
                    remember(&mut found, id, store.fence(), landing);
                }
            })
            .map_err(|e| format!("landing check: {e}"))?;
        Ok(check)
    }

    /// The first violation seen so far.
    pub fn violation(&self) -> Option<String> {
        self.found
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .violation
            .clone()
    }

    /// The highest epoch of a record that landed in node `id` so far.
    pub fn latest_epoch(&self, id: u64) -> Option<Epoch> {
        let found = self.found.lock().unwrap_or_else(|p| p.into_inner());
        found.latest.get(&id).copied()
    }

    /// A record that landed in a node's ring below its fence and that the
    /// node has since adopted (its log holds it at the index, the lsn and
    /// the epoch it landed with), as the run's failure line.
    pub fn adopted_stale(&self, nodes: &Nodes) -> Option<String> {
        let below = self
            .found
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .below_fence
            .clone();
        below.iter().find_map(|b| {
            let node = nodes.get(b.node)?;
            let held = node.log_store().with_wal(|wal| {
                let view = wal.ring().read(b.index).ok()?;
                Some((view.lsn, view.epoch))
            });
            (held == Some((b.lsn, b.epoch))).then(|| {
                format!(
                    "adoption check: node {} adopted index {} (lsn {}) of epoch {}, a record \
                     that landed after its fence had moved to {}: a fenced-out writer's record \
                     taken into the log",
                    b.node, b.index, b.lsn, b.epoch, b.fence
                )
            })
        })
    }

    /// Records checked and WRITEs not checked, so far.
    pub fn counts(&self) -> (u64, u64) {
        let found = self.found.lock().unwrap_or_else(|p| p.into_inner());
        (found.records, found.unchecked)
    }
}

/// Judges one landing in node `id`, whose saved vote is of `vote_term`.
fn judge(found: &mut Found, id: u64, vote_term: u64, landing: &Landing<'_>) {
    let (stale, records) = stale_records(landing.bytes, vote_term);
    found.records += records;
    if found.violation.is_some() {
        return;
    }
    if let Some(first) = stale.first() {
        let h = &first.header;
        found.violation = Some(format!(
            "landing check: a WRITE landed in node {id}'s ring a record of epoch {} (term {}) \
             while node {id}'s vote is of term {vote_term} (lsn {}, index {}, {} stale records \
             in a WRITE of {} bytes): a leader of an older term wrote after the node's term \
             advanced",
            h.epoch,
            h.epoch.term(),
            h.lsn,
            h.index,
            stale.len(),
            landing.bytes.len(),
        ));
    }
}

/// DESIGN.md's data-plane invariant: a remote WRITE lands only at or
/// beyond the node's adopted tail (adopted records are never overwritten
/// from outside). A leader learns the tail in its grant and keeps it exact
/// through the answers; a WRITE below it means the node adopted records
/// behind a granted leader's back (as adoption without its epoch check
/// would: a deposed leader's batch taken after the fence moved).
fn judge_tail(found: &mut Found, id: u64, tail_lsn: u64, landing: &Landing<'_>) {
    if found.violation.is_some() {
        return;
    }
    let (below, _) = records_below(landing.bytes, tail_lsn);
    if let Some(first) = below.first() {
        let h = &first.header;
        found.violation = Some(format!(
            "landing check: a WRITE landed in node {id}'s ring below its adopted tail (a record \
             of epoch {} at lsn {}, index {}, while the tail is at lsn {tail_lsn}): it \
             overwrote an adopted record",
            h.epoch, h.lsn, h.index,
        ));
    }
}

/// Remembers the records of `landing` whose epoch is below `fence` (the
/// node's, now), and the highest epoch that landed.
fn remember(found: &mut Found, id: u64, fence: Epoch, landing: &Landing<'_>) {
    let (records, _) = stale_records(landing.bytes, u64::MAX);
    for record in records {
        let h = record.header;
        let latest = found.latest.entry(id).or_insert(h.epoch);
        *latest = (*latest).max(h.epoch);
        if h.epoch < fence {
            if found.below_fence.len() >= MAX_BELOW_FENCE {
                found.below_fence.remove(0);
            }
            found.below_fence.push(BelowFence {
                node: id,
                index: h.index,
                lsn: h.lsn,
                epoch: h.epoch,
                fence,
            });
        }
    }
}

/// The records in `bytes` (as [`stale_records`] reads them) that start
/// below `tail_lsn`, and how many records were read.
pub fn records_below(bytes: &[u8], tail_lsn: u64) -> (Vec<StaleRecord>, u64) {
    let (all, records) = stale_records(bytes, u64::MAX);
    let below = all
        .into_iter()
        .filter(|r| r.header.lsn < tail_lsn)
        .collect();
    (below, records)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringraft_wal::Epoch;
    use ringraft_wal::record::{RecordKind, record_len};

    /// A sealed entry record of `epoch` at `lsn`, padded to its length.
    fn record(epoch: Epoch, lsn: u64, index: u64, payload: &[u8]) -> Vec<u8> {
        let mut header = RecordHeader {
            kind: RecordKind::Entry,
            payload_len: payload.len() as u32,
            lsn,
            term: epoch.term(),
            index,
            prev_term: epoch.term(),
            epoch,
            crc: 0,
        };
        let mut bytes = header.seal(payload).to_vec();
        bytes.extend_from_slice(payload);
        bytes.resize(record_len(payload.len() as u64) as usize, 0);
        bytes
    }

    fn epoch(term: u64, leader: u64) -> Epoch {
        Epoch::new(term, leader).expect("an epoch")
    }

    #[test]
    fn a_record_below_the_vote_is_flagged_and_a_current_one_is_not() {
        let mut bytes = record(epoch(3, 1), 0, 7, b"c1-1");
        let second = bytes.len() as u64;
        bytes.extend(record(epoch(3, 1), second, 8, &[b'x'; 100]));
        let (stale, records) = stale_records(&bytes, 3);
        assert_eq!(
            (stale.len(), records),
            (0, 2),
            "term 3 under a vote of term 3"
        );
        let (stale, records) = stale_records(&bytes, 4);
        assert_eq!(records, 2);
        assert_eq!(
            stale
                .iter()
                .map(|s| (s.offset, s.header.index))
                .collect::<Vec<_>>(),
            vec![(0, 7), (second as usize, 8)]
        );
    }

    #[test]
    fn what_is_not_a_record_is_skipped() {
        // Garbage, a header whose CRC does not hold, a short tail: nothing.
        let mut bytes = vec![0xa5u8; 64];
        let mut bad = record(epoch(1, 2), 64, 1, b"payload");
        bad[70] ^= 1;
        bytes.extend(bad);
        bytes.extend(record(epoch(1, 2), 192, 2, b"p"));
        bytes.extend_from_slice(&[1, 2, 3]);
        let (stale, records) = stale_records(&bytes, 2);
        assert_eq!(records, 1, "only the record whose CRC holds");
        assert_eq!(stale[0].header.index, 2);
        assert_eq!(stale_records(&[], 9), (Vec::new(), 0));
        assert_eq!(stale_records(&[0; 63], 9), (Vec::new(), 0));
    }

    #[test]
    fn a_violation_names_the_node_the_epoch_and_the_vote() {
        let bytes = record(epoch(2, 1), 128, 5, b"c2-9");
        let mut found = Found::default();
        let landing = Landing {
            node: "node3",
            addr: 0x1000,
            bytes: &bytes,
            moment: Moment::Landed,
        };
        judge(&mut found, 3, 2, &landing);
        assert_eq!(found.violation, None);
        judge(&mut found, 3, 4, &landing);
        let line = found.violation.expect("a violation");
        assert!(line.starts_with("landing check:"), "{line}");
        for part in [
            "node 3",
            "(term 2)",
            "vote is of term 4",
            "lsn 128",
            "index 5",
        ] {
            assert!(line.contains(part), "{part:?} in {line}");
        }
        assert_eq!(found.records, 2);
    }

    #[test]
    fn a_write_below_the_adopted_tail_is_flagged_and_one_at_it_is_not() {
        let bytes = record(epoch(2, 1), 128, 5, b"c2-9");
        let landing = Landing {
            node: "node3",
            addr: 0x1000,
            bytes: &bytes,
            moment: Moment::Landed,
        };
        let mut found = Found::default();
        judge_tail(&mut found, 3, 128, &landing);
        assert_eq!(found.violation, None, "at the tail");
        judge_tail(&mut found, 3, 192, &landing);
        let line = found.violation.expect("a violation");
        for part in ["node 3", "below its adopted tail", "lsn 128", "lsn 192"] {
            assert!(line.contains(part), "{part:?} in {line}");
        }
    }

    #[test]
    fn records_landing_below_the_fence_are_remembered_and_the_latest_epoch_kept() {
        let mut bytes = record(epoch(2, 1), 128, 5, b"old");
        bytes.extend(record(epoch(3, 2), 192, 6, b"new"));
        let landing = Landing {
            node: "node3",
            addr: 0x1000,
            bytes: &bytes,
            moment: Moment::LandedLate,
        };
        let mut found = Found::default();
        remember(&mut found, 3, epoch(3, 2), &landing);
        assert_eq!(
            found.below_fence,
            [BelowFence {
                node: 3,
                index: 5,
                lsn: 128,
                epoch: epoch(2, 1),
                fence: epoch(3, 2),
            }],
            "only the record below the fence"
        );
        assert_eq!(found.latest.get(&3), Some(&epoch(3, 2)));
    }
}
