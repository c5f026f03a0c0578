//! The command line: clap's definitions of every subcommand and its flags.
//! It owns parsing only; it never runs a command (see `commands/`) and
//! never does I/O beyond building a client from the endpoint flags.

use std::time::Duration;

use clap::{Parser, Subcommand};
use ringraft_client::{Client, ClientError, ClientTls};

use crate::daemon::config::ServeArgs;

#[derive(Parser)]
#[command(
    name = "ringraft",
    version,
    about = "A Raft replicated log whose data plane is one-sided RDMA"
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// Options every client command takes.
#[derive(clap::Args, Clone, Debug)]
pub(crate) struct Endpoints {
    /// Client API addresses (host:port,...), tried in turn.
    #[arg(long, default_value = "127.0.0.1:7101", value_delimiter = ',')]
    pub endpoints: Vec<String>,
    /// Time allowed per endpoint per attempt, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    pub timeout_ms: u64,
    /// Time one operation may keep retrying in all, in milliseconds.
    /// Default: 60 s for writes (they ride through leader changes); for
    /// queries (status, read, members list), one pass over the endpoints
    /// plus one second, so that dead endpoints fail the command quickly.
    #[arg(long)]
    pub deadline_ms: Option<u64>,
    /// Dial the endpoints over TLS, trusting only this CA (PEM): each
    /// node's certificate must be signed by it and name the endpoint's
    /// host or IP address. Without it: plaintext.
    #[arg(long, value_name = "PEM")]
    pub ca: Option<std::path::PathBuf>,
    /// This client's certificate (PEM), for nodes that require one
    /// (`serve --tls-client-ca`).
    #[arg(long, value_name = "PEM", requires_all = ["ca", "key"])]
    pub cert: Option<std::path::PathBuf>,
    /// The private key of --cert (PEM).
    #[arg(long, value_name = "PEM", requires = "cert")]
    pub key: Option<std::path::PathBuf>,
}

impl Endpoints {
    /// The TLS settings of the flags (`None`: plaintext), their files read
    /// and checked.
    ///
    /// # Errors
    /// [`ClientError::Tls`] naming a file that cannot be read or used.
    pub fn tls(&self) -> Result<Option<ClientTls>, ClientError> {
        let Some(ca) = &self.ca else {
            return Ok(None);
        };
        let identity = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => Some((cert.as_path(), key.as_path())),
            _ => None,
        };
        ClientTls::from_files(ca, identity).map(Some)
    }

    /// A client of the endpoints, over TLS when the flags say so.
    fn new_client(&self) -> Result<Client, ClientError> {
        let client = Client::new(
            self.endpoints.clone(),
            Duration::from_millis(self.timeout_ms),
        );
        Ok(match self.tls()? {
            Some(tls) => client.with_tls(tls),
            None => client,
        })
    }

    /// A client for writes and membership changes.
    ///
    /// # Errors
    /// As [`Endpoints::tls`].
    pub fn client(&self) -> Result<Client, ClientError> {
        let client = self.new_client()?;
        Ok(match self.deadline_ms {
            Some(ms) => client.with_deadline(Duration::from_millis(ms)),
            None => client,
        })
    }

    /// A client for queries: gives up after one pass over the endpoints
    /// (unless `--deadline-ms` says otherwise).
    ///
    /// # Errors
    /// As [`Endpoints::tls`].
    pub fn query_client(&self) -> Result<Client, ClientError> {
        let pass = self
            .timeout_ms
            .saturating_mul(self.endpoints.len().max(1) as u64)
            .saturating_add(1000);
        Ok(self
            .new_client()?
            .with_deadline(Duration::from_millis(self.deadline_ms.unwrap_or(pass))))
    }
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Run a node.
    Serve(Box<ServeArgs>),
    /// Append records (the arguments, or one per stdin line); prints each
    /// record's index, one per line.
    Append {
        #[command(flatten)]
        endpoints: Endpoints,
        /// Records to append (none: read stdin, one record per line).
        data: Vec<String>,
    },
    /// Read committed records.
    Read(ReadArgs),
    /// The view of the node reached.
    Status {
        #[command(flatten)]
        endpoints: Endpoints,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Membership.
    Members {
        #[command(subcommand)]
        action: MembersAction,
    },
    /// Trim the log: the records below --before are gone on every node
    /// (a trim is a log entry; the first index never moves back). Prints
    /// the first index kept.
    Trim {
        #[command(flatten)]
        endpoints: Endpoints,
        /// The first index to keep.
        #[arg(long)]
        before: u64,
    },
    /// Ask the leader to hand leadership to a node.
    Transfer {
        #[command(flatten)]
        endpoints: Endpoints,
        /// The node to lead.
        to: u64,
    },
    /// Append load: N concurrent clients append records of SIZE bytes for
    /// SECS; prints throughput and commit latency percentiles.
    Bench(BenchArgs),
    /// Runs a local 3-node cluster (child processes, tcp fabric, temp dirs),
    /// appends and reads records, kills the leader, shows the failover and
    /// the data intact; exits 0 when every check passed.
    Demo {
        /// Directory for the nodes' data and logs (new or empty; default: a
        /// new directory under the temp dir). Kept afterwards.
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
        /// Records appended before the failover, and again after it.
        #[arg(long, default_value_t = 10)]
        records: usize,
        /// Deadline of each step, in seconds.
        #[arg(long, default_value_t = 30)]
        step_timeout: u64,
        /// memory or fsync.
        #[arg(long, default_value = "fsync")]
        durability: String,
        /// Serve the client API over TLS, with client certificates
        /// required: a throwaway CA and certificates are made in the demo's
        /// directory, and the demo's own client uses them.
        #[arg(long)]
        tls: bool,
    },
    /// Offline tools for a node's write-ahead log.
    Wal {
        #[command(subcommand)]
        action: WalAction,
    },
}

#[derive(Subcommand)]
pub(crate) enum MembersAction {
    /// List the members.
    List {
        #[command(flatten)]
        endpoints: Endpoints,
    },
    /// Add a learner: a node that receives the log without voting.
    Add {
        #[command(flatten)]
        endpoints: Endpoints,
        /// Its id.
        id: u64,
        /// Its --listen address.
        addr: String,
    },
    /// Make learners voters.
    Promote {
        #[command(flatten)]
        endpoints: Endpoints,
        /// Their ids.
        ids: Vec<u64>,
    },
    /// Remove members.
    Remove {
        #[command(flatten)]
        endpoints: Endpoints,
        /// Their ids.
        ids: Vec<u64>,
    },
}

#[derive(Subcommand)]
pub(crate) enum WalAction {
    /// Check a stopped node's ring and its segment files (`log/`): valid
    /// range, first invalid record and why; exit 1 when corruption lies
    /// inside what the node acknowledged.
    Check {
        /// The node's data directory (its ring is found from there).
        #[arg(long)]
        data_dir: std::path::PathBuf,
    },
    /// Delete a stopped node's data directory and its ring in shared memory
    /// (`rm -r DIR` leaves the ring until the next node start on the host
    /// sweeps it).
    Remove {
        /// The node's data directory.
        #[arg(long)]
        data_dir: std::path::PathBuf,
    },
}

// `ringraft read`'s flags (a plain comment: a doc comment here would
// replace the subcommand's about text).
#[derive(clap::Args, Clone, Debug)]
pub(crate) struct ReadArgs {
    #[command(flatten)]
    pub endpoints: Endpoints,
    /// First index.
    #[arg(long, default_value_t = 1)]
    pub from: u64,
    /// Last index (default: the last committed).
    #[arg(long)]
    pub to: Option<u64>,
    /// Keep following new records.
    #[arg(long)]
    pub follow: bool,
    /// raw (bytes then a newline) or json.
    #[arg(long, default_value = "raw")]
    pub format: String,
    /// linearizable, lease or stale.
    #[arg(long, default_value = "linearizable")]
    pub consistency: String,
}

// `ringraft bench`'s flags (a plain comment, as for `ReadArgs`).
#[derive(clap::Args, Clone, Debug)]
pub(crate) struct BenchArgs {
    #[command(flatten)]
    pub endpoints: Endpoints,
    /// Concurrent client sessions (each waits for its append's answer
    /// before the next).
    #[arg(long, default_value_t = 16)]
    pub clients: usize,
    /// Bytes per record.
    #[arg(long, default_value_t = 256)]
    pub size: usize,
    /// Seconds to run.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Records per append.
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// append (each client appends, waits, appends again), read (each
    /// client reads one record it appended first, again and again) or mixed
    /// (each client appends a record, then reads it back).
    #[arg(long, default_value = "append")]
    pub workload: String,
    /// The reads' consistency: linearizable, lease or stale.
    #[arg(long, default_value = "linearizable")]
    pub consistency: String,
    /// How long one append may retry (leader changes, timeouts) before
    /// it counts as an error, in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    pub append_deadline_ms: u64,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
    /// No progress line on stderr.
    #[arg(long)]
    pub quiet: bool,
}
