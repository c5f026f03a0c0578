//! A small replicated key-value store built on ringraft's embedding API.
//!
//! Three nodes in one process, on the software fabric over loopback TCP:
//!
//! ```text
//! cargo run -p ringraft --example kv -- demo
//! ```
//!
//! One node per process (run three, in three terminals; `--bootstrap` on
//! one of them), commands on stdin (`set KEY VALUE`, `get KEY`, `status`):
//!
//! ```text
//! cargo run -p ringraft --example kv -- node --id 1 --listen 127.0.0.1:7101 \
//!     --peers 1=127.0.0.1:7101,2=127.0.0.1:7102,3=127.0.0.1:7103 --data-dir /tmp/kv1 --bootstrap
//! cargo run -p ringraft --example kv -- node --id 2 --listen 127.0.0.1:7102 \
//!     --peers 1=127.0.0.1:7101,2=127.0.0.1:7102,3=127.0.0.1:7103 --data-dir /tmp/kv2
//! cargo run -p ringraft --example kv -- node --id 3 --listen 127.0.0.1:7103 \
//!     --peers 1=127.0.0.1:7101,2=127.0.0.1:7102,3=127.0.0.1:7103 --data-dir /tmp/kv3
//! ```
//!
//! `set` must reach the leader (a follower says which node leads); `get` is
//! linearizable on the leader and stale on followers.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use ringraft::{
    Applied, Fabric, Node, NodeBuilder, NodeConfig, NodeError, ReadConsistency, StateMachine,
};
use ringraft_testkit::leader::{NodeView, Observe, Wanted, wait_for_leader};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncBufReadExt;

const SECRET: &[u8] = b"example kv cluster secret (16+ B)";

/// The state: a map, and the commands are `set` operations.
#[derive(Default, Serialize, Deserialize)]
struct Kv {
    map: HashMap<String, String>,
}

#[derive(Serialize, Deserialize)]
struct Set {
    key: String,
    value: String,
}

impl StateMachine for Kv {
    fn apply(&mut self, batch: &[Applied<'_>]) -> Vec<Vec<u8>> {
        batch
            .iter()
            .map(|a| {
                match bincode::serde::decode_from_slice::<Set, _>(
                    a.data,
                    bincode::config::standard(),
                ) {
                    Ok((set, _)) => {
                        let old = self.map.insert(set.key, set.value);
                        old.unwrap_or_default().into_bytes()
                    }
                    // A command this version cannot read is answered, not
                    // applied: never panic on log contents.
                    Err(e) => format!("error: {e}").into_bytes(),
                }
            })
            .collect()
    }
    fn snapshot(&self) -> Vec<u8> {
        bincode::serde::encode_to_vec(self, bincode::config::standard()).expect("a map encodes")
    }
    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String> {
        *self = bincode::serde::decode_from_slice(snapshot, bincode::config::standard())
            .map_err(|e| e.to_string())?
            .0;
        Ok(())
    }
}

async fn start(
    id: u64,
    listen: &str,
    peers: &BTreeMap<u64, String>,
    dir: &std::path::Path,
    ring_dir: &std::path::Path,
) -> Result<Node, NodeError> {
    let mut config = NodeConfig::new(id, dir, listen);
    config.ring_dir = ring_dir.to_path_buf();
    config.peers = peers.clone();
    config.ring_capacity = 16 << 20;
    config.lock_memory = false;
    NodeBuilder::new(config)
        .fabric(Fabric::Tcp)
        .secret(SECRET.to_vec())
        .state_machine(Kv::default())
        .start()
        .await
}

async fn set(node: &Node, key: &str, value: &str) -> Result<u64, NodeError> {
    let cmd = bincode::serde::encode_to_vec(
        Set {
            key: key.into(),
            value: value.into(),
        },
        bincode::config::standard(),
    )
    .expect("encodes");
    // A leader that was just elected may not be ready for a moment.
    for _ in 0..50 {
        match node.propose(cmd.clone()).await {
            Err(NodeError::NotLeader { leader_id, .. })
                if leader_id.is_none() || leader_id == Some(node.id()) =>
            {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            other => return other.map(|(index, _)| index),
        }
    }
    node.propose(cmd).await.map(|(index, _)| index)
}

async fn get(
    node: &Node,
    key: &str,
    consistency: ReadConsistency,
) -> Result<Option<String>, NodeError> {
    let snapshot = node.read(consistency, |sm| sm.snapshot()).await?;
    let kv: Kv = bincode::serde::decode_from_slice(&snapshot, bincode::config::standard())
        .map_err(|e| NodeError::Raft(e.to_string()))?
        .0;
    Ok(kv.map.get(key).cloned())
}

/// The nodes of the demo, for the test kit's leader wait.
struct Nodes<'a>(&'a BTreeMap<u64, Node>);

impl Observe for Nodes<'_> {
    fn running(&self) -> Vec<u64> {
        self.0.keys().copied().collect()
    }
    async fn view(&self, id: u64) -> Option<NodeView> {
        let s = self.0.get(&id)?.status();
        Some(NodeView {
            id,
            term: s.term,
            leader: s.leader_id,
            is_leader: s.state == "Leader",
        })
    }
}

/// The leader the nodes agree on (waits as long as it takes).
async fn leader_of(nodes: &BTreeMap<u64, Node>) -> u64 {
    let wanted = Wanted::any(Duration::from_millis(20));
    match wait_for_leader(&Nodes(nodes), &wanted, Duration::MAX).await {
        Ok(leader) => leader.id,
        Err(e) => unreachable!("an unbounded wait ended: {e}"),
    }
}

async fn demo() -> Result<(), NodeError> {
    let base = tempfile::tempdir().map_err(|e| NodeError::Storage(e.to_string()))?;
    let peers: BTreeMap<u64, String> = (1..=3)
        .map(|id| Ok((id, ringraft_testkit::ports::loopback_addr()?)))
        .collect::<std::io::Result<_>>()
        .map_err(|e| NodeError::Storage(format!("no free loopback port: {e}")))?;
    let mut nodes = BTreeMap::new();
    for (id, addr) in &peers {
        nodes.insert(
            *id,
            // The rings go with the temporary directory (a node's default
            // ring dir is /dev/shm).
            start(
                *id,
                addr,
                &peers,
                &base.path().join(format!("n{id}")),
                &base.path().join("shm"),
            )
            .await?,
        );
    }
    nodes[&1].initialize().await?;
    let leader = leader_of(&nodes).await;
    println!("leader: node {leader}");
    for (k, v) in [
        ("apple", "red"),
        ("banana", "yellow"),
        ("cherry", "dark red"),
    ] {
        let index = set(&nodes[&leader], k, v).await?;
        println!("set {k}={v} at index {index}");
    }
    println!(
        "get banana (linearizable) = {:?}",
        get(&nodes[&leader], "banana", ReadConsistency::Linearizable).await?
    );
    let old = nodes.remove(&leader).expect("leader");
    old.shutdown().await;
    println!("stopped the leader (node {leader})");
    let leader = leader_of(&nodes).await;
    println!("new leader: node {leader}");
    set(&nodes[&leader], "apple", "green").await?;
    for key in ["apple", "banana", "cherry"] {
        println!(
            "get {key} = {:?}",
            get(&nodes[&leader], key, ReadConsistency::Linearizable).await?
        );
    }
    for n in nodes.values() {
        n.shutdown().await;
    }
    Ok(())
}

fn parse_peers(s: &str) -> Result<BTreeMap<u64, String>, String> {
    s.split(',')
        .map(|p| {
            let (id, addr) = p
                .split_once('=')
                .ok_or_else(|| format!("peer {p}: expected id=host:port"))?;
            Ok((
                id.parse().map_err(|e| format!("peer id {id}: {e}"))?,
                addr.to_string(),
            ))
        })
        .collect()
}

async fn node(args: &[String]) -> Result<(), String> {
    let mut id = None;
    let mut listen = None;
    let mut peers = None;
    let mut dir = None;
    let mut bootstrap = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{a} needs a value"))
        };
        match a.as_str() {
            "--id" => id = Some(value()?.parse::<u64>().map_err(|e| e.to_string())?),
            "--listen" => listen = Some(value()?),
            "--peers" => peers = Some(parse_peers(&value()?)?),
            "--data-dir" => dir = Some(value()?),
            "--bootstrap" => bootstrap = true,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    let (id, listen, peers, dir) = (
        id.ok_or("--id is required")?,
        listen.ok_or("--listen is required")?,
        peers.ok_or("--peers is required")?,
        dir.ok_or("--data-dir is required")?,
    );
    let ring_dir = std::path::Path::new(ringraft_wal::DEFAULT_RING_DIR);
    let node = start(id, &listen, &peers, std::path::Path::new(&dir), ring_dir)
        .await
        .map_err(|e| e.to_string())?;
    if bootstrap {
        node.initialize().await.map_err(|e| e.to_string())?;
    }
    println!("node {id} listening on {listen}; commands: set KEY VALUE | get KEY | status");
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["set", key, value @ ..] => match set(&node, key, &value.join(" ")).await {
                Ok(index) => println!("ok {index}"),
                Err(e) => println!("error: {e}"),
            },
            ["get", key] => {
                let consistency = if node.status().state == "Leader" {
                    ReadConsistency::Linearizable
                } else {
                    ReadConsistency::Stale
                };
                match get(&node, key, consistency).await {
                    Ok(v) => println!("{}", v.unwrap_or_else(|| "(none)".into())),
                    Err(e) => println!("error: {e}"),
                }
            }
            ["status"] => println!("{:?}", node.status()),
            [] => {}
            _ => println!("commands: set KEY VALUE | get KEY | status"),
        }
    }
    node.shutdown().await;
    Ok(())
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("demo") | None => demo().await.map_err(|e| e.to_string()),
        Some("node") => node(&args[1..]).await,
        Some(other) => Err(format!("unknown mode {other}: demo | node ...")),
    };
    if let Err(e) = result {
        eprintln!("kv: {e}");
        std::process::exit(1);
    }
}
