//! The disk observer (a simulation aid, `ringraft_wal::disk`): told before
//! and after every change the real disk makes, in order, and able to
//! refuse one, which then fails and changes nothing. (A test binary of its
//! own: the observer is process-wide.)

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use ringraft_wal::WalError;
use ringraft_wal::disk::{Disk, DiskFile, DiskObserver, DiskOp, RealDisk, install_observer};

static SEEN: Mutex<Vec<String>> = Mutex::new(Vec::new());
static REFUSE: AtomicBool = AtomicBool::new(false);

struct Recording;

fn describe(op: &DiskOp<'_>) -> String {
    let name = |p: &Path| {
        p.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    match op {
        DiskOp::Create { path } => format!("create {}", name(path)),
        DiskOp::Remove { path } => format!("remove {}", name(path)),
        DiskOp::SyncDir { .. } => "sync dir".to_string(),
        DiskOp::Write { file, offset, len } => {
            format!("write {} {offset}+{len}", name(file.path()))
        }
        DiskOp::SyncData { file } => format!("sync {}", name(file.path())),
        DiskOp::SetLen { file, len } => format!("set len {} {len}", name(file.path())),
        DiskOp::Preallocate { file, len } => format!("preallocate {} {len}", name(file.path())),
    }
}

impl DiskObserver for Recording {
    fn before(&self, op: DiskOp<'_>) -> std::io::Result<()> {
        if REFUSE.load(Ordering::SeqCst) {
            return Err(std::io::Error::other("refused"));
        }
        SEEN.lock()
            .unwrap()
            .push(format!("before {}", describe(&op)));
        Ok(())
    }

    fn after(&self, op: DiskOp<'_>) {
        SEEN.lock()
            .unwrap()
            .push(format!("after {}", describe(&op)));
    }
}

#[test]
fn the_observer_sees_every_change_and_may_refuse_one() {
    assert!(install_observer(Box::new(Recording)).is_ok());
    assert!(
        install_observer(Box::new(Recording)).is_err(),
        "one observer per process"
    );
    let dir = tempfile::tempdir().unwrap();
    let path: PathBuf = dir.path().join("seg");
    let file = RealDisk.create_new(&path).unwrap();
    file.preallocate(4096).unwrap();
    file.write_at(&[b"ab", b"cd"], 8).unwrap();
    file.sync_data().unwrap();
    file.set_len(16).unwrap();
    RealDisk.sync_dir(dir.path()).unwrap();
    let seen = std::mem::take(&mut *SEEN.lock().unwrap());
    assert_eq!(
        seen,
        [
            "before create seg",
            "after create seg",
            "before preallocate seg 4096",
            "after preallocate seg 4096",
            "before write seg 8+4",
            "after write seg 8+4",
            "before sync seg",
            "after sync seg",
            "before set len seg 16",
            "after set len seg 16",
            "before sync dir",
            "after sync dir",
        ]
    );

    // Refused: each change fails with the observer's error, and nothing
    // changed.
    REFUSE.store(true, Ordering::SeqCst);
    let write = file.write_at(&[b"xy"], 0).unwrap_err();
    assert!(matches!(write, WalError::Io { .. }), "{write:?}");
    assert!(file.sync_data().is_err());
    assert!(file.set_len(0).is_err());
    assert!(RealDisk.remove(&path).is_err());
    assert!(RealDisk.create_new(&dir.path().join("other")).is_err());
    REFUSE.store(false, Ordering::SeqCst);
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(bytes.len(), 16);
    assert_eq!(&bytes[8..12], b"abcd");
    assert_eq!(&bytes[..2], &[0, 0]);
    assert!(!dir.path().join("other").exists());
    assert!(
        SEEN.lock().unwrap().is_empty(),
        "refused changes have no after"
    );
    RealDisk.remove(&path).unwrap();
}
