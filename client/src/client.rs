//! A client that tries a list of endpoints in turn, with a timeout per
//! endpoint so that a paused or unreachable node never hangs it, and appends
//! exactly once and in order across retries (a client session: every record
//! carries `(client_id, seq)`, seqs consecutive from 1, and a retry reuses
//! them; the cluster applies a session's records in seq order).

use std::collections::HashMap;
use std::time::Duration;

use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use crate::api_request;
use crate::proto::log_client::LogClient;
use crate::proto::{
    AddLearnerRequest, AppendRequest, Consistency, FollowRequest, Member, MembersRequest,
    PromoteRequest, ReadRequest, Record, RemoveRequest, StatusRequest, StatusResponse,
    TransferLeaderRequest, TrimRequest,
};

/// Largest message the client sends or accepts (the daemon's limit too).
pub const MAX_MESSAGE_BYTES: usize = 64 << 20;

/// The pause after the first round of endpoints that all failed, doubled
/// after each further round up to [`MAX_BACKOFF`]. Short: a node that
/// cannot reach the leader holds a forwarded call until a new one is known
/// (a failover takes tens of milliseconds), so a round fails only while no
/// node at all can answer, and a long first pause would be added whole to
/// the client's wait.
const FIRST_BACKOFF: Duration = Duration::from_millis(5);
/// The longest pause between rounds.
const MAX_BACKOFF: Duration = Duration::from_millis(250);

/// Bytes of an Append request besides its records, at most: `client_id`
/// and `first_seq`, a tag and a varint of up to 10 bytes each.
const APPEND_FIXED_BYTES: usize = 2 * (1 + 10);

/// The largest total of [`append_record_bytes`] that one Append request can
/// carry within [`MAX_MESSAGE_BYTES`].
pub const MAX_APPEND_RECORDS_BYTES: usize = MAX_MESSAGE_BYTES - APPEND_FIXED_BYTES;

/// The largest record one Append request can carry at all (alone). Nodes
/// refuse records above their `--max-record` too, which is usually far
/// smaller.
pub const MAX_RECORD_BYTES: usize =
    MAX_APPEND_RECORDS_BYTES - 1 - varint_bytes(MAX_APPEND_RECORDS_BYTES);

const _: () = assert!(append_record_bytes(MAX_RECORD_BYTES) <= MAX_APPEND_RECORDS_BYTES);

/// Bytes of `value` as a protobuf varint.
const fn varint_bytes(value: usize) -> usize {
    let mut bytes = 1;
    let mut rest = value >> 7;
    while rest > 0 {
        bytes += 1;
        rest >>= 7;
    }
    bytes
}

/// Bytes a record of `record_len` bytes takes in an Append request on the
/// wire (tag, length, bytes).
pub const fn append_record_bytes(record_len: usize) -> usize {
    1 + varint_bytes(record_len) + record_len
}

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No endpoint answered within the deadline.
    #[error("no endpoint answered ({tried} tried): {last}")]
    Unavailable {
        /// How many endpoints were tried.
        tried: usize,
        /// The last error seen.
        last: String,
    },
    /// A node answered and refused the request; retrying will not help.
    #[error("{0}")]
    Refused(Status),
    /// An endpoint address cannot be used.
    #[error("bad endpoint {0}: {1}")]
    Endpoint(String, String),
    /// The request is larger than the client API's message limit: no node
    /// can accept it, so it was not sent (nor retried).
    #[error(
        "an append of {records} record(s) takes {bytes} bytes, above the client API's message limit of {limit} bytes; no node accepts it: append fewer or smaller records (nodes also refuse records above their --max-record)"
    )]
    TooLarge {
        /// Records in the request.
        records: usize,
        /// The request's encoded size.
        bytes: usize,
        /// [`MAX_MESSAGE_BYTES`].
        limit: usize,
    },
}

/// Whether an error is worth trying again (elsewhere, or later). Errors
/// that the same request would meet again (invalid argument, a message
/// above a size limit: `OutOfRange`, ...) are not.
pub fn retryable(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable
            | Code::DeadlineExceeded
            | Code::Unknown
            | Code::Aborted
            | Code::Cancelled
            | Code::Internal
    )
}

/// A client of a ringraft cluster. See the module docs.
pub struct Client {
    endpoints: Vec<String>,
    per_endpoint: Duration,
    deadline: Duration,
    preferred: usize,
    channels: HashMap<usize, LogClient<Channel>>,
    client_id: u64,
    next_seq: u64,
    /// Attempts that failed in a way worth retrying (counted for `bench`).
    retries: u64,
}

impl Client {
    /// A client of `endpoints` (`host:port`), giving each endpoint at most
    /// `per_endpoint` per attempt; an operation gives up after 60 s.
    pub fn new(endpoints: Vec<String>, per_endpoint: Duration) -> Client {
        Client {
            endpoints,
            per_endpoint,
            deadline: Duration::from_secs(60),
            preferred: 0,
            channels: HashMap::new(),
            client_id: new_client_id(),
            next_seq: 1,
            retries: 0,
        }
    }

    /// Changes how long one operation may retry in all.
    pub fn with_deadline(mut self, deadline: Duration) -> Client {
        self.deadline = deadline;
        self
    }

    /// How many attempts so far failed in a way worth retrying (a timeout,
    /// an unreachable node, no leader) and were retried or given up on.
    pub fn retries(&self) -> u64 {
        self.retries
    }

    /// The endpoints.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    async fn channel(&mut self, k: usize) -> Result<LogClient<Channel>, Status> {
        if let Some(c) = self.channels.get(&k) {
            return Ok(c.clone());
        }
        let addr = &self.endpoints[k];
        let endpoint = Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| Status::invalid_argument(format!("endpoint {addr}: {e}")))?
            .connect_timeout(self.per_endpoint);
        let channel = tokio::time::timeout(self.per_endpoint, endpoint.connect())
            .await
            .map_err(|_| Status::unavailable(format!("{addr}: connect timed out")))?
            .map_err(|e| Status::unavailable(format!("{addr}: {e}")))?;
        let client = LogClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        self.channels.insert(k, client.clone());
        Ok(client)
    }

    /// Runs `call` against the endpoints in turn (starting with the one that
    /// answered last) until one succeeds, a node refuses, or the deadline.
    async fn with_retry<T, F, Fut>(&mut self, mut call: F) -> Result<T, ClientError>
    where
        F: FnMut(LogClient<Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<T, Status>>,
    {
        if self.endpoints.is_empty() {
            return Err(ClientError::Unavailable {
                tried: 0,
                last: "no endpoints".into(),
            });
        }
        let deadline = tokio::time::Instant::now() + self.deadline;
        let mut last = String::new();
        let mut tried = 0;
        let mut backoff = FIRST_BACKOFF;
        loop {
            for step in 0..self.endpoints.len() {
                let k = (self.preferred + step) % self.endpoints.len();
                tried += 1;
                let result = match self.channel(k).await {
                    Ok(client) => match tokio::time::timeout(self.per_endpoint, call(client)).await
                    {
                        Ok(r) => r,
                        Err(_) => Err(Status::deadline_exceeded(format!(
                            "{}: no answer within {:?}",
                            self.endpoints[k], self.per_endpoint
                        ))),
                    },
                    Err(e) => Err(e),
                };
                match result {
                    Ok(v) => {
                        self.preferred = k;
                        return Ok(v);
                    }
                    Err(status) if retryable(&status) => {
                        self.retries += 1;
                        // Forget the channel: the node may have restarted.
                        self.channels.remove(&k);
                        last = format!("{}: {}", self.endpoints[k], status.message());
                    }
                    Err(status) => return Err(ClientError::Refused(status)),
                }
            }
            if tokio::time::Instant::now() + backoff > deadline {
                return Err(ClientError::Unavailable { tried, last });
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// Appends `records` exactly once, retrying through leader changes and
    /// timeouts; returns each record's log index. The records get increasing
    /// indexes in their order, after those of this client's earlier appends.
    ///
    /// # Errors
    /// [`ClientError::TooLarge`] at once, without sending anything, when the
    /// request would exceed [`MAX_MESSAGE_BYTES`] (tonic would refuse to
    /// encode it, and the failure would look like a transport error worth
    /// retrying); the others as [`Client`]'s operations. When the append
    /// fails after it was sent, its records may or may not land in the log
    /// (later, even after the next appends); the client goes on in a new
    /// session, since the cluster would refuse the old session's next seqs
    /// as long as this append's are missing.
    pub async fn append(&mut self, records: Vec<Vec<u8>>) -> Result<Vec<u64>, ClientError> {
        let first_seq = self.next_seq;
        let client_id = self.client_id;
        let count = records.len() as u64;
        let request = AppendRequest {
            client_id,
            first_seq,
            records,
        };
        let bytes = prost::Message::encoded_len(&request);
        if bytes > MAX_MESSAGE_BYTES {
            return Err(ClientError::TooLarge {
                records: request.records.len(),
                bytes,
                limit: MAX_MESSAGE_BYTES,
            });
        }
        let records = request.records;
        let response = self
            .with_retry(|mut c| {
                let req = AppendRequest {
                    client_id,
                    first_seq,
                    records: records.clone(),
                };
                async move { c.append(api_request(req)).await.map(|r| r.into_inner()) }
            })
            .await;
        match response {
            Ok(response) => {
                self.next_seq += count;
                Ok(response.indexes)
            }
            Err(e) => {
                self.client_id = new_client_id();
                self.next_seq = 1;
                Err(e)
            }
        }
    }

    /// Reads committed records with index in `from..=to` (`to` 0: up to the
    /// last committed) from the first node that answers.
    pub async fn read(
        &mut self,
        from: u64,
        to: u64,
        consistency: Consistency,
    ) -> Result<Vec<Record>, ClientError> {
        self.with_retry(|mut c| async move {
            let mut stream = c
                .read(api_request(ReadRequest {
                    from,
                    to,
                    consistency: consistency as i32,
                }))
                .await?
                .into_inner();
            let mut out = Vec::new();
            while let Some(r) = stream.message().await? {
                out.push(r);
            }
            Ok(out)
        })
        .await
    }

    /// Follows the log from `from` on the first node that answers; the
    /// stream ends when that node fails (call again from the next index).
    pub async fn follow(&mut self, from: u64) -> Result<tonic::Streaming<Record>, ClientError> {
        self.with_retry(|mut c| async move {
            c.follow(api_request(FollowRequest { from }))
                .await
                .map(|r| r.into_inner())
        })
        .await
    }

    /// The status of the first node that answers.
    pub async fn status(&mut self) -> Result<StatusResponse, ClientError> {
        self.with_retry(|mut c| async move {
            c.status(api_request(StatusRequest {}))
                .await
                .map(|r| r.into_inner())
        })
        .await
    }

    /// The members.
    pub async fn members(&mut self) -> Result<Vec<Member>, ClientError> {
        self.with_retry(|mut c| async move {
            c.members(api_request(MembersRequest {}))
                .await
                .map(|r| r.into_inner().members)
        })
        .await
    }

    /// Adds a learner.
    pub async fn add_learner(&mut self, id: u64, addr: String) -> Result<Vec<Member>, ClientError> {
        self.with_retry(|mut c| {
            let addr = addr.clone();
            async move {
                c.add_learner(api_request(AddLearnerRequest { id, addr }))
                    .await
                    .map(|r| r.into_inner().members)
            }
        })
        .await
    }

    /// Promotes learners to voters.
    pub async fn promote(&mut self, ids: Vec<u64>) -> Result<Vec<Member>, ClientError> {
        self.with_retry(|mut c| {
            let ids = ids.clone();
            async move {
                c.promote(api_request(PromoteRequest { ids }))
                    .await
                    .map(|r| r.into_inner().members)
            }
        })
        .await
    }

    /// Removes members.
    pub async fn remove(&mut self, ids: Vec<u64>) -> Result<Vec<Member>, ClientError> {
        self.with_retry(|mut c| {
            let ids = ids.clone();
            async move {
                c.remove(api_request(RemoveRequest { ids }))
                    .await
                    .map(|r| r.into_inner().members)
            }
        })
        .await
    }

    /// Asks the leader to hand leadership to `to`.
    pub async fn transfer_leader(&mut self, to: u64) -> Result<(), ClientError> {
        self.with_retry(|mut c| async move {
            c.transfer_leader(api_request(TransferLeaderRequest { to }))
                .await
                .map(|_| ())
        })
        .await
    }

    /// Trims the log below `before` on every node; returns the first index
    /// kept (see the `Trim` call of `log.proto`).
    pub async fn trim(&mut self, before: u64) -> Result<u64, ClientError> {
        self.with_retry(|mut c| async move {
            c.trim(api_request(TrimRequest { before }))
                .await
                .map(|r| r.into_inner().first_index)
        })
        .await
    }
}

/// A fresh session's client id (never 0, which means "no session").
fn new_client_id() -> u64 {
    rand::random::<u64>() | 1
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The byte accounting callers batch by ([`append_record_bytes`],
    /// [`MAX_APPEND_RECORDS_BYTES`]) matches what is encoded.
    #[test]
    fn append_record_bytes_is_the_encoded_size() {
        for lens in [
            vec![],
            vec![0],
            vec![1, 127, 128],
            vec![16_383, 16_384, 2_097_151, 2_097_152],
            vec![MAX_RECORD_BYTES],
        ] {
            let records: Vec<Vec<u8>> = lens.iter().map(|n| vec![b'z'; *n]).collect();
            let request = AppendRequest {
                client_id: u64::MAX,
                first_seq: u64::MAX,
                records,
            };
            let records_bytes: usize = lens.iter().map(|n| append_record_bytes(*n)).sum();
            assert_eq!(
                prost::Message::encoded_len(&request),
                APPEND_FIXED_BYTES + records_bytes,
                "{lens:?}"
            );
        }
        assert_eq!(
            APPEND_FIXED_BYTES + append_record_bytes(MAX_RECORD_BYTES),
            MAX_MESSAGE_BYTES,
            "the largest record fills a message exactly"
        );
    }

    /// Issue 10, item 4: an append above the message limit fails at once,
    /// before any endpoint is tried. (The endpoint does not exist and the
    /// deadline is long: old code retried it until the safety net.)
    #[tokio::test]
    async fn an_append_above_the_message_limit_is_refused_before_sending() {
        let mut client = Client::new(vec!["127.0.0.1:1".into()], Duration::from_millis(100))
            .with_deadline(Duration::from_secs(3600));
        let err = tokio::time::timeout(
            Duration::from_secs(120),
            client.append(vec![vec![b'z'; MAX_MESSAGE_BYTES]]),
        )
        .await
        .expect("the append is refused, not retried until its deadline")
        .unwrap_err();
        assert!(
            matches!(
                err,
                ClientError::TooLarge {
                    records: 1,
                    limit: MAX_MESSAGE_BYTES,
                    ..
                }
            ),
            "{err}"
        );
        assert!(
            err.to_string().contains(&MAX_MESSAGE_BYTES.to_string()),
            "{err}"
        );
        assert_eq!(client.retries(), 0, "nothing was tried");
    }
}
