//! Crashes of the segment log on a simulated disk (issue 11, item 2): an
//! in-memory [`Disk`] that keeps, per file, what was flushed and the writes
//! since, and at a crash keeps a seeded random subset of those (the page
//! cache writes back in no particular order) and of the directory changes
//! not yet flushed. Whatever the log made durable (`sync`'s answer,
//! `truncate_after`, `remove_before`) must be there after the crash, the
//! verdict must never say an acknowledged entry is missing, and nothing
//! recovered may differ from what was written.
//!
//! The crash comes between two operations, or in the middle of one (after
//! a chosen number of disk calls): the ordering of `truncate_after` and
//! `remove_before` (newest segments first, oldest first) must leave a valid
//! log at every step.
//!
//! It also shows that the log runs on a disk other than the real one, as
//! the planned simulator will.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use common::segments::{RING, Source, truncate_after_picked};
use proptest::prelude::*;
use ringraft_wal::disk::{Access, Disk, DiskFile};
use ringraft_wal::{
    Damage, EntryRef, Epoch, Evidence, RecordEncoder, SegmentConfig, SegmentLog, WalError,
    WriteBuffer,
};

/// One change to a file not yet flushed.
#[derive(Clone, Debug)]
enum Change {
    Write { offset: u64, bytes: Vec<u8> },
    SetLen(u64),
}

#[derive(Default)]
struct FileState {
    /// What a read sees.
    now: Vec<u8>,
    /// What survives a crash for sure.
    durable: Vec<u8>,
    /// Changes since the last flush, in order.
    pending: Vec<Change>,
}

fn apply(data: &mut Vec<u8>, change: &Change) {
    match change {
        Change::Write { offset, bytes } => {
            let end = *offset as usize + bytes.len();
            if data.len() < end {
                data.resize(end, 0);
            }
            data[*offset as usize..end].copy_from_slice(bytes);
        }
        Change::SetLen(len) => data.resize(*len as usize, 0),
    }
}

#[derive(Default)]
struct State {
    files: BTreeMap<PathBuf, Arc<Mutex<FileState>>>,
    /// The directory entries as of the last directory flush.
    durable_names: BTreeSet<PathBuf>,
    /// Files removed since, with their state (a crash may bring them back).
    removed: BTreeMap<PathBuf, Arc<Mutex<FileState>>>,
}

/// The simulated disk (one flat namespace of paths; directories always
/// exist).
#[derive(Clone, Default)]
struct MemDisk {
    state: Arc<Mutex<State>>,
    crash: Arc<Mutex<CrashPlan>>,
}

/// When to take the crash image: at the `at`-th changing disk call.
#[derive(Default)]
struct CrashPlan {
    calls: u64,
    at: Option<u64>,
    seed: u64,
    image: Option<MemDisk>,
}

struct MemFile {
    path: PathBuf,
    state: Arc<Mutex<FileState>>,
    disk: MemDisk,
}

impl MemDisk {
    /// Counts a changing disk call; at the planned one, takes the crash
    /// image of the disk as it is before the call.
    fn tick(&self) {
        let mut plan = self.crash.lock().unwrap();
        plan.calls += 1;
        if plan.at == Some(plan.calls) && plan.image.is_none() {
            let seed = plan.seed;
            drop(plan);
            let image = self.crash(seed);
            self.crash.lock().unwrap().image = Some(image);
        }
    }

    fn crash_taken(&self) -> bool {
        self.crash.lock().unwrap().image.is_some()
    }

    /// The disk after a crash: each pending change of each file survives
    /// with probability 1/2 (in order), a write sometimes only in some of
    /// its 512-byte sectors (a torn write); each unflushed creation or
    /// removal survives with probability 1/2 too.
    fn crash(&self, seed: u64) -> MemDisk {
        let mut rng = seed | 1;
        let mut coin = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng & 1 == 1
        };
        let state = self.state.lock().unwrap();
        let mut after = State::default();
        let candidates = state
            .files
            .iter()
            .chain(state.removed.iter())
            .map(|(p, f)| (p.clone(), Arc::clone(f)));
        for (path, file) in candidates {
            let durable_entry = state.durable_names.contains(&path);
            let exists_now = state.files.contains_key(&path);
            let keep = if durable_entry == exists_now {
                exists_now
            } else {
                coin()
            };
            if !keep {
                continue;
            }
            let file = file.lock().unwrap();
            let mut data = file.durable.clone();
            for change in &file.pending {
                if !coin() {
                    continue;
                }
                match change {
                    Change::Write { offset, bytes } if coin() && coin() => {
                        // Torn: some sectors only.
                        for (k, sector) in bytes.chunks(512).enumerate() {
                            if coin() {
                                let torn = Change::Write {
                                    offset: offset + (k * 512) as u64,
                                    bytes: sector.to_vec(),
                                };
                                apply(&mut data, &torn);
                            }
                        }
                    }
                    _ => apply(&mut data, change),
                }
            }
            after.files.insert(
                path.clone(),
                Arc::new(Mutex::new(FileState {
                    now: data.clone(),
                    durable: data,
                    pending: Vec::new(),
                })),
            );
            after.durable_names.insert(path);
        }
        MemDisk {
            state: Arc::new(Mutex::new(after)),
            crash: Arc::default(),
        }
    }
}

fn not_found(path: &Path) -> WalError {
    WalError::Io {
        op: "open",
        path: path.to_path_buf(),
        source: std::io::Error::from(std::io::ErrorKind::NotFound),
    }
}

impl Disk for MemDisk {
    type File = MemFile;

    fn create_dir_all(&self, _dir: &Path) -> ringraft_wal::Result<()> {
        Ok(())
    }

    fn list(&self, dir: &Path) -> ringraft_wal::Result<Vec<String>> {
        let state = self.state.lock().unwrap();
        Ok(state
            .files
            .keys()
            .filter(|p| p.parent() == Some(dir))
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect())
    }

    fn create_new(&self, path: &Path) -> ringraft_wal::Result<MemFile> {
        self.tick();
        let mut state = self.state.lock().unwrap();
        assert!(
            !state.files.contains_key(path),
            "create_new of {path:?}, which exists"
        );
        let file = Arc::new(Mutex::new(FileState::default()));
        state.files.insert(path.to_path_buf(), Arc::clone(&file));
        state.removed.remove(path);
        Ok(MemFile {
            path: path.to_path_buf(),
            state: file,
            disk: self.clone(),
        })
    }

    fn open(&self, path: &Path, _access: Access) -> ringraft_wal::Result<MemFile> {
        let state = self.state.lock().unwrap();
        let file = state.files.get(path).ok_or_else(|| not_found(path))?;
        Ok(MemFile {
            path: path.to_path_buf(),
            state: Arc::clone(file),
            disk: self.clone(),
        })
    }

    fn remove(&self, path: &Path) -> ringraft_wal::Result<()> {
        self.tick();
        let mut state = self.state.lock().unwrap();
        let file = state.files.remove(path).ok_or_else(|| not_found(path))?;
        state.removed.insert(path.to_path_buf(), file);
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> ringraft_wal::Result<()> {
        self.tick();
        let mut state = self.state.lock().unwrap();
        let current: Vec<PathBuf> = state.files.keys().cloned().collect();
        state.durable_names.retain(|p| p.parent() != Some(dir));
        state
            .durable_names
            .extend(current.into_iter().filter(|p| p.parent() == Some(dir)));
        state.removed.retain(|p, _| p.parent() != Some(dir));
        Ok(())
    }
}

impl DiskFile for MemFile {
    fn path(&self) -> &Path {
        &self.path
    }

    fn size(&self) -> ringraft_wal::Result<u64> {
        Ok(self.state.lock().unwrap().now.len() as u64)
    }

    fn write_at(&self, bufs: &[&[u8]], offset: u64) -> ringraft_wal::Result<()> {
        self.disk.tick();
        let mut file = self.state.lock().unwrap();
        let change = Change::Write {
            offset,
            bytes: bufs.concat(),
        };
        apply(&mut file.now, &change);
        file.pending.push(change);
        Ok(())
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> ringraft_wal::Result<usize> {
        let file = self.state.lock().unwrap();
        let start = (offset as usize).min(file.now.len());
        let n = buf.len().min(file.now.len() - start);
        buf[..n].copy_from_slice(&file.now[start..start + n]);
        Ok(n)
    }

    fn sync_data(&self) -> ringraft_wal::Result<()> {
        self.disk.tick();
        let mut file = self.state.lock().unwrap();
        file.durable = file.now.clone();
        file.pending.clear();
        Ok(())
    }

    fn set_len(&self, len: u64) -> ringraft_wal::Result<()> {
        self.disk.tick();
        let mut file = self.state.lock().unwrap();
        let change = Change::SetLen(len);
        apply(&mut file.now, &change);
        file.pending.push(change);
        Ok(())
    }

    fn preallocate(&self, len: u64) -> ringraft_wal::Result<()> {
        self.disk.tick();
        let mut file = self.state.lock().unwrap();
        if (file.now.len() as u64) < len {
            let change = Change::SetLen(len);
            apply(&mut file.now, &change);
            file.pending.push(change);
        }
        Ok(())
    }
}

fn config() -> SegmentConfig {
    SegmentConfig {
        zero_ahead_bytes: 4096,
        ..common::segments::config(8192)
    }
}

fn dir() -> PathBuf {
    PathBuf::from("/sim/node1/log")
}

#[derive(Clone, Debug)]
enum Op {
    Append { term_bump: bool, lens: Vec<usize> },
    Sync,
    TruncateAfter(u64),
    RemoveBefore(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (any::<bool>(), prop::collection::vec(0usize..3000, 1..4))
            .prop_map(|(term_bump, lens)| Op::Append { term_bump, lens }),
        3 => Just(Op::Sync),
        1 => (0u64..1000).prop_map(Op::TruncateAfter),
        1 => (0u64..1000).prop_map(Op::RemoveBefore),
    ]
}

/// The writer's side of the world: what was written, what is durable.
struct Writer {
    log: SegmentLog<MemDisk>,
    /// Encodes the entries; holds the log's entries as written.
    source: Source,
    term: u64,
    /// The highest index made durable and still in the log.
    durable: Option<u64>,
    first: u64,
}

impl Writer {
    fn apply(&mut self, op: &Op) {
        match op {
            Op::Append { term_bump, lens } => {
                if *term_bump {
                    self.term += 1;
                }
                let bytes = self.source.batch(self.term, lens);
                self.log.append(&[&bytes]).unwrap();
            }
            Op::Sync => {
                let durable = self.log.sync().unwrap();
                assert_eq!(durable, self.log.last_log());
                self.durable = durable.map(|d| d.index);
            }
            Op::TruncateAfter(k) => {
                let picked = truncate_after_picked(&mut self.log, &mut self.source, self.first, *k);
                if let Some(keep) = picked {
                    self.durable = self.durable.map(|d| d.min(keep));
                }
            }
            Op::RemoveBefore(k) => {
                let next = self.log.next_index();
                self.first = self.log.remove_before(k % (next + 1)).unwrap();
            }
        }
    }
}

/// What must hold after the crash: (entries that may be recovered, the
/// highest durable index still retained, the first index that retention
/// may have left).
type AfterCrash = (Vec<(u64, u64, Vec<u8>)>, Option<u64>, u64);

/// Opens a log on `disk` and applies `ops` until the crash planned on the
/// disk is taken (or all of them); returns the writer and what must hold
/// after the crash.
fn write_until_crash(disk: &MemDisk, ops: &[Op]) -> (Writer, AfterCrash) {
    let (log, _) = SegmentLog::open(disk.clone(), &dir(), config(), None).unwrap();
    let mut writer = Writer {
        log,
        source: Source::new(),
        term: 1,
        durable: None,
        first: 0,
    };
    let mut context = disk.crash_taken().then(|| (Vec::new(), None, 0));
    for op in ops {
        if context.is_some() {
            break;
        }
        let (entries, durable, first) =
            (writer.source.entries.clone(), writer.durable, writer.first);
        writer.apply(op);
        if disk.crash_taken() {
            context = Some(match op {
                // Truncated entries may still be there, in their old
                // version; those up to `keep` must be.
                Op::TruncateAfter(_) => {
                    let keep = writer.source.entries.last().map(|e| e.0);
                    let durable = match (durable, keep) {
                        (Some(durable), Some(keep)) => Some(durable.min(keep)),
                        (durable, _) => durable,
                    };
                    (entries, durable, first)
                }
                Op::RemoveBefore(_) => (entries, durable, writer.first),
                _ => (writer.source.entries.clone(), durable, first),
            });
        }
    }
    let context =
        context.unwrap_or_else(|| (writer.source.entries.clone(), writer.durable, writer.first));
    (writer, context)
}

/// The node goes on from what it recovered in `log` (a leader
/// re-replicates from there, in a term after `term`): the damaged rest is
/// discarded at the first write, and the next open of `after_crash` finds
/// a clean log from `first` on.
fn goes_on_after_recovery(
    mut log: SegmentLog<MemDisk>,
    term: u64,
    after_crash: MemDisk,
    first: u64,
) -> Result<(), TestCaseError> {
    let tip = log.tip();
    let epoch = Epoch::new(term + 1, 1).unwrap();
    let mut encoder = RecordEncoder::new(RING, log.lsn_end() + (1 << 30), tip, epoch).unwrap();
    let mut buf = WriteBuffer::new(RING, encoder.next_lsn()).unwrap();
    let index = if tip.unanchored { 1000 } else { tip.next_index };
    encoder
        .push(
            &mut buf,
            &EntryRef {
                term: term + 1,
                index,
                payload: b"after",
            },
        )
        .unwrap();
    log.append(&[&buf.segments()[0].bytes]).unwrap();
    log.sync().unwrap();
    drop(log);
    let (log, again) = SegmentLog::open(after_crash, &dir(), config(), Some(index)).unwrap();
    prop_assert_eq!(again.damage, Damage::None, "{:?}", again);
    prop_assert_eq!(again.stop, None);
    let reader = log.reader();
    prop_assert_eq!(
        reader.range(),
        (if tip.unanchored { index } else { first }, index + 1)
    );
    prop_assert_eq!(reader.read(index).unwrap().payload, b"after".to_vec());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Issue 11, item 2: after a crash between operations or in the middle
    /// of one, with any subset of the unflushed writes lost, recovery keeps
    /// every entry the log had made durable, never calls the log broken
    /// below it, and recovers nothing that was not written.
    #[test]
    fn a_crash_keeps_what_was_made_durable(
        ops in prop::collection::vec(op(), 1..30),
        seed in any::<u64>(),
        crash_at in prop::option::weighted(0.75, 1u64..60),
    ) {
        let disk = MemDisk::default();
        {
            let mut plan = disk.crash.lock().unwrap();
            plan.seed = seed;
            plan.at = crash_at;
        }
        let (writer, (expected_entries, durable, retained_from)) = write_until_crash(&disk, &ops);
        let image = disk.crash.lock().unwrap().image.take();
        let crashed = image.unwrap_or_else(|| disk.crash(seed));
        let after_crash = crashed.clone();
        // What the caller passes: the highest durable index the log must
        // still hold (retention may have removed it).
        let acked = durable.filter(|d| *d >= retained_from);
        let (log, recovery) = SegmentLog::open(crashed, &dir(), config(), acked).unwrap();
        prop_assert!(
            !matches!(recovery.damage, Damage::CorruptInside(Evidence::BelowWatermark { .. })),
            "durable entries lost: {recovery:?}"
        );
        let reader = log.reader();
        let (first, next) = reader.range();
        if let Some(durable) = acked {
            // Every retained durable entry is there.
            prop_assert!(
                first <= retained_from && next > durable,
                "recovered {first}..{next}; durable up to {durable}, retained from {retained_from}"
            );
        }
        for index in first..next {
            let record = reader.read(index).unwrap();
            let expected = expected_entries.iter().find(|e| e.0 == index);
            prop_assert!(expected.is_some(), "entry {index} recovered but never in the log");
            let (_, term, payload) = expected.unwrap();
            prop_assert_eq!(record.term, *term);
            prop_assert_eq!(&record.payload, payload);
        }
        goes_on_after_recovery(log, writer.term, after_crash, first)?;
    }
}
