//! `ringraft`: the replicated-log daemon and its command-line client.

mod bench;
mod config;
mod demo;
mod metrics;
mod records;
mod serve;
mod service;

use std::io::{BufRead, Read, Write};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use ringraft_client::client::{
    MAX_APPEND_RECORDS_BYTES, MAX_MESSAGE_BYTES, MAX_RECORD_BYTES, append_record_bytes,
};
use ringraft_client::{Client, ClientError, Consistency};

#[derive(Parser)]
#[command(
    name = "ringraft",
    version,
    about = "A Raft replicated log whose data plane is one-sided RDMA"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Options every client command takes.
#[derive(clap::Args, Clone, Debug)]
struct Endpoints {
    /// Client API addresses (host:port,...), tried in turn.
    #[arg(long, default_value = "127.0.0.1:7101", value_delimiter = ',')]
    endpoints: Vec<String>,
    /// Time allowed per endpoint per attempt, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    timeout_ms: u64,
    /// Time one operation may keep retrying in all, in milliseconds.
    /// Default: 60 s for writes (they ride through leader changes); for
    /// queries (status, read, members list), one pass over the endpoints
    /// plus one second, so that dead endpoints fail the command quickly.
    #[arg(long)]
    deadline_ms: Option<u64>,
}

impl Endpoints {
    /// A client for writes and membership changes.
    fn client(&self) -> Client {
        let client = Client::new(
            self.endpoints.clone(),
            Duration::from_millis(self.timeout_ms),
        );
        match self.deadline_ms {
            Some(ms) => client.with_deadline(Duration::from_millis(ms)),
            None => client,
        }
    }

    /// A client for queries: gives up after one pass over the endpoints
    /// (unless `--deadline-ms` says otherwise).
    fn query_client(&self) -> Client {
        let pass = self
            .timeout_ms
            .saturating_mul(self.endpoints.len().max(1) as u64)
            .saturating_add(1000);
        Client::new(
            self.endpoints.clone(),
            Duration::from_millis(self.timeout_ms),
        )
        .with_deadline(Duration::from_millis(self.deadline_ms.unwrap_or(pass)))
    }
}

#[derive(Subcommand)]
enum Command {
    /// Run a node.
    Serve(Box<config::ServeArgs>),
    /// Append records (the arguments, or one per stdin line); prints each
    /// record's index, one per line.
    Append {
        #[command(flatten)]
        endpoints: Endpoints,
        /// Records to append (none: read stdin, one record per line).
        data: Vec<String>,
    },
    /// Read committed records.
    Read {
        #[command(flatten)]
        endpoints: Endpoints,
        /// First index.
        #[arg(long, default_value_t = 1)]
        from: u64,
        /// Last index (default: the last committed).
        #[arg(long)]
        to: Option<u64>,
        /// Keep following new records.
        #[arg(long)]
        follow: bool,
        /// raw (bytes then a newline) or json.
        #[arg(long, default_value = "raw")]
        format: String,
        /// linearizable, lease or stale.
        #[arg(long, default_value = "linearizable")]
        consistency: String,
    },
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
    Bench {
        #[command(flatten)]
        endpoints: Endpoints,
        /// Concurrent client sessions (each waits for its append's answer
        /// before the next).
        #[arg(long, default_value_t = 16)]
        clients: usize,
        /// Bytes per record.
        #[arg(long, default_value_t = 256)]
        size: usize,
        /// Seconds to run.
        #[arg(long, default_value_t = 10.0)]
        duration: f64,
        /// Records per append.
        #[arg(long, default_value_t = 1)]
        batch: usize,
        /// How long one append may retry (leader changes, timeouts) before
        /// it counts as an error, in milliseconds.
        #[arg(long, default_value_t = 10_000)]
        append_deadline_ms: u64,
        /// Print the summary as JSON.
        #[arg(long)]
        json: bool,
        /// No progress line on stderr.
        #[arg(long)]
        quiet: bool,
    },
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
    },
    /// Offline tools for a node's write-ahead log.
    Wal {
        #[command(subcommand)]
        action: WalAction,
    },
}

#[derive(Subcommand)]
enum MembersAction {
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
enum WalAction {
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

fn init_logging(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "info,openraft=warn".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

fn fail(e: impl std::fmt::Display) -> ExitCode {
    eprintln!("ringraft: {e}");
    ExitCode::from(2)
}

fn client_error(e: ClientError) -> ExitCode {
    fail(e)
}

/// Appends `batch` and prints each record's index, one per line.
async fn append_printing(
    client: &mut Client,
    batch: Vec<Vec<u8>>,
    out: &mut impl Write,
) -> Result<(), ClientError> {
    for index in client.append(batch).await? {
        let _ = writeln!(out, "{index}");
    }
    Ok(())
}

/// The next line of `input` (line `line_no`) without its line end, or `None`
/// at the end. A line too long for any Append request is refused once its
/// first [`MAX_RECORD_BYTES`] + 2 bytes are read, without reading the rest.
fn next_record(input: &mut impl BufRead, line_no: u64) -> Result<Option<Vec<u8>>, String> {
    let mut line = Vec::new();
    let read = input
        .by_ref()
        .take(MAX_RECORD_BYTES as u64 + 2)
        .read_until(b'\n', &mut line)
        .map_err(|e| format!("stdin: {e}"))?;
    if read == 0 {
        return Ok(None);
    }
    if line.last() == Some(&b'\n') {
        line.pop();
        if line.last() == Some(&b'\r') {
            line.pop();
        }
    }
    if line.len() > MAX_RECORD_BYTES {
        return Err(format!(
            "stdin line {line_no} is longer than {MAX_RECORD_BYTES} bytes, the largest record an append can carry within the client API's message limit of {MAX_MESSAGE_BYTES} bytes; no node accepts it"
        ));
    }
    Ok(Some(line))
}

fn parse_consistency(s: &str) -> Result<Consistency, String> {
    match s {
        "linearizable" => Ok(Consistency::Linearizable),
        "lease" => Ok(Consistency::Lease),
        "stale" => Ok(Consistency::Stale),
        other => Err(format!(
            "--consistency {other}: expected linearizable, lease or stale"
        )),
    }
}

fn print_record(
    out: &mut impl Write,
    r: &ringraft_client::proto::Record,
    json: bool,
) -> std::io::Result<()> {
    if json {
        let data = match std::str::from_utf8(&r.data) {
            Ok(s) => serde_json::Value::String(s.to_string()),
            Err(_) => serde_json::Value::Array(r.data.iter().map(|b| (*b).into()).collect()),
        };
        writeln!(
            out,
            "{}",
            serde_json::json!({"index": r.index, "term": r.term, "data": data})
        )
    } else {
        out.write_all(&r.data)?;
        out.write_all(b"\n")
    }
}

fn print_members(members: &[ringraft_client::proto::Member]) {
    for m in members {
        println!(
            "{} {} {}",
            m.id,
            m.addr,
            if m.voter { "voter" } else { "learner" }
        );
    }
}

async fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Serve(args) => {
            let config = match args.resolve() {
                Ok(c) => c,
                Err(e) => return fail(e),
            };
            init_logging(config.json_logs);
            if config.secret == config::DEV_SECRET {
                tracing::warn!(
                    "no --secret-file: using the built-in development secret; do not do this in production"
                );
            }
            match serve::run(config).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(e),
            }
        }
        Command::Append { endpoints, data } => {
            let mut client = endpoints.client();
            let mut out = std::io::stdout().lock();
            if !data.is_empty() {
                let records = data.into_iter().map(String::into_bytes).collect();
                return match client.append(records).await {
                    Ok(indexes) => {
                        for i in indexes {
                            let _ = writeln!(out, "{i}");
                        }
                        ExitCode::SUCCESS
                    }
                    Err(e) => client_error(e),
                };
            }
            // One record per stdin line, in batches of what is available,
            // each small enough for one request.
            let mut stdin = std::io::stdin().lock();
            let mut batch = Vec::new();
            let mut batch_bytes = 0;
            for line_no in 1.. {
                let next = next_record(&mut stdin, line_no);
                // The batch goes before a line that would not fit in its
                // request, at the end, and before failing on a bad line.
                let send = match &next {
                    Ok(Some(line)) => {
                        batch_bytes + append_record_bytes(line.len()) > MAX_APPEND_RECORDS_BYTES
                    }
                    Ok(None) | Err(_) => true,
                };
                if send && !batch.is_empty() {
                    let batch = std::mem::take(&mut batch);
                    if let Err(e) = append_printing(&mut client, batch, &mut out).await {
                        return client_error(e);
                    }
                    batch_bytes = 0;
                }
                match next {
                    Ok(Some(line)) => {
                        batch_bytes += append_record_bytes(line.len());
                        batch.push(line);
                    }
                    Ok(None) => break,
                    Err(e) => return fail(e),
                }
                if batch.len() == 256 {
                    let batch = std::mem::take(&mut batch);
                    if let Err(e) = append_printing(&mut client, batch, &mut out).await {
                        return client_error(e);
                    }
                    batch_bytes = 0;
                }
            }
            ExitCode::SUCCESS
        }
        Command::Read {
            endpoints,
            from,
            to,
            follow,
            format,
            consistency,
        } => {
            let json = match format.as_str() {
                "raw" => false,
                "json" => true,
                other => return fail(format!("--format {other}: expected raw or json")),
            };
            let consistency = match parse_consistency(&consistency) {
                Ok(c) => c,
                Err(e) => return fail(e),
            };
            if follow && let Some(to) = to.filter(|to| *to < from) {
                // Nothing can ever arrive: refuse instead of waiting forever
                // (the server refuses an empty range of a plain read itself).
                return fail(format!("range {from}..={to} is empty"));
            }
            let mut client = if follow {
                endpoints.client()
            } else {
                endpoints.query_client()
            };
            let mut out = std::io::stdout().lock();
            if !follow {
                return match client.read(from, to.unwrap_or(0), consistency).await {
                    Ok(records) => {
                        for r in &records {
                            if print_record(&mut out, r, json).is_err() {
                                return ExitCode::SUCCESS;
                            }
                        }
                        ExitCode::SUCCESS
                    }
                    Err(e) => client_error(e),
                };
            }
            let mut next = from;
            loop {
                let mut stream = match client.follow(next).await {
                    Ok(s) => s,
                    Err(e) => return client_error(e),
                };
                loop {
                    let r = match stream.message().await {
                        Ok(Some(r)) => r,
                        Ok(None) => break,
                        // The same request would fail again anywhere.
                        Err(status) if !ringraft_client::client::retryable(&status) => {
                            return client_error(ClientError::Refused(status));
                        }
                        Err(_) => break,
                    };
                    if to.is_some_and(|t| r.index > t) {
                        return ExitCode::SUCCESS;
                    }
                    next = r.index + 1;
                    if print_record(&mut out, &r, json).is_err() || out.flush().is_err() {
                        return ExitCode::SUCCESS;
                    }
                }
                // The node went away: follow from another one.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        Command::Status { endpoints, json } => match endpoints.query_client().status().await {
            Ok(s) => {
                if json {
                    let members: Vec<_> = s
                        .members
                        .iter()
                        .map(|m| serde_json::json!({"id": m.id, "addr": m.addr, "voter": m.voter}))
                        .collect();
                    println!(
                        "{}",
                        serde_json::json!({
                            "id": s.id,
                            "state": s.state,
                            "leader_id": if s.leader_id == 0 { serde_json::Value::Null } else { s.leader_id.into() },
                            "leader_addr": s.leader_addr,
                            "term": s.term,
                            "commit_index": s.commit_index,
                            "applied_index": s.applied_index,
                            "last_log_index": s.last_log_index,
                            "members": members,
                            "fabric": s.fabric,
                            "durability": s.durability,
                            "votes_blocked": s.votes_blocked,
                            "first_index": s.first_index,
                        })
                    );
                } else {
                    println!("node {} ({}), term {}", s.id, s.state, s.term);
                    println!(
                        "leader {}",
                        if s.leader_id == 0 {
                            "unknown".into()
                        } else {
                            format!("{} at {}", s.leader_id, s.leader_addr)
                        }
                    );
                    println!(
                        "commit {}, applied {}, last log {}, first index {}",
                        s.commit_index, s.applied_index, s.last_log_index, s.first_index
                    );
                    println!(
                        "fabric {}, durability {}{}",
                        s.fabric,
                        s.durability,
                        if s.votes_blocked {
                            ", votes blocked (log corrupt inside)"
                        } else {
                            ""
                        }
                    );
                    print_members(&s.members);
                }
                ExitCode::SUCCESS
            }
            Err(e) => client_error(e),
        },
        Command::Members { action } => {
            let result = match action {
                MembersAction::List { endpoints } => endpoints.query_client().members().await,
                MembersAction::Add {
                    endpoints,
                    id,
                    addr,
                } => endpoints.client().add_learner(id, addr).await,
                MembersAction::Promote { endpoints, ids } => endpoints.client().promote(ids).await,
                MembersAction::Remove { endpoints, ids } => endpoints.client().remove(ids).await,
            };
            match result {
                Ok(members) => {
                    print_members(&members);
                    ExitCode::SUCCESS
                }
                Err(e) => client_error(e),
            }
        }
        Command::Trim { endpoints, before } => match endpoints.client().trim(before).await {
            Ok(first) => {
                println!("first index {first}");
                ExitCode::SUCCESS
            }
            Err(e) => client_error(e),
        },
        Command::Transfer { endpoints, to } => match endpoints.client().transfer_leader(to).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => client_error(e),
        },
        Command::Bench {
            endpoints,
            clients,
            size,
            duration,
            batch,
            append_deadline_ms,
            json,
            quiet,
        } => {
            if !(duration.is_finite()
                && duration > 0.0
                && duration <= bench::MAX_DURATION_SECS as f64)
            {
                return fail(format!(
                    "--duration {duration}: expected seconds in (0, {}]",
                    bench::MAX_DURATION_SECS
                ));
            }
            let config = bench::BenchConfig {
                endpoints: endpoints.endpoints.clone(),
                per_endpoint: Duration::from_millis(endpoints.timeout_ms),
                clients,
                size,
                batch,
                duration: Duration::from_secs_f64(duration),
                append_deadline: Duration::from_millis(append_deadline_ms.max(1)),
            };
            match bench::run(config, !quiet).await {
                Ok(report) => {
                    if json {
                        println!("{}", report.to_json());
                    } else {
                        println!("{}", report.to_text());
                    }
                    if report.acknowledged == 0 {
                        eprintln!("ringraft: bench: no append was acknowledged");
                        return ExitCode::from(1);
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => fail(format!("bench: {e}")),
            }
        }
        Command::Demo {
            dir,
            records,
            step_timeout,
            durability,
        } => {
            demo::run(demo::DemoConfig {
                dir,
                records,
                step_timeout: Duration::from_secs(step_timeout.clamp(1, 3600)),
                durability,
            })
            .await
        }
        Command::Wal {
            action: WalAction::Check { data_dir },
        } => match ringraft_wal::check(&data_dir) {
            Ok(report) => {
                println!("{report}");
                if report.corrupt_in_acknowledged_range() {
                    ExitCode::from(1)
                } else {
                    ExitCode::SUCCESS
                }
            }
            Err(e) => fail(format!("wal check {}: {e}", data_dir.display())),
        },
        Command::Wal {
            action: WalAction::Remove { data_dir },
        } => match ringraft_wal::remove(&data_dir) {
            Ok(removed) => {
                match removed.ring {
                    Some(ring) => println!(
                        "removed {} and its ring {}",
                        data_dir.display(),
                        ring.display()
                    ),
                    None => println!("removed {} (its ring was gone)", data_dir.display()),
                }
                ExitCode::SUCCESS
            }
            Err(e) => fail(format!("wal remove {}: {e}", data_dir.display())),
        },
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Serve(_) | Command::Demo { .. }) {
        // A client command is a Unix filter: `ringraft read ... | head` ends
        // quietly when the reader goes away, instead of failing to print.
        // (The daemon keeps SIGPIPE ignored: it writes to sockets; the demo
        // too: it must stop its nodes.)
        // SAFETY: called before any other thread exists; SIG_DFL is a valid
        // disposition for SIGPIPE.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return fail(format!("tokio runtime: {e}")),
    };
    runtime.block_on(run(cli))
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    fn deploy() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
    }

    /// deploy/config/node{1,2,3}.toml load through `serve`'s own loader and
    /// describe one cluster.
    #[test]
    fn the_example_configs_load_through_the_real_loader() {
        let dir = tempfile::tempdir().unwrap();
        // The files name /etc/ringraft/secret; the flag (which wins) points
        // at a stand-in so that the test needs no /etc.
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "a test secret of more than 16 bytes\n").unwrap();
        let mut configs = Vec::new();
        for id in 1..=3u64 {
            let path = deploy().join(format!("config/node{id}.toml"));
            let text = std::fs::read_to_string(&path).unwrap();
            assert!(
                text.contains("secret_file = \"/etc/ringraft/secret\""),
                "{}",
                path.display()
            );
            let c = crate::config::ServeArgs {
                config: Some(path.clone()),
                secret_file: Some(secret.clone()),
                ..Default::default()
            }
            .resolve()
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert_eq!(c.id, id);
            assert_eq!(c.bootstrap, id == 1, "only node 1 bootstraps");
            assert_eq!(c.durability, ringraft::Durability::Fsync);
            assert_eq!(c.fabric, crate::config::FabricChoice::Auto);
            assert_eq!(c.peers.len(), 3);
            assert_eq!(c.peers[&id], c.listen);
            assert_eq!(c.data_dir, Path::new("/var/lib/ringraft"));
            assert_eq!(c.ring_dir, Path::new("/dev/shm"));
            assert!(c.metrics.is_some());
            assert_ne!(c.secret, crate::config::DEV_SECRET);
            configs.push(c);
        }
        assert!(
            configs
                .windows(2)
                .all(|w| w[0].peers == w[1].peers && w[0].cluster_id == w[1].cluster_id),
            "one cluster: the same peers and cluster id everywhere"
        );
    }

    /// The unit starts the daemon the way the README says, on the config
    /// path the example files are written for, with unlimited memlock.
    #[test]
    fn the_systemd_unit_runs_serve_with_the_config() {
        let unit = std::fs::read_to_string(deploy().join("systemd/ringraft.service")).unwrap();
        let lines: Vec<&str> = unit.lines().map(str::trim).collect();
        for expected in [
            "ExecStart=/usr/local/bin/ringraft serve --config /etc/ringraft/ringraft.toml",
            "KillSignal=SIGTERM",
            "LimitMEMLOCK=infinity",
            "StateDirectory=ringraft",
        ] {
            assert!(lines.contains(&expected), "the unit lacks {expected}");
        }
    }
}
