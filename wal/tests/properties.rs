//! Property tests: arbitrary operation sequences against a model, and
//! arbitrary damage to the files never yielding a wrong record.

mod common;

use std::os::unix::fs::FileExt;
use std::path::Path;

use common::*;
use proptest::prelude::*;
use ringraft_wal::layout::CONTROL_BLOCK_BYTES;
use ringraft_wal::{EntryRef, Epoch, LogPos, Wal};

/// The model: what the log must hold.
#[derive(Clone, Debug, Default)]
struct Model {
    /// Entries from `first_index` on.
    entries: Vec<(u64, u64, Vec<u8>)>,
    first_index: u64,
    purged: Option<LogPos>,
}

impl Model {
    fn next_index(&self) -> u64 {
        self.first_index + self.entries.len() as u64
    }
    fn last_term(&self) -> u64 {
        self.entries
            .last()
            .map(|e| e.1)
            .or(self.purged.map(|p| p.term))
            .unwrap_or(0)
    }
}

#[derive(Clone, Debug)]
enum Op {
    /// Append a batch locally.
    Append(Vec<usize>),
    /// A remote leader writes a batch, the ring adopts it.
    Adopt(Vec<usize>),
    /// A new term: a new leader takes the fence.
    NewTerm,
    /// Truncate after a point chosen by the fraction (per mille) of the log.
    Truncate(u16),
    /// Purge up to a point chosen by the fraction (per mille) of the log.
    Purge(u16),
    /// Purge beyond the log, as after installing a snapshot.
    Snapshot(u8),
    /// Close and reopen (a clean restart: memory mode keeps the mapping).
    Reopen,
}

fn sizes() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(
        prop_oneof![
            4 => 0usize..200,
            2 => 200usize..4000,
            1 => Just(MAX_RECORD as usize),
            1 => 4000usize..=MAX_RECORD as usize,
        ],
        1..8,
    )
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => sizes().prop_map(Op::Append),
        6 => sizes().prop_map(Op::Adopt),
        1 => Just(Op::NewTerm),
        1 => (0u16..1000).prop_map(Op::Truncate),
        2 => (0u16..1000).prop_map(Op::Purge),
        1 => (1u8..20).prop_map(Op::Snapshot),
        1 => Just(Op::Reopen),
    ]
}

struct World {
    dir: TestDir,
    wal: Option<Wal>,
    model: Model,
    term: u64,
    seq: u64,
}

impl World {
    fn new() -> World {
        let dir = tempdir();
        let wal = open(dir.path());
        let world = World {
            dir,
            wal: Some(wal),
            model: Model::default(),
            term: 1,
            seq: 0,
        };
        take_fence(world.wal().ring(), world.epoch());
        world
    }
    fn wal(&self) -> &Wal {
        self.wal.as_ref().unwrap()
    }
    fn wal_mut(&mut self) -> &mut Wal {
        self.wal.as_mut().unwrap()
    }
    fn epoch(&self) -> Epoch {
        epoch(self.term, 1 + self.term % 3)
    }
    fn batch(&mut self, sizes: &[usize]) -> Vec<(u64, u64, Vec<u8>)> {
        let first = self.model.next_index();
        sizes
            .iter()
            .enumerate()
            .map(|(k, len)| {
                self.seq += 1;
                let index = first + k as u64;
                (index, self.term, payload(index ^ self.seq, *len))
            })
            .collect()
    }
    /// Makes room for `sizes` by purging the whole log if the ring is too
    /// full (the model follows).
    fn make_room(&mut self, sizes: &[usize]) {
        let needed: u64 = sizes
            .iter()
            .map(|s| (*s as u64 + 64).div_ceil(64) * 64 + 64)
            .sum();
        if self.wal().ring().free_bytes() < needed + 64 * 1024
            && let Some(last) = self.wal().ring().last_log()
        {
            self.purge_to(last);
        }
    }
    fn purge_to(&mut self, upto: LogPos) {
        let purged = self.wal_mut().purge(upto).unwrap();
        let m = &mut self.model;
        if purged {
            let drop = (upto.index + 1)
                .saturating_sub(m.first_index)
                .min(m.entries.len() as u64);
            m.entries.drain(..drop as usize);
            m.first_index = upto.index + 1;
            m.purged = Some(upto);
        }
    }

    fn apply(&mut self, op: &Op) {
        match op {
            Op::Append(sizes) => {
                self.make_room(sizes);
                let batch = self.batch(sizes);
                let refs: Vec<_> = batch
                    .iter()
                    .map(|(i, t, p)| EntryRef {
                        term: *t,
                        index: *i,
                        payload: p,
                    })
                    .collect();
                let e = self.epoch();
                self.wal_mut().ring_mut().append(e, &refs).unwrap();
                self.model.entries.extend(batch);
            }
            Op::Adopt(sizes) => {
                self.make_room(sizes);
                let batch = self.batch(sizes);
                let ring = self.wal().ring();
                let buf = remote_write(ring, ring.tail_lsn(), ring.tip(), self.epoch(), &batch);
                let request = adopt_request(&buf, &batch);
                self.wal_mut().ring_mut().adopt(request).unwrap();
                self.model.entries.extend(batch);
            }
            Op::NewTerm => {
                self.term += 1;
                let e = self.epoch();
                take_fence(self.wal().ring(), e);
            }
            Op::Truncate(per_mille) => {
                let n = self.model.entries.len() as u64;
                let keep = n * *per_mille as u64 / 1000;
                let last_kept = (self.model.first_index + keep).checked_sub(1);
                if last_kept.is_none() && self.model.purged.is_some() {
                    return;
                }
                self.wal_mut().ring_mut().truncate_after(last_kept).unwrap();
                self.model.entries.truncate(keep as usize);
            }
            Op::Purge(per_mille) => {
                let n = self.model.entries.len() as u64;
                if n == 0 {
                    return;
                }
                let k = (n - 1) * *per_mille as u64 / 1000;
                let (index, term, _) = self.model.entries[k as usize];
                self.purge_to(LogPos { term, index });
            }
            Op::Snapshot(beyond) => {
                let index = self.model.next_index() + *beyond as u64;
                let term = self.model.last_term().max(self.term);
                if term > self.term {
                    return;
                }
                self.purge_to(LogPos { term, index });
                assert!(self.model.entries.is_empty());
            }
            Op::Reopen => {
                self.wal = None;
                self.wal = Some(open(self.dir.path()));
                assert_eq!(self.wal().ring().fence(), self.epoch());
            }
        }
        self.check_model();
    }

    fn check_model(&self) {
        let ring = self.wal().ring();
        assert_eq!(ring.first_index(), self.model.first_index);
        assert_eq!(ring.next_index(), self.model.next_index());
        assert_eq!(ring.last_purged(), self.model.purged);
        assert!(ring.tail_lsn() <= ring.head_lsn() + CAP);
    }

    fn check_contents(&self) {
        assert_log_eq!(contents(self.wal().ring()), self.model.entries);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn operation_sequences_match_the_model(ops in prop::collection::vec(op(), 1..60)) {
        let mut world = World::new();
        for op in &ops {
            world.apply(op);
        }
        world.check_contents();
        world.apply(&Op::Reopen);
        world.check_contents();
    }
}

/// Builds a directory holding a log that wrapped at least once, synced.
/// Returns the model of what it holds.
fn written_log(sizes: &[usize]) -> (TestDir, Model) {
    let mut world = World::new();
    for (k, chunk) in sizes.chunks(5).enumerate() {
        if k % 2 == 0 {
            world.apply(&Op::Append(chunk.to_vec()));
        } else {
            world.apply(&Op::Adopt(chunk.to_vec()));
        }
        if k % 7 == 3 {
            world.apply(&Op::NewTerm);
        }
    }
    world.wal_mut().ring_mut().sync().unwrap();
    let model = world.model.clone();
    let World { dir, wal, .. } = world;
    drop(wal);
    (dir, model)
}

/// Whatever recovery returns, every record must be exactly the one written,
/// and they must form a prefix of the log.
fn assert_prefix_of(dir: &Path, model: &Model) {
    let Ok(wal) = open_with(dir, &config(1)) else {
        return; // a clear error is an allowed outcome
    };
    let got = contents(wal.ring());
    assert_eq!(wal.ring().first_index(), model.first_index);
    assert!(
        got.len() <= model.entries.len(),
        "recovery invented entries"
    );
    assert_log_eq!(
        got,
        model.entries[..got.len()],
        "recovery returned a wrong record"
    );
}

fn log_sizes() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(0usize..6000, 20..200)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn a_flipped_bit_never_yields_a_wrong_record(sizes in log_sizes(), bit in any::<u64>()) {
        let (tmp, model) = written_log(&sizes);
        let dir = tmp.path().to_path_buf();
        let ring = ring_file(&dir);
        let bit = bit % ((CONTROL_BLOCK_BYTES as u64 + CAP) * 8);
        let mut b = [0u8];
        ring.read_exact_at(&mut b, bit / 8).unwrap();
        ring.write_all_at(&[b[0] ^ (1 << (bit % 8))], bit / 8).unwrap();
        drop(ring);
        let _ = ringraft_wal::check(&dir); // must not panic either
        assert_prefix_of(&dir, &model);
    }

    #[test]
    fn a_torn_tail_never_yields_a_wrong_record(sizes in log_sizes(), cut in any::<u64>()) {
        let (tmp, model) = written_log(&sizes);
        let dir = tmp.path().to_path_buf();
        let (head, tail) = {
            let wal = open_with(&dir, &config(1)).unwrap();
            (wal.ring().head_lsn(), wal.ring().tail_lsn())
        };
        // Lose every byte written from a point between head and tail on, as
        // if the machine died while those pages were on their way to disk.
        let from = head + cut % (tail - head).max(1);
        let ring = ring_file(&dir);
        let mut lsn = from;
        while lsn < tail {
            let physical = lsn % CAP;
            let run = (CAP - physical).min(tail - lsn);
            ring.write_all_at(&vec![0u8; run as usize], CONTROL_BLOCK_BYTES as u64 + physical).unwrap();
            lsn += run;
        }
        drop(ring);
        assert_prefix_of(&dir, &model);
    }

    #[test]
    fn a_truncated_file_is_a_clear_error(sizes in log_sizes(), cut in any::<u64>()) {
        let (tmp, model) = written_log(&sizes);
        let dir = tmp.path().to_path_buf();
        let len = CONTROL_BLOCK_BYTES as u64 + CAP;
        let ring = ring_file(&dir);
        ring.set_len(cut % len).unwrap();
        drop(ring);
        prop_assert!(open_with(&dir, &config(1)).is_err());
        prop_assert!(ringraft_wal::check(&dir).is_err());
        assert_prefix_of(&dir, &model);
    }
}
