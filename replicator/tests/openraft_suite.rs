//! openraft's own storage test suite against the ring-backed log store.

use std::sync::Arc;

use openraft::StorageError;
use openraft::testing::log::{StoreBuilder, Suite};
use ringraft::{Applied, Durability, LocalGuard, LogStore, SmStore, StateMachine, TypeConfig};
use ringraft_wal::{RingConfig, Wal};

/// Answers each command with its own bytes; snapshots are the applied count.
#[derive(Default)]
struct Echo {
    applied: u64,
}

impl StateMachine for Echo {
    fn apply(&mut self, batch: &[Applied<'_>]) -> Vec<Vec<u8>> {
        self.applied += batch.len() as u64;
        batch.iter().map(|a| a.data.to_vec()).collect()
    }
    fn snapshot(&self) -> Vec<u8> {
        self.applied.to_le_bytes().to_vec()
    }
    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String> {
        self.applied = u64::from_le_bytes(snapshot.try_into().map_err(|_| "bad snapshot")?);
        Ok(())
    }
}

struct Builder {
    durability: Durability,
}

impl StoreBuilder<TypeConfig, LogStore, SmStore, tempfile::TempDir> for Builder {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, LogStore, SmStore), StorageError<TypeConfig>> {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = RingConfig {
            capacity: 1 << 20,
            max_record_bytes: 64 << 10,
            cluster_id: 1,
            node_id: 0,
            lock_memory: false,
        };
        // The ring goes with the temporary directory, not into /dev/shm.
        let wal =
            Wal::open(&dir.path().join("data"), &dir.path().join("shm"), &config).expect("wal");
        let guard = Arc::new(LocalGuard::default());
        let store = LogStore::new(wal, 0, self.durability, guard.clone());
        guard.bind(&store);
        let sm = SmStore::open(Box::new(Echo::default()), Some(dir.path())).expect("sm");
        Ok((dir, store, sm))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ring_log_store_passes_openraft_suite_in_memory_mode() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    Suite::test_all(Builder {
        durability: Durability::Memory,
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ring_log_store_passes_openraft_suite_in_fsync_mode() {
    Suite::test_all(Builder {
        durability: Durability::Fsync,
    })
    .await
    .unwrap();
}
