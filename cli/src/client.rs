//! A client that tries a list of endpoints in turn, with a timeout per
//! endpoint so that a paused or unreachable node never hangs it, and appends
//! exactly once and in order across retries (a client session: every record
//! carries `(client_id, seq)`, seqs consecutive from 1, and a retry reuses
//! them; the cluster applies a session's records in seq order).

use std::collections::HashMap;
use std::time::Duration;

use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Status};

use crate::proto::log_client::LogClient;
use crate::proto::{
    AddLearnerRequest, AppendRequest, Consistency, FollowRequest, Member, MembersRequest,
    PromoteRequest, ReadRequest, Record, RemoveRequest, StatusRequest, StatusResponse,
    TransferLeaderRequest,
};

/// Largest message the client sends or accepts.
pub const MAX_MESSAGE_BYTES: usize = 64 << 20;

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
}

/// Whether an error is worth trying again (elsewhere, or later).
fn retryable(status: &Status) -> bool {
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
        let mut backoff = Duration::from_millis(20);
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
            backoff = (backoff * 2).min(Duration::from_millis(500));
        }
    }

    /// Appends `records` exactly once, retrying through leader changes and
    /// timeouts; returns each record's log index. The records get increasing
    /// indexes in their order, after those of this client's earlier appends.
    ///
    /// # Errors
    /// When the append fails, its records may or may not land in the log
    /// (later, even after the next appends); the client goes on in a new
    /// session, since the cluster would refuse the old session's next seqs
    /// as long as this append's are missing.
    pub async fn append(&mut self, records: Vec<Vec<u8>>) -> Result<Vec<u64>, ClientError> {
        let first_seq = self.next_seq;
        let client_id = self.client_id;
        let count = records.len() as u64;
        let response = self
            .with_retry(|mut c| {
                let req = AppendRequest {
                    client_id,
                    first_seq,
                    records: records.clone(),
                };
                async move { c.append(api(req)).await.map(|r| r.into_inner()) }
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
                .read(api(ReadRequest {
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
            c.follow(api(FollowRequest { from }))
                .await
                .map(|r| r.into_inner())
        })
        .await
    }

    /// The status of the first node that answers.
    pub async fn status(&mut self) -> Result<StatusResponse, ClientError> {
        self.with_retry(|mut c| async move {
            c.status(api(StatusRequest {}))
                .await
                .map(|r| r.into_inner())
        })
        .await
    }

    /// The members.
    pub async fn members(&mut self) -> Result<Vec<Member>, ClientError> {
        self.with_retry(|mut c| async move {
            c.members(api(MembersRequest {}))
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
                c.add_learner(api(AddLearnerRequest { id, addr }))
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
                c.promote(api(PromoteRequest { ids }))
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
                c.remove(api(RemoveRequest { ids }))
                    .await
                    .map(|r| r.into_inner().members)
            }
        })
        .await
    }

    /// Asks the leader to hand leadership to `to`.
    pub async fn transfer_leader(&mut self, to: u64) -> Result<(), ClientError> {
        self.with_retry(|mut c| async move {
            c.transfer_leader(api(TransferLeaderRequest { to }))
                .await
                .map(|_| ())
        })
        .await
    }
}

/// A fresh session's client id (never 0, which means "no session").
fn new_client_id() -> u64 {
    rand::random::<u64>() | 1
}

fn api<T>(message: T) -> Request<T> {
    let mut req = Request::new(message);
    req.metadata_mut().insert(
        "ringraft-api",
        tonic::metadata::MetadataValue::from_static(crate::API_VERSION),
    );
    req
}
