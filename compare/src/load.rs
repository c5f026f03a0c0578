//! The closed-loop workload, the same for both systems.
//!
//! `clients` tasks each send one operation, wait for its answer, and send
//! the next, for the warm-up and then the measured time; only operations
//! that start after the warm-up are counted and timed (from just before the
//! call to its answer). One operation:
//! - ringraft: `Log.Append` of one record of `size` bytes, in a client
//!   session (`client_id`, consecutive `first_seq`), as `ringraft_client`
//!   and `ringraft bench` append: exactly-once, answered once committed and
//!   applied;
//! - etcd: `KV.Put` of a fresh key (`compare/<run>/<client>/<seq>`) with a
//!   value of `size` bytes, answered once committed and applied.
//!
//! Both go straight to the leader, found by asking every member for its
//! status (on both systems a follower would forward the write to the
//! leader: that hop is not what is compared). The clients share
//! `connections` gRPC connections to it round-robin (client `k` uses
//! connection `k % connections`), the same for both systems.
//!
//! A failed or timed-out operation counts as an error, is not timed, and
//! the client goes on (a ringraft client starts a new session, as
//! `ringraft_client` does after a failed append).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tonic::Status;
use tonic::transport::{Channel, Endpoint};

use ringraft_client::proto::log_client::LogClient;
use ringraft_client::proto::{AppendRequest, StatusRequest as LogStatusRequest};

use crate::args::LoadConfig;
use crate::etcd_proto::kv_client::KvClient;
use crate::etcd_proto::maintenance_client::MaintenanceClient;
use crate::etcd_proto::{PutRequest, StatusRequest as EtcdStatusRequest};
use crate::report::{RunResult, System, new_histogram, to_buckets};

/// Time one status or probe call gets while waiting for a leader.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Pause between two looks for a leader.
const PROBE_PERIOD: Duration = Duration::from_millis(200);
/// Pause after a failed operation, so that a dead cluster is not spun on.
const ERROR_PAUSE: Duration = Duration::from_millis(10);
/// Largest gRPC message either side may send (a 1 MiB record and more).
const MAX_MESSAGE_BYTES: usize = 4 << 20;

/// Why a run could not take place.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// No leader accepting writes within the bound.
    #[error(
        "the {system} cluster at {endpoints} did not come up within {waited:?} (a leader all members agree on, accepting a write): {last}"
    )]
    NotReady {
        /// The system.
        system: System,
        /// The endpoints, comma-separated.
        endpoints: String,
        /// The bound.
        waited: Duration,
        /// What the last attempt saw.
        last: String,
    },
    /// A connection to the leader could not be opened.
    #[error("connecting to {endpoint}: {reason}")]
    Connect {
        /// The endpoint.
        endpoint: String,
        /// Why.
        reason: String,
    },
}

async fn connect(addr: &str) -> Result<Channel, String> {
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| format!("bad endpoint {addr}: {e}"))?
        .connect_timeout(PROBE_TIMEOUT)
        .tcp_nodelay(true);
    tokio::time::timeout(PROBE_TIMEOUT, endpoint.connect())
        .await
        .map_err(|_| format!("{addr}: connect timed out"))?
        .map_err(|e| format!("{addr}: {e}"))
}

async fn bounded<T>(
    what: &str,
    call: impl std::future::Future<Output = Result<tonic::Response<T>, Status>>,
) -> Result<T, String> {
    match tokio::time::timeout(PROBE_TIMEOUT, call).await {
        Ok(Ok(r)) => Ok(r.into_inner()),
        Ok(Err(s)) => Err(format!("{what}: {} {}", s.code(), s.message())),
        Err(_) => Err(format!("{what}: no answer within {PROBE_TIMEOUT:?}")),
    }
}

/// The index of the leader among `endpoints` if every member answers and
/// names it, and it accepts a write; otherwise what was seen.
async fn look_for_leader(system: System, endpoints: &[String]) -> Result<usize, String> {
    // (this member's id, the leader it names, whether it says it leads)
    let mut seen = Vec::with_capacity(endpoints.len());
    for addr in endpoints {
        let channel = connect(addr).await?;
        let status = match system {
            System::Etcd => {
                let s = bounded(
                    &format!("{addr} status"),
                    MaintenanceClient::new(channel).status(EtcdStatusRequest {}),
                )
                .await?;
                let id = s.header.map(|h| h.member_id).unwrap_or(0);
                (id, s.leader, id != 0 && id == s.leader)
            }
            System::Ringraft => {
                let s = bounded(
                    &format!("{addr} status"),
                    LogClient::new(channel)
                        .status(ringraft_client::api_request(LogStatusRequest {})),
                )
                .await?;
                if s.members.iter().filter(|m| m.voter).count() != endpoints.len() {
                    return Err(format!(
                        "{addr} knows {} voters, not {}",
                        s.members.iter().filter(|m| m.voter).count(),
                        endpoints.len()
                    ));
                }
                (s.id, s.leader_id, s.state == "Leader")
            }
        };
        seen.push(status);
    }
    let leaders: Vec<usize> = (0..seen.len()).filter(|&k| seen[k].2).collect();
    let [leader] = leaders[..] else {
        return Err(format!(
            "{} members say they lead (member id, leader named): {:?}",
            leaders.len(),
            seen.iter().map(|s| (s.0, s.1)).collect::<Vec<_>>()
        ));
    };
    if let Some(k) = (0..seen.len()).find(|&k| seen[k].1 != seen[leader].0) {
        return Err(format!(
            "{} names leader {}, {} says it leads",
            endpoints[k], seen[k].1, endpoints[leader]
        ));
    }
    let channel = connect(&endpoints[leader]).await?;
    let addr = &endpoints[leader];
    match system {
        System::Etcd => {
            bounded(
                &format!("{addr} probe put"),
                KvClient::new(channel).put(PutRequest {
                    key: b"compare/ready".to_vec(),
                    value: b"1".to_vec(),
                    lease: 0,
                }),
            )
            .await?;
        }
        System::Ringraft => {
            bounded(
                &format!("{addr} probe append"),
                LogClient::new(channel).append(ringraft_client::api_request(AppendRequest {
                    client_id: 0,
                    first_seq: 0,
                    records: vec![b"compare ready".to_vec()],
                })),
            )
            .await?;
        }
    }
    Ok(leader)
}

/// Waits (at most `ready_timeout`) until the cluster has a leader that
/// every member names and that accepts a write; returns its endpoint.
///
/// # Errors
/// [`LoadError::NotReady`] with what the last attempt saw.
pub async fn wait_for_leader(
    system: System,
    endpoints: &[String],
    ready_timeout: Duration,
) -> Result<String, LoadError> {
    let deadline = Instant::now() + ready_timeout;
    let mut last = String::from("no look at the members finished");
    loop {
        match tokio::time::timeout_at(deadline, look_for_leader(system, endpoints)).await {
            Ok(Ok(k)) => return Ok(endpoints[k].clone()),
            Ok(Err(e)) => last = e,
            Err(_) => last += " (then a look was cut short by the bound)",
        }
        if Instant::now() + PROBE_PERIOD >= deadline {
            return Err(LoadError::NotReady {
                system,
                endpoints: endpoints.join(","),
                waited: ready_timeout,
                last,
            });
        }
        tokio::time::sleep(PROBE_PERIOD).await;
    }
}

/// One client's connection to the leader.
#[derive(Clone)]
enum Conn {
    Etcd(KvClient<Channel>),
    Ringraft(LogClient<Channel>),
}

/// What one client measured.
struct ClientTally {
    latency: hdrhistogram::Histogram<u64>,
    ops: u64,
    errors: u64,
    first_error: Option<String>,
    /// When its last counted operation ended.
    last_done: Option<Instant>,
}

struct Plan {
    run_tag: u32,
    size: usize,
    measure_from: Instant,
    end: Instant,
    op_timeout: Duration,
}

async fn client_loop(number: usize, mut conn: Conn, plan: Arc<Plan>) -> ClientTally {
    let mut tally = ClientTally {
        latency: new_histogram(),
        ops: 0,
        errors: 0,
        first_error: None,
        last_done: None,
    };
    let payload = vec![b'r'; plan.size];
    let mut session = rand::random::<u64>() | 1;
    let mut next_seq: u64 = 1;
    let mut key_seq: u64 = 0;
    loop {
        let started = Instant::now();
        if started >= plan.end {
            return tally;
        }
        let call = async {
            match &mut conn {
                Conn::Etcd(kv) => {
                    key_seq += 1;
                    let key = format!("compare/{:08x}/{number}/{key_seq}", plan.run_tag);
                    kv.put(PutRequest {
                        key: key.into_bytes(),
                        value: payload.clone(),
                        lease: 0,
                    })
                    .await
                    .map(|_| ())
                }
                Conn::Ringraft(log) => {
                    let answer = log
                        .append(ringraft_client::api_request(AppendRequest {
                            client_id: session,
                            first_seq: next_seq,
                            records: vec![payload.clone()],
                        }))
                        .await?
                        .into_inner();
                    if answer.indexes.len() != 1 {
                        return Err(Status::internal(format!(
                            "an append of one record was answered with {} indexes",
                            answer.indexes.len()
                        )));
                    }
                    Ok(())
                }
            }
        };
        let result = match tokio::time::timeout(plan.op_timeout, call).await {
            Ok(r) => r.map_err(|s| format!("{}: {}", s.code(), s.message())),
            Err(_) => Err(format!("no answer within {:?}", plan.op_timeout)),
        };
        let done = Instant::now();
        let counted = started >= plan.measure_from;
        match result {
            Ok(()) => {
                next_seq += 1;
                if counted {
                    tally.ops += 1;
                    let ns = u64::try_from((done - started).as_nanos()).unwrap_or(u64::MAX);
                    tally.latency.saturating_record(ns.max(1));
                    tally.last_done = Some(done);
                }
            }
            Err(e) => {
                // As ringraft_client does: the failed append may still land,
                // so this session's next seqs could be refused; start anew.
                session = rand::random::<u64>() | 1;
                next_seq = 1;
                if counted {
                    tally.errors += 1;
                    tally.last_done = Some(done);
                    tally.first_error.get_or_insert(e);
                }
                tokio::time::sleep(ERROR_PAUSE).await;
            }
        }
    }
}

/// Runs the workload of `config` against its cluster (see the module docs).
///
/// # Errors
/// [`LoadError`] when no leader comes up or the leader cannot be reached.
/// Failed operations are counted in the result, not returned as errors.
pub async fn run(config: &LoadConfig) -> Result<RunResult, LoadError> {
    let leader = wait_for_leader(config.system, &config.endpoints, config.ready_timeout).await?;
    let mut conns = Vec::with_capacity(config.connections);
    for _ in 0..config.connections {
        let channel = connect(&leader)
            .await
            .map_err(|reason| LoadError::Connect {
                endpoint: leader.clone(),
                reason,
            })?;
        conns.push(match config.system {
            System::Etcd => Conn::Etcd(
                KvClient::new(channel)
                    .max_decoding_message_size(MAX_MESSAGE_BYTES)
                    .max_encoding_message_size(MAX_MESSAGE_BYTES),
            ),
            System::Ringraft => Conn::Ringraft(
                LogClient::new(channel)
                    .max_decoding_message_size(MAX_MESSAGE_BYTES)
                    .max_encoding_message_size(MAX_MESSAGE_BYTES),
            ),
        });
    }
    let start = Instant::now();
    let plan = Arc::new(Plan {
        run_tag: rand::random::<u32>(),
        size: config.size,
        measure_from: start + config.warmup,
        end: start + config.warmup + config.duration,
        op_timeout: config.op_timeout,
    });
    let tasks: Vec<_> = (0..config.clients)
        .map(|k| tokio::spawn(client_loop(k, conns[k % conns.len()].clone(), plan.clone())))
        .collect();
    let mut latency = new_histogram();
    let (mut ops, mut errors, mut first_error, mut last_done) = (0, 0, None, plan.end);
    for task in tasks {
        let tally = task.await.expect("a client task never panics");
        latency
            .add(&tally.latency)
            .expect("histograms of the same bounds add");
        ops += tally.ops;
        errors += tally.errors;
        if first_error.is_none() {
            first_error = tally.first_error;
        }
        if let Some(done) = tally.last_done {
            last_done = last_done.max(done);
        }
    }
    Ok(RunResult {
        system: config.system,
        durability: config.durability,
        round: config.round,
        clients: config.clients,
        size_bytes: config.size,
        connections: config.connections,
        measured_s: (last_done - plan.measure_from).as_secs_f64(),
        ops,
        errors,
        first_error,
        latency_ns: to_buckets(&latency),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cluster that never answers is reported as not ready, with what
    /// was seen, instead of hanging or panicking.
    #[tokio::test]
    async fn a_cluster_that_never_answers_is_not_ready() {
        // Nothing listens on port 1 of loopback: every connect is refused.
        let endpoints = vec!["127.0.0.1:1".to_string()];
        for system in [System::Etcd, System::Ringraft] {
            let err = wait_for_leader(system, &endpoints, Duration::from_secs(1))
                .await
                .unwrap_err();
            let LoadError::NotReady {
                system: s, last, ..
            } = &err
            else {
                panic!("{err}");
            };
            assert_eq!(*s, system);
            assert!(last.contains("127.0.0.1:1"), "{err}");
        }
    }
}
