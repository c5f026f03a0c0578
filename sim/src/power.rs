//! Power loss: a node's machine (or every machine) loses power and boots
//! again. What it keeps is what a real machine keeps:
//! - of its segment files, what was made durable: every byte written since
//!   a file's last `fdatasync` is lost (it reads as it did before the
//!   write: zeroes over preallocated space, nothing past the old end),
//!   except, sometimes, a seeded prefix of those writes in the order they
//!   were made (a torn last write); a file created since its directory's
//!   last sync may be gone altogether;
//! - its ring not at all: it lives in shared memory (`/dev/shm`), which a
//!   reboot clears (the ring file and its owner record are removed);
//! - its vote and metadata file, the ring-location record and the state
//!   machine's snapshots whole: they are written atomically with fsync
//!   before they are used.
//!
//! How it knows what was synced: the wal's disk observer
//! (`ringraft_wal::disk::DiskObserver`), a process-wide hook that sees
//! every change `RealDisk` and `RealFile` make. For each file under a
//! watched data directory this module keeps the length as of its last sync
//! and, for every write since, the bytes the write covered before it (read
//! just before the write). At the instant of the loss
//! ([`cut`]) the data directory's disk refuses every further change (the
//! node's shutdown, which would flush, then fails to write anything);
//! [`restore`] then undoes, newest first, the writes the disk never made
//! durable, and sets each file back to its durable length.
//!
//! Why an observer rather than a recording `Disk` implementation: the
//! node's `Wal` opens its segment log over `RealDisk`, and the log store,
//! the flusher and the node name that type; a recording disk would make
//! all of them generic (or boxed) for the simulator's sake. The observer
//! is a few lines in `wal/src/disk.rs` that production never installs
//! (one atomic load per change without it), and it watches the real
//! system calls rather than the segment log's own idea of what is durable.
//!
//! Simplifications, each one in the log's favour only where the log
//! already does what makes it so: a length change (`set_len`,
//! `preallocate`) counts as durable when made (the segment log syncs right
//! after every truncation); a removal counts as durable when made (the
//! segment log syncs the directory after each one).
//!
//! Deterministic: the state is keyed by path in ordered maps, and every
//! choice (torn or not, how much, a new file kept or gone) comes from the
//! run's generator.

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, Once};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use ringraft::Durability;
use ringraft_wal::disk::{DiskFile, DiskObserver, DiskOp, install_observer};

use crate::nemesis::Fault;
use crate::world::World;

/// The chance that the next fault of an `fsync` run is a power loss.
pub const POWER_LOSS_CHANCE: f64 = 0.3;

/// One write not yet made durable.
#[derive(Clone, Debug)]
struct Unsynced {
    /// Where it starts.
    offset: u64,
    /// The bytes it covered before it (zeroes past the file's end then);
    /// as long as the write.
    old: Vec<u8>,
}

/// What the disk made durable of one file, and the writes since.
#[derive(Clone, Debug)]
struct FileState {
    /// The file's length as of its last sync or length change.
    durable_len: u64,
    /// Writes since the last sync, oldest first.
    unsynced: Vec<Unsynced>,
    /// Created since its directory was last synced.
    new_entry: bool,
}

impl FileState {
    fn new(durable_len: u64) -> FileState {
        FileState {
            durable_len,
            unsynced: Vec::new(),
            new_entry: false,
        }
    }

    /// The file's length was set to `len`: writes beyond it are gone.
    fn cut(&mut self, len: u64) {
        self.durable_len = len;
        self.unsynced.retain_mut(|w| {
            if w.offset >= len {
                return false;
            }
            let fits = usize::try_from(len - w.offset).unwrap_or(usize::MAX);
            w.old.truncate(fits);
            true
        });
    }
}

/// The watched data directories and their files.
struct Machines {
    /// Watched directory → powered (false between [`cut`] and [`restore`]).
    roots: BTreeMap<PathBuf, bool>,
    files: BTreeMap<PathBuf, FileState>,
}

static MACHINES: Mutex<Machines> = Mutex::new(Machines {
    roots: BTreeMap::new(),
    files: BTreeMap::new(),
});

fn machines() -> MutexGuard<'static, Machines> {
    MACHINES.lock().unwrap_or_else(|p| p.into_inner())
}

impl Machines {
    /// Whether `path` lies in a watched directory, and that directory's
    /// power.
    fn powered(&self, path: &Path) -> Option<bool> {
        self.roots
            .iter()
            .find(|(root, _)| path.starts_with(root))
            .map(|(_, powered)| *powered)
    }

    /// The state of `path`, first seen now at length `len` (a file that
    /// existed before the watch counts as durable as it is).
    fn file(&mut self, path: &Path, len: impl FnOnce() -> u64) -> &mut FileState {
        self.files
            .entry(path.to_path_buf())
            .or_insert_with(|| FileState::new(len()))
    }
}

/// The wal's disk observer: records, and refuses changes to an unpowered
/// directory.
struct Observer;

fn op_path<'a>(op: &DiskOp<'a>) -> &'a Path {
    match *op {
        DiskOp::Create { path } | DiskOp::Remove { path } => path,
        DiskOp::SyncDir { dir } => dir,
        DiskOp::Write { file, .. }
        | DiskOp::SyncData { file }
        | DiskOp::SetLen { file, .. }
        | DiskOp::Preallocate { file, .. } => file.path(),
    }
}

fn size_of(file: &impl DiskFile) -> u64 {
    file.size().unwrap_or(0)
}

impl DiskObserver for Observer {
    fn before(&self, op: DiskOp<'_>) -> std::io::Result<()> {
        let path = op_path(&op);
        let mut m = machines();
        match m.powered(path) {
            None => return Ok(()),
            Some(false) => {
                return Err(std::io::Error::other(format!(
                    "{}: the machine lost power",
                    path.display()
                )));
            }
            Some(true) => {}
        }
        if let DiskOp::Write { file, offset, len } = op {
            let len = usize::try_from(len).map_err(std::io::Error::other)?;
            let mut old = vec![0u8; len];
            // Past the end a read stops; the rest stays zeroes.
            file.read_at(&mut old, offset)
                .map_err(std::io::Error::other)?;
            m.file(path, || size_of(file))
                .unsynced
                .push(Unsynced { offset, old });
        }
        Ok(())
    }

    fn after(&self, op: DiskOp<'_>) {
        let path = op_path(&op);
        let mut m = machines();
        if m.powered(path).is_none() {
            return;
        }
        match op {
            DiskOp::Create { path } => {
                m.files.insert(
                    path.to_path_buf(),
                    FileState {
                        new_entry: true,
                        ..FileState::new(0)
                    },
                );
            }
            DiskOp::Remove { path } => {
                m.files.remove(path);
            }
            DiskOp::SyncDir { dir } => {
                for (_, state) in m.files.iter_mut().filter(|(p, _)| p.parent() == Some(dir)) {
                    state.new_entry = false;
                }
            }
            DiskOp::Write { .. } => {}
            DiskOp::SyncData { file } => {
                let len = size_of(file);
                let state = m.file(path, || len);
                state.durable_len = len;
                state.unsynced.clear();
            }
            DiskOp::SetLen { len, .. } => m.file(path, || len).cut(len),
            DiskOp::Preallocate { file, .. } => {
                let len = size_of(file);
                let state = m.file(path, || len);
                state.durable_len = state.durable_len.max(len);
            }
        }
    }
}

/// Installs the observer (once per process).
fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        assert!(
            install_observer(Box::new(Observer)).is_ok(),
            "another disk observer is installed in the simulator's process"
        );
    });
}

/// Watches the files under `dir` from now on (a file that exists already
/// counts as durable as it is when first seen).
pub fn watch(dir: &Path) {
    install();
    machines().roots.insert(dir.to_path_buf(), true);
}

/// Stops watching `dir` and forgets its files.
pub fn forget(dir: &Path) {
    let mut m = machines();
    m.roots.remove(dir);
    m.files.retain(|path, _| !path.starts_with(dir));
}

/// The instant of the loss: from now on the disk of `dir` refuses every
/// change, until [`restore`].
///
/// # Panics
/// When `dir` is not watched (the simulator's own bug).
pub fn cut(dir: &Path) {
    let mut m = machines();
    let powered = m
        .roots
        .get_mut(dir)
        .unwrap_or_else(|| panic!("{} is not watched", dir.display()));
    *powered = false;
}

/// What a power loss took from one data directory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Loss {
    /// Files that had writes not made durable.
    pub files: u64,
    /// Bytes written and lost.
    pub lost_bytes: u64,
    /// Bytes written, not made durable, and kept anyway (a torn write).
    pub torn_bytes: u64,
    /// Files gone (created, their directory never synced since).
    pub gone: Vec<PathBuf>,
}

/// The machine of `dir` boots again: every file under it is set back to
/// what its disk made durable before [`cut`] (module docs), with the
/// choices drawn from `rng`; then its disk takes changes again.
///
/// # Errors
/// A file cannot be set back (an I/O error of the real disk under the
/// simulation).
///
/// # Panics
/// When `dir` is not watched.
pub fn restore(dir: &Path, rng: &mut StdRng) -> Result<Loss, String> {
    let mut m = machines();
    assert!(
        m.roots.contains_key(dir),
        "{} is not watched",
        dir.display()
    );
    let paths: Vec<PathBuf> = m
        .files
        .keys()
        .filter(|p| p.starts_with(dir))
        .cloned()
        .collect();
    let mut loss = Loss::default();
    for path in paths {
        let state = m.files.remove(&path).expect("listed");
        if state.new_entry && rng.random_bool(0.5) {
            match std::fs::remove_file(&path) {
                Ok(()) => loss.gone.push(path),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(format!("{}: {e}", path.display())),
            }
            continue;
        }
        let total: u64 = state.unsynced.iter().map(|w| w.old.len() as u64).sum();
        if total == 0 {
            continue;
        }
        let keep = if rng.random_bool(0.5) {
            rng.random_range(0..total)
        } else {
            0
        };
        set_back(&path, &state, keep).map_err(|e| format!("{}: {e}", path.display()))?;
        loss.files += 1;
        loss.lost_bytes += total - keep;
        loss.torn_bytes += keep;
    }
    m.roots.insert(dir.to_path_buf(), true);
    Ok(loss)
}

/// Sets `path` back to its durable state, keeping the first `keep` bytes
/// of its unsynced writes (in the order they were made).
fn set_back(path: &Path, state: &FileState, keep: u64) -> std::io::Result<()> {
    let file = std::fs::OpenOptions::new().write(true).open(path)?;
    let mut budget = keep;
    let kept: Vec<u64> = state
        .unsynced
        .iter()
        .map(|w| {
            let k = budget.min(w.old.len() as u64);
            budget -= k;
            k
        })
        .collect();
    let mut len = state.durable_len;
    for (write, kept) in state.unsynced.iter().zip(&kept).rev() {
        let from = usize::try_from(*kept).expect("at most the write's length");
        file.write_all_at(&write.old[from..], write.offset + kept)?;
        if *kept > 0 {
            len = len.max(write.offset + kept);
        }
    }
    file.set_len(len)?;
    Ok(())
}

/// Removes the ring of data directory `dir` and its owner record (shared
/// memory does not survive a reboot). Returns the ring's path.
///
/// # Errors
/// The directory names no ring, or the files cannot be removed.
pub fn lose_ring(dir: &Path) -> Result<PathBuf, String> {
    let ring = ringraft_wal::ring_path(dir).map_err(|e| e.to_string())?;
    for path in [ring.clone(), ring.with_extension("owner")] {
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("{}: {e}", path.display())),
        }
    }
    Ok(ring)
}

/// How long a flush of run `seed`'s simulated disk takes: 1 to 5 ms, from
/// a generator of its own (the world's draws stay as they were).
pub fn flush_latency(seed: u64) -> Duration {
    let mut rng = StdRng::seed_from_u64(seed ^ 0xd15c_f1a5);
    Duration::from_millis(rng.random_range(1..=5))
}

/// True when `world` runs in `fsync` durability: the only one where a
/// power loss must not lose an acknowledged entry (in `memory` durability
/// a machine crash may, by design: DESIGN.md).
pub fn fsync(world: &World) -> bool {
    world
        .cluster
        .members
        .values()
        .all(|m| m.config.durability == Durability::Fsync)
}

/// Watches the data directories of `world`'s nodes, in an `fsync` run.
pub fn watch_world(world: &World) {
    if fsync(world) {
        for id in world.cluster.members.keys() {
            watch(&world.cluster.data_dir(*id));
        }
    }
}

/// Forgets the data directories of `world`'s nodes.
pub fn forget_world(world: &World) {
    for id in world.cluster.members.keys() {
        forget(&world.cluster.data_dir(*id));
    }
}

/// The next fault is a power loss (of one node, or of every node), or
/// `None`: only in `fsync` runs, with [`POWER_LOSS_CHANCE`].
pub fn choose(world: &mut World) -> Option<Fault> {
    if !fsync(world) || !world.rng.random_bool(POWER_LOSS_CHANCE) {
        return None;
    }
    if world.rng.random_bool(0.5) {
        return Some(Fault::PowerLossAll);
    }
    let ids: Vec<u64> = world.cluster.members.keys().copied().collect();
    Some(Fault::PowerLoss {
        node: ids[world.rng.random_range(0..ids.len())],
    })
}

/// `nodes` lose power at one instant, stay off for `hold` and boot again.
///
/// # Errors
/// A node does not start again, or its files cannot be set back.
pub async fn apply(world: &mut World, nodes: &[u64], hold: Duration) -> Result<(), String> {
    let running = world.cluster.running();
    let nodes: Vec<u64> = nodes
        .iter()
        .copied()
        .filter(|id| running.contains(id))
        .collect();
    // The instant of the loss: no disk of theirs takes a change from now
    // on (their shutdown's flush fails).
    for id in &nodes {
        cut(&world.cluster.data_dir(*id));
    }
    for id in &nodes {
        world.stop(*id).await;
    }
    for id in &nodes {
        let dir = world.cluster.data_dir(*id);
        let loss = restore(&dir, &mut world.rng)?;
        lose_ring(&dir)?;
        // Names only: the directories' and the ring's names are not the
        // seed's (temporary directories, the ring's random id).
        let gone: Vec<String> = loss
            .gone
            .iter()
            .filter_map(|p| p.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .collect();
        world.trace.event(|| {
            format!(
                "node {id} lost power: {} bytes of {} files lost, {} torn bytes kept, \
                 files gone {gone:?}, its ring gone",
                loss.lost_bytes, loss.files, loss.torn_bytes,
            )
        });
    }
    tokio::time::sleep(hold).await;
    for id in &nodes {
        world.boot(*id).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringraft_wal::disk::{Disk, RealDisk};

    /// A watched directory with one file written through the real disk.
    fn setup() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        watch(dir.path());
        let path = dir.path().join("segment");
        (dir, path)
    }

    fn bytes(path: &Path) -> Vec<u8> {
        std::fs::read(path).unwrap()
    }

    #[test]
    fn unsynced_writes_are_lost_and_synced_ones_kept() {
        let (dir, path) = setup();
        let file = RealDisk.create_new(&path).unwrap();
        file.write_at(&[b"synced "], 0).unwrap();
        file.sync_data().unwrap();
        RealDisk.sync_dir(dir.path()).unwrap();
        file.write_at(&[b"lost"], 7).unwrap();
        assert_eq!(bytes(&path), b"synced lost");
        cut(dir.path());
        // The disk refuses changes once the power is cut.
        assert!(file.write_at(&[b"x"], 11).is_err());
        assert!(file.sync_data().is_err());
        // Some seed loses it all (not torn).
        let mut seen_clean = false;
        let mut seen_torn = false;
        for seed in 0..64 {
            std::fs::write(&path, b"synced lost").unwrap();
            machines().files.insert(
                path.clone(),
                FileState {
                    durable_len: 7,
                    unsynced: vec![Unsynced {
                        offset: 7,
                        old: vec![0; 4],
                    }],
                    new_entry: false,
                },
            );
            cut(dir.path());
            let loss = restore(dir.path(), &mut StdRng::seed_from_u64(seed)).unwrap();
            let now = bytes(&path);
            assert!(now.starts_with(b"synced "), "{now:?}");
            assert_eq!(loss.lost_bytes + loss.torn_bytes, 4);
            assert_eq!(now.len() as u64, 7 + loss.torn_bytes);
            assert_eq!(&now[7..], &b"lost"[..loss.torn_bytes as usize]);
            if loss.torn_bytes == 0 {
                seen_clean = true;
            } else {
                seen_torn = true;
            }
        }
        assert!(
            seen_clean && seen_torn,
            "clean {seen_clean}, torn {seen_torn}"
        );
        // Powered again: changes go through.
        file.write_at(&[b"again"], 7).unwrap();
        forget(dir.path());
    }

    #[test]
    fn a_write_over_preallocated_space_reads_zeroes_after_the_loss() {
        let (dir, path) = setup();
        let file = RealDisk.create_new(&path).unwrap();
        file.preallocate(4096).unwrap();
        file.write_at(&[b"header"], 0).unwrap();
        file.sync_data().unwrap();
        RealDisk.sync_dir(dir.path()).unwrap();
        file.write_at(&[b"record-1", b"record-2"], 6).unwrap();
        file.write_at(&[b"record-3"], 22).unwrap();
        cut(dir.path());
        // A seed that tears: a prefix of the two writes, in order, stays.
        let (loss, now) = (0..64)
            .find_map(|seed| {
                let mut m = machines();
                let saved = m.files.get(&path).cloned().unwrap();
                drop(m);
                let image = std::fs::read(&path).unwrap();
                let loss = restore(dir.path(), &mut StdRng::seed_from_u64(seed)).unwrap();
                let now = bytes(&path);
                // Put the state back for the next seed.
                std::fs::write(&path, &image).unwrap();
                m = machines();
                m.files.insert(path.clone(), saved);
                m.roots.insert(dir.path().to_path_buf(), false);
                (loss.torn_bytes > 8).then_some((loss, now))
            })
            .expect("some seed tears the second write");
        assert_eq!(now.len(), 4096, "the preallocated length stays");
        let written = b"headerrecord-1record-2record-3";
        let kept = 6 + loss.torn_bytes as usize;
        assert_eq!(&now[..kept], &written[..kept]);
        assert!(now[kept..].iter().all(|b| *b == 0), "the rest reads zeroes");
        assert_eq!(loss.lost_bytes + loss.torn_bytes, 24);
        forget(dir.path());
        drop(file);
    }

    #[test]
    fn a_new_file_whose_directory_was_never_synced_may_be_gone() {
        let dir = tempfile::tempdir().unwrap();
        let (mut gone, mut kept) = (0, 0);
        for seed in 0..32 {
            watch(dir.path());
            let path = dir.path().join(format!("new-{seed}"));
            let file = RealDisk.create_new(&path).unwrap();
            file.write_at(&[b"data"], 0).unwrap();
            file.sync_data().unwrap();
            cut(dir.path());
            let loss = restore(dir.path(), &mut StdRng::seed_from_u64(seed)).unwrap();
            if loss.gone.contains(&path) {
                assert!(!path.exists());
                gone += 1;
            } else {
                // Its data was synced: kept.
                assert_eq!(bytes(&path), b"data");
                kept += 1;
            }
            // After a directory sync it stays.
            let synced = dir.path().join(format!("synced-{seed}"));
            let file = RealDisk.create_new(&synced).unwrap();
            RealDisk.sync_dir(dir.path()).unwrap();
            cut(dir.path());
            restore(dir.path(), &mut StdRng::seed_from_u64(seed)).unwrap();
            assert!(synced.exists());
            drop(file);
        }
        assert!(gone > 0 && kept > 0, "gone {gone}, kept {kept}");
        forget(dir.path());
    }

    #[test]
    fn a_cut_drops_the_unsynced_writes_beyond_it() {
        let (dir, path) = setup();
        let file = RealDisk.create_new(&path).unwrap();
        file.write_at(&[b"0123456789"], 0).unwrap();
        file.sync_data().unwrap();
        RealDisk.sync_dir(dir.path()).unwrap();
        file.write_at(&[b"abcdef"], 10).unwrap();
        // Truncated back below the unsynced write, then extended: the
        // write is gone, not restored.
        file.set_len(12).unwrap();
        file.preallocate(32).unwrap();
        cut(dir.path());
        let loss = restore(dir.path(), &mut StdRng::seed_from_u64(1)).unwrap();
        let now = bytes(&path);
        assert_eq!(now.len(), 32);
        assert_eq!(&now[..10], b"0123456789");
        assert!(loss.lost_bytes + loss.torn_bytes == 2, "{loss:?}");
        assert!(now[12..].iter().all(|b| *b == 0));
        forget(dir.path());
    }
}
