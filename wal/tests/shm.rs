//! Where the ring lives (issue 11, item 1): a named file in a shared-memory
//! directory, bound to its data directory, swept when that directory is
//! removed, recreated from the durable vote when a reboot cleared it, and a
//! clear error when the directory is too small.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use ringraft_wal::meta::META_FILE;
use ringraft_wal::shm::LOCATION_FILE;
use ringraft_wal::{
    Damage, Epoch, LogPos, RingConfig, VoteRecord, Wal, WalError, check, collect_garbage,
};

fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn canonical(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap()
}

/// Issue 11, item 1: the ring is a file of the ring dir, named after the
/// cluster, the node and a random id, readable by its owner only, with an
/// owner record beside it; the data directory holds only the metadata file
/// and the record that names the ring.
#[test]
fn the_ring_lives_in_the_ring_dir_not_in_the_data_dir() {
    let dir = tempdir();
    let wal = open(dir.path());
    let ring = ring_path(dir.path());
    assert_eq!(wal.ring_path(), ring);
    assert_eq!(ring.parent().unwrap(), canonical(&ring_dir_of(dir.path())));
    let name = ring.file_name().unwrap().to_str().unwrap().to_string();
    assert!(
        name.starts_with("ringraft-c0ffee-1-") && name.ends_with(".ring") && name.len() == 39,
        "{name}"
    );
    assert_eq!(
        files_in(dir.path()),
        [ringraft_wal::segment::SEGMENT_DIR, META_FILE, LOCATION_FILE],
        "the metadata file, the segment log and the ring's location: no ring"
    );
    let owner = name.replace(".ring", ".owner");
    assert_eq!(files_in(&ring_dir_of(dir.path())), [owner, name]);
    let mode = std::fs::metadata(&ring).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the log is not for other users");
    assert_eq!(
        check(dir.path()).unwrap().ring,
        ring,
        "wal check finds the ring from the data directory alone"
    );
    // Two data directories sharing a ring dir get two rings.
    let other = dir.root().join("other");
    let wal2 = Wal::open(&other, &ring_dir_of(dir.path()), &config(1)).unwrap();
    assert_ne!(wal2.ring_path(), wal.ring_path());
}

/// Issue 11, item 1: `memory` durability keeps what a killed process wrote
/// (the ring is shared memory, not the process's). A child process opens
/// the data directory, appends and acknowledges without any sync, and
/// aborts (no destructor runs, as under `kill -9`); the parent finds every
/// entry.
#[test]
fn a_killed_process_loses_nothing() {
    let dir = tempdir();
    drop(open(dir.path()));
    let status = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_appends_then_aborts",
            "--ignored",
            "--nocapture",
        ])
        .env("RINGRAFT_WAL_TEST_DIR", dir.path())
        .status()
        .unwrap();
    assert!(!status.success(), "the child aborts: {status}");
    let wal = open(dir.path());
    assert_eq!(wal.recovery().entries, 50, "{:?}", wal.recovery());
    assert_eq!(wal.recovery().acked, Some(49));
    assert_eq!(wal.recovery().damage, Damage::None);
    assert_eq!(wal.ring().fence(), epoch(2, 1));
    for (i, _, p) in contents(wal.ring()) {
        assert_eq!(p, payload(i, 200));
    }
}

/// Run by [`a_killed_process_loses_nothing`] in a child process.
#[test]
#[ignore = "a child of a_killed_process_loses_nothing"]
fn child_appends_then_aborts() {
    let dir = PathBuf::from(std::env::var_os("RINGRAFT_WAL_TEST_DIR").expect("run by the parent"));
    let mut wal = open(&dir);
    let e = epoch(2, 1);
    take_fence(wal.ring(), e);
    append_n(wal.ring_mut(), e, 2, 50, |_| 200);
    wal.ring().mark_acked(49);
    std::process::abort();
}

/// Issue 11, item 1: removing a data directory frees its ring at the next
/// open of any wal in the same ring dir; the rings of live data directories
/// stay, and so does a ring a process holds open even when its data
/// directory is gone. A directory wiped and reused gets a new ring and the
/// old one goes.
#[test]
fn removed_data_dirs_lose_their_rings_and_live_ones_keep_theirs() {
    let dir = tempdir();
    let ring_dir = ring_dir_of(dir.path());
    let data = |name: &str| dir.root().join(name);
    let open_at = |name: &str| Wal::open(&data(name), &ring_dir, &config(1)).unwrap();
    let (a, b) = (open_at("a"), open_at("b"));
    let (ring_a, ring_b) = (a.ring_path().to_path_buf(), b.ring_path().to_path_buf());
    drop((a, b));
    let held = open_at("held");
    let ring_held = held.ring_path().to_path_buf();

    std::fs::remove_dir_all(data("a")).unwrap();
    std::fs::remove_dir_all(data("held")).unwrap();
    let c = open_at("c");
    assert!(
        !ring_a.exists(),
        "the ring of a removed data dir is deleted"
    );
    assert!(!ring_a.with_extension("owner").exists());
    assert!(ring_b.exists(), "a live data dir keeps its ring");
    assert!(ring_held.exists(), "a ring held open is never deleted");
    assert!(c.ring_path().exists());
    drop(held);
    assert_eq!(collect_garbage(&ring_dir), [ring_held]);

    // Wiped and reused: a new ring, and the old one goes at the next open.
    std::fs::remove_dir_all(data("b")).unwrap();
    std::fs::create_dir(data("b")).unwrap();
    let b = open_at("b");
    assert!(b.recovery().created);
    assert_ne!(b.ring_path(), ring_b);
    assert!(
        !ring_b.exists(),
        "the old ring of a reused data dir is deleted"
    );
    assert!(c.ring_path().exists());

    // The explicit way: `remove` takes the ring with the directory.
    let ring_c = c.ring_path().to_path_buf();
    drop(c);
    let removed = ringraft_wal::remove(&data("c")).unwrap();
    assert_eq!(removed.ring, Some(ring_c.clone()));
    assert!(!ring_c.exists() && !data("c").exists());
    assert!(b.ring_path().exists());
    let mut left = files_in(&ring_dir);
    left.retain(|n| {
        !b.ring_path()
            .to_str()
            .unwrap()
            .contains(n.trim_end_matches(".owner"))
    });
    assert!(
        left.is_empty(),
        "only b's ring and owner are left: {left:?}"
    );
}

/// Issue 11, item 1: a data directory that is moved keeps its ring: the
/// next open binds the ring to the new path, and the sweep of another open
/// leaves it.
#[test]
fn a_moved_data_dir_keeps_its_ring() {
    let dir = tempdir();
    let ring_dir = ring_dir_of(dir.path());
    let e = epoch(1, 1);
    {
        let mut wal = open_fenced(dir.path(), e);
        append_n(wal.ring_mut(), e, 1, 5, |_| 64);
    }
    let moved = dir.root().join("moved");
    std::fs::rename(dir.path(), &moved).unwrap();
    let wal = Wal::open(&moved, &ring_dir, &config(1)).unwrap();
    assert_eq!(wal.recovery().entries, 5);
    drop(wal);
    drop(Wal::open(&dir.root().join("other"), &ring_dir, &config(2)).unwrap());
    assert_eq!(
        Wal::open(&moved, &ring_dir, &config(1))
            .unwrap()
            .recovery()
            .entries,
        5
    );
}

/// Writes a log with a purge point, a fence and a vote, then "reboots":
/// the ring dir is emptied. Returns the incarnation the lost ring had.
fn reboot_after(dir: &Path, vote: VoteRecord, fence: Epoch) -> u64 {
    let incarnation = {
        let mut wal = open_fenced(dir, fence);
        append_n(wal.ring_mut(), fence, fence.term(), 20, |_| 100);
        wal.ring_mut().sync_and_ack(19).unwrap();
        assert!(
            wal.purge(LogPos {
                term: fence.term(),
                index: 9
            })
            .unwrap()
        );
        wal.save_vote(vote).unwrap();
        wal.recovery().incarnation
    };
    let ring_dir = ring_dir_of(dir);
    std::fs::remove_dir_all(&ring_dir).unwrap();
    std::fs::create_dir(&ring_dir).unwrap();
    incarnation
}

/// Issue 11, item 1: a ring that a reboot cleared is recreated, empty,
/// anchored at the metadata file's purge point, with its fence rebuilt from
/// the durable vote (the vote's leader's epoch when committed, the vote's
/// term alone when not), never below the vote's term, and an incarnation
/// above every one the lost ring had. `wal check` says the ring is gone
/// before, and reads the new one after.
#[test]
fn a_ring_lost_in_a_reboot_is_recreated_with_the_fence_of_the_vote() {
    let cases = [
        (
            VoteRecord {
                term: 5,
                voted_for: Some(2),
                committed: true,
            },
            epoch(3, 2),
            epoch(5, 2),
        ),
        (
            VoteRecord {
                term: 7,
                voted_for: Some(3),
                committed: false,
            },
            epoch(4, 3),
            epoch(7, 0),
        ),
        // The fence was above the vote (a leader fenced this node before it
        // saved that leader's vote): never below the vote's term.
        (
            VoteRecord {
                term: 4,
                voted_for: Some(1),
                committed: true,
            },
            epoch(6, 2),
            epoch(4, 1),
        ),
    ];
    for (vote, fence, rebuilt) in cases {
        let dir = tempdir();
        let lost_incarnation = reboot_after(dir.path(), vote, fence);
        // The offline checker says the ring is gone and checks the
        // segments, which are the log now.
        match check(dir.path()) {
            Ok(report) => {
                assert!(!report.ring_present && !report.ring.exists(), "{report:?}");
                assert_eq!(report.dir, dir.path());
                assert!(report.segments.is_some(), "{report:?}");
            }
            other => panic!("check of a lost ring: {other:?}"),
        }
        let wal = open(dir.path());
        let recovery = *wal.recovery();
        assert!(recovery.ring_recreated && !recovery.created, "{recovery:?}");
        assert_eq!(recovery.fence, rebuilt, "{vote:?}");
        assert_eq!(wal.ring().fence(), rebuilt);
        assert!(recovery.fence.term() >= vote.term);
        assert_eq!(recovery.entries, 0);
        assert_eq!(recovery.first_index, 10);
        assert_eq!(
            recovery.last,
            Some(LogPos {
                term: fence.term(),
                index: 9
            })
        );
        assert_eq!(recovery.head_lsn, wal.meta().purged.unwrap().next_lsn);
        assert_eq!(recovery.tail_lsn, recovery.head_lsn);
        assert_eq!(recovery.damage, Damage::None);
        assert!(
            recovery.incarnation > lost_incarnation + 1,
            "{} must be above every incarnation of the lost ring ({lost_incarnation})",
            recovery.incarnation
        );
        assert_eq!(wal.meta().vote, Some(vote), "the vote is kept");
        drop(wal);
        // The new ring is a ring like any other: it reopens, and check reads it.
        let report = check(dir.path()).unwrap();
        assert_eq!(report.fence, rebuilt);
        assert_eq!(report.first_index, 10);
        let wal = open(dir.path());
        assert!(!wal.recovery().ring_recreated);
        assert_eq!(wal.ring().fence(), rebuilt);
    }
}

/// Issue 11, item 1: a lost ring is recreated only where the metadata file
/// is there to rebuild it from; a ring without its metadata file stays an
/// error, and a ring of another node stays foreign.
#[test]
fn a_ring_without_metadata_or_of_another_node_is_still_refused() {
    let dir = tempdir();
    drop(open(dir.path()));
    assert!(matches!(
        open_with(dir.path(), &config(2)),
        Err(WalError::Foreign { .. })
    ));
    std::fs::remove_file(dir.path().join(META_FILE)).unwrap();
    assert!(matches!(
        open_with(dir.path(), &config(1)),
        Err(WalError::Incomplete { .. })
    ));
    assert!(ring_path(dir.path()).exists(), "nothing was deleted");
}

/// Issue 11, item 1: the ring stays in the ring dir it was made in: opening
/// with another ring dir is an error that names both, until the operator
/// moves the ring there.
#[test]
fn a_ring_in_another_ring_dir_is_refused_until_moved() {
    let dir = tempdir();
    let e = epoch(1, 1);
    let old_ring = {
        let mut wal = open_fenced(dir.path(), e);
        append_n(wal.ring_mut(), e, 1, 3, |_| 10);
        wal.ring_path().to_path_buf()
    };
    let elsewhere = dir.root().join("elsewhere");
    let err = Wal::open(dir.path(), &elsewhere, &config(1)).unwrap_err();
    assert!(matches!(err, WalError::RingElsewhere { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains(old_ring.to_str().unwrap()) && text.contains("elsewhere"),
        "{text}"
    );
    let name = old_ring.file_name().unwrap();
    std::fs::rename(&old_ring, elsewhere.join(name)).unwrap();
    std::fs::rename(
        old_ring.with_extension("owner"),
        elsewhere.join(name).with_extension("owner"),
    )
    .unwrap();
    let wal = Wal::open(dir.path(), &elsewhere, &config(1)).unwrap();
    assert!(!wal.recovery().ring_recreated);
    assert_eq!(wal.recovery().entries, 3);
    assert_eq!(ring_path(dir.path()), canonical(&elsewhere).join(name));
}

/// Issue 11, item 1: a data directory of the layout before shared memory
/// (`<data dir>/ring`) has its ring moved into the ring dir at open, whole.
#[test]
fn an_old_layout_ring_is_moved_into_the_ring_dir() {
    let dir = tempdir();
    let e = epoch(1, 1);
    let ring = {
        let mut wal = open_fenced(dir.path(), e);
        append_n(wal.ring_mut(), e, 1, 7, |i| 30 + i as usize);
        wal.ring_mut().sync_and_ack(6).unwrap();
        wal.ring_path().to_path_buf()
    };
    // Make it look like an old data directory.
    std::fs::rename(&ring, dir.path().join("ring")).unwrap();
    std::fs::remove_file(ring.with_extension("owner")).unwrap();
    std::fs::remove_file(dir.path().join(LOCATION_FILE)).unwrap();
    assert_eq!(
        check(dir.path()).unwrap().entries,
        7,
        "check reads old layouts"
    );
    let wal = open(dir.path());
    assert_eq!(wal.recovery().entries, 7);
    assert_eq!(wal.recovery().acked, Some(6));
    assert_eq!(wal.ring().fence(), e);
    assert!(!dir.path().join("ring").exists());
    assert!(
        wal.ring_path()
            .starts_with(canonical(&ring_dir_of(dir.path())))
    );
    assert_eq!(
        files_in(dir.path()),
        [ringraft_wal::segment::SEGMENT_DIR, META_FILE, LOCATION_FILE],
        "the metadata file, the segment log and the ring's location: no ring"
    );
}

/// Unmounts a tmpfs when dropped.
struct Mount(PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let path = std::ffi::CString::new(self.0.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path.
        unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
    }
}

/// Mounts a tmpfs of `bytes` at `at`, or says why not.
fn mount_tmpfs(at: &Path, bytes: u64) -> Result<Mount, String> {
    // SAFETY: no arguments.
    if unsafe { libc::geteuid() } != 0 {
        return Err("not root".into());
    }
    std::fs::create_dir_all(at).unwrap();
    let c = |s: &str| std::ffi::CString::new(s).unwrap();
    let (source, target, fstype, data) = (
        c("tmpfs"),
        c(at.to_str().unwrap()),
        c("tmpfs"),
        c(&format!("size={bytes}")),
    );
    // SAFETY: NUL-terminated strings that outlive the call.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            data.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(format!("mount: {}", std::io::Error::last_os_error()));
    }
    Ok(Mount(at.to_path_buf()))
}

/// Issue 11, item 1: a ring dir too small for the ring (a container's
/// 64 MiB /dev/shm) is an error at open that names the directory, the bytes
/// needed and free, and how to fix it, not a SIGBUS later; nothing is left
/// behind, and a ring that fits opens in the same data directory after.
/// Needs root (a tmpfs of 2 MiB is mounted for it): skipped, loudly,
/// otherwise.
#[test]
fn a_ring_dir_too_small_is_a_clear_error() {
    let dir = tempdir();
    let ring_dir = dir.root().join("small-shm");
    let _mount = match mount_tmpfs(&ring_dir, 2 << 20) {
        Ok(mount) => mount,
        Err(why) => {
            eprintln!(
                "SKIPPED a_ring_dir_too_small_is_a_clear_error: cannot mount a tmpfs ({why})"
            );
            return;
        }
    };
    let big = RingConfig {
        capacity: 4 << 20,
        ..config(1)
    };
    let err = Wal::open(dir.path(), &ring_dir, &big).unwrap_err();
    let WalError::RingDirFull {
        dir: d,
        needed,
        free,
    } = &err
    else {
        panic!("{err}");
    };
    assert_eq!(*d, canonical(&ring_dir));
    assert_eq!(*needed, 4096 + (4 << 20));
    assert!(*free <= 2 << 20 && *free > 1 << 20, "free {free}");
    let text = err.to_string();
    for part in [
        ring_dir.to_str().unwrap(),
        &needed.to_string(),
        &free.to_string(),
        "--shm-size",
        "--ring-dir",
        "capacity",
    ] {
        assert!(text.contains(part), "`{part}` missing from: {text}");
    }
    let left: Vec<String> = files_in(&ring_dir)
        .into_iter()
        .filter(|n| n.ends_with(".ring"))
        .collect();
    assert!(left.is_empty(), "a failed ring is removed: {left:?}");
    // A ring that fits opens in the same data directory.
    let wal = Wal::open(dir.path(), &ring_dir, &config(1)).unwrap();
    assert!(wal.recovery().created);
}
