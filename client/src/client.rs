//! A client that tries a list of endpoints in turn, with a timeout per
//! endpoint so that a paused or unreachable node never hangs it, and appends
//! exactly once and in order across retries (a client session: every record
//! carries `(client_id, seq)`, seqs consecutive from 1, and a retry reuses
//! them; the cluster applies a session's records in seq order).

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use futures::{Stream, StreamExt};

use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use crate::api_request;
use crate::proto::log_client::LogClient;
use crate::proto::{
    AddLearnerRequest, AppendRequest, AppendResponse, Consistency, FollowRequest, Member,
    MembersRequest, PromoteRequest, ReadRequest, Record, RemoveRequest, StatusRequest,
    StatusResponse, TransferLeaderRequest, TrimRequest,
};
use crate::tls::{self, ClientTls};

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
    /// TLS failed: a CA, certificate or key file cannot be used, or every
    /// endpoint failed in a round because of TLS (a node's certificate not
    /// signed by the client's CA or not naming its endpoint, a client
    /// certificate missing or refused, a node that serves TLS dialled in
    /// plaintext). Not retried: the same files would fail again.
    #[error("{0}")]
    Tls(String),
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
    /// `None`: plaintext (`http://`).
    tls: Option<ClientTls>,
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
            tls: None,
        }
    }

    /// Dials every endpoint over TLS (`https://`), trusting only the CA of
    /// `tls`, and checking that each node's certificate names the host or
    /// IP address of its endpoint (`host:port` as given).
    pub fn with_tls(mut self, tls: ClientTls) -> Client {
        self.tls = Some(tls);
        self.channels.clear();
        self
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
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))
            .map_err(|e| Status::invalid_argument(format!("endpoint {addr}: {e}")))?
            .connect_timeout(self.per_endpoint);
        if let Some(tls) = &self.tls {
            endpoint = endpoint
                .tls_config(tls.config())
                .map_err(|e| Status::invalid_argument(format!("endpoint {addr}: {}", chain(&e))))?;
        }
        let channel = tokio::time::timeout(self.per_endpoint, endpoint.connect())
            .await
            .map_err(|_| Status::unavailable(format!("{addr}: connect timed out")))?
            .map_err(|e| {
                let mut status = Status::unavailable(format!("{addr}: {}", chain(&e)));
                status.set_source(std::sync::Arc::new(e));
                status
            })?;
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
            // The round's TLS failures: when every endpoint failed so, the
            // next round would too.
            let mut tls_failures = Vec::new();
            for step in 0..self.endpoints.len() {
                let k = (self.preferred + step) % self.endpoints.len();
                tried += 1;
                let result = match self.channel(k).await {
                    Ok(client) => match tokio::time::timeout(self.per_endpoint, call(client)).await
                    {
                        Ok(r) => r,
                        Err(_) => Err(self.no_answer(k)),
                    },
                    Err(e) => Err(e),
                };
                match result {
                    Ok(v) => {
                        self.preferred = k;
                        return Ok(v);
                    }
                    Err(status) => match tls::failure(&status, self.tls.is_some()) {
                        // Another endpoint may have a certificate that
                        // passes; this one is tried again next round.
                        Some(why) => {
                            self.forget(k);
                            last = format!("{}: {why}", self.endpoints[k]);
                            tls_failures.push(last.clone());
                        }
                        None if retryable(&status) => {
                            self.forget(k);
                            last = format!("{}: {}", self.endpoints[k], describe(&status));
                        }
                        None => return Err(ClientError::Refused(status)),
                    },
                }
            }
            if tls_failures.len() == self.endpoints.len() {
                return Err(ClientError::Tls(tls_failures.join("; ")));
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
        let (client_id, first_seq) = (self.client_id, self.next_seq);
        let count = records.len() as u64;
        let request = checked_request(client_id, first_seq, records)?;
        match self.send_append(request).await {
            Ok(indexes) => {
                self.next_seq += count;
                Ok(indexes)
            }
            Err(e) => {
                self.new_session();
                Err(e)
            }
        }
    }

    /// Sends one Append request, retrying as [`Client`]'s operations do;
    /// the session is the caller's to move on.
    async fn send_append(&mut self, request: AppendRequest) -> Result<Vec<u64>, ClientError> {
        let count = request.records.len();
        let answer = self
            .with_retry(|mut c| {
                let request = request.clone();
                async move { c.append(api_request(request)).await.map(|r| r.into_inner()) }
            })
            .await?;
        indexes_of(answer, count)
    }

    /// A new session: the cluster would refuse the old one's next seqs as
    /// long as an append that failed may be missing.
    fn new_session(&mut self) {
        self.client_id = new_client_id();
        self.next_seq = 1;
    }

    /// Appends the batches `batches` yields, in their order, pipelined:
    /// each batch is sent as soon as it comes (up to [`PIPELINE_DEPTH`]
    /// unanswered), without waiting for the commits of those before it,
    /// over one `AppendStream` call; `answered` gets each batch's indexes
    /// in order as they come. Returns how many records were appended.
    ///
    /// The guarantees of [`Client::append`] hold across the whole run: the
    /// records get increasing indexes in their order, each exactly once.
    /// When the stream breaks (its node fails, or the leader changes under
    /// it), the batches it left unanswered are sent again with
    /// [`Client::append`]'s retries, with the same seqs, one at a time and
    /// in order; then a new stream goes on with the rest.
    ///
    /// # Errors
    /// As [`Client::append`]. A batch above the message limit
    /// ([`ClientError::TooLarge`]) is not sent: the batches before it are
    /// answered first. After an error the records of the batches not
    /// answered may or may not land in the log, and the client goes on in a
    /// new session.
    pub async fn append_pipelined<B>(
        &mut self,
        mut batches: B,
        mut answered: impl FnMut(Vec<u64>),
    ) -> Result<u64, ClientError>
    where
        B: Stream<Item = Vec<Vec<u8>>> + Unpin,
    {
        if self.endpoints.is_empty() {
            return Err(ClientError::Unavailable {
                tried: 0,
                last: "no endpoints".into(),
            });
        }
        let mut pipe = Pipe::default();
        let outcome = 'run: loop {
            // What a broken stream left unanswered, one request at a time.
            while let Some(request) = pipe.unanswered.front() {
                match self.send_append(request.clone()).await {
                    Ok(indexes) => pipe.answered(indexes, &mut answered),
                    Err(e) => break 'run Err(e),
                }
            }
            if pipe.input_done {
                break match pipe.refused.take() {
                    Some(e) => Err(e),
                    None => Ok(pipe.appended),
                };
            }
            if let Err(e) = self
                .stream_appends(&mut pipe, &mut batches, &mut answered)
                .await
            {
                break Err(e);
            }
        };
        if outcome.is_err() {
            self.new_session();
        }
        outcome
    }

    /// One `AppendStream` call of [`Client::append_pipelined`], on the
    /// endpoint that answered last: sends the batches `batches` yields
    /// while answers come back. Returns when the input ended and every
    /// request was answered, or when the stream broke in a way worth
    /// retrying (`pipe.unanswered` then holds what it left; when no stream
    /// could be opened, the next batch, for [`Client::append`]'s retries).
    ///
    /// # Errors
    /// A node's refusal (not worth retrying).
    async fn stream_appends<B>(
        &mut self,
        pipe: &mut Pipe,
        batches: &mut B,
        answered: &mut impl FnMut(Vec<u64>),
    ) -> Result<(), ClientError>
    where
        B: Stream<Item = Vec<Vec<u8>>> + Unpin,
    {
        debug_assert!(pipe.unanswered.is_empty(), "drained before a stream");
        let k = self.preferred;
        let opened = match self.channel(k).await {
            Ok(mut c) => {
                let (requests, outgoing) = tokio::sync::mpsc::channel(PIPELINE_DEPTH);
                let call = c.append_stream(api_request(
                    tokio_stream::wrappers::ReceiverStream::new(outgoing),
                ));
                match tokio::time::timeout(self.per_endpoint, call).await {
                    Ok(Ok(responses)) => Ok((requests, responses.into_inner())),
                    Ok(Err(status)) => Err(status),
                    Err(_) => Err(self.no_answer(k)),
                }
            }
            Err(status) => Err(status),
        };
        let (requests, mut responses) = match opened {
            Ok(opened) => opened,
            Err(status) if self.worth_another_try(&status) => {
                // The next batch goes with Append's retries, which try the
                // other endpoints (and tell a TLS failure everywhere).
                self.broken(k);
                pipe.take_next(self, batches).await;
                return Ok(());
            }
            Err(status) => return Err(ClientError::Refused(status)),
        };
        let mut requests = Some(requests);
        // When the oldest unanswered request must be answered by.
        let mut answer_by = tokio::time::Instant::now();
        loop {
            if pipe.unanswered.is_empty() && pipe.input_done {
                return Ok(());
            }
            let can_send = requests.is_some()
                && pipe.unanswered.len() < PIPELINE_DEPTH
                && pipe.unanswered_bytes < PIPELINE_BYTES;
            tokio::select! {
                biased;
                answer = tokio::time::timeout_at(answer_by, responses.message()), if !pipe.unanswered.is_empty() => {
                    let status = match answer {
                        Ok(Ok(Some(answer))) => {
                            let sent = pipe.unanswered.front().expect("checked").records.len();
                            pipe.answered(indexes_of(answer, sent)?, answered);
                            answer_by = tokio::time::Instant::now() + self.per_endpoint;
                            continue;
                        }
                        Ok(Ok(None)) => Status::unavailable(format!(
                            "{}: the append stream ended with {} requests unanswered",
                            self.endpoints[k],
                            pipe.unanswered.len()
                        )),
                        Ok(Err(status)) => status,
                        Err(_) => self.no_answer(k),
                    };
                    if !self.worth_another_try(&status) {
                        return Err(ClientError::Refused(status));
                    }
                    self.broken(k);
                    return Ok(());
                }
                sent = pipe.take_next(self, batches), if can_send => {
                    let Some(request) = sent else {
                        // The input ended (or a batch was refused): the
                        // server answers the rest, then ends the stream.
                        requests = None;
                        continue;
                    };
                    if pipe.unanswered.len() == 1 {
                        answer_by = tokio::time::Instant::now() + self.per_endpoint;
                    }
                    // A closed stream shows as an error on the answers.
                    let _ = requests.as_ref().expect("checked").send(request).await;
                }
            }
        }
    }

    /// Whether a failed call is worth another try, here or elsewhere: a
    /// failure [`retryable`] says so of, or one of TLS (the round of
    /// [`Client::append`]'s retries tells whether every endpoint fails so).
    fn worth_another_try(&self, status: &Status) -> bool {
        retryable(status) || tls::failure(status, self.tls.is_some()).is_some()
    }

    /// Notes an endpoint whose call failed in a way worth retrying.
    fn forget(&mut self, k: usize) {
        self.retries += 1;
        // Forget the channel: the node may have restarted.
        self.channels.remove(&k);
    }

    /// [`Client::forget`], and the next call starts at the next endpoint.
    fn broken(&mut self, k: usize) {
        self.forget(k);
        self.preferred = (k + 1) % self.endpoints.len().max(1);
    }

    /// The error of a call that endpoint `k` did not answer in time.
    fn no_answer(&self, k: usize) -> Status {
        Status::deadline_exceeded(format!(
            "{}: no answer within {:?}",
            self.endpoints[k], self.per_endpoint
        ))
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

/// Requests of one `AppendStream` call in flight at most (unanswered):
/// the client sends no more, and the server (`ringraft serve`) reads no
/// further (`log.proto`).
pub const PIPELINE_DEPTH: usize = 64;
/// Bytes of records in flight on one `AppendStream` call: no further
/// request is sent while the unanswered ones hold as many (a client holds
/// them until they are answered, to send them again if the stream breaks).
pub const PIPELINE_BYTES: usize = 16 << 20;

/// The state of one [`Client::append_pipelined`] run.
#[derive(Default)]
struct Pipe {
    /// Requests sent (or to send again) and not answered, oldest first.
    unanswered: VecDeque<AppendRequest>,
    /// The input ended, or a batch was refused.
    input_done: bool,
    /// A batch refused before it was sent: reported once the batches
    /// before it are answered.
    refused: Option<ClientError>,
    /// Bytes of records in `unanswered`.
    unanswered_bytes: usize,
    /// Records answered.
    appended: u64,
}

impl Pipe {
    /// The oldest request is answered with `indexes`.
    fn answered(&mut self, indexes: Vec<u64>, answered: &mut impl FnMut(Vec<u64>)) {
        let request = self
            .unanswered
            .pop_front()
            .expect("a request was unanswered");
        self.unanswered_bytes -= records_bytes(&request);
        self.appended += indexes.len() as u64;
        answered(indexes);
    }

    /// The next batch of `batches` as the session's next request, queued as
    /// unanswered (and returned, to send); `None` when the input ended or
    /// the batch is too large for any request (kept to report).
    async fn take_next<B>(&mut self, client: &mut Client, batches: &mut B) -> Option<AppendRequest>
    where
        B: Stream<Item = Vec<Vec<u8>>> + Unpin,
    {
        let records = loop {
            match batches.next().await {
                Some(records) if records.is_empty() => continue,
                Some(records) => break records,
                None => {
                    self.input_done = true;
                    return None;
                }
            }
        };
        let count = records.len() as u64;
        match checked_request(client.client_id, client.next_seq, records) {
            Ok(request) => {
                client.next_seq += count;
                self.unanswered_bytes += records_bytes(&request);
                self.unanswered.push_back(request.clone());
                Some(request)
            }
            Err(e) => {
                self.input_done = true;
                self.refused = Some(e);
                None
            }
        }
    }
}

/// The indexes of an answer to an Append of `sent` records: one each.
fn indexes_of(answer: AppendResponse, sent: usize) -> Result<Vec<u64>, ClientError> {
    if answer.indexes.len() != sent {
        return Err(ClientError::Refused(Status::internal(format!(
            "{} indexes answered to an append of {sent} records",
            answer.indexes.len()
        ))));
    }
    Ok(answer.indexes)
}

/// Bytes of records in `request`.
fn records_bytes(request: &AppendRequest) -> usize {
    request.records.iter().map(Vec::len).sum()
}

/// An Append request of the session's records from `first_seq` on, or
/// [`ClientError::TooLarge`] when it would exceed [`MAX_MESSAGE_BYTES`]
/// (tonic would refuse to encode it, and the failure would look like a
/// transport error worth retrying).
fn checked_request(
    client_id: u64,
    first_seq: u64,
    records: Vec<Vec<u8>>,
) -> Result<AppendRequest, ClientError> {
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
    Ok(request)
}

/// `error` and its causes, each once (a cause whose words its effect
/// already says is left out).
fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut next = error.source();
    while let Some(cause) = next {
        let words = cause.to_string();
        if !text.contains(&words) {
            text = format!("{text}: {words}");
        }
        next = cause.source();
    }
    text
}

/// A failed call's status in words: its message and its causes (tonic
/// says only "transport error" where the cause says what happened).
fn describe(status: &Status) -> String {
    match std::error::Error::source(status) {
        Some(cause) => {
            let causes = chain(cause);
            if status.message().contains(&causes) {
                status.message().to_string()
            } else {
                format!("{}: {causes}", status.message())
            }
        }
        None => status.message().to_string(),
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
